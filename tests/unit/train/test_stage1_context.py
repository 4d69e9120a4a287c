"""Stage1 TF-AnyFlow with the rows before the noisy ones run once (``teacher_context``) gives the
loss, the per-sample records and the gradients of every forward over the whole sequence: on the tiny
Wan config (``[clean | noisy]``, guided: once per prompt; image condition kept and dropped, with
cameras and the adaptive rescale) and the tiny MiniMax-H3 config (``[text | anchor | audio | clean |
noisy]``, unguided: once per step; LoRA, noised silence as audio), each also under Ulysses SP = 2
(gloo ranks)."""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.train.engine import read_records
from solar.train.stage1_step import anyflow_loss
from tests.conftest import CONFIGS
from tests.unit.models.wan_helpers import moving_cameras

CONFIG = CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
H3_CONFIG = CONFIGS / "tiny" / "minimax_h3" / "train_stage1_tf_anyflow_158f.yaml"
B, FRAMES, H, W = 2, 9, 4, 6
STEPS = (3, 4, 11)
H3_FRAMES = 12   # chunks of 5 latents: three


def _setup(*sets: str):
    cfg = resolve_file(CONFIG, ["data.root=/data", "runtime.output_dir=/out", "checkpoint.path=null",
                                "checkpoint.weights=null", *sets]).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cpu")
    d = model.cfg.dims
    g = torch.Generator().manual_seed(11)
    batch = Batch(latents=torch.randn(B, d.out_channels, FRAMES, H, W, generator=g),
                  prompt=torch.randn(B, 5, d.text_dim, generator=g), prompt_mask=torch.ones(B, 5),
                  cameras=moving_cameras(FRAMES, batch=B), image_condition=None,
                  identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(B)])
    negative = torch.randn(5, d.text_dim, generator=g)
    return cfg, model, batch, negative


def _setup_h3():
    cfg = resolve_file(H3_CONFIG, ["data.root=/data", "runtime.output_dir=/out"]).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cpu")
    d = model.cfg.dims
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():   # every weight random (LoRA's up projections start at zero), large enough
        for p in model.parameters():   # that attention patterns move the loss well beyond 1e-5
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    batch = Batch(latents=torch.randn(B, d.out_channels, H3_FRAMES, H, W, generator=g),
                  prompt=torch.randn(B, 5, d.text_dim, generator=g), prompt_mask=torch.ones(B, 5),
                  cameras=moving_cameras(H3_FRAMES, batch=B), image_condition=None,
                  identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(B)])
    silence = torch.randn(2, 3, model.cfg.audio_in_channels, generator=g)
    return cfg, model, batch, silence


def _loss_and_grads(model, cfg, batch, negative, step, clean_context, audio_silence=None):
    model.zero_grad(set_to_none=True)
    calls = {"full": 0, "context": 0, "noisy": 0}
    outputs = []   # every forward's prediction, in call order
    full, context = model.forward_teacher_forcing, model.teacher_context

    def counting_full(*args, **kwargs):
        calls["full" if kwargs.get("context") is None else "noisy"] += 1
        out = full(*args, **kwargs)
        outputs.append(out.detach().clone())
        return out

    def counting_context(*args, **kwargs):
        calls["context"] += 1
        return context(*args, **kwargs)

    model.forward_teacher_forcing, model.teacher_context = counting_full, counting_context
    try:
        loss, records = anyflow_loss(model, cfg, batch, step=step, dp_rank=0, dp_world=1, micro=0,
                                     gather=lambda rows: rows, negative=negative, clean_context=clean_context,
                                     audio_silence=audio_silence)
        loss.backward()
    finally:
        del model.forward_teacher_forcing, model.teacher_context
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), read_records(records), grads, calls, outputs  # the values the step's event shows


def test_the_steps_cover_kept_and_dropped_image_conditions():
    from solar.objectives import fm

    cfg, *_ = _setup("train.fm.image_condition_dropout=0.5")
    drops = {fm.drop_decision(cfg.train.seed, step, 0, i, 0.5) for step in STEPS for i in range(B)}
    assert drops == {True, False}


@pytest.mark.parametrize("step", STEPS)
def test_clean_context_gives_the_full_sequence_loss_and_gradients(step):
    cfg, model, batch, negative = _setup("train.fm.image_condition_dropout=0.5")
    assert (cfg.train.anyflow.guidance_scale or 1.0) != 1.0 and model.cfg.camera_transform is not None
    ref = _loss_and_grads(model, cfg, batch, negative, step, False)
    new = _loss_and_grads(model, cfg, batch, negative, step, True)
    assert ref[3] == {"full": 5, "context": 0, "noisy": 0}
    # the negative prompt's context, then the prompt's: four forwards over the noisy half; the
    # forward with grad over the whole sequence
    assert new[3] == {"full": 1, "context": 2, "noisy": 4}
    _assert_same_step(ref, new)


def _assert_same_step(ref, new):
    """The loss, the records, the gradients and every forward's prediction: the forwards without
    grad enter AnyFlow's loss through a difference quotient (and, unguided as H3, nowhere else),
    which damps their errors in the loss and gradients."""
    (ref_loss, ref_records, ref_grads, _, ref_outputs), (loss, records, grads, _, outputs) = ref, new
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * max(1.0, abs(ref_loss.item()))
    assert [{k: v for k, v in r.items() if k != "loss"} for r in records] == \
        [{k: v for k, v in r.items() if k != "loss"} for r in ref_records]
    assert all(abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(b["loss"])) for a, b in zip(records, ref_records))
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        scale = max(1.0, ref_grads[name].abs().max().item())
        assert (g - ref_grads[name]).abs().max().item() <= 1e-5 * scale, name
    assert len(outputs) == len(ref_outputs) > 0
    for a, b in zip(outputs, ref_outputs):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


def _sp_step(rank: int, world: int, family: str, step: int):
    """One rank of an SP group (or the single process at world 1): the step without and with the
    context, parameter gradients summed over the group as the trainer does."""
    import torch.distributed as dist

    from solar.models.sequence_parallel import SPGroup

    if family == "wan":
        cfg, model, batch, negative = _setup("train.fm.image_condition_dropout=0.5")
        silence = None
    else:
        (cfg, model, batch, silence), negative = _setup_h3(), None
    if world > 1:
        model.set_sequence_parallel(SPGroup(None, rank, world))
    out = []
    for clean_context in (False, True):
        result = _loss_and_grads(model, cfg, batch, negative, step, clean_context, silence)
        if world > 1:
            for g in result[2].values():
                dist.all_reduce(g)
        out.append(result)
    return out


def test_clean_context_under_sequence_parallelism_gives_the_full_sequence_step():
    """SP = 2: the clean half's 9 frames split 5 + 4 (the whole sequence's 18: 9 + 9); step 3 keeps
    one sample's image condition and drops the other's."""
    from tests.support.distributed import run_ranks

    for ref, new in run_ranks(_sp_step, 2, "wan", 3):
        assert ref[3] == {"full": 5, "context": 0, "noisy": 0}
        assert new[3] == {"full": 1, "context": 2, "noisy": 4}
        _assert_same_step(ref, new)


@pytest.mark.parametrize("step", (3, 4))
def test_h3_context_gives_the_full_sequence_loss_and_gradients(step):
    """One context a step (one prompt, no guidance): three forwards over the noisy rows, the
    forward with grad over the whole sequence."""
    ref, new = _sp_step(0, 1, "h3", step)
    assert ref[3] == {"full": 4, "context": 0, "noisy": 0}
    assert new[3] == {"full": 1, "context": 1, "noisy": 3}
    _assert_same_step(ref, new)


def test_h3_context_under_sequence_parallelism_gives_the_full_sequence_step():
    """SP = 2, as H3 trains: context rows and noisy rows each split over the two ranks."""
    from tests.support.distributed import run_ranks

    single = _sp_step(0, 1, "h3", 3)
    for ref, new in run_ranks(_sp_step, 2, "h3", 3):
        assert new[3] == {"full": 1, "context": 1, "noisy": 3}
        _assert_same_step(ref, new)
        _assert_same_step(single[0], ref)   # and SP = 2 is SP = 1


def test_compiled_blocks_are_recognised(monkeypatch):
    """The step keeps the full-sequence forwards for compiled blocks (``parallelize.is_compiled``),
    unless the benchmark's switch asks for the context."""
    from solar.train.parallelize import apply_compile, is_compiled
    from solar.train.stage1_step import _reuses_context

    _, model, _, _ = _setup()
    assert not is_compiled(model) and _reuses_context(model, True)
    apply_compile(model)   # nothing compiles until a block runs
    assert is_compiled(model) and not _reuses_context(model, True)
    monkeypatch.setenv("SOLAR_COMPILED_CONTEXT", "1")
    assert _reuses_context(model, True) and not _reuses_context(model, False)
