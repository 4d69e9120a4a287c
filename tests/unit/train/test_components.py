"""Engine components: schedules, EMA, objectives, metrics."""

from __future__ import annotations

import socket
import urllib.request

import pytest
import torch

from solar.config.schema import OptimizerBlock
from solar.objectives import fm
from solar.train.ema import EMA
from solar.train.schedule import lr_at


def test_schedules():
    warm_cos = OptimizerBlock(lr=1.0, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_at(5, warm_cos, 110) == 0.5 and lr_at(10, warm_cos, 110) == 1.0
    assert lr_at(60, warm_cos, 110) == pytest.approx(0.55) and lr_at(110, warm_cos, 110) == pytest.approx(0.1)
    lin = OptimizerBlock(lr=2.0, schedule="linear", min_lr_ratio=0.0)
    assert lr_at(50, lin, 100) == pytest.approx(1.0)
    assert lr_at(7, OptimizerBlock(lr=3.0), 100) == 3.0


def test_ema_start_warmup_and_swap():
    p = torch.nn.Parameter(torch.zeros(2))
    ema = EMA({"p": p}, decay=0.5, start_step=3, warmup_steps=1)
    for step, value in ((1, 1.0), (2, 2.0)):
        p.data.fill_(value)
        ema.update(step)
    assert not ema.exists
    p.data.fill_(4.0)
    ema.update(3)  # first update: a copy
    p.data.fill_(6.0)
    ema.update(4)  # warmup: decay 0
    p.data.fill_(8.0)
    ema.update(5)  # 0.5 * 6 + 0.5 * 8
    assert torch.equal(ema.shadow["p"], torch.full((2,), 7.0))
    with ema.swapped():
        assert torch.equal(p.data, torch.full((2,), 7.0))
    assert torch.equal(p.data, torch.full((2,), 8.0))


def test_ema_update_is_the_per_parameter_update_bit_for_bit():
    """The multi-tensor update computes what ``shadow.mul_(decay).add_(p, alpha=1 - decay)`` per
    parameter computed, to the bit, over parameters of several shapes."""
    g = torch.Generator().manual_seed(0)
    params = {f"p{i}": torch.nn.Parameter(torch.randn(*shape, generator=g))
              for i, shape in enumerate([(3,), (4, 5), (2, 3, 7), (1,)])}
    ema = EMA(params, decay=0.999, start_step=1, warmup_steps=0)
    ema.update(1)
    expected = {n: t.clone() for n, t in ema.shadow.items()}
    for step in range(2, 6):
        for p in params.values():
            p.data.add_(torch.randn(p.shape, generator=g))
        ema.update(step)
        for n, p in params.items():
            expected[n].mul_(0.999).add_(p.detach().float(), alpha=1 - 0.999)
    assert all(torch.equal(ema.shadow[n], expected[n]) for n in params)


def test_objective_conventions():
    x0, eps = torch.ones(1, 2, 3, 1, 1), torch.zeros(1, 2, 3, 1, 1)
    assert torch.allclose(fm.noisy_sigma(x0, eps, torch.tensor([0.25])), torch.full_like(x0, 0.75))
    assert torch.allclose(fm.noisy_h3(x0, eps, torch.tensor([0.25])), torch.full_like(x0, 0.25))
    table = fm.sigma_table(5.0)
    assert table[-1] == 1.0 and torch.all(table[1:] > table[:-1])
    w = fm.gaussian_weights(table * 1000)
    assert w.min() == 0 and torch.isclose(w.mean(), torch.tensor(1.0, dtype=w.dtype))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    pred = torch.zeros(1, 2, 3, 1, 1)
    target = torch.tensor([10.0, 1.0, 3.0]).view(1, 1, 3, 1, 1).expand(1, 2, 3, 1, 1)
    assert fm.masked_mse(pred, target, mask).item() == pytest.approx(5.0)  # frame 0 excluded
    draws = [fm.drop_decision(1, s, 0, 0, 0.1) for s in range(2000)]
    assert 0.07 < sum(draws) / len(draws) < 0.13
    g1, g2, g3 = fm.clip_generator(1, 2, 3), fm.clip_generator(1, 2, 3), fm.clip_generator(1, 2, 4)
    a = torch.randn(4, generator=g1)
    assert torch.equal(a, torch.randn(4, generator=g2)) and not torch.equal(a, torch.randn(4, generator=g3))
    sig = fm.sample_ltx_sigmas(1000, 480, torch.Generator().manual_seed(0))
    assert sig.min() >= 1e-3 and sig.max() <= 1 - 1e-3
    t = fm.sample_h3_times(1000, 12.0, torch.Generator().manual_seed(0))
    assert t.mean() < 0.3  # shift 12 leaves most samples noisy (small t in H3's reversed time)


def test_trainer_metrics_serve_the_contract_names(monkeypatch):
    from solar.train.metrics import maybe_start

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SOLAR_METRICS_PORT", str(port))
    assert maybe_start(rank=1) is None
    metrics = maybe_start(rank=0)
    try:
        metrics.step.set(3)
        metrics.loss.labels(term="fm").set(0.5)
        metrics.step_seconds.observe(0.2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        metrics.close()
    for name in ("solar_train_step 3.0", 'solar_train_loss{term="fm"} 0.5', "solar_train_grad_norm",
                 "solar_train_step_seconds_bucket", "solar_train_samples_total", "solar_train_tokens_total",
                 "solar_train_mfu_ratio", "solar_checkpoint_save_seconds_bucket", "solar_checkpoint_last_step"):
        assert name in body, name
