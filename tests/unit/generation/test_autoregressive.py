"""Chunk-by-chunk generation: KV cache == teacher forcing, determinism, conditions, errors, exactness."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from solar.generation.autoregressive import rollout_cameras, sample_autoregressive
from solar.launch.batch import Batch
from solar.objectives.fm import noisy_h3, sample_h3_times
from tests.unit.models.family_helpers import H3_DIMS, h3_ours
from tests.unit.models.wan_helpers import TI2V, dims, moving_cameras, ours, randomize

WAN, H3 = "wan22_ti2v_5b", "minimax_h3"
SHIFT, AUDIO_SHIFT = 3.0, 3.0
WAN_DIMS = dims(TI2V, heads=2, head_dim=16)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _cfg(family: str) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(family=family, timestep_shift=SHIFT,
                                                 audio_timestep_shift=AUDIO_SHIFT))


@functools.cache
def _model(family: str, anyflow: bool):
    """Tiny random models whose window (one prior chunk) slides within a three-chunk rollout."""
    if family == WAN:
        return randomize(ours(WAN_DIMS, camera_transform="logd4", chunk_latents=3, max_prior_clean_chunks=1,
                              anyflow=anyflow))
    return randomize(h3_ours(camera_transform="logd4", anyflow=anyflow, max_prior_clean_chunks=1))


def _batch(family: str, frames: int, *, B: int = 2, channels: int | None = None, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    wan = family == WAN
    C = channels or (48 if wan else 24)
    h, w = (4, 4) if wan else (4, 6)
    text_dim = WAN_DIMS.text_dim if wan else H3_DIMS.text_dim
    return Batch(latents=torch.randn(B, C, frames, h, w, generator=gen),
                 prompt=torch.randn(B, 5, text_dim, generator=gen), prompt_mask=torch.ones(B, 5),
                 cameras=moving_cameras(frames, batch=B, seed=seed), image_condition=None, identities=[])


def _silence(seed: int = 7) -> torch.Tensor:
    return torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(seed))


def _shift(s: float) -> float:
    return SHIFT * s / (1 + (SHIFT - 1) * s)


def _teacher_forcing_rollout(model, family: str, batch: Batch, *, seed: int, solver: str, steps: int,
                             denoising: list[int] | None = None, audio_silence=None) -> torch.Tensor:
    """The same rollout without a cache: each chunk's prediction is the chunk's rows of one
    ``forward_teacher_forcing`` over the whole sequence with the chunks generated so far as clean."""
    h3 = family == H3
    x0 = batch.latents
    B, C, R, h, w = x0.shape
    k = model.cfg.chunk_latents
    gen = torch.Generator().manual_seed(seed)
    extra = {}
    if h3:  # draw order: anchor noise, audio time, audio noise
        a = model.cfg.anchor_timestep
        extra["anchor"] = a * x0[:, :, :1] + (1 - a) * torch.randn(x0[:, :, :1].shape, generator=gen)
        if audio_silence is not None:
            silence = audio_silence.expand(B, *audio_silence.shape)
            t_audio = sample_h3_times(B, AUDIO_SHIFT, gen)
            extra.update(audio=noisy_h3(silence, torch.randn(silence.shape, generator=gen), t_audio),
                         audio_timestep=t_audio)
    noise = torch.randn(B, C, R, h, w, generator=gen)
    if solver == "flowmap":
        sigmas = [_shift(1 - i / steps) for i in range(steps + 1)]
    else:
        sigmas = [_shift(d / 1000) for d in denoising]
    clean = torch.zeros(B, C, R, h, w)
    for c in range(R // k):
        s = slice(c * k, (c + 1) * k)

        def output(x, sigma, r_sigma):
            t = torch.full((B, R), (1 - sigma) if h3 else 1000 * sigma)
            r = torch.full((B, R), (1 - r_sigma) if h3 else 1000 * r_sigma)
            if not h3 and c == 0:
                t[:, 0] = r[:, 0] = 0.0
            noisy = torch.zeros_like(clean)
            noisy[:, :, s] = x
            out = model.forward_teacher_forcing(clean, noisy, t, batch.prompt, cameras=batch.cameras,
                                                r_timestep=r, **extra)
            return out[:, :, s]

        def restore(x):
            if not h3 and c == 0:
                x[:, :, 0] = x0[:, :, 0]
            return x

        x = restore(noise[:, :, s].clone())
        if solver == "flowmap":
            for i in range(steps):
                out = output(x, sigmas[i], sigmas[i + 1])
                u = -out if h3 else out
                x = restore(x - (sigmas[i] - sigmas[i + 1]) * u)
        else:
            for j, sigma in enumerate(sigmas):
                out = output(x, sigma, sigma)
                pred = restore(x + sigma * out if h3 else x - sigma * out)
                if j + 1 < len(sigmas):
                    eps = torch.randn(x.shape, generator=gen)
                    x = restore((1 - sigmas[j + 1]) * pred + sigmas[j + 1] * eps)
            x = pred
        clean[:, :, s] = x
    return clean


@pytest.mark.parametrize("family", [WAN, H3])
@pytest.mark.parametrize("solver, steps, denoising", [("flowmap", 1, None), ("flowmap", 2, None),
                                                      ("self_forcing", 2, [1000, 500])])
def test_kv_cache_rollout_equals_teacher_forcing(family, solver, steps, denoising):
    model = _model(family, anyflow=True)
    frames = 3 * model.cfg.chunk_latents  # three chunks: the one-chunk window slides
    batch = _batch(family, frames)
    audio = _silence() if family == H3 else None
    got = sample_autoregressive(model, _cfg(family), batch, noise_seed=11, solver=solver, steps=steps,
                                audio_silence=audio, denoising_steps=denoising)
    expected = _teacher_forcing_rollout(model, family, batch, seed=11, solver=solver, steps=steps,
                                        denoising=denoising, audio_silence=audio)
    assert got.shape == batch.latents.shape
    assert expected.abs().max() > 0.1  # not a trivial comparison
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", [WAN, H3])
def test_the_noise_seed_decides_the_rollout(family):
    model = _model(family, anyflow=True)
    batch = _batch(family, 2 * model.cfg.chunk_latents, B=1)
    run = functools.partial(sample_autoregressive, model, _cfg(family), batch, solver="self_forcing", steps=4,
                            audio_silence=_silence() if family == H3 else None)
    first, again, other = run(noise_seed=3), run(noise_seed=3), run(noise_seed=4)
    assert torch.equal(first, again)
    assert (first - other).abs().max() > 1e-3


@pytest.mark.parametrize("anyflow, solver, steps", [(True, "flowmap", 2), (False, "unipc", 3),
                                                    (True, "self_forcing", 4), (False, "self_forcing", 2)])
def test_wan_first_latent_is_the_clean_image_condition(anyflow, solver, steps):
    batch = _batch(WAN, 6)
    out = sample_autoregressive(_model(WAN, anyflow), _cfg(WAN), batch, noise_seed=0, solver=solver, steps=steps,
                                denoising_steps=[1000, 500] if steps == 2 and solver == "self_forcing" else None)
    assert out.shape == batch.latents.shape and torch.isfinite(out).all()
    assert torch.equal(out[:, :, 0], batch.latents[:, :, 0])
    assert not torch.equal(out[:, :, 1], batch.latents[:, :, 1])


def test_bad_requests_are_refused():
    flow, plain = _model(WAN, anyflow=True), _model(WAN, anyflow=False)
    batch = _batch(WAN, 6, B=1)
    cfg = _cfg(WAN)
    with pytest.raises(ValueError, match="multiple of the chunk"):
        sample_autoregressive(flow, cfg, batch, noise_seed=0, solver="flowmap", steps=1, rollout_latents=8)
    with pytest.raises(ValueError, match="multiple of the chunk"):
        sample_autoregressive(flow, cfg, _batch(WAN, 7, B=1), noise_seed=0, solver="flowmap", steps=1)
    with pytest.raises(ValueError, match="AnyFlow"):
        sample_autoregressive(plain, cfg, batch, noise_seed=0, solver="flowmap", steps=1)
    with pytest.raises(ValueError, match="len\\(denoising_steps\\)"):
        sample_autoregressive(flow, cfg, batch, noise_seed=0, solver="self_forcing", steps=3)
    with pytest.raises(ValueError, match="len\\(denoising_steps\\)"):
        sample_autoregressive(flow, cfg, batch, noise_seed=0, solver="self_forcing", steps=4,
                              denoising_steps=[1000, 500])
    with pytest.raises(ValueError, match="not an autoregressive solver"):
        sample_autoregressive(flow, cfg, batch, noise_seed=0, solver="euler", steps=1)
    with pytest.raises(ValueError, match="Wan TF-FM baseline"):
        sample_autoregressive(_model(H3, anyflow=False), _cfg(H3), _batch(H3, 5, B=1), noise_seed=0,
                              solver="unipc", steps=2)
    with pytest.raises(ValueError, match="supports"):
        sample_autoregressive(flow, _cfg("wan22_i2v_a14b"), batch, noise_seed=0, solver="flowmap", steps=1)


def test_h3_rolls_out_past_the_clip_with_the_last_camera_repeated():
    model = _model(H3, anyflow=True)
    batch = _batch(H3, 7)  # like 47 latents rolled out to 50: R = 10 > T = 7
    out = sample_autoregressive(model, _cfg(H3), batch, noise_seed=5, solver="flowmap", steps=2, rollout_latents=10,
                                audio_silence=_silence())
    assert out.shape == (2, 24, 10, 4, 6) and torch.isfinite(out).all()
    cams = rollout_cameras(batch.cameras, 10)
    assert torch.equal(cams[:, :7], batch.cameras) and torch.equal(cams[:, 7:], batch.cameras[:, 6:7].expand(-1, 3, -1, -1))
    # the same as a 10-latent clip whose cameras hold still after latent 6 (latents: shape and anchor only)
    padded = Batch(torch.cat([batch.latents, torch.randn(2, 24, 3, 4, 6)], dim=2), batch.prompt, batch.prompt_mask,
                   cams.clone(), None, [])
    same = sample_autoregressive(model, _cfg(H3), padded, noise_seed=5, solver="flowmap", steps=2,
                                 audio_silence=_silence())
    assert torch.equal(out, same)


class ExactFlow:
    """A stand-in model whose data distribution is the single point ``target``: its (average)
    velocity in sigma is exactly u(z, sigma_t, sigma_r) = (z - target) / sigma_t, in the family's
    convention (H3: reversed time, output -u)."""

    def __init__(self, target: torch.Tensor, family: str, chunk: int, anyflow: bool) -> None:
        self.target, self.h3 = target, family == H3
        self.cfg = SimpleNamespace(chunk_latents=chunk, anchor_timestep=0.999)
        self.delta_embedding = object() if anyflow else None
        self.prefix: dict = {}

    def new_cache(self, prompt, **prefix):
        self.prefix = prefix
        return SimpleNamespace(frames=0)

    def forward_chunk(self, noisy, timestep, cache, *, cameras=None, r_timestep=None):
        B, _, k = noisy.shape[:3]
        assert timestep.shape == (B, k) and cameras.shape == (B, k, 4, 4)
        assert (r_timestep is not None) == (self.delta_embedding is not None)
        sigma = (1 - timestep if self.h3 else timestep / 1000)[:, None, :, None, None]
        target = self.target[:, :, cache.frames:cache.frames + k]
        u = torch.where(sigma > 0, (noisy - target) / sigma.clamp_min(1e-12), torch.zeros_like(noisy))
        return -u if self.h3 else u

    def commit_chunk(self, clean, cache, *, cameras=None):
        assert cameras.shape[1] == clean.shape[2]
        cache.frames += clean.shape[2]


EXACT_CASES = [("flowmap", 1, None, True, 1e-5), ("flowmap", 4, None, True, 1e-5), ("flowmap", 7, None, True, 1e-5),
               ("self_forcing", 4, None, True, 1e-5), ("self_forcing", 3, [1000, 600, 200], False, 1e-5)]


@pytest.mark.parametrize("family, solver, steps, denoising, anyflow, atol",
                         [(f, *case) for f in (WAN, H3) for case in EXACT_CASES]
                         + [(WAN, "unipc", 6, None, False, 1e-4)])  # unipc: Wan only
def test_an_exact_velocity_lands_on_the_data_point(family, solver, steps, denoising, anyflow, atol):
    chunk = 3 if family == WAN else 5
    gen = torch.Generator().manual_seed(9)
    target = torch.randn(2, 4, 2 * chunk, 3, 5, generator=gen)
    latents = torch.randn(target.shape, generator=gen)
    latents[:, :, 0] = target[:, :, 0]  # Wan: the clean first latent is the data point's
    batch = Batch(latents, torch.randn(2, 5, 8, generator=gen), torch.ones(2, 5),
                  moving_cameras(2 * chunk, batch=2), None, [])
    model = ExactFlow(target, family, chunk, anyflow)
    out = sample_autoregressive(model, _cfg(family), batch, noise_seed=1, solver=solver, steps=steps,
                                denoising_steps=denoising)
    torch.testing.assert_close(out, target, atol=atol, rtol=0)
    if family == H3:
        assert model.prefix["anchor"].shape == (2, 4, 1, 3, 5) and model.prefix["audio"] is None
        assert torch.equal(model.prefix["anchor_camera"], batch.cameras[:, :1])
