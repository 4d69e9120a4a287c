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
        self.loss = Gauge("solar_train_loss", "Training loss of the last step.", ["term"], registry=r)
        self.grad_norm = Gauge("solar_train_grad_norm", "Global gradient norm before clipping.", registry=r)
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


def maybe_start(rank: int) -> TrainMetrics | None:
    wanted = "SOLAR_METRICS_PORT" in os.environ or "KUBERNETES_SERVICE_HOST" in os.environ
    return TrainMetrics() if rank == 0 and wanted else None
