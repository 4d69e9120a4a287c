"""What an executor does with a reconcile's decision, for the unit tests' simulated clusters."""

from __future__ import annotations

from solar.run.machine import Decision, JobState


def carry_out(decision: Decision, jobs: dict[str, JobState], created: list, deleted: list, *,
              attempts: bool = True) -> None:
    """Create each job the decision asks for (phase Created, its attempt recorded unless ``attempts`` is
    off, as for a job whose labels do not say) and delete each it deletes."""
    for a in decision.actions:
        if a.kind == "create_job":
            created.append(a)
            jobs[a.stage] = JobState(a.job, "Created", attempt=a.attempt if attempts else None)
        else:
            deleted.append(a)
            jobs.pop(a.stage, None)
