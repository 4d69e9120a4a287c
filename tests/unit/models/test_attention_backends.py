"""The attention interface's SDPA kernel selection: every kernel torch can run on this machine
matches the reference masked attention, a kernel it cannot run is not silently replaced, and
unknown names are rejected with the valid choices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solar.models.attention import (
    BACKENDS, SDPA_KERNELS, _reference, build_attention, make_sdpa, teacher_forcing_mask,
)
from solar.models.registry import build
from tests.unit.models.family_helpers import ltx_dims


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mask = teacher_forcing_mask(frames=4, tokens_per_frame=3, chunk=2, window=1, pad=2)
    S = mask.kind.numel()
    q, k, v = (torch.randn(2, 4, S, 16, generator=gen) for _ in range(3))
    return q, k, v, mask


def _torch_runs(kernel: str, q, k, v, mask) -> bool:
    """Whether torch itself has ``kernel`` for these inputs here (asked without our interface)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[kernel]
    try:
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
        return True
    except RuntimeError:
        return False


def test_math_and_flash_run_on_cpu():
    """The kernels the parametrized test below compares on CPU (so it never compares nothing)."""
    q, k, v, mask = _inputs()
    assert _torch_runs("math", q, k, v, mask)
    assert _torch_runs("flash", q, k, v, mask)


@pytest.mark.parametrize("kernel", [None, *SDPA_KERNELS])
def test_each_usable_sdpa_kernel_equals_the_reference(kernel):
    q, k, v, mask = _inputs()
    attend = build_attention("sdpa", device="cpu", sdpa_kernel=kernel)
    if kernel is not None and not _torch_runs(kernel, q, k, v, mask):
        # The pin is honoured: no silent fallback to another kernel.
        with pytest.raises(RuntimeError):
            attend(q, k, v, mask)
        return
    for m in (mask, None):
        got, expected = attend(q, k, v, m), _reference(q, k, v, m)
        assert got.shape == expected.shape
        assert torch.isfinite(got).all()
        assert (got - expected).abs().max().item() <= 1e-5, m
    # Masked keys matter: a different mask changes the output (the mask is not ignored).
    assert (attend(q, k, v, mask) - attend(q, k, v, None)).abs().max().item() > 1e-3


def test_cpu_auto_is_sdpa():
    q, k, v, mask = _inputs(1)
    auto = build_attention("auto", device="cpu")
    assert (auto(q, k, v, mask) - _reference(q, k, v, mask)).abs().max().item() <= 1e-5


def test_unknown_names_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown SDPA kernel 'flash2'.*'flash', 'efficient', 'cudnn', 'math'"):
        make_sdpa("flash2")
    with pytest.raises(ValueError, match=r"unknown SDPA kernel 'Math'"):
        build_attention("sdpa", sdpa_kernel="Math")
    with pytest.raises(ValueError, match=r"unknown SDPA kernel 'nope'"):  # auto builds sdpa too
        build_attention("auto", sdpa_kernel="nope")
    with pytest.raises(ValueError, match=r"unknown attention backend 'xformers'; use auto or one of"):
        build_attention("xformers")
    assert set(BACKENDS) == {"reference", "sdpa", "flex"}


def test_a_model_with_an_unknown_kernel_refuses_to_attend():
    model = build("ltx25_video", ltx_dims(), attention_backend="sdpa", sdpa_kernel="bogus")
    with pytest.raises(ValueError, match="unknown SDPA kernel 'bogus'"):
        model.attention_fn()


def test_the_config_schema_rejects_unknown_kernels_and_backends():
    from pydantic import ValidationError

    from solar.config.schema import ModelBlock

    base = {"family": "ltx25_video", "camera_translation_transform": "linear"}
    assert ModelBlock(**base, attention_backend="sdpa", sdpa_kernel="math").sdpa_kernel == "math"
    with pytest.raises(ValidationError, match="sdpa_kernel"):
        ModelBlock(**base, sdpa_kernel="flash2")
    with pytest.raises(ValidationError, match="attention_backend"):
        ModelBlock(**base, attention_backend="xformers")


def test_compiled_blocks_find_the_block_mask_built_and_compile_once_per_layout():
    """A masked run builds flex attention's block mask before its blocks (``prepare_mask``), so a
    compiled block never traces the mask's construction: one graph serves every block and every
    later call of a layout (before, the first block's graph built the mask and the next block,
    finding it cached, compiled again), with the eager forward's values. Flex attention runs
    eagerly on the CPU inside dynamo's graphs (``aot_eager``; inductor has no CPU flex backward)."""
    import copy

    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    from tests.unit.models.wan_helpers import TI2V, dims, ours, randomize

    model = randomize(ours(dims(TI2V, layers=3), attention_backend="flex", chunk_latents=2, max_prior_clean_chunks=1,
                           camera_transform=None))
    gen = torch.Generator().manual_seed(3)
    clean, noisy = (torch.randn(1, 48, 4, 4, 6, generator=gen) for _ in range(2))
    prompt = torch.randn(1, 5, model.cfg.dims.text_dim, generator=gen)
    t = torch.rand(1, 4, generator=gen) * 1000
    reference = copy.deepcopy(model)   # eager, with attention of its own (no block mask shared)
    with torch.no_grad():
        torch._dynamo.reset()
        clear_compilation_metrics()
        for block in model.blocks:
            block.compile(backend="aot_eager")
        try:
            first = model.forward_teacher_forcing(clean, noisy, t, prompt)
            again = model.forward_teacher_forcing(clean, noisy, t + 1, prompt)
            graphs = len(get_compilation_metrics())
        finally:
            torch._dynamo.reset()
        eager = reference.forward_teacher_forcing(clean, noisy, t, prompt)
    assert graphs == 1
    torch.testing.assert_close(first, eager, rtol=1e-5, atol=1e-5)
    assert again.shape == first.shape
