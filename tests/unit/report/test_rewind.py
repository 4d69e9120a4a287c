"""`solar report` on run directories rewound in place or restarted from step 0 (issue 52 items 2 and 3),
built by hand (tests/support/run_dirs.py): every step's numbers come from the latest launch that did
it, the steps a rewind superseded are gone from the curves and the timeline, and the rewind or
restart is a labelled marker on every step axis and a line of the text."""

from __future__ import annotations

from solar.report import build, render_text
from solar.report import shape as run_shape
from solar.report.html import interruption_text, page
from tests.support.run_dirs import T0, restarted, rewound


def ckpt_event_steps(series: dict) -> list[int]:
    return [c["step"] for c in series["checkpoints"]]


def test_a_rewound_run_is_reported_from_the_launch_that_rewound_it(tmp_path):
    run = rewound(tmp_path / "run")
    report = build(run.root)
    s = report["series"]
    assert s["step"] == [1, 2, 3, 4, 5, 6]                      # launch 1's steps 7 and 8 were superseded
    assert s["loss"] == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]          # steps 5 and 6 as launch 2 trained them
    assert ckpt_event_steps(s) == [2, 4, 6]                      # launch 1's 6 and 8 are under superseded/
    second = report["launches"][1]
    assert second["rewind"]["step"] == 4 and second["at_step"] == 5
    text = render_text(report)
    assert ("  launch 2: resume from step_00000004, rewound to step 4 (step_00000006, step_00000008 superseded, "
            "kept under checkpoints/superseded/0001/), steps 5-6") in text.splitlines()
    assert "checkpoints: 3 verified of 3 (newest step 6); 2 superseded under checkpoints/superseded/" in text
    assert text.splitlines()[-4] == f"  continue it: {report['diagnosis']['next']['command']}"
    html = page(report)
    marker = '<g class="launch-marker" data-launch="2" data-step="5"><title>launch 2: resume from step_00000004, ' \
             'rewound to step 4'
    assert html.count(marker) == 5                               # four step plots and the timeline
    assert ">launch 2 (rewind to step 4)</text>" in html
    assert f'<code class="next">solar train --config {run.root / "launches" / "0001-resolved-config.json"} ' in html


def test_an_interruption_ended_by_a_rewind_counts_until_the_first_step_past_the_rewind(tmp_path):
    run = rewound(tmp_path / "run")
    [gap] = build(run.root)["shape"]["interruptions"]
    assert (gap["after_launch"], gap["durable_step"], gap["rewound_to"], gap["resumed_by"], gap["recovered_step"],
            gap["seconds"]) == (1, 4, 4, 2, 5, 96.0)
    # the run had completed: going back and on was a person's choice, not time lost
    assert gap["chosen"] and gap["pause"][1] - gap["pause"][0] == 91.0
    assert interruption_text(gap) == ("complete after step 8 (rewound to step 4 by launch 2): continued after a pause "
                                      "of 91.0 s: 4 steps redone, 96.0 s until step 5 in launch 2 (a person's choice, "
                                      "not counted as time lost)")


def test_a_launch_that_rewound_and_trained_nothing_is_placed_after_the_rewind(tmp_path):
    run = rewound(tmp_path / "run")
    events = run.root / "events" / "rank-00000.jsonl"
    lines = events.read_text().splitlines()
    events.write_text("\n".join(lines[:16]) + "\n")             # launch 2: start, rewound, then nothing
    (run.root / "run-result.json").unlink()
    report = build(run.root)
    assert report["series"]["step"] == [1, 2, 3, 4] and report["launches"][1]["at_step"] == 5
    assert ckpt_event_steps(report["series"]) == [2, 4]


def test_a_restarted_run_is_reported_from_its_new_start(tmp_path):
    run = restarted(tmp_path / "run")
    report = build(run.root)
    s = report["series"]
    assert s["step"] == [1, 2, 3, 4] and s["loss"] == [0.5] * 4  # launch 1's steps 1-3 are history
    assert report["launches"][1]["restart"]["earlier_launches"] == 1 and report["launches"][1]["at_step"] == 1
    text = render_text(report)
    assert ("  launch 2: restart from step 0 (no committed checkpoint; its 1 earlier launch kept as history), "
            "steps 1-4") in text.splitlines()
    html = page(report)
    assert '<g class="launch-marker" data-launch="2" data-step="1">' in html
    assert ">launch 2 (restart)</text>" in html


def test_a_plain_resume_keeps_the_steps_before_it_and_drops_the_killed_launchs_later_ones():
    """A launch killed after step 7 whose newest checkpoint was 6: the resume's steps 7.. replace its
    7, and its steps past where the resume stopped are not the run's either."""
    from solar.report import _series

    def step(n, loss):
        return {"event": "step", "step": n, "loss": loss, "time": T0 + n}

    events = [{"event": "start"}, *(step(n, 1.0) for n in range(1, 9)),
              {"event": "start"}, step(7, 0.5)]                 # stopped again after step 7
    s = _series(events)
    assert s["step"] == list(range(1, 8)) and s["loss"][-1] == 0.5
    assert run_shape.segments(events)[1][1]["step"] == 7


def test_a_rewind_is_read_from_rank_0s_event_when_the_launch_record_lacks_it(tmp_path):
    import json

    run = rewound(tmp_path / "run")
    record = run.root / "launches" / "0001-launch-manifest.json"
    doc = json.loads(record.read_text())
    del doc["rewind"]
    record.write_text(json.dumps(doc))
    first, second = build(run.root)["launches"]
    assert second["rewind"]["step"] == 4 and second["rewind"]["superseded_dir"] == "checkpoints/superseded/0001"
    assert first["rewind"] is first["restart"] is None
