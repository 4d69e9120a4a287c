"""SolarRun validation and stage planning: every stage resolved with the config library."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from solar.run.plan import RunInvalid, job_name, plan_run
from solar.run.spec import SolarRun
from tests.conftest import REPO

MANIFEST = yaml.safe_load((REPO / "examples" / "solarrun-tiny.yaml").read_text())


def _spec(edit=None):
    doc = copy.deepcopy(MANIFEST)
    if edit:
        edit(doc["spec"])
    return SolarRun.model_validate(doc).spec


def _invalid(edit) -> RunInvalid:
    with pytest.raises(RunInvalid) as info:
        plan_run(_spec(edit), "/runs/tiny-wan", repo=REPO, environ={})
    return info.value


def test_the_tiny_manifest_plans_four_wired_stages():
    plan = plan_run(_spec(), "/runs/tiny-wan", repo=REPO, environ={})
    assert [(s.name, s.action, s.final_step) for s in plan.stages] == [
        ("fm", "train", 4), ("anyflow", "train", 4), ("dmd", "train", 10), ("generate", "infer", None)]
    anyflow, dmd, gen = plan.stages[1], plan.stages[2], plan.stages[3]
    assert "checkpoint.path=/runs/tiny-wan/fm/checkpoints/step_00000004" in anyflow.sets
    assert "checkpoint.mode=weights_only" in anyflow.sets and "checkpoint.weights=ema" in anyflow.sets
    assert dmd.sets[-7:] == (
        "checkpoint.mode=roles",
        "checkpoint.roles.student.path=/runs/tiny-wan/anyflow/checkpoints/step_00000004",
        "checkpoint.roles.student.weights=ema",
        "checkpoint.roles.teacher.path=/runs/tiny-wan/fm/checkpoints/step_00000004",
        "checkpoint.roles.teacher.weights=ema",
        "checkpoint.roles.critic.path=/runs/tiny-wan/fm/checkpoints/step_00000004",
        "checkpoint.roles.critic.weights=ema")
    assert "checkpoint.path=/runs/tiny-wan/dmd/checkpoints/step_00000010" in gen.sets and gen.generation
    assert "runtime.output_dir=/runs/tiny-wan/generate" in gen.sets
    assert not any(s.startswith("train.") for s in gen.sets)  # batch fields only on training stages
    assert plan.stages[0].validation_step == 4 and dmd.validation_step == 10
    args = anyflow.arguments()
    assert args[:5] == ["-m", "solar", "train", "--config", "configs/solar_wm/tiny/wan22_ti2v_5b/train_stage1_tf_anyflow_81f.yaml"]
    assert all(a == "--set" for a in args[5::2])
    resumed = anyflow.arguments(resume_from="/runs/tiny-wan/anyflow/checkpoints/step_00000002")
    assert resumed[-4:] == ["--set", "checkpoint.mode=full_resume", "--set",
                            "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002"]
    assert "checkpoint.weights=ema" not in resumed


@pytest.mark.parametrize("edit, reason, fragment", [
    (lambda s: s["stages"][0]["set"].append("train.stage=stage1"), "UnsupportedRoute", "spec.stages[0] (fm)"),
    (lambda s: s["stages"][1].update(set=[]), "UnresolvedPlaceholder", "data.root"),
    (lambda s: s["topology"].update(globalBatchSize=3), "TopologyMismatch", "spec.topology.globalBatchSize=3 disagrees"),
    (lambda s: s["stages"][1]["init"]["model"].update(stage="nope"), "InvalidInit", "'nope' is not an earlier stage"),
    (lambda s: s["stages"][1]["init"]["model"].update(stage="dmd"), "InvalidInit", "'dmd' is not an earlier stage"),
    (lambda s: s["stages"][2].update(init={"model": {"stage": "anyflow", "weights": "ema"}}), "InvalidInit",
     "Stage2 training initialises three roles"),
    (lambda s: s["stages"][1].update(init={"student": {"stage": "fm", "weights": "ema"}}), "InvalidInit",
     "give either model, or student, teacher and critic"),
    (lambda s: s["stages"].append({"name": "again", "config": s["stages"][3]["config"], "set": s["stages"][3]["set"],
                                   "init": {"model": {"stage": "generate", "weights": "ema"}}}), "InvalidInit",
     "is an inference stage"),
    (lambda s: s["stages"][0]["set"].append("runtime.output_dir=/elsewhere"), "InvalidSpec", "is set by the run"),
    (lambda s: s["stages"][0]["set"].append("checkpoint.mode=none"), "InvalidSpec",
     "gives checkpoint.mode and checkpoint.path only together"),
    (lambda s: s["stages"][0]["set"].append("checkpoint.weights=ema"), "InvalidSpec",
     "checkpoint.weights is set by the run"),
    (lambda s: s["stages"][0]["set"].extend(["checkpoint.mode=full_resume",
                                            "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002"]),
     "InvalidSpec", "a stage rewinds only to a checkpoint of its own directory, /runs/tiny-wan/fm/checkpoints/step_"),
    (lambda s: s["stages"][0]["set"].extend(["checkpoint.mode=full_resume", "checkpoint.path=/runs/tiny-wan/fm/x"]),
     "InvalidSpec", "a stage rewinds only to a checkpoint of its own directory"),
    (lambda s: s["stages"][3]["set"].extend(["checkpoint.mode=full_resume",
                                            "checkpoint.path=/runs/tiny-wan/generate/checkpoints/step_00000002"]),
     "InvalidSpec", "only a training stage rewinds"),
    (lambda s: s["stages"][1].update(name="fm"), "InvalidSpec", "appears twice"),
    (lambda s: s.update(family="minimax_h3"), "InvalidSpec", "spec.family is minimax_h3"),
    (lambda s: s["stages"][0].update(config="configs/nope.yaml"), "InvalidSpec", "does not exist"),
])
def test_bad_runs_are_refused_with_a_reason(edit, reason, fragment):
    err = _invalid(edit)
    assert err.reason == reason, err.message
    assert fragment in err.message


def test_a_stage_set_may_rewind_the_stage_to_its_own_checkpoint_and_list_accepted_changes():
    """Issue 52 item 3: checkpoint.mode=full_resume with checkpoint.path at one of the stage's own checkpoints
    (as the pods see it) is the stage's rewind, not part of its sets; checkpoint.accept_changes reaches every
    attempt, a resume's included."""
    def edit(spec):
        spec["stages"][1]["set"] += ["checkpoint.mode=full_resume",
                                     "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002/",
                                     "checkpoint.accept_changes=[train.optimizer.lr]", "train.optimizer.lr=0.002"]
    plan = plan_run(_spec(edit), "/runs/tiny-wan", repo=REPO, environ={})
    anyflow = plan.stage("anyflow")
    assert anyflow.rewind == 2 and plan.stage("fm").rewind is None
    assert not [s for s in anyflow.sets if s.startswith(("checkpoint.mode=full", "checkpoint.path=/runs/tiny-wan/any"))]
    assert "checkpoint.mode=weights_only" in anyflow.sets    # a fresh start keeps its init wiring
    assert anyflow.resolved["checkpoint"]["accept_changes"] == ["train.optimizer.lr"]
    args = anyflow.arguments("/runs/tiny-wan/anyflow/checkpoints/step_00000002")
    assert args[-4:] == ["--set", "checkpoint.mode=full_resume", "--set",
                         "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002"]
    assert [a for a in args if a.startswith("checkpoint.")] == [
        "checkpoint.accept_changes=[train.optimizer.lr]", "checkpoint.mode=full_resume",
        "checkpoint.path=/runs/tiny-wan/anyflow/checkpoints/step_00000002"]
    assert "checkpoint.weights=ema" not in args


def test_h3_sequence_parallel_rule_is_a_topology_mismatch():
    def h3(spec):
        spec.update(family="minimax_h3")
        spec["stages"] = [{"name": "fm", "config": "configs/solar_wm/tiny/minimax_h3/train_stage0p5_fm_158f.yaml",
                           "set": ["data.root=/d"]}]
    err = _invalid(h3)  # world 1, SP 1: H3 trains with SP 2
    assert err.reason == "TopologyMismatch" and "sequence" in err.message.lower()


def test_job_names_are_dns_labels_within_63_characters_with_worker_suffixes():
    assert job_name("tiny-wan", "fm", 1) == "tiny-wan-fm-1"
    long = job_name("a" * 50, "stage-with-a-long-name", 12)
    assert len(long) <= 51 and long == job_name("a" * 50, "stage-with-a-long-name", 12) and long.endswith("-12")
    assert len(long + "-worker-1023") <= 63
    assert job_name("a" * 50, "stage-one", 1) != job_name("a" * 50, "stage-two", 1)
    import re

    for name in (long, job_name("x" * 60, "y" * 60, 1000)):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 51


def test_each_attempt_has_a_job_name_of_its_own_that_no_other_stage_or_attempt_has():
    """Its pods' names (``<job>-worker-<i>``) then never meet those of an earlier attempt's pod left
    Terminating on a lost node."""
    names = {(stage, attempt): job_name("run", stage, attempt) for stage in ("fm", "fm-2", "fm-21", "f", "m-2")
             for attempt in (1, 2, 12, 21)}
    assert len(set(names.values())) == len(names)
    assert names["fm", 1] != names["fm", 2] and names["fm-2", 1] == "run-fm-2-1" and names["fm", 21] == "run-fm-21"


def test_every_training_stage_carries_its_memory_forecast():
    plan = plan_run(_spec(), "/runs/tiny-wan", repo=REPO, environ={})
    assert [(s.name, s.memory_peak is not None, s.gpu_memory) for s in plan.stages] == [
        ("fm", True, None), ("anyflow", True, None), ("dmd", True, None), ("generate", False, None)]

    def declared(spec):
        spec["topology"]["gpuMemory"] = "80Gi"
    planned = plan_run(_spec(declared), "/runs/tiny-wan", repo=REPO, environ={})
    assert {s.gpu_memory for s in planned.stages if s.action == "train"} == {80 << 30}


def test_a_stage_that_does_not_fit_the_declared_gpu_memory_is_refused_naming_the_figures():
    def small(spec):
        spec["topology"]["gpuMemory"] = "3Gi"  # nothing fits: 3 GiB are kept for CUDA and NCCL
    invalid = _invalid(small)
    assert invalid.reason == "InsufficientGPUMemory" and invalid.stage == "fm"
    assert re.search(r"forecast \d+\.\d MiB per GPU does not fit topology.gpuMemory 3Gi \(0 GiB usable\)",
                     invalid.message), invalid.message   # a tiny config: MiB, never "0.0 GiB"
    assert "to fit:" in invalid.message and "solar config memory" in invalid.message


def _limit(memory, stage=None):
    def edit(spec):
        target = spec if stage is None else spec["stages"][stage]
        target["resources"] = {"limits": {"memory": memory, "nvidia.com/gpu": 1}}
    return edit


def test_every_training_stage_carries_its_host_memory_forecast_and_a_limit_that_fits_passes():
    plan = plan_run(_spec(_limit("64Gi")), "/runs/tiny-wan", repo=REPO, environ={})
    train = [s for s in plan.stages if s.action == "train"]
    assert [s.host_limit for s in train] == [64 << 30] * 3
    assert all(6 << 30 <= s.host_memory <= 64 << 30 for s in train)   # the process's stated 6 GiB and the tiny state
    assert plan.stage("generate").host_memory is None
    unlimited = plan_run(_spec(), "/runs/tiny-wan", repo=REPO, environ={})
    assert [s.host_limit for s in unlimited.stages] == [None] * 4
    assert [s.host_memory for s in unlimited.stages] == [s.host_memory for s in plan.stages]


def test_a_stage_whose_pod_needs_more_host_memory_than_its_limit_is_refused_naming_the_figures():
    need = plan_run(_spec(), "/runs/tiny-wan", repo=REPO, environ={}).stage("fm").host_memory
    invalid = _invalid(_limit("2Gi"))
    assert invalid.reason == "InsufficientHostMemory" and invalid.stage == "fm"
    assert "\n" not in invalid.message and invalid.message.startswith("spec.stages[0] (fm): forecast host memory ")
    assert f"{need / 2**30:.1f} GiB per pod (1 rank; rank 0 " in invalid.message
    assert "exceeds spec.resources.limits.memory 2Gi (2.0 GiB); raise the limit to at least 7Gi" in invalid.message
    assert "sharded checkpoints" in invalid.message and "more nodes" in invalid.message


def test_a_stages_own_resources_decide_its_host_memory_limit():
    def own(spec):
        _limit("64Gi")(spec)
        _limit("3Gi", stage=2)(spec)    # the Stage2 pod only
    invalid = _invalid(own)
    assert invalid.reason == "InsufficientHostMemory" and invalid.stage == "dmd"
    assert "spec.stages[2] (dmd)" in invalid.message and "spec.stages[2].resources.limits.memory 3Gi" in invalid.message

    def own_without_limit(spec):
        _limit("2Gi")(spec)
        for stage in spec["stages"]:
            stage["resources"] = {"limits": {"nvidia.com/gpu": 1}}   # as the jobs use them: no memory limit
    assert [s.host_limit for s in plan_run(_spec(own_without_limit), "/runs/tiny-wan", repo=REPO,
                                           environ={}).stages] == [None] * 4


def test_the_host_check_counts_every_rank_of_the_pod():
    """Two ranks per pod: the pod needs rank 0's peak plus the other rank's (unsharded: the other holds no
    checkpoint state)."""
    from solar.config import memory

    def two(spec):
        spec["topology"].update(gpusPerNode=2)
    plan = plan_run(_spec(two), "/runs/tiny-wan", repo=REPO, environ={})
    fm = plan.stage("fm")
    from solar.config.resolve import resolve_file

    resolved = resolve_file(REPO / fm.config, list(fm.sets), expected_action="train", placeholders=False)
    host = memory.forecast(resolved, gpu_memory_bytes=80 << 30, gpus_per_node=2).host
    assert fm.host_memory == host.used["rank0"].peak + host.used["other"].peak > host.peak
    gib = -(-fm.host_memory // 2**30)
    assert _invalid(lambda s: (two(s), _limit(f"{gib - 1}Gi")(s))).reason == "InsufficientHostMemory"
    assert plan_run(_spec(lambda s: (two(s), _limit(f"{gib}Gi")(s))), "/runs/tiny-wan", repo=REPO, environ={})


@pytest.mark.parametrize("text, expected", [("80Gi", 80 << 30), ("141G", 141 * 10**9), ("1.5Ti", 3 << 39),
                                            ("1024", 1024), ("512Mi", 512 << 20)])
def test_gpu_memory_is_a_kubernetes_quantity(text, expected):
    from solar.run.spec import quantity_bytes

    assert quantity_bytes(text) == expected


def test_a_gpu_memory_that_is_not_a_quantity_is_an_invalid_spec():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="gpuMemory"):
        _spec(lambda spec: spec["topology"].update(gpuMemory="80 GB"))
