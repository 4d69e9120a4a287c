"""On a CUDA device: Stage1 TF-AnyFlow with the clean half run once per prompt gives the loss and
gradients of the full-sequence forwards — flex attention with the teacher-forcing block masks, fp32
and under bf16 autocast; with compiled, checkpointed blocks (``runtime.compile``) the step keeps
the full-sequence forwards. The same for MiniMax-H3's context (text, anchor, audio, clean; once a
step), eager.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from solar.train.parallelize import apply_activation_checkpointing, apply_compile
from tests.unit.train.test_stage1_context import _loss_and_grads, _setup, _setup_h3

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("bf16, compiled", [(False, False), (True, False), (True, True)])
def test_clean_context_matches_the_full_sequence_on_gpu(bf16, compiled):
    cfg, model, batch, negative = _setup("train.fm.image_condition_dropout=0.5")
    model = model.cuda()
    if compiled:
        apply_activation_checkpointing(model, policy="full", skip_blocks=0)
        apply_compile(model)
    batch, negative = batch.to("cuda"), negative.cuda()
    tol = 3e-2 if bf16 else 1e-4
    for step in (3, 11):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            ref_loss, _, ref_grads, *_ = _loss_and_grads(model, cfg, batch, negative, step, False)
            loss, _, grads, calls, _ = _loss_and_grads(model, cfg, batch, negative, step, True)
        # compiled blocks keep the full-sequence forwards (bench/RESULTS.md: the compile with the
        # context did not finish); the numbers are the same either way
        assert calls == ({"full": 5, "context": 0, "noisy": 0} if compiled else {"full": 1, "context": 2, "noisy": 4})
        torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=5 * tol, atol=5 * tol, msg=name)


@pytest.mark.parametrize("bf16", [False, True])
def test_h3_context_matches_the_full_sequence_on_gpu(bf16):
    cfg, model, batch, silence = _setup_h3()
    model, batch, silence = model.cuda(), batch.to("cuda"), silence.cuda()
    tol = 3e-2 if bf16 else 1e-4
    for step in (3, 4):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            ref_loss, _, ref_grads, *_ = _loss_and_grads(model, cfg, batch, None, step, False, silence)
            loss, _, grads, calls, _ = _loss_and_grads(model, cfg, batch, None, step, True, silence)
        assert calls == {"full": 1, "context": 1, "noisy": 3}
        torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=5 * tol, atol=5 * tol, msg=name)
