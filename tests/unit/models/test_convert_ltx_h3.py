"""``solar model convert`` for LTX-2.5 and MiniMax-H3: the official LTX layout, mismatch reports,
and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from solar.models.convert import convert
from solar.models.weights import WeightsError, iter_solar_tensors, load_solar, read_solar_manifest
from tests.support.files import snapshot
from tests.unit.models.family_helpers import (
    H3_DIMS,
    LTX25_DIFFUSERS,
    h3_ours,
    h3_reference,
    ltx_dims,
    ltx_ours,
    ltx_reference,
)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


PREFIX = "model.diffusion_model."


def _official_ltx_name(name: str) -> str:
    """diffusers name -> LTX-2 official name (the inverse of diffusers' single-file converter)."""
    for diffusers_name, official in (
            ("av_cross_attn_video_scale_shift", "av_ca_video_scale_shift_adaln_single"),
            ("av_cross_attn_video_a2v_gate", "av_ca_a2v_gate_adaln_single"),
            ("av_cross_attn_audio_scale_shift", "av_ca_audio_scale_shift_adaln_single"),
            ("av_cross_attn_audio_v2a_gate", "av_ca_v2a_gate_adaln_single"),
            ("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
            ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
            ("norm_q", "q_norm"), ("norm_k", "k_norm"), ("proj_in", "patchify_proj")):
        name = name.replace(diffusers_name, official)
    if name.startswith("time_embed."):
        name = "adaln_single." + name[len("time_embed."):]
    elif name.startswith("audio_time_embed."):
        name = "audio_adaln_single." + name[len("audio_time_embed."):]
    return PREFIX + name


def _ltx_sources(tmp_path, seed: int = 3, extra: dict | None = None):
    """A tiny LTX-2.5 saved twice: diffusers layout (``diffusers/``) and official layout (``official/``,
    with the text connectors the diffusers converter drops, plus ``extra`` tensors)."""
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    ref = ltx_reference(ltx_dims(), LTX25_DIFFUSERS, seed=seed)
    ref.save_pretrained(tmp_path / "diffusers")
    state = ref.state_dict()
    official = {_official_ltx_name(k): v.clone() for k, v in state.items()}
    official[PREFIX + "video_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight"] = torch.ones(4, 4)
    official[PREFIX + "audio_embeddings_connector.learnable_registers"] = torch.ones(2, 4)
    # diffusers' own converter is the oracle that the official names above are right.
    oracle = convert_ltx2_transformer_to_diffusers(dict(official))
    assert oracle.keys() == state.keys()
    assert all(torch.equal(oracle[k], state[k]) for k in state)
    assert any(k.startswith(PREFIX + "adaln_single.") for k in official)
    assert any(".q_norm." in k for k in official) and any("patchify_proj" in k for k in official)
    src = tmp_path / "official"
    src.mkdir()
    save_file({**official, **(extra or {})}, src / "ltx-2.5-tiny.safetensors")
    (src / "config.json").write_text(json.dumps(dict(ref.config)))
    return ref, state


def _solar_tensors(path) -> dict[str, torch.Tensor]:
    return dict(iter_solar_tensors(path))


def test_ltx_official_layout_converts_to_the_same_weights_as_diffusers(tmp_path):
    ref, state = _ltx_sources(tmp_path)
    from_diffusers = convert("ltx25_video", "diffusers", str(tmp_path / "diffusers"), str(tmp_path / "a"))
    from_official = convert("ltx25_video", "official", str(tmp_path / "official"), str(tmp_path / "b"))
    assert from_official["source"]["format"] == "official" and from_diffusers["source"]["format"] == "diffusers"
    assert from_official["dims"] == from_diffusers["dims"]
    assert from_official["parameters"] == from_diffusers["parameters"]
    # The audio stream is set aside the same way from both layouts.
    assert from_official["source"]["dropped_tensors"] == from_diffusers["source"]["dropped_tensors"] > 0
    a, b = _solar_tensors(tmp_path / "a"), _solar_tensors(tmp_path / "b")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ours = ltx_ours(ltx_dims(), camera_transform=None)
    load_solar(ours, tmp_path / "b")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_ltx_official_all_in_one_checkpoint_sets_the_vaes_aside(tmp_path):
    """The released single file also holds the video and audio VAEs (and the vocoder) next to
    ``model.diffusion_model.*``; only the transformer is converted."""
    extra = {"vae.per_channel_statistics.mean-of-means": torch.zeros(128),
             "vae.decoder.conv_in.conv.weight": torch.zeros(8, 128, 3, 3, 3),
             "audio_vae.per_channel_statistics.mean-of-means": torch.zeros(8),
             "vocoder.conv_pre.weight": torch.zeros(4, 8, 7)}
    _, state = _ltx_sources(tmp_path, extra=extra)
    convert("ltx25_video", "official", str(tmp_path / "official"), str(tmp_path / "solar"))
    ours = ltx_ours(ltx_dims(), camera_transform=None)
    load_solar(ours, tmp_path / "solar")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, state[name]), name


# --- mismatch reports ---------------------------------------------------------------------------

def _save_ltx(path, d=None):
    ref = ltx_reference(d or ltx_dims(), LTX25_DIFFUSERS)
    ref.save_pretrained(path)
    return ref


def _save_h3(path, d=H3_DIMS):
    ref = h3_reference(d)
    ref.save_pretrained(path)
    return ref


FAMILIES = {
    # family, alias on the command line, saver, a kept (not dropped) tensor, another one
    "ltx25_video": ("ltx-2.5", _save_ltx, "transformer_blocks.1.attn2.to_k.weight", "proj_out.weight"),
    "minimax_h3": ("minimax-h3", _save_h3, "transformer_blocks.1.attn.to_k.weight", "proj_in.weight"),
}


def _edit(path, fn):
    file = path / "diffusion_pytorch_model.safetensors"
    state = load_file(file)
    fn(state)
    save_file(state, file)


def _convert_cli(cli, family, src, out):
    return cli("model", "convert", "--family", FAMILIES[family][0], "--from", "diffusers", str(src), "--out", str(out))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_missing_tensor_is_named(family, tmp_path, cli):
    _, save, kept, _ = FAMILIES[family]
    save(tmp_path / "src")
    _edit(tmp_path / "src", lambda s: s.pop(kept))
    before = snapshot(tmp_path)
    result = _convert_cli(cli, family, tmp_path / "src", tmp_path / "out")
    assert result.code == 2, result.err
    assert f"does not match a {family} model" in result.err and f"1 missing: {kept}" in result.err
    assert "unexpected" not in result.err
    assert snapshot(tmp_path) == before  # nothing written, no partial dir, the source untouched


@pytest.mark.parametrize("family", FAMILIES)
def test_an_extra_tensor_is_named(family, tmp_path, cli):
    _, save, kept, _ = FAMILIES[family]
    save(tmp_path / "src")
    extra = kept.replace("to_k", "to_k_extra")
    _edit(tmp_path / "src", lambda s: s.update({extra: torch.zeros(3)}))
    before = snapshot(tmp_path)
    result = _convert_cli(cli, family, tmp_path / "src", tmp_path / "out")
    assert result.code == 2, result.err
    assert f"1 unexpected: {extra}" in result.err and "missing" not in result.err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("family", FAMILIES)
def test_a_wrong_shape_is_named_with_both_shapes(family, tmp_path, cli):
    _, save, _, other = FAMILIES[family]
    ref = save(tmp_path / "src")
    shape = list(ref.state_dict()[other].shape)
    wrong = [shape[0], shape[1] + 1]
    _edit(tmp_path / "src", lambda s: s.update({other: torch.zeros(wrong)}))
    before = snapshot(tmp_path)
    result = _convert_cli(cli, family, tmp_path / "src", tmp_path / "out")
    assert result.code == 2, result.err
    assert f"1 shape mismatch: {other}: source {wrong} vs model {shape}" in result.err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("family, dims, report", [
    ("ltx25_video", dataclasses.replace(ltx_dims(), in_channels=64, out_channels=64),
     "the source has 64 input / 64 output channels; ltx25_video has 128 / 128"),
    ("minimax_h3", dataclasses.replace(H3_DIMS, in_channels=16, out_channels=16),
     "the source has 16 input / 16 output channels; minimax_h3 has 24 / 24"),
])
def test_a_wrong_channel_count_is_rejected(family, dims, report, tmp_path, cli):
    FAMILIES[family][1](tmp_path / "src", dims)
    before = snapshot(tmp_path)
    result = _convert_cli(cli, family, tmp_path / "src", tmp_path / "out")
    assert result.code == 2 and report in result.err, result.err
    assert snapshot(tmp_path) == before


def test_official_ltx_mismatches_are_reported_too(tmp_path):
    # A renamed official tensor the converter does not know stays unexpected; its partner goes missing.
    _ltx_sources(tmp_path)
    file = tmp_path / "official" / "ltx-2.5-tiny.safetensors"
    state = load_file(file)
    state[PREFIX + "transformer_blocks.0.attn1.to_q_renamed.weight"] = state.pop(
        PREFIX + "transformer_blocks.0.attn1.to_q.weight")
    save_file(state, file)
    with pytest.raises(WeightsError) as info:
        convert("ltx25_video", "official", str(tmp_path / "official"), str(tmp_path / "out"))
    assert "1 missing: transformer_blocks.0.attn1.to_q.weight" in str(info.value)
    assert "1 unexpected: transformer_blocks.0.attn1.to_q_renamed.weight" in str(info.value)
    assert not (tmp_path / "out").exists()


# --- the CLI on a success path ------------------------------------------------------------------

def test_cli_converts_official_ltx_and_the_result_loads_and_runs(tmp_path, cli):
    ref, state = _ltx_sources(tmp_path, seed=4)
    out = tmp_path / "solar"
    result = cli("model", "convert", "--family", "ltx-2.5", "--from", "official", str(tmp_path / "official"),
                 "--out", str(out))
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["family"] == "ltx25_video" and report["out"] == str(out)
    assert report["source"] == {"format": "official", "path": str((tmp_path / "official").resolve()),
                                "dropped_tensors": report["source"]["dropped_tensors"]}
    assert "solar: wrote model-00001-of-00001.safetensors" in result.err
    manifest = read_solar_manifest(out)
    assert [f["path"] for f in manifest["files"]] == ["model-00001-of-00001.safetensors"]
    ours = ltx_ours(ltx_dims(), camera_transform=None)
    assert manifest["parameters"] == report["parameters"] == sum(p.numel() for p in ours.parameters())
    assert load_solar(ours, out)["family"] == "ltx25_video"
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    # The loaded model runs and gives diffusers' video output.
    gen = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(1, 128, 2, 2, 3, generator=gen), torch.randn(1, 4, 24, generator=gen)
    t = torch.tensor([[0.0, 700.0]])
    got = ours(x, t, ctx, prompt_mask=torch.ones(1, 4))
    expected = ref(x.flatten(2).transpose(1, 2), torch.randn(1, 3, 8, generator=gen), ctx, torch.randn(1, 4, 8),
                   timestep=t.repeat_interleave(6, 1), audio_timestep=t[:, :1], sigma=t[:, 1] / 1000,
                   encoder_attention_mask=torch.ones(1, 4), audio_encoder_attention_mask=torch.ones(1, 4),
                   num_frames=2, height=2, width=3, audio_num_frames=3, isolate_modalities=True,
                   return_dict=False)[0].transpose(1, 2).reshape(1, 128, 2, 2, 3)
    assert (got - expected).abs().max().item() <= 1e-5
    # A second conversion into the same (now non-empty) directory is refused, nothing overwritten.
    again = cli("model", "convert", "--family", "ltx-2.5", "--from", "official", str(tmp_path / "official"),
                "--out", str(out))
    assert again.code == 2 and "exists and is not empty" in again.err
    assert read_solar_manifest(out) == manifest


def test_cli_converts_diffusers_h3_and_the_result_loads(tmp_path, cli):
    ref = _save_h3(tmp_path / "src")
    result = cli("model", "convert", "--family", "minimax-h3", "--from", "diffusers", str(tmp_path / "src"),
                 "--out", str(tmp_path / "solar"))
    assert result.code == 0, result.err
    assert json.loads(result.out)["family"] == "minimax_h3"
    ours = h3_ours(camera_transform=None)
    load_solar(ours, tmp_path / "solar")
    state = ref.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, state[name]), name
