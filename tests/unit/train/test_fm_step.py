"""The Stage0.5 flow-matching step (``fm_loss``) on the real tiny models, per family (semantics.md §4).

Hooks on the real model record what it is fed and what it returns; the expected inputs, targets,
weights and loss are recomputed here from the formulas of the spec (float64), replaying only the
documented draw order of each clip's generator ``fm.clip_generator(seed, step, position)``, the
position being the clip's place in the step's global batch, ``(micro * dp_world + dp_rank) * B + i``.
"""

from __future__ import annotations

import math

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.objectives import fm
from solar.train.fm_step import fm_loss
from tests.conftest import CONFIGS

TINY = CONFIGS / "tiny"
CONFIG = {
    "wan22_ti2v_5b": TINY / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml",
    "wan22_i2v_a14b": TINY / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml",
    "ltx25_video": TINY / "ltx25" / "train_stage0p5_fm_153f.yaml",
    "minimax_h3": TINY / "minimax_h3" / "train_stage0p5_fm_158f.yaml",
}
B, FRAMES, H, W = 2, 3, 4, 6
STEP, DP_RANK, MICRO = 7, 1, 0


def _setup(family: str, *sets: str):
    cfg = resolve_file(CONFIG[family], ["data.root=/data", "runtime.output_dir=/out", *sets]).config
    torch.manual_seed(0)
    model = model_from_config(cfg, device="cpu")
    d = model.cfg.dims
    channels = d.out_channels  # the latent channels (A14B's input adds 20 image-condition channels)
    g = torch.Generator().manual_seed(11)
    extra = d.in_channels - channels
    condition = torch.randn(B, extra, FRAMES, H, W, generator=g) if extra else None
    batch = Batch(latents=torch.randn(B, channels, FRAMES, H, W, generator=g),
                  prompt=torch.randn(B, 5, d.text_dim, generator=g), prompt_mask=torch.ones(B, 5),
                  cameras=torch.eye(4).expand(B, FRAMES, 4, 4).clone(), image_condition=condition,
                  identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(B)])
    return cfg, model, batch


def _run(model, cfg, batch, **kw):
    """fm_loss with the model's inputs and output recorded (the output keeps its gradient)."""
    seen = {}

    def pre(module, args, kwargs):
        seen["args"], seen["kwargs"] = [a.detach().clone() if torch.is_tensor(a) else a for a in args], dict(kwargs)

    def post(module, args, kwargs, output):
        output.retain_grad()
        seen["out"] = output

    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.register_forward_hook(post, with_kwargs=True)]
    try:
        loss, records = fm_loss(model, cfg, batch, step=kw.pop("step", STEP), dp_rank=DP_RANK, micro=MICRO, **kw)
    finally:
        for h in handles:
            h.remove()
    return loss, records, seen


def _gens(cfg, step: int) -> list[torch.Generator]:
    dp_world = cfg.distributed.world_size // cfg.distributed.sequence_parallel_size
    first = (MICRO * dp_world + DP_RANK) * B
    return [fm.clip_generator(cfg.train.seed, step, first + i) for i in range(B)]


def _each(gens, draw) -> torch.Tensor:
    return torch.cat([draw(g) for g in gens])


def _noise(gens, shape) -> torch.Tensor:
    return torch.stack([torch.randn(tuple(shape)[1:], generator=g) for g in gens]).double()


def _shifted(s: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * s / (1 + (shift - 1) * s)


def _per_frame_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (pred.double() - target.double()).square().mean(dim=(1, 3, 4))  # [B, F]


def _first_step_dropping(seed: int, probability: float, want: list[bool]) -> int:
    for step in range(1, 10_000):
        first = (MICRO * 1 + DP_RANK) * B   # the tiny configs: one dp rank
        if [fm.drop_decision(seed, step, 0, first + i, probability) for i in range(B)] == want:
            return step
    raise AssertionError("no step with the wanted drop pattern")


# --- Wan TI2V: sigma convention, shift, Gaussian weight, anchored first latent -------------------------

@pytest.mark.parametrize("drops", [[False, False], [True, False]])
def test_wan_ti2v_sigma_convention_anchor_and_weight(drops):
    cfg, model, batch = _setup("wan22_ti2v_5b")
    p = cfg.train.fm.image_condition_dropout
    assert p == 0.1 and cfg.model.timestep_shift == 5.0
    step = _first_step_dropping(cfg.train.seed, p, drops)
    loss, records, seen = _run(model, cfg, batch, step=step)

    assert cfg.train.gradient_accumulation == 1
    gens = _gens(cfg, step)
    index = torch.stack([torch.randint(0, 1000, (1,), generator=g)[0] for g in gens])  # a grid level per video
    eps = _noise(gens, batch.latents.shape)
    sigma = _shifted((index + 1).double() / 1000, 5.0)
    grid = 1000 * _shifted(torch.arange(1, 1001, dtype=torch.float64) / 1000, 5.0)
    gauss = torch.exp(-2 * ((grid - 500) / 1000) ** 2)
    gauss = (gauss - gauss.min()) / (gauss - gauss.min()).mean()
    weight = gauss[index]

    x0 = batch.latents.double()
    s = sigma.view(B, 1, 1, 1, 1)
    x_expected = (1 - s) * x0 + s * eps
    t_expected = (sigma * 1000)[:, None].expand(B, FRAMES).clone()
    mask = torch.ones(B, FRAMES, dtype=torch.float64)
    for i, dropped in enumerate(drops):
        if not dropped:  # the image condition: clean, t = 0, outside the loss
            x_expected[i, :, 0] = x0[i, :, 0]
            t_expected[i, 0] = 0.0
            mask[i, 0] = 0.0

    x_fed, t_fed = seen["args"][0], seen["args"][1]
    assert torch.allclose(x_fed.double(), x_expected, atol=1e-5)
    assert torch.allclose(t_fed.double(), t_expected, atol=1e-3)
    for i, dropped in enumerate(drops):
        assert torch.equal(x_fed[i, :, 0], batch.latents[i, :, 0]) != dropped
    err = _per_frame_mse(seen["out"], eps - x0)  # target eps - x0
    per_sample = (err * mask).sum(1) / mask.sum(1) * weight
    assert loss.item() == pytest.approx(per_sample.mean().item(), rel=1e-5)
    assert [r["image_condition_dropped"] for r in records] == drops
    assert [r["timestep"] for r in records] == pytest.approx((sigma * 1000).tolist(), rel=1e-5)
    assert [r["loss"] for r in records] == pytest.approx(per_sample.tolist(), rel=1e-5)

    loss.backward()  # the anchored frame carries no gradient; a dropped one does
    grad = seen["out"].grad
    for i, dropped in enumerate(drops):
        assert (grad[i, :, 0].abs().sum() > 0) == dropped
        assert grad[i, :, 1:].abs().sum() > 0


def test_wan_draws_do_not_depend_on_the_drop_and_follow_the_micro_batch_identity():
    """The drop is a hash (no RNG): forcing every drop leaves sigma and noise unchanged; the same
    (seed, step, dp rank, micro) draws the same values (SP peers, resumes), another step does not."""
    cfg, model, batch = _setup("wan22_ti2v_5b", "train.fm.image_condition_dropout=0.0")
    cfg_all, _, _ = _setup("wan22_ti2v_5b", "train.fm.image_condition_dropout=1.0")
    _, records, kept = _run(model, cfg, batch)
    _, records_all, dropped = _run(model, cfg_all, batch)
    assert [r["image_condition_dropped"] for r in records] == [False] * B
    assert [r["image_condition_dropped"] for r in records_all] == [True] * B
    assert torch.equal(kept["args"][0][:, :, 1:], dropped["args"][0][:, :, 1:])
    assert torch.equal(kept["args"][1][:, 1:], dropped["args"][1][:, 1:])
    _, _, again = _run(model, cfg, batch)
    assert torch.equal(again["args"][0], kept["args"][0])
    _, _, other = _run(model, cfg, batch, step=STEP + 1)
    assert not torch.equal(other["args"][0], kept["args"][0])


def test_wan_uniform_weighting_drops_the_gaussian_weight():
    cfg, model, batch = _setup("wan22_ti2v_5b", "train.fm.weighting=uniform", "train.fm.image_condition_dropout=0.0")
    loss, _, seen = _run(model, cfg, batch)
    gens = _gens(cfg, STEP)
    for g in gens:
        torch.randint(0, 1000, (1,), generator=g)
    eps = _noise(gens, batch.latents.shape)
    err = _per_frame_mse(seen["out"], eps - batch.latents.double())[:, 1:]
    assert loss.item() == pytest.approx(err.mean().item(), rel=1e-5)


# --- A14B: one timestep per video, image-condition channels zeroed when dropped ----------------------

def test_a14b_scalar_timestep_condition_channels_and_drop():
    cfg, model, batch = _setup("wan22_i2v_a14b", "train.fm.image_condition_dropout=1.0")
    assert cfg.model.timestep_shift == 3.0
    loss, records, seen = _run(model, cfg, batch)
    gens = _gens(cfg, STEP)
    index = torch.stack([torch.randint(0, 1000, (1,), generator=g)[0] for g in gens])
    eps = _noise(gens, batch.latents.shape)
    sigma = _shifted((index + 1).double() / 1000, 3.0)
    x0 = batch.latents.double()
    assert seen["args"][1].shape == (B,)  # [B]: one level per video, no anchored frame
    assert torch.allclose(seen["args"][1].double(), sigma * 1000, atol=1e-3)
    s = sigma.view(B, 1, 1, 1, 1)
    assert torch.allclose(seen["args"][0].double(), (1 - s) * x0 + s * eps, atol=1e-5)
    assert torch.equal(seen["kwargs"]["condition"], torch.zeros_like(batch.image_condition))
    assert all(r["image_condition_dropped"] for r in records)
    _, _, kept = _run(model, _setup("wan22_i2v_a14b", "train.fm.image_condition_dropout=0.0")[0], batch)
    assert torch.equal(kept["kwargs"]["condition"], batch.image_condition)
    grid = 1000 * _shifted(torch.arange(1, 1001, dtype=torch.float64) / 1000, 3.0)
    gauss = torch.exp(-2 * ((grid - 500) / 1000) ** 2)
    gauss = (gauss - gauss.min()) / (gauss - gauss.min()).mean()
    err = _per_frame_mse(seen["out"], eps - x0).mean(1)  # every frame counts
    assert loss.item() == pytest.approx((err * gauss[index]).mean().item(), rel=1e-5)


# --- LTX: shifted logit-normal sigmas, first latent bit-equal to the condition and masked -----------

def test_ltx_logit_normal_sigmas_and_clean_first_latent():
    cfg, model, batch = _setup("ltx25_video")
    f = cfg.train.fm
    loss, records, seen = _run(model, cfg, batch)
    tokens = FRAMES * H * W
    mu = 0.95 + (2.05 - 0.95) * (tokens - 1024) / (4096 - 1024)  # LTX's resolution-dependent shift
    gens = _gens(cfg, STEP)
    draws = [(torch.randn(1, generator=g).double(), torch.rand(1, generator=g).double(),
              torch.rand(1, generator=g).double(), torch.randn(tuple(batch.latents.shape)[1:], generator=g).double())
             for g in gens]   # per clip: normal, uniform, the choice, then its noise
    normal = torch.cat([d[0] for d in draws]) * f.logit_normal_std + mu
    uniform = torch.cat([d[1] for d in draws])
    use_uniform = torch.cat([d[2] for d in draws]) < f.uniform_probability
    sigma = torch.where(use_uniform, uniform, torch.sigmoid(normal)).clamp(f.logit_normal_eps, 1 - f.logit_normal_eps)
    eps = torch.stack([d[3] for d in draws])

    x_fed, t_fed = seen["args"][0], seen["args"][1]
    assert torch.equal(x_fed[:, :, 0], batch.latents[:, :, 0])  # bit-equal clean condition
    s = sigma.view(B, 1, 1, 1, 1)
    x0 = batch.latents.double()
    assert torch.allclose(x_fed[:, :, 1:].double(), ((1 - s) * x0 + s * eps)[:, :, 1:], atol=1e-5)
    assert (t_fed[:, 0] == 0).all()
    assert torch.allclose(t_fed[:, 1:].double(), (sigma * 1000)[:, None].expand(B, FRAMES - 1), atol=1e-3)
    assert torch.equal(seen["kwargs"]["prompt_mask"], batch.prompt_mask)
    assert seen["kwargs"]["fps"] == cfg.data.fps
    err = _per_frame_mse(seen["out"], eps - x0)[:, 1:]  # uniform weight, frame 0 masked out
    assert loss.item() == pytest.approx(err.mean().item(), rel=1e-5)
    assert [r["timestep"] for r in records] == pytest.approx((sigma * 1000).tolist(), rel=1e-5)
    loss.backward()
    assert seen["out"].grad[:, :, 0].abs().sum() == 0


# --- MiniMax-H3: reversed time, keyframe anchor at 0.999, audio fed the encoded silence --------------

def test_h3_reversed_time_anchor_and_encoded_silence():
    cfg, model, batch = _setup("minimax_h3")
    assert cfg.model.timestep_shift == 12.0 and cfg.train.fm.keyframe_anchor_t == 0.999
    silence = torch.randn(2, 6, model.cfg.audio_in_channels, generator=torch.Generator().manual_seed(4))
    loss, records, seen = _run(model, cfg, batch, audio_silence=silence)

    gens = _gens(cfg, STEP)
    draws = [(torch.rand(1, generator=g).double(), torch.randn(tuple(batch.latents.shape)[1:], generator=g).double(),
              torch.randn((batch.latents.shape[1], 1, H, W), generator=g).double(),
              torch.rand(1, generator=g).double(), torch.randn(tuple(silence.shape), generator=g).double())
             for g in gens]   # per clip: time, noise, anchor noise, audio time, audio noise
    t = 1 - _shifted(torch.cat([d[0] for d in draws]).clamp(1e-4, 1.0), 12.0)
    eps = torch.stack([d[1] for d in draws])
    anchor_eps = torch.stack([d[2] for d in draws])
    t_audio = 1 - _shifted(torch.cat([d[3] for d in draws]).clamp(1e-4, 1.0), cfg.model.audio_timestep_shift)
    audio_eps = torch.stack([d[4] for d in draws])

    x0 = batch.latents.double()
    x_fed, t_fed, kw = seen["args"][0], seen["args"][1], seen["kwargs"]
    tt = t.view(B, 1, 1, 1, 1)
    assert torch.allclose(x_fed.double(), tt * x0 + (1 - tt) * eps, atol=1e-5)  # t = 1 is clean
    assert torch.allclose(t_fed.double(), t, atol=1e-6)
    assert torch.allclose(kw["anchor"].double(), 0.999 * x0[:, :, :1] + 0.001 * anchor_eps, atol=1e-6)
    ta = t_audio.view(B, 1, 1, 1)
    assert torch.allclose(kw["audio"].double(), ta * silence.double() + (1 - ta) * audio_eps, atol=1e-5)
    assert torch.allclose(kw["audio_timestep"].double(), t_audio, atol=1e-6)
    assert torch.equal(kw["cameras"], batch.cameras)
    err = _per_frame_mse(seen["out"], x0 - eps)  # target x0 - eps, every frame, no audio term
    assert loss.item() == pytest.approx(err.mean().item(), rel=1e-5)
    assert [r["timestep"] for r in records] == pytest.approx(t.tolist(), rel=1e-5)
    assert not any(r["image_condition_dropped"] for r in records)
    assert all(math.isfinite(r["loss"]) for r in records)


# --- issue 39: a clip's draws are its own, whatever the micro-batch, accumulation or dp rank ------------

def _part(batch: Batch, i: int) -> Batch:
    pick = (lambda t: None if t is None else t[i:i + 1])  # noqa: E731
    return Batch(pick(batch.latents), pick(batch.prompt), pick(batch.prompt_mask), pick(batch.cameras),
                 pick(batch.image_condition), batch.identities[i:i + 1])


@pytest.mark.parametrize("family", list(CONFIG))
def test_a_clip_draws_the_same_in_any_micro_batch_split_and_at_any_dp_rank(family):
    """Positions 0 and 1 of a global batch of 2: one micro-batch of 2 at world 1, two micro-batches of
    1 (accumulation 2), and dp ranks 0 and 1 of world 2 feed the model the same inputs per clip
    (noise, sigma/time, anchor, audio; the image-condition drop at p = 0.5) and give the same losses."""
    sets = ["train.global_batch_size=null", *([] if family == "minimax_h3" else ["train.fm.image_condition_dropout=0.5"])]
    cfg, model, batch = _setup(family, *sets, "train.micro_batch_size=2")
    silence = torch.randn(2, 6, model.cfg.audio_in_channels, generator=torch.Generator().manual_seed(4)) \
        if family == "minimax_h3" else None
    kw = {"audio_silence": silence} if silence is not None else {}

    def run(cfg, part, dp_rank, micro):
        seen = {}
        handle = model.register_forward_pre_hook(
            lambda m, args, kwargs: seen.update(args=[a.detach().clone() for a in args if torch.is_tensor(a)]),
            with_kwargs=True)
        try:
            _, records = fm_loss(model, cfg, part, step=STEP, dp_rank=dp_rank, micro=micro, **kw)
        finally:
            handle.remove()
        return seen["args"], [(r["timestep"], r["image_condition_dropped"], float(r["loss"])) for r in records]

    joint_args, joint = run(cfg, batch, 0, 0)
    accum = _setup(family, *sets, "train.gradient_accumulation=2")[0]
    world2 = _setup(family, *sets, "distributed.world_size=2")[0]
    for split_cfg, where in ((accum, lambda i: (0, i)), (world2, lambda i: (i, 0))):
        for i in range(B):
            args, records = run(split_cfg, _part(batch, i), *where(i))
            assert records[0][:2] == joint[i][:2] and records[0][2] == pytest.approx(joint[i][2], rel=1e-5)
            for a, b in zip(args, joint_args):
                assert torch.allclose(a, b[i:i + 1], atol=1e-6), family
