"""LTX-2.5 and MiniMax-H3: parameter counts, fp32 parity with diffusers, H3 teacher forcing."""

from __future__ import annotations

import json

import pytest
import torch

from solar.models.convert import convert
from solar.models.h3 import layout as L
from solar.models.weights import load_solar
from tests.unit.models.family_helpers import (
    H3_DIMS,
    LTX20_DIFFUSERS,
    LTX20_OURS,
    LTX25_DIFFUSERS,
    h3_ours,
    h3_reference,
    ltx_dims,
    ltx_ours,
    ltx_reference,
    randomize,
)
from tests.unit.models.wan_helpers import moving_cameras


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def test_released_parameter_counts_equal_diffusers_on_meta(cli):
    from diffusers import LTX2VideoTransformer3DModel, MiniMaxH3Transformer3DModel

    with torch.device("meta"):
        h3 = MiniMaxH3Transformer3DModel()
        ltx = LTX2VideoTransformer3DModel(num_attention_heads=32, attention_head_dim=128, cross_attention_dim=4096,
                                          num_layers=48, **LTX25_DIFFUSERS)
    h3_count = sum(p.numel() for p in h3.parameters())
    from solar.models.convert import LTX_DROPPED

    video = sum(p.numel() for n, p in ltx.named_parameters() if not LTX_DROPPED.match(n))
    reports = {f: json.loads(cli("model", "info", "--family", f).out) for f in ("minimax-h3", "ltx-2.5")}
    assert reports["minimax-h3"]["parameters"] == h3_count and 32.5e9 < h3_count < 33.5e9
    assert reports["ltx-2.5"]["parameters"] == video
    # The released H3 LoRA recipe trains 2,075,394,048 parameters (r384 on 52 blocks x 6 linears).
    assert reports["minimax-h3"]["lora_r384_trainable_parameters"] == 2_075_394_048


@pytest.mark.parametrize("variant", ["ltx25", "ltx20"])
def test_ltx_parity_with_the_video_path_of_diffusers(variant, tmp_path):
    d = ltx_dims(caption=None if variant == "ltx25" else 20)
    ref = ltx_reference(d, LTX25_DIFFUSERS if variant == "ltx25" else LTX20_DIFFUSERS)
    ours = ltx_ours(d, None if variant == "ltx25" else LTX20_OURS, camera_transform=None)
    if variant == "ltx25":  # through `solar model convert`, which sets the audio stream aside
        ref.save_pretrained(tmp_path / "ref")
        d25 = convert("ltx25_video", "diffusers", str(tmp_path / "ref"), str(tmp_path / "solar"))
        assert d25["source"]["dropped_tensors"] > 0
        load_solar(ours, tmp_path / "solar")
    else:
        ours.load_state_dict({k: v for k, v in ref.state_dict().items() if k in ours.state_dict()})
    gen = torch.Generator().manual_seed(2)
    B, frames, H, W = 2, 4, 3, 5
    x = torch.randn(B, 128, frames, H, W, generator=gen)
    ctx = torch.randn(B, 6, d.text_dim, generator=gen)
    mask = torch.ones(B, 6)
    mask[1, -2:] = 0
    t = torch.tensor([[0.0, 400.0, 400.0, 400.0], [0.0, 900.0, 900.0, 900.0]])  # frame 0: clean condition
    got = ours(x, t, ctx, prompt_mask=mask)
    audio_ctx = torch.randn(B, 6, 8 if variant == "ltx25" else d.text_dim, generator=gen)
    expected = ref(x.flatten(2).transpose(1, 2), torch.randn(B, 3, 8, generator=gen), ctx, audio_ctx,
                   timestep=t.repeat_interleave(H * W, 1), audio_timestep=t[:, :1], sigma=t[:, 1] / 1000,
                   encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=frames, height=H,
                   width=W, audio_num_frames=3, isolate_modalities=True, return_dict=False)[0]
    expected = expected.transpose(1, 2).reshape(B, 128, frames, H, W)
    assert (got - expected).abs().max().item() <= 1e-5


def _h3_inputs(B=1, frames=7, H=4, W=6, text=5, audio=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, 24, frames, H, W, generator=gen), torch.randn(B, 24, 1, H, W, generator=gen),
            torch.randn(B, 2, audio, 32, generator=gen), torch.randn(B, text, H3_DIMS.text_dim, generator=gen))


def test_h3_parity_with_diffusers_through_convert(tmp_path):
    ref = h3_reference()
    ref.save_pretrained(tmp_path / "ref")
    convert("minimax_h3", "diffusers", str(tmp_path / "ref"), str(tmp_path / "solar"))
    ours = h3_ours(camera_transform=None)
    load_solar(ours, tmp_path / "solar")
    x, anchor, audio, ctx = _h3_inputs()
    t = torch.tensor([0.3])
    got, got_audio = ours(x, t, ctx, anchor=anchor, audio=audio, audio_timestep=0.7, return_audio=True)
    lay = L.build(text_tokens=5, frames=7, height=4, width=6, audio_latents=3, patch=(1, 2, 2), teacher_forcing=False)
    t_groups, _ = ours._groups(1, 7, t[:, None].expand(1, 7), None, t[0], 0.7, "cpu")
    rows = torch.arange(lay.length)
    video, audio_out = ref(torch.cat([ours.patchify(anchor), ours.patchify(x)], 1), audio.reshape(1, 6, 32), ctx,
                           timestep=t_groups[0], timestep_indices=lay.groups, token_tags=lay.tags,
                           position_ids=lay.positions.float(), video_indices=torch.cat([rows[lay.anchor], rows[lay.noisy]]),
                           audio_indices=rows[lay.audio], text_indices=rows[lay.text], return_dict=False)
    expected = ours.unpatchify(video[:, lay.anchor.stop - lay.anchor.start:], 7, 4, 6)
    assert (got - expected).abs().max().item() <= 1e-5
    assert (got_audio - audio_out).abs().max().item() <= 1e-5


def test_h3_official_layout_converts_like_diffusers(tmp_path):
    """Official names (fused qkv, [gate; value] FFN) through diffusers' converter give the same model."""
    from safetensors.torch import save_file

    ref = h3_reference(seed=3)
    state = ref.state_dict()
    official = {}
    for name, tensor in state.items():
        if ".attn.to_q." in name:
            base = name.replace(".attn.to_q.weight", "")
            official[f"{base}.attn.qkv_proj.weight"] = torch.cat(
                [state[f"{base}.attn.to_q.weight"], state[f"{base}.attn.to_k.weight"], state[f"{base}.attn.to_v.weight"]])
            continue
        if ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        if name.endswith(".ff.net.0.proj.weight"):
            value, gate = tensor.chunk(2)
            tensor = torch.cat([gate, value])
        renamed = (name.replace("transformer_blocks.", "blocks.").replace("token_refiner.refiner_blocks.", "token_refiner.blocks.")
                   .replace("time_embedder.linear_1.", "time_embedder.proj_in.").replace("time_embedder.linear_2.", "time_embedder.proj_out.")
                   .replace("audio_proj_in.", "audio_patch_proj.").replace("context_embedder.", "condition_proj.")
                   .replace("norm_out.norm.", "final_layer.norm.").replace("norm_out.linear.", "final_layer.adaln_proj.linear.")
                   .replace("audio_proj_out.", "final_layer.audio_out.").replace(".attn.norm_q.", ".attn.q_norm.")
                   .replace(".attn.norm_k.", ".attn.k_norm.").replace(".attn.to_out.0.", ".attn.out_proj.")
                   .replace(".ff.net.0.proj.", ".mlp.fc1.").replace(".ff.net.2.", ".mlp.fc2."))
        if renamed.startswith("proj_in."):
            renamed = renamed.replace("proj_in.", "video_patch_proj.")
        if renamed.startswith("proj_out."):
            renamed = renamed.replace("proj_out.", "final_layer.video_out.")
        official[renamed] = tensor.clone()
    src = tmp_path / "official"
    src.mkdir()
    save_file(official, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps(dict(ref.config)))
    convert("minimax_h3", "official", str(src), str(tmp_path / "solar"))
    ours = h3_ours(camera_transform=None)
    load_solar(ours, tmp_path / "solar")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, state[name]), name


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_h3_teacher_forcing_equals_chunked_kv_generation(backend):
    model = randomize(h3_ours(camera_transform="logd4", attention_backend=backend, anyflow=True,
                              max_prior_clean_chunks=1))
    frames = 15  # three 5-latent chunks; the window of one prior chunk slides
    clean, _, audio, ctx = _h3_inputs(frames=frames, seed=1)
    noisy = torch.randn_like(clean)
    anchor = clean[:, :, :1]
    t = torch.rand(1, frames)
    r = t + (1 - t) * torch.rand(1, frames)
    cams = moving_cameras(frames)
    full = model.forward_teacher_forcing(clean, noisy, t, ctx, anchor=anchor, audio=audio, audio_timestep=0.4,
                                         cameras=cams, r_timestep=r)
    cache = model.new_cache(ctx, anchor=anchor, audio=audio, audio_timestep=0.4, anchor_camera=cams[:, :1],
                            height=4, width=6)
    pieces = []
    for i in range(0, frames, 5):
        s = slice(i, i + 5)
        pieces.append(model.forward_chunk(noisy[:, :, s], t[:, s], cache, cameras=cams[:, s], r_timestep=r[:, s]))
        model.commit_chunk(clean[:, :, s], cache, cameras=cams[:, s])
    assert (full - torch.cat(pieces, dim=2)).abs().max().item() <= 1e-5


def test_h3_compiled_blocks_compile_nothing_on_the_next_step():
    """The row layout and its teacher-forcing mask are kept per call shape (one object each), so a
    compiled block's guards on the mask hold on the next call, and a teacher context's masks too:
    the second step compiles nothing (before, each call's new mask compiled every block again
    until dynamo's recompile limit) and gives the eager model's values. ``aot_eager`` runs flex
    attention eagerly on the CPU inside dynamo's graphs."""
    import copy

    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    model = randomize(h3_ours(camera_transform="logd4", attention_backend="flex", anyflow=True,
                              max_prior_clean_chunks=1))
    reference = copy.deepcopy(model)
    frames = 10
    clean, _, audio, ctx = _h3_inputs(frames=frames, seed=1)
    anchor, cams = clean[:, :, :1], moving_cameras(frames)

    def step(m, noisy, t):
        kwargs = dict(anchor=anchor, audio=audio, audio_timestep=0.4, cameras=cams)
        full = m.forward_teacher_forcing(clean, noisy, t, ctx, r_timestep=t, **kwargs)
        context = m.teacher_context(clean, ctx, **kwargs)
        return full, m.forward_teacher_forcing(clean, noisy, t, ctx, r_timestep=t, context=context, **kwargs)

    gen = torch.Generator().manual_seed(4)
    inputs = [(torch.randn_like(clean), torch.rand(1, frames, generator=gen)) for _ in range(2)]
    with torch.no_grad():
        torch._dynamo.reset()
        for block in model.transformer_blocks:
            block.compile(backend="aot_eager")
        try:
            compiles = []
            outputs = []
            for noisy, t in inputs:
                clear_compilation_metrics()
                outputs.append(step(model, noisy, t))
                compiles.append(len(get_compilation_metrics()))
        finally:
            torch._dynamo.reset()
        expected = [step(reference, noisy, t) for noisy, t in inputs]
    assert compiles[0] > 0 and compiles[1] == 0
    for got, want in zip(outputs, expected):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_h3_layout_geometry():
    lay = L.build(text_tokens=3, frames=7, height=4, width=6, audio_latents=2, patch=(1, 2, 2), teacher_forcing=True)
    n = 2 * 3
    assert lay.length == 3 + n + 2 * 2 + 2 * 7 * n
    assert lay.positions[lay.text, 0].tolist() == [0.0, 1.0, 2.0]
    assert set(lay.positions[lay.anchor, 0].tolist()) == {3.0}
    times = sorted(set(lay.positions[lay.noisy, 0].tolist()))
    spans = [round(b - a, 6) for a, b in zip(times, times[1:])]
    assert spans == [round(5 / 3 * s, 6) for s in (1, 4, 4, 4, 4, 1)]
    assert torch.equal(lay.positions[lay.clean], lay.positions[lay.noisy])
    assert lay.camera_frame[lay.anchor].tolist() == [0] * n and lay.camera_frame[lay.audio].tolist() == [0] * 4
    assert lay.camera_frame[lay.text].tolist() == [0] * 3  # poseless rows use the first latent's camera
    assert lay.chunks[lay.noisy].tolist()[-1] == 1


def _rigid(seed: int) -> torch.Tensor:
    """A random rotation and translation (a change of world frame applied to every camera)."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    g = torch.eye(4)
    g[:3, :3] = (q * torch.sign(torch.linalg.det(q))).float()
    g[:3, 3] = torch.randn(3, generator=gen) * 2
    return g


@pytest.mark.parametrize("family", ["ltx25_video", "minimax_h3"])
def test_prope_is_relative_and_identity_means_no_camera(family):
    """As for Wan: every row of the attention (H3's text, anchor and audio rows included) sees the
    cameras only relative to each other."""
    gen = torch.Generator().manual_seed(3)
    frames = 4
    if family == "ltx25_video":
        d = ltx_dims()
        model = randomize(ltx_ours(d, camera_transform="linear"))
        x, ctx = torch.randn(1, 128, frames, 3, 5, generator=gen), torch.randn(1, 6, d.text_dim, generator=gen)
        t = torch.tensor([[0.0, 400.0, 400.0, 400.0]])
        run = lambda cams: model(x, t, ctx, cameras=cams)  # noqa: E731
    else:
        model = randomize(h3_ours(camera_transform="linear"))
        x, anchor, audio, ctx = _h3_inputs(frames=frames, seed=3)
        run = lambda cams: model(x, torch.tensor([0.5]), ctx, anchor=anchor, audio=audio,  # noqa: E731
                                 audio_timestep=0.7, cameras=cams)
    cams = moving_cameras(frames)
    base = run(cams)
    assert (base - run(cams @ _rigid(1))).abs().max().item() <= 1e-5
    plain = run(None)
    assert (plain - run(torch.eye(4).repeat(1, frames, 1, 1))).abs().max().item() <= 1e-5
    assert (base - plain).abs().max().item() > 1e-3  # cameras do condition the output
