"""Stacking stream clips into a micro-batch, with the identities events and SP checks use."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from solar.data.stream import StreamClip


def latent_camera_frames(pixel_frames: int, latent_frames: int) -> list[int]:
    """The pixel frame whose camera each latent frame uses (the same mapping the synthetic world
    renders with): round(j * (F - 1) / (T - 1))."""
    if latent_frames == 1:
        return [0]
    return [round(j * (pixel_frames - 1) / (latent_frames - 1)) for j in range(latent_frames)]


@dataclass
class Batch:
    latents: torch.Tensor            # [B, C, T, h, w] float32
    prompt: torch.Tensor             # [B, L, D]
    prompt_mask: torch.Tensor        # [B, L] 1 = token
    cameras: torch.Tensor            # [B, T, 4, 4] rebased viewmats at the latent frames
    image_condition: torch.Tensor | None
    identities: list[dict]

    def to(self, device) -> "Batch":
        move = (lambda t: None if t is None else to_device(t, device))
        return Batch(move(self.latents), move(self.prompt), move(self.prompt_mask), move(self.cameras),
                     move(self.image_condition), self.identities)

    def digest(self) -> str:
        """What SP peers must agree on: sample, start, and the exact input bytes."""
        h = hashlib.blake2s(digest_size=16)
        for ident in self.identities:
            h.update(f"{ident['sample_id']}|{ident['start_frame']}|".encode())
        for t in (self.latents, self.prompt, self.cameras):
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``; a host tensor bound for a GPU goes through pinned memory without waiting:
    a copy from pageable memory waits for the work queued before it (the previous step's optimizer
    and EMA) and holds the host meanwhile (issue 18). The values are the same. The pinned block
    returns to torch's caching host allocator, which reuses it only after the copy has run."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    if not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def host_noise(shape, gen: torch.Generator, device) -> torch.Tensor:
    """Standard normal noise drawn on the CPU generator (the same values on every device), written
    straight into pinned memory when bound for a GPU and copied without waiting (issue 18)."""
    cuda = torch.device(device).type == "cuda"
    return to_device(torch.randn(shape, generator=gen, pin_memory=cuda), device)


def collate(clips: list[StreamClip]) -> Batch:
    lengths = [c.clip.prompt_embeds.shape[0] for c in clips]
    width = max(lengths)
    prompts, masks = [], []
    for clip, n in zip(clips, lengths):
        emb = clip.clip.prompt_embeds.float()
        prompts.append(torch.nn.functional.pad(emb, (0, 0, 0, width - n)))
        masks.append(torch.cat([torch.ones(n), torch.zeros(width - n)]))
    latents = torch.stack([c.clip.latents.float() for c in clips])
    frames = latent_camera_frames(clips[0].rel_c2w.shape[0], latents.shape[2])
    cameras = torch.stack([c.rel_c2w.float()[frames] for c in clips])
    cond = None
    if clips[0].clip.image_condition is not None:
        cond = torch.stack([c.clip.image_condition.float() for c in clips])
    identities = [{"sample_id": c.row.sample_id, "key": c.row.key, "shard": c.row.shard,
                   "start_frame": c.occurrence.start_frame, "epoch": c.occurrence.epoch,
                   "reader": c.occurrence.reader, "position": c.occurrence.position} for c in clips]
    return Batch(latents, torch.stack(prompts), torch.stack(masks), cameras, cond, identities)
