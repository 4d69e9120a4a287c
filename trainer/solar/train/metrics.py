"""The trainer's Prometheus series (contract.md §6), served by rank 0 when ``SOLAR_METRICS_PORT`` is
set or the trainer runs in a Kubernetes pod (default port 9400). No per-run labels."""

from __future__ import annotations

import os


class TrainMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("solar_train_step", "Last completed optimizer step.", registry=r)
        self.loss = Gauge("solar_train_loss", "Training loss (mean over ranks) of the last step; Stage2: "
                          "term critic every step, term student at its last update.", ["term"], registry=r)
        self.grad_norm = Gauge("solar_train_grad_norm", "Global gradient norm before clipping (Stage2: the "
                               "critic's).", registry=r)
        self.role_grad_norm = Gauge("solar_train_role_grad_norm", "Stage2: each trained role's global gradient "
                                    "norm before clipping at its last update.", ["role"], registry=r)
        self.step_seconds = Histogram("solar_train_step_seconds", "Wall time of an optimizer step.",
                                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=r)
        self.samples = Counter("solar_train_samples_total", "Clips consumed.", registry=r)
        self.tokens = Counter("solar_train_tokens_total", "Latent tokens consumed.", registry=r)
        self.mfu = Gauge("solar_train_mfu_ratio", "Model FLOP utilisation of the last step (0-1).", registry=r)
        self.gpu_memory = Gauge("solar_train_gpu_memory_bytes", "GPU memory.", ["kind"], registry=r)
        self.save_seconds = Histogram("solar_checkpoint_save_seconds", "Checkpoint save wall time.",
                                      buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900), registry=r)
        self.last_checkpoint = Gauge("solar_checkpoint_last_step", "Step of the last committed checkpoint.",
                                     registry=r)
        self.port = int(os.environ.get("SOLAR_METRICS_PORT", "9400"))
        self.server, self.thread = start_http_server(self.port, registry=r)

    def close(self) -> None:
        self.server.shutdown()


def gpu_memory() -> dict[str, int]:
    """CUDA allocated and peak bytes of this process ({} without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated()}


def observe_step(loop, *, step: int, losses: dict[str, float], grad_norm: float, seconds: float,
                 clips: int, grad_norms: dict[str, float] | None = None) -> None:
    """The per-step series of every route (Stage0.5/1 ``Loop.step`` and Stage2's outer step); no-op
    without ``loop.metrics``. ``clips``: the clips this rank's logical DP rank consumed in the step
    (every role's batches for Stage2); counters and MFU count them over all logical DP ranks. MFU
    prices a clip at one forward+backward (``Loop.flops_per_clip``), so Stage2's extra rollout,
    teacher and critic forwards make it a lower bound there. ``losses`` are means over the ranks;
    ``grad_norms`` (Stage2) the norm of each role the step updated."""
    m = loop.metrics
    if m is None:
        return
    d = loop.dist
    m.step.set(step)
    for term, value in losses.items():
        m.loss.labels(term=term).set(value)
    m.grad_norm.set(grad_norm)
    for role, value in (grad_norms or {}).items():
        m.role_grad_norm.labels(role=role).set(value)
    m.step_seconds.observe(seconds)
    consumed = clips * d.dp_world
    m.samples.inc(consumed)
    m.tokens.inc(loop.tokens_per_sample * consumed)
    if loop.peak_flops and seconds > 0:  # model FLOPs of every clip of the step, shared by all GPUs
        m.mfu.set(loop.flops_per_clip * consumed / d.world / seconds / loop.peak_flops)
    for kind, value in gpu_memory().items():
        m.gpu_memory.labels(kind=kind).set(value)


def maybe_start(rank: int) -> TrainMetrics | None:
    wanted = "SOLAR_METRICS_PORT" in os.environ or "KUBERNETES_SERVICE_HOST" in os.environ
    return TrainMetrics() if rank == 0 and wanted else None
