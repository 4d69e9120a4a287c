"""On a CUDA device: LoRA roles on one base with the frozen weights stored in bf16 under bf16
autocast, as Stage2 builds them on a GPU, compute exactly what each role's own model computes and
train only their own adapter (the CPU variant is in tests/unit/models/test_lora_roles.py)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.models.test_lora_roles import (
    test_each_role_computes_as_its_own_model_and_trains_only_its_adapter as each_role_as_its_own_model,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_roles_on_a_bf16_shared_base_on_the_gpu():
    each_role_as_its_own_model("cuda")
