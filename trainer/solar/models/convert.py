"""``solar model convert``: released checkpoints of every family into Solar's layout.

Per family: where the dims come from (``config.json``), how official names become Solar's
(Wan: our table, checked against diffusers' converter in tests; LTX-2 and MiniMax-H3: diffusers'
own single-file converters), and which reference tensors Solar leaves out on purpose (LTX: the
audio stream and audio-video cross-attention; see ``ltx/model.py``). Every remaining key and shape
is checked against the Solar module built on the meta device before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from solar.config import families
from solar.config.families import Dims
from solar.errors import SolarError
from solar.models.registry import canonical, dims_json, expected_shapes
from solar.models.wan.convert import plan_conversion, read_config, resolve_source_dir
from solar.models.weights import TensorSource, WeightsError, compare_keys, open_source, write_solar

LTX_DROPPED = re.compile(r"^(audio_|av_cross_attn_|cross_attn_rope|cross_attn_audio_rope|prompt_adaln"
                         r"|transformer_blocks\.\d+\.(audio_|video_to_audio|audio_to_video|"
                         r"video_a2v_cross_attn|audio_a2v_cross_attn))")


def ltx_dims(config: dict) -> Dims:
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    hidden = heads * head_dim
    patch = config.get("patch_size", 1)
    text = config.get("caption_channels", hidden) if config.get("use_prompt_embeddings", True) else hidden
    return Dims(config["num_layers"], hidden, heads, head_dim, 4 * hidden, text, 256, config["in_channels"],
                config.get("out_channels") or config["in_channels"], (config.get("patch_size_t", 1), patch, patch), 0)


def h3_dims(config: dict) -> Dims:
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    return Dims(config["num_layers"], config["hidden_size"], heads, head_dim, config["ffn_dim"], config["text_dim"],
                config.get("freq_dim", 256), config["in_channels"], config["in_channels"],
                tuple(config.get("patch_size", (1, 2, 2))), 6 * config.get("rope_freq_dim", 16))


class _MemorySource(TensorSource):
    """A converted in-memory state dict behind the TensorSource interface."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__({k: Path("<memory>") for k in state}, {k: (v.dtype, tuple(v.shape)) for k, v in state.items()}, {})
        self._state = state

    def get(self, name: str) -> torch.Tensor:
        return self._state[name]


def _official_ltx(source: TensorSource) -> TensorSource:
    from solar.models import diffusers_lib

    diffusers_lib.prepare()
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    # The released single file also holds the video/audio VAEs, the vocoder and the text projection
    # next to ``model.diffusion_model.*``: convert the transformer only (as diffusers' loader does).
    names = source.names()
    if any(k.startswith("model.diffusion_model.") for k in names):
        names = [k for k in names if k.startswith("model.diffusion_model.")]
    return _MemorySource(convert_ltx2_transformer_to_diffusers({k: source.get(k) for k in names}))


def _official_h3(source: TensorSource, dims: Dims) -> TensorSource:
    from solar.models import diffusers_lib

    diffusers_lib.prepare()
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    config = {"num_attention_heads": dims.num_heads, "attention_head_dim": dims.head_dim}
    state = {k: source.get(k) for k in source.names()}
    return _MemorySource(convert_minimax_h3_transformer_checkpoint_to_diffusers(state, config))


def plan(family: str, kind: str, src: str | Path):
    """(dims, source, {solar name: source name}, dropped names), all checked strictly."""
    if family in ("wan22_ti2v_5b", "wan22_i2v_a14b"):
        dims, source, mapping = plan_conversion(family, kind, src)
        return dims, source, mapping, []
    root = resolve_source_dir(Path(src))
    config = read_config(root) if root.is_dir() else None
    base = families.spec(family).dims("released")
    if config is None:
        raise WeightsError(f"{root}: no config.json (diffusers keys) to read the {family} dims from")
    dims = ltx_dims(config) if family == "ltx25_video" else h3_dims(config)
    if (dims.in_channels, dims.out_channels) != (base.in_channels, base.out_channels):
        raise WeightsError(f"the source has {dims.in_channels} input / {dims.out_channels} output channels; "
                           f"{family} has {base.in_channels} / {base.out_channels}")
    source = open_source(root)
    if kind == "official":
        source = _official_ltx(source) if family == "ltx25_video" else _official_h3(source, dims)
    names = source.names()
    dropped = [n for n in names if family == "ltx25_video" and LTX_DROPPED.match(n)]
    mapping = {n: n for n in names if n not in set(dropped)}
    anyflow = any(k.startswith("delta_embedding.") for k in mapping)
    got = {k: source.shapes[k][1] for k in mapping}
    report = compare_keys(expected_shapes(family, dims, anyflow=anyflow), got)
    if not report.ok:
        raise WeightsError(f"{root} does not match a {family} model with the source's dims: {report.summary()}")
    return dims, source, mapping, dropped


def convert(family: str, kind: str, src: str, out: str, progress=lambda _: None) -> dict:
    """``solar model convert``: ``src`` (diffusers or official layout) into a new Solar directory ``out``."""
    name = canonical(family)
    if kind not in ("diffusers", "official"):
        raise SolarError(f"--from {kind!r}: use diffusers or official")
    dims, source, mapping, dropped = plan(name, kind, src)
    specs = {target: source.shapes[origin] for target, origin in mapping.items()}
    manifest = {"family": name, "dims": dims_json(dims),
                "anyflow": any("delta_embedding." in k for k in specs),
                "source": {"format": kind, "path": str(Path(src).resolve()),
                           "dropped_tensors": len(dropped)}}
    return write_solar(out, specs, lambda n: source.get(mapping[n]), manifest, progress)
