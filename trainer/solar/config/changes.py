"""What a full resume may change, by kind of key (no torch, no I/O).

A full resume continues a run directory. Its config is compared key by key with the config of the
run's latest launch, and each differing key is one of three kinds:

- ``execution``: where and how the run executes, changed freely: the distributed block, the
  micro-batch and accumulation (the global batch, a recipe key, stays), the runtime block
  (cadences, switches, ``exit_after_step``, the output directory), the checkpoint block, the
  attention kernels, the data loader's workers, and paths that say only where the same things live
  (``data.root``, ``model.vae_path``), the run's name and metadata;
- ``schedule``: ``train.max_steps`` (longer, or shorter but not below the completed step) and the
  learning-rate schedule's warm-up and decay (``warmup_steps``, ``schedule``, ``min_lr_ratio`` of
  ``train.optimizer`` and of Stage2's ``train.sgf.critic_optimizer``): changed with one printed line
  and recorded; the new schedule applies from the next step (learning rates are pure functions of
  the step, ``solar.train.schedule``);
- ``recipe``: every other key (the model, family and objective parameters, its base weights
  ``model.pretrained_path``, which a LoRA run trains on, the data indexes, seed and sampling, the
  global batch, optimizer hyper-parameters, EMA, validation): refused unless the
  resume lists the key in ``checkpoint.accept_changes``; an accepted change is recorded.

Two spellings of one path (``/data`` and ``/data/``, ``a/./b``) are the same value.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

EXECUTION, SCHEDULE, RECIPE = "execution", "schedule", "recipe"

_SCHEDULE_FIELDS = ("warmup_steps", "schedule", "min_lr_ratio")
# Dotted key or block -> kind; the longest listed prefix of a key decides, unlisted keys are recipe.
KINDS: dict[str, str] = {
    "schema": EXECUTION, "name": EXECUTION, "metadata": EXECUTION,
    "distributed": EXECUTION, "runtime": EXECUTION, "checkpoint": EXECUTION,
    "train.micro_batch_size": EXECUTION, "train.gradient_accumulation": EXECUTION,
    "model.vae_path": EXECUTION,
    "model.attention_backend": EXECUTION, "model.sdpa_kernel": EXECUTION,
    "data.root": EXECUTION, "data.num_workers": EXECUTION,
    "train.max_steps": SCHEDULE,
    **{f"train.optimizer.{f}": SCHEDULE for f in _SCHEDULE_FIELDS},
    **{f"train.sgf.critic_optimizer.{f}": SCHEDULE for f in _SCHEDULE_FIELDS},
}
# Keys whose values are paths: compared after normalising their spelling.
PATH_KEYS = frozenset({"data.root", "data.train_index", "data.test_index", "data.negative_prompt",
                       "model.pretrained_path", "model.vae_path", "runtime.output_dir", "checkpoint.path"})
SHOWN = 3  # a refusal names this many keys, then how many more


@dataclass(frozen=True)
class Change:
    key: str
    kind: str
    old: Any
    new: Any

    def as_dict(self, from_step: int | None = None) -> dict:
        out = {"key": self.key, "kind": self.kind, "old": self.old, "new": self.new}
        if from_step is not None:
            out["from_step"] = from_step
        return out

    def text(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def kind_of(key: str) -> str:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = KINDS.get(".".join(parts[:n]))
        if found:
            return found
    return RECIPE


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every leaf (a list or an empty mapping is one value)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _normal(key: str, value: Any) -> Any:
    if key in PATH_KEYS and isinstance(value, str) and value:
        return posixpath.normpath(value)
    return value


def diff(old: dict, new: dict) -> list[Change]:
    """Every key whose value differs between two resolved configs (a key present in one only
    counts as None in the other), in key order."""
    a, b = flatten(old), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        before, after = _normal(key, a.get(key)), _normal(key, b.get(key))
        if before != after:
            out.append(Change(key, kind_of(key), a.get(key), b.get(key)))
    return out


@dataclass
class Review:
    """A full resume's changes against the run's latest launch: the schedule and accepted recipe
    changes (recorded, printed) and the execution ones (free)."""

    execution: list[Change]
    schedule: list[Change]
    accepted: list[Change]
    from_step: int | None = None   # the first step the changes apply to

    @property
    def recorded(self) -> list[dict]:
        """The schedule and accepted recipe changes as the launch record keeps them."""
        return [c.as_dict(self.from_step) for c in self.schedule + self.accepted]

    def lines(self) -> list[str]:
        """One line per recorded change, as the trainer prints it at start."""
        at = f" (from step {self.from_step})" if self.from_step is not None else ""
        return ([f"schedule change: {c.text()}{at}" for c in self.schedule] +
                [f"accepted recipe change: {c.text()}{at}" for c in self.accepted])


def review(old: dict, new: dict, *, completed_step: int | None, where: str) -> Review:
    """The changes a full resume of the run whose latest config is ``old`` makes with ``new``, or a
    ValueError naming each refused key with both values (``where``: the run directory, for the
    message). ``completed_step``: the step of the checkpoint it resumes (``train.max_steps`` may not
    go below it)."""
    accept = list(((new.get("checkpoint") or {}).get("accept_changes")) or [])
    known = set(flatten(new)) | set(flatten(old))
    unknown = [k for k in accept if k not in known]
    if unknown:
        raise ValueError(f"checkpoint.accept_changes lists {', '.join(unknown)}, which "
                         f"{'is not a key' if len(unknown) == 1 else 'are not keys'} of the config; list dotted keys "
                         "such as train.optimizer.lr")
    changes = diff(old, new)
    refused = [c for c in changes if c.kind == RECIPE and c.key not in accept]
    if refused:
        keys = ",".join(c.key for c in refused)
        raise ValueError(f"{where} holds a run with another recipe: {listing(refused)}; a full resume changes recipe "
                         f"keys only when it lists them: --set 'checkpoint.accept_changes=[{keys}]' (or restore "
                         f"the run's values)")
    schedule = [c for c in changes if c.kind == SCHEDULE]
    for c in schedule:
        if c.key == "train.max_steps" and completed_step is not None and isinstance(c.new, int) \
                and c.new < completed_step:
            raise ValueError(f"train.max_steps={c.new} is below step {completed_step}, which {where} has already "
                             f"completed; set train.max_steps to {completed_step} or more")
    return Review(execution=[c for c in changes if c.kind == EXECUTION], schedule=schedule,
                  accepted=[c for c in changes if c.kind == RECIPE],
                  from_step=None if completed_step is None else completed_step + 1)


def listing(changes: list[Change]) -> str:
    """The first ``SHOWN`` changes with both values, then how many more: what a refusal names."""
    more = f" and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
    return ", ".join(c.text() for c in changes[:SHOWN]) + more


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)
