"""Flow matching, each family with its own convention (semantics.md §4).

Wan / LTX (sigma convention): x_sigma = (1 - sigma) x0 + sigma eps, target eps - x0, the model is
fed sigma * 1000. MiniMax-H3 (reversed time): x_t = t x0 + (1 - t) eps, target x0 - eps, t = 1 -
shift(sigma), the model is fed t in [0, 1]. Randomness comes only from the generator passed in.
"""

from __future__ import annotations

import torch

NUM_TRAIN_TIMESTEPS = 1000


def shift_sigma(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * sigma / (1 + (shift - 1) * sigma)


def sigma_table(shift: float, steps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """The shifted training grid: sigma_i = shift(i / steps), i = 1..steps (float64)."""
    base = torch.arange(1, steps + 1, dtype=torch.float64) / steps
    return shift_sigma(base, shift)


def gaussian_weights(timesteps: torch.Tensor) -> torch.Tensor:
    """exp(-2((t - 500) / 1000)^2) over a timestep table, shifted to min 0 and normalised to mean 1."""
    w = torch.exp(-2.0 * ((timesteps - 500.0) / 1000.0) ** 2)
    w = w - w.min()
    return w / w.mean()


def sample_wan_sigmas(batch: int, shift: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One grid sigma per video and its Gaussian weight."""
    table = sigma_table(shift)
    weights = gaussian_weights(table * NUM_TRAIN_TIMESTEPS)
    index = torch.randint(0, table.numel(), (batch,), generator=gen)
    return table[index].float(), weights[index].float()


def ltx_mu(tokens: int, base_shift: float = 0.95, max_shift: float = 2.05, base_tokens: int = 1024,
           max_tokens: int = 4096) -> float:
    """The logit-normal mean grows linearly with the token count (LTX's resolution-dependent shift)."""
    slope = (max_shift - base_shift) / (max_tokens - base_tokens)
    return base_shift + slope * (tokens - base_tokens)


def sample_ltx_sigmas(batch: int, tokens: int, gen: torch.Generator, *, std: float = 1.0, eps: float = 1e-3,
                      uniform_probability: float = 0.1) -> torch.Tensor:
    """Shifted logit-normal sigmas; a share drawn uniformly; clamped to [eps, 1 - eps]."""
    normal = torch.randn(batch, generator=gen) * std + ltx_mu(tokens)
    sigma = torch.sigmoid(normal)
    uniform = torch.rand(batch, generator=gen)
    use_uniform = torch.rand(batch, generator=gen) < uniform_probability
    sigma = torch.where(use_uniform, uniform, sigma)
    return sigma.clamp(eps, 1 - eps)


def sample_h3_times(batch: int, shift: float, gen: torch.Generator) -> torch.Tensor:
    """H3 time t = 1 - shift(sigma) with sigma uniform in (0, 1)."""
    sigma = torch.rand(batch, generator=gen).clamp(1e-4, 1.0)
    return 1.0 - shift_sigma(sigma, shift)


def noisy_sigma(x0: torch.Tensor, eps: torch.Tensor, sigma_B: torch.Tensor) -> torch.Tensor:
    s = sigma_B.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1 - s) * x0 + s * eps


def noisy_h3(x0: torch.Tensor, eps: torch.Tensor, t_B: torch.Tensor) -> torch.Tensor:
    t = t_B.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return t * x0 + (1 - t) * eps


def masked_mse(pred: torch.Tensor, target: torch.Tensor, frame_mask_BF: torch.Tensor) -> torch.Tensor:
    """Per-sample MSE in fp32 over [B, C, F, H, W], counting only frames where the mask is 1."""
    err = (pred.float() - target.float()).square().mean(dim=(1, 3, 4))  # [B, F]
    mask = frame_mask_BF.float()
    return (err * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def drop_decision(seed: int, step: int, dp_rank: int, index: int, probability: float) -> bool:
    """Whether sample ``index`` of this step drops its image condition: a hash, so no RNG is used.
    Keyed by the clip's global-batch position (issue 39): callers pass ``dp_rank=0`` and the position
    (``first_position(...) + i``) as ``index``, so the decision does not depend on the topology."""
    if probability <= 0:
        return False
    import hashlib

    digest = hashlib.blake2s(f"image-drop|{seed}|{step}|{dp_rank}|{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < probability


def clip_generator(seed: int, step: int, position: int, purpose: str = "") -> torch.Generator:
    """The generator of one clip of a step: keyed by the run's seed, the step and the clip's position in
    the step's global batch (``first_position`` + i), never by a rank, a reader or a micro-batch size,
    so any topology with the same global batch draws the same values for the same clip (issue 39), and
    SP peers (one dp rank, the same positions) agree. ``purpose`` separates independent streams of one
    clip (Stage2: student and critic)."""
    import hashlib

    label = f"clip|{seed}|{step}|{position}" + (f"|{purpose}" if purpose else "")
    digest = hashlib.blake2s(label.encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "big") & ((1 << 63) - 1))


def first_position(dp_rank: int, dp_world: int, micro: int, micro_batch: int) -> int:
    """The global-batch position of a micro-batch's first clip. The step's clips are dealt micro-batch
    by micro-batch: micro-batch m of every dp rank covers positions ``[m * dp_world * micro_batch,
    (m + 1) * dp_world * micro_batch)``, dp rank d the d-th ``micro_batch`` of them
    (``solar.data.from_config.rank_positions``: reader j of the run reads position j of every step).
    So the step's positions are taken in increasing order micro-batch after micro-batch at any
    topology, which keeps AnyFlow's rescale by the diffusion samples (the lowest positions) the same."""
    return (micro * dp_world + dp_rank) * micro_batch


class ClipDraws:
    """One generator per clip of a micro-batch (``clip_generator``), and draws stacked over the clips:
    clip i's values never depend on the micro-batch's size or its other clips."""

    def __init__(self, seed: int, step: int, first: int, count: int, purpose: str = "") -> None:
        self.gens = [clip_generator(seed, step, first + i, purpose) for i in range(count)]

    def __len__(self) -> int:
        return len(self.gens)

    def noise(self, shape, device, clips=None) -> torch.Tensor:
        """Standard normal noise of ``shape`` (its first dim the clips), each clip's slice from its own
        generator, drawn on the host (pinned when bound for a GPU) and copied without waiting.
        ``clips``: only these clips draw (the others' slices are zeros and their generators untouched;
        Stage2's re-noising of a clip still before its exit level)."""
        shape = tuple(shape)
        if shape[0] != len(self.gens):
            raise ValueError(f"noise for {shape[0]} clips from {len(self.gens)} generators")
        drawing = range(len(self.gens)) if clips is None else clips
        cuda = torch.device(device).type == "cuda"
        out = torch.empty(shape, pin_memory=cuda) if clips is None else torch.zeros(shape, pin_memory=cuda)
        for i in drawing:
            torch.randn(shape[1:], generator=self.gens[i], out=out[i])
        return out.to(device, non_blocking=cuda)   # from pinned memory: no wait (as launch.batch.host_noise)

    def each(self, draw) -> torch.Tensor:
        """``draw(generator)`` once per clip (a tensor whose first dim is 1 for that clip), concatenated."""
        return torch.cat([draw(g) for g in self.gens])


__all__ = ["ClipDraws", "clip_generator", "first_position", "gaussian_weights", "masked_mse", "noisy_h3", "noisy_sigma",
           "sample_h3_times", "sample_ltx_sigmas", "sample_wan_sigmas", "shift_sigma", "sigma_table", "drop_decision",
           "ltx_mu"]
