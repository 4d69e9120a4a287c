"""Per-family contracts: latent layout, frame profiles, camera rules, SP rules, model profiles.

Pure data (no torch). Everything the config library checks about a family before any model is
allocated lives here, so the trainer, the operator and ``solar model info`` agree on one table.
Numbers are the released models' (``semantics.md`` §2, §10); ``tiny`` profiles are CPU-sized twins
with the same latent layout and head-count divisibility.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Family = Literal["wan22_ti2v_5b", "wan22_i2v_a14b", "ltx25_video", "minimax_h3"]
FAMILIES: tuple[str, ...] = ("wan22_ti2v_5b", "wan22_i2v_a14b", "ltx25_video", "minimax_h3")

ALIASES: dict[str, str] = {
    "wan22_ti2v_5b": "wan22_ti2v_5b",
    "wan2.2-ti2v-5b": "wan22_ti2v_5b",
    "wan22_i2v_a14b": "wan22_i2v_a14b",
    "wan2.2-i2v-a14b": "wan22_i2v_a14b",
    "ltx25_video": "ltx25_video",
    "ltx-2.5": "ltx25_video",
    "minimax_h3": "minimax_h3",
    "minimax-h3": "minimax_h3",
}

# Directory of the example configs of each family, under configs/solar_wm/ (and tiny/).
CONFIG_DIRS: dict[str, str] = {
    "wan22_ti2v_5b": "wan22_ti2v_5b",
    "wan22_i2v_a14b": "wan22_i2v_a14b",
    "ltx25_video": "ltx25",
    "minimax_h3": "minimax_h3",
}


def canonical_family(name: str) -> str | None:
    """The canonical family for a name or alias (case-insensitive), or None."""
    return ALIASES.get(name.strip().lower())


def not_a_family(name: str, what: str = "--family") -> str:
    """The one-line refusal of a family name: the family it is closest to (by name or alias), and the list."""
    import difflib

    close = difflib.get_close_matches(name.strip().lower(), list(ALIASES), n=1, cutoff=0.6)
    hint = f" (did you mean {ALIASES[close[0]]}?)" if close else ""
    return f"{what} {name!r} is not a family{hint}; use one of {', '.join(FAMILIES)}"


@dataclass(frozen=True)
class Dims:
    """Backbone dimensions (the fields ``model.dims`` may override)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    text_dim: int
    freq_dim: int
    in_channels: int
    out_channels: int
    patch_size: tuple[int, int, int]
    # Head dims [prope_start, head_dim) carry camera PRoPE; [0, prope_start) carry RoPE (H3 split).
    prope_start: int


@dataclass(frozen=True)
class Vae:
    """The latent codec's layout."""

    name: str
    channels: int
    spatial: int  # pixels per latent along H and W
    temporal: Literal["x4", "x8", "h3"]  # how pixel frames map to latent frames

    def latent_frames(self, pixel_frames: int) -> int | None:
        """Latent frames for a pixel frame count, or None when the count is not representable."""
        if pixel_frames < 1:
            return None
        if self.temporal == "h3":  # 17n+5 pixels <-> 5n+2 latents
            n, rest = divmod(pixel_frames - 5, 17)
            return 5 * n + 2 if rest == 0 and n >= 0 else None
        step = 4 if self.temporal == "x4" else 8
        n, rest = divmod(pixel_frames - 1, step)
        return n + 1 if rest == 0 else None

    def describe_frames(self) -> str:
        if self.temporal == "h3":
            return "17n+5 pixel frames (5n+2 latents)"
        return f"{4 if self.temporal == 'x4' else 8}n+1 pixel frames"


@dataclass(frozen=True)
class FamilySpec:
    family: str
    title: str
    vae: Vae
    profiles: dict[str, Dims]
    # Pixel frame counts allowed per stage (semantics.md §2 / contract.md §2).
    frame_profiles: dict[str, tuple[int, ...]]
    camera_transforms: tuple[str, ...]
    # Sign convention of the flow: Wan/LTX x_sigma=(1-s)x0+s*eps -> eps-x0; H3 reversed time.
    parameterization: str
    training_mode: Literal["full", "lora"]
    # Teacher-forcing / causal chunking (None for families without causal routes).
    chunk_latents: int | None
    max_prior_clean_chunks: int | None
    kv_cache_latents: int | None  # attention window in latents, current chunk included
    timestep_shift: float | None
    audio_timestep_shift: float | None = None
    # Which block holds the inference sample count (validation.sample_count or inference.sample_count).
    infer_sample_count_field: str = "validation.sample_count"
    # Required SP degree for (action, stage); absent = any degree that divides heads and world.
    sp_rules: dict[tuple[str, str], int] = field(default_factory=dict)

    def dims(self, profile: str) -> Dims:
        return self.profiles[profile]


_WAN22_VAE = Vae("wan2.2", channels=48, spatial=16, temporal="x4")
_WAN21_VAE = Vae("wan2.1", channels=16, spatial=8, temporal="x4")
_LTX_VAE = Vae("ltx2", channels=128, spatial=32, temporal="x8")
_H3_VAE = Vae("minimax_h3", channels=24, spatial=16, temporal="h3")

SPECS: dict[str, FamilySpec] = {
    "wan22_ti2v_5b": FamilySpec(
        family="wan22_ti2v_5b",
        title="Wan 2.2 TI2V-5B",
        vae=_WAN22_VAE,
        profiles={
            "released": Dims(30, 3072, 24, 128, 14336, 4096, 256, 48, 48, (1, 2, 2), 0),
            "tiny": Dims(2, 64, 4, 16, 128, 32, 32, 48, 48, (1, 2, 2), 0),
        },
        frame_profiles={"stage0p5": (81, 153), "stage1": (81,), "stage2": (81,)},
        camera_transforms=("linear", "logd4"),
        parameterization="velocity_eps_minus_x0",
        training_mode="full",
        chunk_latents=3,
        max_prior_clean_chunks=5,
        kv_cache_latents=18,
        timestep_shift=5.0,
        sp_rules={("train", "stage2"): 1, ("infer", "stage2"): 1},
    ),
    "wan22_i2v_a14b": FamilySpec(
        family="wan22_i2v_a14b",
        title="Wan 2.2 I2V-A14B (high-noise expert)",
        vae=_WAN21_VAE,
        profiles={
            "released": Dims(40, 5120, 40, 128, 13824, 4096, 256, 36, 16, (1, 2, 2), 0),
            "tiny": Dims(2, 64, 4, 16, 128, 32, 32, 36, 16, (1, 2, 2), 0),
        },
        frame_profiles={"stage0p5": (81, 153)},
        camera_transforms=("linear", "logd4"),
        parameterization="velocity_eps_minus_x0",
        training_mode="full",
        chunk_latents=None,
        max_prior_clean_chunks=None,
        kv_cache_latents=None,
        timestep_shift=3.0,
    ),
    "ltx25_video": FamilySpec(
        family="ltx25_video",
        title="LTX-2.5 (video only)",
        vae=_LTX_VAE,
        profiles={
            # LTX-2.5 has no caption projection in the transformer: prompt features arrive at the
            # hidden width (text_dim == hidden_size).
            "released": Dims(48, 4096, 32, 128, 16384, 4096, 256, 128, 128, (1, 1, 1), 0),
            "tiny": Dims(2, 64, 4, 16, 256, 64, 256, 128, 128, (1, 1, 1), 0),
        },
        frame_profiles={"stage0p5": (153,)},
        camera_transforms=("linear", "logd4"),
        parameterization="velocity_eps_minus_x0",
        training_mode="lora",
        chunk_latents=None,
        max_prior_clean_chunks=None,
        kv_cache_latents=None,
        timestep_shift=None,  # shifted logit-normal timesteps instead of a fixed shift
        infer_sample_count_field="inference.sample_count",
    ),
    "minimax_h3": FamilySpec(
        family="minimax_h3",
        title="MiniMax-H3 (33B)",
        vae=_H3_VAE,
        profiles={
            "released": Dims(50, 5376, 56, 128, 14336, 5120, 256, 24, 24, (1, 2, 2), 96),
            "tiny": Dims(2, 64, 4, 32, 128, 40, 32, 24, 24, (1, 2, 2), 24),
        },
        frame_profiles={"stage0p5": (158,), "stage1": (158,), "stage2": (158,)},
        camera_transforms=("logd4",),
        parameterization="velocity_x0_minus_eps",
        training_mode="lora",
        chunk_latents=5,
        max_prior_clean_chunks=5,
        kv_cache_latents=30,
        timestep_shift=12.0,
        audio_timestep_shift=3.0,
        sp_rules={("train", "stage0p5"): 2, ("train", "stage1"): 2, ("train", "stage2"): 4},
    ),
}


def spec(family: str) -> FamilySpec:
    return SPECS[family]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
