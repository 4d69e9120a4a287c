"""Wan DiT: parameter counts, parity with diffusers, teacher forcing vs KV cache, PRoPE, AnyFlow."""

from __future__ import annotations

import json
import math

import pytest
import torch

from solar.models.attention import CLEAN, NOISY, PAD, TokenMask, teacher_forcing_mask
from solar.models.convert import convert
from solar.models.weights import WeightsError, load_solar
from tests.support.files import snapshot
from tests.unit.models.wan_helpers import A14B, TI2V, dims, moving_cameras, ours, randomize, reference


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.mark.parametrize("family, config, approx", [
    ("wan22_ti2v_5b", dict(num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336,
                           num_layers=30), 5.0e9),
    ("wan22_i2v_a14b", dict(num_attention_heads=40, in_channels=36, out_channels=16, ffn_dim=13824,
                            num_layers=40), 14.3e9),
])
def test_parameter_count_equals_diffusers_on_meta(family, config, approx, cli):
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        ref = WanTransformer3DModel(patch_size=(1, 2, 2), attention_head_dim=128, text_dim=4096,
                                    freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                    **config)
    expected = sum(p.numel() for p in ref.parameters())
    result = cli("model", "info", "--family", family)
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["parameters"] == expected and report["allocated"] is False
    assert math.isclose(expected, approx, rel_tol=0.01)
    assert sum(report["parameters_by_part"].values()) == expected


def _convert_from_diffusers(ref, tmp_path, family):
    ref.save_pretrained(tmp_path / "diffusers")
    out = tmp_path / "solar"
    document = convert(family, "diffusers", str(tmp_path / "diffusers"), str(out))
    assert document["parameters"] == sum(p.numel() for p in ref.parameters())
    return out


@pytest.mark.parametrize("variant, family", [(TI2V, "wan22_ti2v_5b"), (A14B, "wan22_i2v_a14b")])
def test_fp32_parity_with_diffusers_through_convert(variant, family, tmp_path):
    d = dims(variant)
    ref = reference(d)
    model = ours(d, camera_transform=None)
    load_solar(model, _convert_from_diffusers(ref, tmp_path, family))
    gen = torch.Generator().manual_seed(1)
    frames, h, w = 5, 8, 12
    x = torch.randn(2, 48 if variant is TI2V else 16, frames, h, w, generator=gen)
    cond = None if variant is TI2V else torch.randn(2, 20, frames, h, w, generator=gen)
    ctx = torch.randn(2, 7, d.text_dim, generator=gen)
    t = torch.tensor([120.0, 870.0])
    if variant is TI2V:  # first latent is the image condition: t = 0 on its tokens
        t_frames = t[:, None].repeat(1, frames)
        t_frames[:, 0] = 0
        t_tokens = t_frames.repeat_interleave((h // 2) * (w // 2), dim=1)
        expected = ref(x, t_tokens, ctx, return_dict=False)[0]
        got = model(x, t_frames, ctx)
    else:
        expected = ref(torch.cat([x, cond], 1), t, ctx, return_dict=False)[0]
        got = model(x, t, ctx, condition=cond)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-5


def test_official_layout_converts_to_the_same_weights(tmp_path):
    """Official names are made with diffusers' own converter as the oracle."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors.torch import save_file

    from solar.models.wan.convert import official_to_solar

    d = dims(TI2V)
    ref = reference(d)
    diff_state = ref.state_dict()
    inverse = {}
    for name in diff_state:  # official name candidates for each diffusers name
        official = (name.replace("condition_embedder.time_embedder.linear_1", "time_embedding.0")
                    .replace("condition_embedder.time_embedder.linear_2", "time_embedding.2")
                    .replace("condition_embedder.text_embedder.linear_1", "text_embedding.0")
                    .replace("condition_embedder.text_embedder.linear_2", "text_embedding.2")
                    .replace("condition_embedder.time_proj", "time_projection.1")
                    .replace("attn1.", "self_attn.").replace("attn2.", "cross_attn.")
                    .replace("to_out.0.", "o.").replace("to_q.", "q.").replace("to_k.", "k.")
                    .replace("to_v.", "v.").replace("ffn.net.0.proj", "ffn.0").replace("ffn.net.2", "ffn.2")
                    .replace(".norm2.", ".norm3."))
        if name == "scale_shift_table":
            official = "head.modulation"
        elif name.startswith("proj_out."):
            official = name.replace("proj_out.", "head.head.")
        elif name.endswith(".scale_shift_table"):
            official = name.replace(".scale_shift_table", ".modulation")
        inverse[official] = name
    official_state = {k: diff_state[v].clone() for k, v in inverse.items()}
    oracle = convert_wan_transformer_to_diffusers(dict(official_state))
    assert {k: v for k, v in oracle.items()}.keys() == diff_state.keys()  # the inverse is right
    assert {official_to_solar(k) for k in official_state} == set(diff_state)
    src = tmp_path / "official"
    src.mkdir()
    save_file(official_state, src / "diffusion_pytorch_model.safetensors")
    (src / "config.json").write_text(json.dumps({"dim": d.hidden_size, "num_heads": d.num_heads,
                                                 "num_layers": d.num_layers, "ffn_dim": d.ffn_dim,
                                                 "freq_dim": d.freq_dim, "in_dim": 48, "out_dim": 48,
                                                 "text_dim": d.text_dim}))
    convert("wan22_ti2v_5b", "official", str(src), str(tmp_path / "solar"))
    model = ours(d, camera_transform=None)
    load_solar(model, tmp_path / "solar")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, diff_state[name]), name


def test_convert_rejects_mismatches_with_a_report(tmp_path, cli):
    ref = reference(dims(A14B))
    ref.save_pretrained(tmp_path / "a14b")
    result = cli("model", "convert", "--family", "wan22_ti2v_5b", "--from", "diffusers",
                 str(tmp_path / "a14b"), "--out", str(tmp_path / "out"))
    assert result.code == 2 and "36 input / 16 output channels; wan22_ti2v_5b has 48 / 48" in result.err
    assert not (tmp_path / "out").exists()
    # A tensor missing from the source is named.
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "a14b" / "diffusion_pytorch_model.safetensors")
    del state["blocks.1.attn2.to_k.weight"]
    save_file(state, tmp_path / "a14b" / "diffusion_pytorch_model.safetensors")
    before = snapshot(tmp_path)
    result = cli("model", "convert", "--family", "wan22_i2v_a14b", "--from", "diffusers",
                 str(tmp_path / "a14b"), "--out", str(tmp_path / "out"))
    assert result.code == 2 and "1 missing: blocks.1.attn2.to_k.weight" in result.err
    assert snapshot(tmp_path) == before   # nothing written, the source untouched
    result = cli("model", "convert", "--family", "wan22_i2v_a14b", "--from", "diffusers",
                 str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert result.code == 2 and "no such file or directory" in result.err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_teacher_forcing_equals_chunked_kv_generation():
    d = dims(TI2V, heads=2, head_dim=16)
    for backend in ("reference", "sdpa", "flex"):
        model = randomize(ours(d, camera_transform="logd4", chunk_latents=3, max_prior_clean_chunks=2,
                               attention_backend=backend, anyflow=True))
        gen = torch.Generator().manual_seed(3)
        frames = 12  # four chunks: the window of two prior chunks slides
        clean, noisy = (torch.randn(1, 48, frames, 4, 4, generator=gen) for _ in range(2))
        ctx = torch.randn(1, 5, d.text_dim, generator=gen)
        t = torch.rand(1, frames, generator=gen) * 1000
        r = t * torch.rand(1, frames, generator=gen)
        cams = moving_cameras(frames)
        full = model.forward_teacher_forcing(clean, noisy, t, ctx, cameras=cams, r_timestep=r)
        cache = model.new_cache(ctx)
        pieces = []
        for i in range(0, frames, 3):
            s = slice(i, i + 3)
            pieces.append(model.forward_chunk(noisy[:, :, s], t[:, s], cache, cameras=cams[:, s],
                                              r_timestep=r[:, s]))
            model.commit_chunk(clean[:, :, s], cache, cameras=cams[:, s])
            assert cache.layers[0].k.shape[2] == 4 * 3 * 4  # a ring of 2 prior chunks and the current, a spare
            assert cache.keys == (min(i // 3, 2) + 1) * 3 * 4  # this chunk and its window
        assert (full - torch.cat(pieces, dim=2)).abs().max().item() <= 1e-5, backend


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("variant", [TI2V, A14B])
def test_teacher_context_gives_the_full_sequence_prediction(variant):
    """The clean half run once, then the noisy half alone against its keys/values, predicts what
    the whole ``[clean | noisy]`` sequence does, for several noisy inputs and both r conventions."""
    d = dims(variant, heads=2, head_dim=16)
    for backend, with_r in (("reference", True), ("sdpa", True), ("flex", True), ("sdpa", False)):
        model = randomize(ours(d, camera_transform="logd4", chunk_latents=3, max_prior_clean_chunks=2,
                               attention_backend=backend, anyflow=with_r))
        gen = torch.Generator().manual_seed(5)
        frames, channels = 9, d.out_channels
        clean = torch.randn(2, channels, frames, 4, 4, generator=gen)
        extra = d.in_channels - channels
        condition = torch.randn(2, extra, frames, 4, 4, generator=gen) if extra else None
        ctx = torch.randn(2, 5, d.text_dim, generator=gen)
        cams = moving_cameras(frames).expand(2, -1, -1, -1)
        context = model.teacher_context(clean, ctx, cameras=cams, with_r=with_r, condition=condition)
        for _ in range(2):  # the context is read, never changed
            noisy = torch.randn(2, channels, frames, 4, 4, generator=gen)
            t = torch.rand(2, frames, generator=gen) * 1000
            r = t * torch.rand(2, frames, generator=gen) if with_r else None
            full = model.forward_teacher_forcing(clean, noisy, t, ctx, cameras=cams, r_timestep=r,
                                                 condition=condition)
            half = model.forward_teacher_forcing(clean, noisy, t, ctx, cameras=cams, r_timestep=r,
                                                 condition=condition, context=context)
            assert (full - half).abs().max().item() <= 1e-5, (backend, with_r)
        other = None if with_r else t
        with pytest.raises(ValueError, match="other r_timestep convention"):
            model.forward_teacher_forcing(clean, noisy, t, ctx, cameras=cams, r_timestep=other,
                                          condition=condition, context=context)
        with torch.enable_grad(), pytest.raises(ValueError, match="without grad"):
            model.forward_teacher_forcing(clean, noisy, t, ctx, cameras=cams, r_timestep=r, condition=condition,
                                          context=context)


def test_teacher_forcing_mask_rules():
    m = teacher_forcing_mask(frames=9, tokens_per_frame=1, chunk=3, window=1, pad=2)
    dense = m.dense()
    clean, noisy = slice(0, 9), slice(9, 18)
    assert dense[clean, clean].int().tolist()[5] == [1, 1, 1, 1, 1, 1, 0, 0, 0]      # clean chunk 1
    assert dense[clean, clean].int().tolist()[8] == [0, 0, 0, 1, 1, 1, 1, 1, 1]      # window 1
    assert dense[noisy, clean].int().tolist()[7] == [0, 0, 0, 1, 1, 1, 0, 0, 0]      # never its own clean chunk
    assert dense[noisy, noisy].int().tolist()[4] == [0, 0, 0, 1, 1, 1, 0, 0, 0]      # itself
    assert dense[noisy, clean].int().tolist()[1] == [0] * 9                            # chunk 0: no context
    assert dense[18].int().tolist() == [0] * 18 + [1, 0] and dense[:18, 18:].sum() == 0  # pads
    assert set(m.kind.tolist()) == {CLEAN, NOISY, PAD}
    assert isinstance(m, TokenMask)


def _rigid(seed=7):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen))
    g = torch.eye(4)
    g[:3, :3] = q * torch.sign(torch.det(q))
    g[:3, 3] = torch.randn(3, generator=gen) * 2
    return g


@pytest.mark.parametrize("transform", ["linear"])
def test_prope_is_relative_and_identity_means_no_camera(transform):
    d = dims(TI2V, heads=2, head_dim=16)
    model = randomize(ours(d, camera_transform=transform))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 48, 4, 4, 6, generator=gen)
    ctx = torch.randn(1, 5, d.text_dim, generator=gen)
    t = torch.tensor([400.0])
    cams = moving_cameras(4)
    base = model(x, t, ctx, cameras=cams)
    moved = model(x, t, ctx, cameras=cams @ _rigid())  # the same world transform on every camera
    assert (base - moved).abs().max().item() <= 1e-5
    plain = model(x, t, ctx, cameras=None)
    identity = model(x, t, ctx, cameras=torch.eye(4).repeat(1, 4, 1, 1))
    assert (plain - identity).abs().max().item() <= 1e-5
    assert (base - plain).abs().max().item() > 1e-3  # cameras do condition the output
    tf = model.forward_teacher_forcing(x, x.flip(2), t, ctx, cameras=cams)
    tf_moved = model.forward_teacher_forcing(x, x.flip(2), t, ctx, cameras=cams @ _rigid(9))
    assert (tf - tf_moved).abs().max().item() <= 1e-5


def test_logd4_is_part_of_the_model():
    d = dims(TI2V, heads=2, head_dim=16)
    lin = randomize(ours(d, camera_transform="linear"))
    log = ours(d, camera_transform="logd4")
    log.load_state_dict(lin.state_dict())
    gen = torch.Generator().manual_seed(2)
    x, ctx = torch.randn(1, 48, 3, 4, 4, generator=gen), torch.randn(1, 3, d.text_dim, generator=gen)
    cams = moving_cameras(3)
    assert (lin(x, 300.0, ctx, cameras=cams) - log(x, 300.0, ctx, cameras=cams)).abs().max() > 1e-4


def test_anyflow_delta_starts_as_the_time_embedding_and_drops_on_load(tmp_path):
    from solar.models.weights import load_into

    d = dims(TI2V)
    base = randomize(ours(d, camera_transform=None))
    flow = ours(d, camera_transform=None, anyflow=True)
    load_into(flow, base.state_dict(), init_delta_from_time=True)
    gen = torch.Generator().manual_seed(4)
    x, ctx = torch.randn(1, 48, 3, 4, 4, generator=gen), torch.randn(1, 3, d.text_dim, generator=gen)
    t = torch.tensor([[0.0, 500.0, 500.0]])
    assert (flow(x, t, ctx, r_timestep=t) - base(x, t, ctx)).abs().max() <= 1e-6  # r = t: unchanged
    assert (flow(x, t, ctx, r_timestep=t * 0.2) - base(x, t, ctx)).abs().max() > 1e-4
    student = ours(d, camera_transform=None)
    load_into(student, flow.state_dict(), drop_delta=True)
    with pytest.raises(WeightsError, match="unexpected: condition_embedder.delta_embedding"):
        load_into(ours(d, camera_transform=None), flow.state_dict())
    with pytest.raises(WeightsError, match="missing: condition_embedder.delta_embedding"):
        load_into(ours(d, camera_transform=None, anyflow=True), base.state_dict())
    with pytest.raises(ValueError, match="needs the endpoint r_timestep"):
        flow(x, t, ctx)
