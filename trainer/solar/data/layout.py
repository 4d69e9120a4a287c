"""The pre-encoded sample format (``solar.latent-sample.v1``) and each family's tensor layout.

A sample is one safetensors blob: tensors plus string metadata (safetensors ``__metadata__``).
It lives either as a member ``<key>.safetensors`` (or the row's ``member``) of an uncompressed tar
shard, located by the row's ``member_offset``/``member_size`` when given, or as a plain
``.safetensors`` file that is the shard itself.

Tensors (C latent channels, T latent frames, F pixel frames, h/w latent grid, L prompt tokens,
D prompt width)::

    latents          [C, T, h, w]   float32 | bfloat16 | float16
    prompt_embeds    [L, D]         float32 | bfloat16 | float16
    c2w              [F, 4, 4]      float32 | float64   absolute camera-to-world, stored convention
    image_condition  [20, T, h, w]  Wan I2V-A14B only: 4 mask + 16 image-latent channels

Metadata: ``schema`` (solar.latent-sample.v1), ``family``, ``sample_id``, ``key``, ``num_frames`` (F),
``fps``, ``height``, ``width``, ``caption``. Dataset-level tensors live beside the shards:
``conditioning/negative-prompt.safetensors`` (``prompt_embeds``) and, for MiniMax-H3,
``support/audio-silence.safetensors`` (``audio_latents`` [2, T_a, 32]: the encoded silence of the
two audio channels, 32 features per latent).
"""

from __future__ import annotations

from dataclasses import dataclass

from solar.config import families

SAMPLE_SCHEMA = "solar.latent-sample.v1"
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
CAMERA_DTYPES = ("float32", "float64")
METADATA_KEYS = ("schema", "family", "sample_id", "key", "num_frames", "fps", "height", "width",
                 "caption")
NEGATIVE_PROMPT = "conditioning/negative-prompt.safetensors"
AUDIO_SILENCE = "support/audio-silence.safetensors"
H3_AUDIO_CHANNELS = 2
H3_AUDIO_FEATURES = 32
A14B_CONDITION_CHANNELS = 20


@dataclass(frozen=True)
class Layout:
    """The tensor shapes a family's samples must have at a given resolution."""

    family: str
    latent_channels: int
    latent_height: int
    latent_width: int
    text_dim: int
    image_condition_channels: int | None

    def latent_frames(self, pixel_frames: int) -> int | None:
        return families.spec(self.family).vae.latent_frames(pixel_frames)


def layout_for(family: str, *, height: int, width: int, text_dim: int) -> Layout:
    spec = families.spec(family)
    s = spec.vae.spatial
    return Layout(family, spec.vae.channels, height // s, width // s, text_dim,
                  A14B_CONDITION_CHANNELS if family == "wan22_i2v_a14b" else None)


def latent_start(family: str, pixel_start: int) -> int:
    """Latent index where a clip starting at ``pixel_start`` begins (starts are stride-aligned)."""
    temporal = families.spec(family).vae.temporal
    if temporal == "h3":
        return (pixel_start // 17) * 5
    return pixel_start // (4 if temporal == "x4" else 8)
