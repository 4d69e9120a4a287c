"""The trainer's per-step Prometheus series (contract.md §6) from the real loop, single process on
CPU: Stage2's outer step updates the same throughput series as the Stage0.5/1 step (samples,
tokens, MFU, GPU memory), counting every role's batches."""

from __future__ import annotations

import socket

import pytest
import torch

from solar.config.contracts import effective_dims
from solar.config.resolve import resolve_file
from solar.data.synth import synthesize
from solar.launch.distributed import Dist
from solar.storage.run_dir import EventLog, Heartbeat
from solar.train import metrics as train_metrics
from solar.train.engine import Loop
from solar.train.flops import train_flops_per_clip
from tests.conftest import CONFIGS

TINY = CONFIGS / "tiny" / "wan22_ti2v_5b"
PEAK = 1e12
# tiny TI2V at 81 frames, 64x96: 21 latents of 4x6 (VAE x16), patch 2 -> 2x3 tokens per latent
TOKENS_PER_CLIP = 21 * 2 * 3


@pytest.fixture
def metrics(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SOLAR_METRICS_PORT", str(port))
    monkeypatch.setenv("SOLAR_PEAK_FLOPS", str(PEAK))  # CPU has no table entry: MFU needs a stated peak
    monkeypatch.setattr(train_metrics, "gpu_memory", lambda: {"allocated": 123, "peak": 456})
    m = train_metrics.maybe_start(rank=0)
    yield m
    m.close()


def _value(m, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def _loop(config: str, root, metrics, sets=()):
    data = root / "data"
    if not data.exists():
        synthesize("wan22_ti2v_5b", data, samples=2, seed=1)
    out = root / "out"
    resolved = resolve_file(TINY / config, [f"data.root={data}", f"runtime.output_dir={out}",
                                            "runtime.validate_every=0", "runtime.validation_steps=[]", *sets])
    d = Dist(rank=0, world=1, local_rank=0, local_world=1, sp=1, device=torch.device("cpu"), backend=None)
    if resolved.route.stage == "stage2":
        from solar.train.stage2 import build_stage2

        parts, stage2 = build_stage2(resolved, 0, d.device)
        return Loop(resolved, d, parts, out, EventLog(out, 0), Heartbeat(out, 0), metrics, stage2=stage2,
                    term="critic")
    from solar.train.objective import objective_for
    from solar.train.setup import build_parts

    parts = build_parts(resolved, 0, d.device)
    objective, term = objective_for(resolved, d, None)
    return Loop(resolved, d, parts, out, EventLog(out, 0), Heartbeat(out, 0), metrics, objective=objective,
                term=term)


def _flops_per_clip(loop) -> float:
    dims = effective_dims(loop.resolved.config)
    return train_flops_per_clip(layers=dims.num_layers, hidden=dims.hidden_size, ffn=dims.ffn_dim,
                                tokens=TOKENS_PER_CLIP)


def test_stage2_step_updates_samples_tokens_mfu_and_memory(tmp_path, metrics):
    # one critic update per student update: outer step 1 is critic only, step 2 student + critic;
    # a short rollout keeps it fast (the clips consumed are still whole 21-latent clips)
    loop = _loop("train_stage2_sgf_81f.yaml", tmp_path, metrics, ["train.sgf.critic_updates_per_student=1",
                                                                  "train.sgf.rollout_latents=6",
                                                                  "train.sgf.supervised_latents=6"])
    first = loop.step(1)
    assert not first["student_updated"]
    assert _value(metrics, "solar_train_samples_total") == 1
    assert _value(metrics, "solar_train_tokens_total") == TOKENS_PER_CLIP
    second = loop.step(2)
    assert second["student_updated"]
    assert _value(metrics, "solar_train_step") == 2
    assert _value(metrics, "solar_train_samples_total") == 3  # the student's batch and the critic's
    assert _value(metrics, "solar_train_tokens_total") == 3 * TOKENS_PER_CLIP
    mfu = 2 * _flops_per_clip(loop) / second["step_seconds"] / PEAK
    assert _value(metrics, "solar_train_mfu_ratio") == pytest.approx(mfu, rel=1e-6)
    assert 0 < mfu < 1
    assert _value(metrics, "solar_train_gpu_memory_bytes", kind="allocated") == 123
    assert _value(metrics, "solar_train_gpu_memory_bytes", kind="peak") == 456
    # both roles: each loss as the mean over ranks (one rank here), each role's gradient norm
    assert _value(metrics, "solar_train_loss", term="critic") == pytest.approx(second["loss_mean"])
    assert _value(metrics, "solar_train_loss", term="student") == pytest.approx(second["student_loss_mean"])
    assert second["student_loss_mean"] == pytest.approx(second["losses"]["student"])
    assert _value(metrics, "solar_train_grad_norm") == pytest.approx(second["grad_norm"])
    assert _value(metrics, "solar_train_role_grad_norm", role="critic") == pytest.approx(second["grad_norm"])
    assert _value(metrics, "solar_train_role_grad_norm", role="student") == pytest.approx(second["student_grad_norm"])
    assert _value(metrics, "solar_train_step_seconds_count") == 2
    # the progress line of the real events: the critic alone, then both roles
    from solar.train.engine import roles_text

    assert roles_text(first).startswith("critic loss ") and roles_text(first).endswith(" student no update yet")
    assert f"student loss {second['student_loss_mean']:.4f} grad {second['student_grad_norm']:.3g}" in roles_text(second)


def test_single_model_step_updates_the_same_series(tmp_path, metrics):
    loop = _loop("train_stage0p5_fm_81f.yaml", tmp_path, metrics)
    event = loop.step(1)
    assert _value(metrics, "solar_train_samples_total") == 1
    assert _value(metrics, "solar_train_tokens_total") == TOKENS_PER_CLIP
    mfu = _flops_per_clip(loop) / event["step_seconds"] / PEAK
    assert _value(metrics, "solar_train_mfu_ratio") == pytest.approx(mfu, rel=1e-6)
    assert _value(metrics, "solar_train_gpu_memory_bytes", kind="peak") == 456
    assert _value(metrics, "solar_train_loss", term="fm") == pytest.approx(event["loss_mean"])


def test_without_a_peak_no_mfu_is_reported(tmp_path, metrics, monkeypatch):
    monkeypatch.delenv("SOLAR_PEAK_FLOPS")
    loop = _loop("train_stage0p5_fm_81f.yaml", tmp_path, metrics)
    loop.step(1)
    assert _value(metrics, "solar_train_mfu_ratio") == 0  # never set (a wrong MFU is worse than none)
    assert _value(metrics, "solar_train_samples_total") == 1
