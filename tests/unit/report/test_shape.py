"""The run's shape over time (``solar.report.shape``) on hand-written rank-0 event logs: launches cut
at their ``start`` events, how each ended, the interruptions between them and what they cost, and
the words and chart the report shows for them (``solar.report.html``). A real killed-and-resumed
run is reported in test_shape_run.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from solar.report import shape
from solar.report.html import interruption_text, lost_text, shape_chart, shape_text

T0 = 1_800_000_000.0


def start(t: float, world: int = 8) -> dict:
    return {"event": "start", "time": T0 + t, "rank": 0, "world": world}


def step(n: int, t: float) -> dict:
    return {"event": "step", "step": n, "time": T0 + t}


def ckpt(n: int, t: float) -> dict:
    return {"event": "checkpoint", "step": n, "time": T0 + t}


def launch(n: int, world: int | None = 8, attempt: dict | None = None) -> dict:
    """A launch as the report's ``launches`` lists it (only what ``shape`` reads)."""
    return {"launch": n, "topology": {"world_size": world} if world is not None else {}, "attempt": attempt}


def run(*parts: list[dict]) -> list[dict]:
    return [e for part in parts for e in part]


# -- segments and endings ---------------------------------------------------------------------------
def test_segments_cut_at_each_start_and_drop_what_came_before_the_first():
    events = [step(0, -1), start(0), step(1, 1), start(5), step(2, 6), {"event": "complete", "time": T0 + 7}]
    assert shape.segments(events) == [[start(0), step(1, 1)],
                                      [start(5), step(2, 6), {"event": "complete", "time": T0 + 7}]]
    assert shape.segments([step(1, 1)]) == []


@pytest.mark.parametrize("tail, attempt, last, running, expected", [
    ([{"event": "complete"}], None, True, False, ("complete", None)),
    ([{"event": "stopped"}], {"status": "failed"}, False, False, ("stopped", None)),   # the event wins
    ([{"event": "error", "error_type": "OOMError"}], None, False, False, ("failed", "OOMError")),
    ([], {"status": "failed"}, False, False, ("failed", None)),     # rank 0 wrote no end; its attempt did
    ([], {"status": "stopped"}, False, False, ("stopped", None)),
    ([], None, False, False, ("killed", None)),                     # nothing recorded its end
    ([], None, True, True, ("running", None)),                      # the last launch of a running run
    ([], None, False, True, ("killed", None)),                      # ... but not an earlier one
    ([], {"status": "weird"}, True, False, ("killed", None)),
])
def test_how_a_launch_ended(tail, attempt, last, running, expected):
    segment = [start(0), step(1, 1), *tail]
    assert shape.ending(segment, attempt, last=last, running=running) == expected


def test_a_launch_on_the_time_axis():
    segment = [start(0, world=4), step(1, 1), ckpt(1, 1.5), step(2, 2), ckpt(2, 2.5),
               {"event": "stopped", "time": T0 + 3}]
    s = shape.launch_shape(launch(1), segment, {"world_size": 8, "nproc_per_node": 4}, last=False, running=False)
    assert s == {"launch": 1, "world_size": 8, "nodes": 2, "ranks_per_node": 4, "started": T0, "ended": T0 + 3,
                 "end": "stopped", "error_type": None, "first_step": 1, "last_step": 2, "checkpoints": [1, 2]}
    assert shape_text(s) == "world 8 (2 nodes x 4), steps 1-2 in 3.0 s, stopped"


def test_world_size_from_the_record_else_the_start_event_else_the_attempt():
    segment = [start(0, world=4)]
    assert shape.world_size(launch(1, 8), segment) == 8
    assert shape.world_size(launch(1, None), segment) == 4
    assert shape.world_size(launch(1, None, {"world_size": 2}), [{"event": "start"}]) == 2
    assert shape.world_size(launch(1, None), None) is None
    # ranks per node that do not divide the world (a record from another shape) give no node count
    s = shape.launch_shape(launch(1, 6), segment, {"world_size": 6, "nproc_per_node": 4}, last=True, running=False)
    assert (s["nodes"], s["ranks_per_node"]) == (None, None)


def test_a_launch_with_no_events_is_placed_nowhere():
    s = shape.launch_shape(launch(2, None), None, None, last=True, running=False)
    assert s["world_size"] is None and s["started"] is s["ended"] is s["first_step"] is None and s["end"] == "killed"
    assert shape_text(s) == "world not recorded, no step recorded, killed"


# -- interruptions ----------------------------------------------------------------------------------
def _shapes(parts, launches=None, running=False):
    launches = launches or [launch(n + 1) for n in range(len(parts))]
    return [shape.launch_shape(lc, p, None, last=i == len(parts) - 1, running=running)
            for i, (lc, p) in enumerate(zip(launches, parts))]


def test_a_killed_launch_costs_until_a_later_one_trains_past_its_newest_checkpoint():
    first = [start(0), *(step(n, n) for n in range(1, 38)), ckpt(10, 10.5), ckpt(20, 20.5), ckpt(30, 30.5)]
    first.sort(key=lambda e: e["time"])
    second = [start(80, world=4), step(31, 89.3), step(32, 90)]
    gaps = shape.interruptions(_shapes([first, second]), [first, second])
    assert gaps == [{"after_launch": 1, "previous_end": "killed", "error_type": None, "last_step": 37,
                     "began": T0 + 37, "durable_step": 30, "steps_redone": 7, "through": [], "resumed_by": 2,
                     "recovered_step": 31, "recovered_at": T0 + 89.3, "seconds": 52.3, "rewound_to": None,
                     "chosen": False, "pause": None}]
    assert interruption_text(gaps[0]) == \
        "killed after step 37 (checkpoint 30): 7 steps redone, 52.3 s until step 31 in launch 2"


def test_launches_that_end_again_before_getting_past_the_checkpoint_belong_to_the_same_interruption():
    first = [start(0), step(1, 1), step(2, 2), ckpt(2, 2.5), step(3, 3), {"event": "error", "time": T0 + 4,
                                                                           "error_type": "NCCLError"}]
    second = [start(10), {"event": "error", "time": T0 + 15, "error_type": "OOMError"}]  # before its first step
    third = [start(20), step(2, 24), step(3, 25), step(4, 26)]   # its step 2 was durable: step 3 gets past
    fourth = [start(40), step(3, 42)]
    parts = [first, second, third, fourth]
    gaps = shape.interruptions(_shapes(parts), parts)
    assert [(g["after_launch"], g["previous_end"], g["error_type"], g["through"], g["resumed_by"],
             g["recovered_step"], g["seconds"], g["steps_redone"]) for g in gaps] == [
        (1, "failed", "NCCLError", [2], 3, 3, 21.0, 1),
        (3, "killed", None, [], 4, 3, 16.0, 2)]
    assert interruption_text(gaps[0]) == ("failed (NCCLError) after step 3 (checkpoint 2): 1 step redone, 21.0 s "
                                          "until step 3 in launch 3, launch 2 ended before getting there")


def test_an_unrecovered_interruption_is_not_counted(tmp_path):
    first = [start(0), step(1, 1), ckpt(1, 1.5), step(2, 2), {"event": "stopped", "time": T0 + 3}]
    second = [start(10), step(1, 11)]                   # restarted from scratch: never past checkpoint 1
    events = run(first, second)
    doc = shape.build(tmp_path, events, [launch(1), launch(2)])
    [gap] = doc["interruptions"]
    assert gap["resumed_by"] is gap["recovered_at"] is gap["seconds"] is None and gap["through"] == [2]
    assert doc["lost_seconds"] == 0 and doc["lost_by_end"] == {}
    assert interruption_text(gap) == "stopped after step 2 (checkpoint 1): not recovered (no later launch trained " \
                                     "past step 1)"
    assert lost_text(doc) == "none counted (1 interruption not recovered or not timed)"


def test_the_durable_point_carries_over_from_an_earlier_launch():
    first = [start(0), step(1, 1), step(2, 2), ckpt(2, 2.1), step(3, 3)]
    second = [start(10), step(3, 12)]                   # killed before a checkpoint of its own
    third = [start(20), step(3, 22), step(4, 23)]
    parts = [first, second, third]
    gaps = shape.interruptions(_shapes(parts), parts)
    # launch 2 got past checkpoint 2 (its step 3), so it ends the first interruption; the second
    # starts at its end and counts from checkpoint 2, the newest committed by then
    assert [(g["after_launch"], g["durable_step"], g["steps_redone"], g["resumed_by"], g["seconds"])
            for g in gaps] == [(1, 2, 1, 2, 9.0), (2, 2, 1, 3, 10.0)]


def test_no_checkpoint_means_training_again_from_the_first_step():
    first = [start(0), step(1, 1), step(2, 2)]
    second = [start(10), step(1, 12)]
    [gap] = shape.interruptions(_shapes([first, second]), [first, second])
    assert (gap["durable_step"], gap["steps_redone"], gap["recovered_step"], gap["seconds"]) == (None, 2, 1, 10.0)
    assert interruption_text(gap) == "killed after step 2 (no checkpoint): 2 steps redone, 10.0 s until step 1 in " \
                                     "launch 2"


def test_a_launch_with_no_time_leaves_its_interruption_untimed():
    first = [{"event": "start"}, {"event": "step", "step": 1}]
    second = [start(10), step(2, 12)]
    [gap] = shape.interruptions(_shapes([first, second]), [first, second])
    assert gap["recovered_step"] == 2 and gap["seconds"] is None
    assert interruption_text(gap).endswith("until step 2 in launch 2 (time not recorded)")


# -- build: the report's `shape` ---------------------------------------------------------------------
def _position(root: Path, step_: int, saved: dict | str) -> None:
    path = root / "checkpoints" / f"step_{step_:08d}" / "data" / "position.json"
    path.parent.mkdir(parents=True)
    path.write_text(saved if isinstance(saved, str) else json.dumps({"step": step_, "saved_with": saved}))


def test_saved_with_reads_the_first_checkpoint_recorded_at_this_world(tmp_path):
    _position(tmp_path, 2, "not json")
    _position(tmp_path, 4, {"world_size": 4, "nproc_per_node": 4})           # another world
    _position(tmp_path, 6, {"world_size": 8})                                 # no ranks per node
    _position(tmp_path, 8, {"world_size": 8, "nproc_per_node": 4})
    _position(tmp_path, 10, {"world_size": 8, "nproc_per_node": 2})
    assert shape.saved_with(tmp_path, [1, 2, 4, 6, 8, 10], 8) == {"world_size": 8, "nproc_per_node": 4}
    assert shape.saved_with(tmp_path, [2, 4, 6], 8) is None
    assert shape.saved_with(tmp_path, [], 8) is None


def test_build_sums_the_cost_by_how_each_interruption_began(tmp_path):
    _position(tmp_path, 2, {"world_size": 8, "nproc_per_node": 4})
    _position(tmp_path, 6, {"world_size": 4, "nproc_per_node": 4})
    events = run(
        [step(0, -5)],                                                              # before any start: nobody's
        [start(0), step(1, 1), step(2, 2), ckpt(2, 2.5), step(3, 3)],               # killed after step 3
        [start(60, 4), step(3, 63), step(4, 64), step(5, 65), step(6, 66), ckpt(6, 66.5),
         {"event": "stopped", "time": T0 + 67}],                                    # stopped (shrunk back)
        [start(70), step(7, 75.7), {"event": "complete", "time": T0 + 76}])
    doc = shape.build(tmp_path, events, [launch(1, 8), launch(2, 4), launch(3, 8)])
    assert [(s["launch"], s["world_size"], s["nodes"], s["end"]) for s in doc["launches"]] == [
        (1, 8, 2, "killed"), (2, 4, 1, "stopped"), (3, 8, None, "complete")]
    assert [(g["after_launch"], g["seconds"]) for g in doc["interruptions"]] == [(1, 60.0), (2, 8.7)]
    assert doc["lost_seconds"] == 68.7 and doc["lost_by_end"] == {"killed": 60.0, "stopped": 8.7}
    assert lost_text(doc) == "68.7 s in 2 interruptions (killed 60.0 s, stopped 8.7 s)"
    assert [shape_text(s) for s in doc["launches"]] == [
        "world 8 (2 nodes x 4), steps 1-3 in 3.0 s, killed",
        "world 4 (1 node x 4), steps 3-6 in 7.0 s, stopped",
        "world 8, steps 7-7 in 6.0 s, complete"]
    assert all(math.isfinite(g["seconds"]) for g in doc["interruptions"])
    json.dumps(doc, allow_nan=False)


def test_build_on_one_launch_has_no_interruption(tmp_path):
    doc = shape.build(tmp_path, [start(0), step(1, 1)], [launch(1)], running=True)
    assert doc["interruptions"] == [] and doc["lost_seconds"] == 0 and doc["launches"][0]["end"] == "running"


# -- the chart ---------------------------------------------------------------------------------------
def test_the_chart_draws_each_launch_at_its_world_and_shades_each_interruption(tmp_path):
    events = run([start(0), step(1, 1), ckpt(1, 1.5), step(2, 2)],
                 [start(30, 4), step(2, 40), step(3, 41), {"event": "error", "time": T0 + 42, "error_type": "X<&>"}],
                 [start(50), step(4, 55)])
    doc = shape.build(tmp_path, events, [launch(1, 8), launch(2, 4), launch(3, 8)])
    svg = shape_chart(doc)
    assert svg.startswith('<svg class="shape"') and svg.endswith("</svg>") and "<script" not in svg
    assert svg.count('class="shape-launch"') == 3 and svg.count('class="interruption"') == 2
    assert 'data-launch="2" data-world="4"' in svg
    assert ">38.0 s<" in svg and ">13.0 s<" in svg                 # each interruption's seconds on the chart
    assert "X&lt;&amp;&gt;" in svg and "X<&>" not in svg           # escaped
    assert "wall time since launch 1 began (s)" in svg
    one = shape.build(tmp_path, [start(0), step(1, 1)], [launch(1)])
    assert shape_chart(one) == ""


def test_the_chart_counts_long_runs_in_minutes_or_hours(tmp_path):
    for span, unit in ((500, "s"), (5000, "min"), (50_000, "h")):
        events = run([start(0), step(1, 1), ckpt(1, 2)], [start(span / 2), step(2, span)])
        svg = shape_chart(shape.build(tmp_path, events, [launch(1), launch(2)]))
        assert f"began ({unit})" in svg, unit


def test_the_time_lost_leaves_out_what_was_not_recovered():
    doc = {"interruptions": [{"seconds": 5.0}, {"seconds": None}], "lost_seconds": 5.0, "lost_by_end": {"failed": 5.0}}
    assert lost_text(doc) == "5.0 s in 1 interruption (failed 5.0 s); 1 more not counted (not recovered or not timed)"
