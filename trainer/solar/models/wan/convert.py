"""Released Wan checkpoints -> Solar's layout.

Solar's Wan module uses diffusers' parameter names, so a diffusers checkpoint maps one to one. The
official Wan layout (Wan-Video repositories) is renamed by ``official_to_solar``. Dims come from
the source's ``config.json`` (diffusers or official keys) and are checked against the family
(latent channels in and out); every key and shape is checked against the model built on the meta
device before anything is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from solar.config import families
from solar.config.families import Dims
from solar.models.registry import expected_shapes
from solar.models.weights import TensorSource, WeightsError, compare_keys, open_source

# Official Wan names -> diffusers/Solar names, applied in order to each key.
_OFFICIAL = [
    (r"^model\.diffusion_model\.", ""),
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"^head\.head\.", "proj_out."),
    (r"\.self_attn\.", ".attn1."),
    (r"\.cross_attn\.", ".attn2."),
    (r"\.(attn[12])\.o\.", r".\1.to_out.0."),
    (r"\.(attn[12])\.([qkv])\.", r".\1.to_\2."),
    (r"\.modulation$", ".scale_shift_table"),
    (r"\.ffn\.0\.", ".ffn.net.0.proj."),
    (r"\.ffn\.2\.", ".ffn.net.2."),
    # The official block calls its cross-attention norm norm3 (diffusers: norm2).
    (r"\.norm3\.", ".norm2."),
]


def official_to_solar(name: str) -> str:
    for pattern, repl in _OFFICIAL:
        name = re.sub(pattern, repl, name)
    return name


def dims_from_config(config: dict, family: str) -> Dims:
    base = families.spec(family).dims("released")
    if "num_attention_heads" in config:  # diffusers
        heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
        values = dict(num_layers=config["num_layers"], num_heads=heads, head_dim=head_dim,
                      hidden_size=heads * head_dim, ffn_dim=config["ffn_dim"], text_dim=config["text_dim"],
                      freq_dim=config["freq_dim"], in_channels=config["in_channels"],
                      out_channels=config["out_channels"] or config["in_channels"],
                      patch_size=tuple(config.get("patch_size", base.patch_size)))
    elif "num_heads" in config and "dim" in config:  # official
        heads, dim = config["num_heads"], config["dim"]
        values = dict(num_layers=config["num_layers"], num_heads=heads, head_dim=dim // heads,
                      hidden_size=dim, ffn_dim=config["ffn_dim"], text_dim=config.get("text_dim", 4096),
                      freq_dim=config.get("freq_dim", 256), in_channels=config["in_dim"],
                      out_channels=config["out_dim"], patch_size=tuple(config.get("patch_size", base.patch_size)))
    else:
        raise WeightsError("config.json has neither diffusers (num_attention_heads) nor official (num_heads, dim) keys")
    return Dims(**values, prope_start=base.prope_start)


def dims_from_tensors(source: TensorSource, rename, family: str) -> Dims:
    """Dims from shapes; the head count cannot be seen, so Wan's head dim of 128 is assumed."""
    shapes = {rename(k): v[1] for k, v in source.shapes.items()}
    base = families.spec(family).dims("released")
    try:
        hidden, in_channels, *patch = shapes["patch_embedding.weight"]
        layers = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k)))
        dims = Dims(num_layers=layers, hidden_size=hidden, num_heads=hidden // base.head_dim,
                    head_dim=base.head_dim, ffn_dim=shapes["blocks.0.ffn.net.0.proj.weight"][0],
                    text_dim=shapes["condition_embedder.text_embedder.linear_1.weight"][1],
                    freq_dim=shapes["condition_embedder.time_embedder.linear_1.weight"][1],
                    in_channels=in_channels,
                    out_channels=shapes["proj_out.weight"][0] // (patch[0] * patch[1] * patch[2]),
                    patch_size=tuple(patch), prope_start=base.prope_start)
    except (KeyError, ValueError) as exc:
        raise WeightsError(f"cannot infer Wan dims from the tensors (missing {exc}); add the source's config.json") from None
    if hidden % base.head_dim:   # not a released Wan: the head count cannot be guessed (0 heads would build nothing)
        raise WeightsError(f"cannot infer Wan dims from the tensors: hidden size {hidden} is not a multiple of Wan's "
                           f"head dim {base.head_dim}; add the source's config.json")
    return dims


def check_family(dims: Dims, family: str) -> None:
    base = families.spec(family).dims("released")
    if (dims.in_channels, dims.out_channels) != (base.in_channels, base.out_channels):
        raise WeightsError(
            f"the source has {dims.in_channels} input / {dims.out_channels} output channels; {family} has "
            f"{base.in_channels} / {base.out_channels} (is it another Wan model?)")
    if dims.head_dim % 4:
        raise WeightsError(f"head dim {dims.head_dim} is not a multiple of 4 (camera PRoPE needs 4-blocks)")


def read_config(src: Path) -> dict | None:
    for candidate in (src / "config.json", src / "transformer" / "config.json"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except ValueError as exc:
                raise WeightsError(f"{candidate}: not valid JSON ({exc})") from None
    return None


def resolve_source_dir(src: Path) -> Path:
    """A diffusers pipeline root has its transformer in ``transformer/``."""
    return src / "transformer" if (src / "transformer").is_dir() and src.is_dir() else src


def plan_conversion(family: str, kind: str, src: str | Path) -> tuple[Dims, TensorSource, dict[str, str]]:
    """Dims, the source, and the Solar-name -> source-name map, checked strictly."""
    src = resolve_source_dir(Path(src))
    source = open_source(src)
    rename = (lambda k: k) if kind == "diffusers" else official_to_solar
    config = read_config(src) if src.is_dir() else None
    dims = dims_from_config(config, family) if config else dims_from_tensors(source, rename, family)
    check_family(dims, family)
    mapping = {}
    for name in source.names():
        target = rename(name)
        if target in mapping:
            raise WeightsError(f"source tensors {mapping[target]!r} and {name!r} both map to {target!r}")
        mapping[target] = name
    got = {target: source.shapes[name][1] for target, name in mapping.items()}
    anyflow = any(k.startswith("condition_embedder.delta_embedding.") for k in got)
    report = compare_keys(expected_shapes(family, dims, anyflow=anyflow), got)
    if not report.ok:
        raise WeightsError(f"{src} does not match a {family} model with the source's dims: {report.summary()}")
    return dims, source, mapping
