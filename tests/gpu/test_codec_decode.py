"""The validation / inference codec on a GPU (issue 40 item 1): ``test_set.codec_for`` makes the Wan 2.2
decoder's 3D convolutions channels-last and ``wan_vae.decode_stream`` autotunes them; the decode must
give the CPU's frames (fp32 both sides; cuDNN may use TF32, so within 2e-2 of [-1, 1]) and leave the
caller's cuDNN setting as it was. Skipped without CUDA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_channels_last_decode_on_the_gpu_gives_the_cpu_frames():
    from solar.generation.test_set import codec_for

    cfg = SimpleNamespace(model=SimpleNamespace(family="wan22_ti2v_5b", vae_path=None, profile="tiny"),
                          validation=SimpleNamespace(decode_precision="fp32"))
    cpu, gpu = codec_for(cfg, None), codec_for(cfg, torch.device("cuda"))
    assert any(m.weight.is_contiguous(memory_format=torch.channels_last_3d)
               for m in gpu.vae.modules() if isinstance(m, torch.nn.Conv3d))
    z = torch.randn(1, 48, 5, 8, 12, generator=torch.Generator().manual_seed(0))
    torch.backends.cudnn.benchmark = False
    want = cpu.decode(z)
    got = gpu.decode(z.cuda()).cpu()
    assert torch.backends.cudnn.benchmark is False
    assert got.shape == want.shape == (1, 3, 17, 128, 192)
    assert (got - want).abs().max().item() <= 2e-2
