"""Stage2 rollout and losses on tiny models: the teacher-forced replay reproduces the chunked
KV-cache pass, and gradients reach only the role being trained."""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.train.stage2 import Role, Stage2, _role
from tests.conftest import CONFIGS

TINY = {
    "wan22_ti2v_5b": (CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml", []),
    "minimax_h3": (CONFIGS / "tiny" / "minimax_h3" / "train_stage2_sgf_158f.yaml",
                   ["sgf.rollout_latents=10", "sgf.supervised_latents=7"]),
}


def _setup(family, root):
    from safetensors.torch import save_file

    path, extra = TINY[family]
    sets = [f"data.root={root}", f"runtime.output_dir={root}/out", "runtime.validate_every=0",
            "runtime.validation_steps=[]", *[f"train.{e}" for e in extra]]
    resolved = resolve_file(path, sets)
    cfg = resolved.config
    if cfg.data.negative_prompt:
        (root / cfg.data.negative_prompt).parent.mkdir(parents=True)
        text_dim = model_from_config(cfg).cfg.dims.text_dim
        save_file({"prompt_embeds": torch.randn(3, text_dim)}, str(root / cfg.data.negative_prompt))
    torch.manual_seed(0)
    student, teacher, critic = (model_from_config(cfg, device="cpu") for _ in range(3))
    for p in teacher.parameters():
        p.requires_grad_(False)
    state = Stage2(resolved, teacher, _role(critic, cfg.train.sgf.critic_optimizer, "critic"), 0, None)
    if family == "minimax_h3":
        state.audio_silence = torch.randn(2, 6, student.cfg.audio_in_channels)
    d = student.cfg.dims
    frames = 7 if family == "minimax_h3" else 21
    channels = d.in_channels if family == "minimax_h3" else d.out_channels
    g = torch.Generator().manual_seed(1)
    batch = Batch(latents=torch.randn(1, channels, frames, 4, 6, generator=g),
                  prompt=torch.randn(1, 5, d.text_dim, generator=g), prompt_mask=torch.ones(1, 5),
                  cameras=torch.eye(4).expand(1, frames, 4, 4).clone(), image_condition=None,
                  identities=[{"sample_id": "s", "start_frame": 0}])
    return state, student, batch


@pytest.mark.parametrize("family", ["wan22_ti2v_5b", "minimax_h3"])
def test_replay_reproduces_the_chunked_rollout(family, tmp_path):
    state, student, batch = _setup(family, tmp_path)
    g = torch.Generator().manual_seed(5)
    committed = state.rollout(student, batch, state._conditions(batch, g), g, grad=False)
    g = torch.Generator().manual_seed(5)  # the same draws again, now with the gradient-carrying replay
    replayed = state.rollout(student, batch, state._conditions(batch, g), g, grad=True)
    assert replayed.shape == committed.shape == (1, batch.latents.shape[1], state.sgf.rollout_latents, 4, 6)
    assert replayed.requires_grad and not committed.requires_grad
    assert torch.allclose(replayed, committed, atol=1e-5), (replayed - committed).abs().max()
    if family == "wan22_ti2v_5b":
        assert torch.equal(replayed[:, :, 0], batch.latents[:, :, 0])  # the image condition


@pytest.mark.parametrize("family", ["wan22_ti2v_5b", "minimax_h3"])
def test_each_loss_trains_only_its_role(family, tmp_path):
    state, student, batch = _setup(family, tmp_path)
    loss, extra = state.student_loss(student, batch, torch.Generator().manual_seed(2))
    loss.backward()
    assert torch.isfinite(loss) and extra["dmd_gradient"] >= 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters() if p.requires_grad)
    assert all(p.grad is None for p in state.critic.model.parameters())
    assert all(p.grad is None for p in state.teacher.parameters())
    student.zero_grad(set_to_none=True)
    loss, _ = state.critic_loss(student, batch, torch.Generator().manual_seed(3))
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in state.critic.params.values())
    assert all(p.grad is None for p in student.parameters())
    assert all(p.grad is None for p in state.teacher.parameters())


def test_role_optimizers_follow_their_blocks(tmp_path):
    state, student, _ = _setup("wan22_ti2v_5b", tmp_path)
    assert isinstance(state.critic, Role)
    assert state.critic.optimizer.param_groups[0]["betas"] == (0.0, 0.999)
    assert state.levels[0] == 1000.0 and len(state.levels) == 4


@pytest.mark.parametrize("negative_tokens, forwards", [(5, 1), (3, 2)])
def test_guided_teacher_scores_both_prompts_in_one_batch(negative_tokens, forwards, tmp_path):
    """Under guidance the teacher's conditional and unconditional velocities come from one forward
    over a batch of both when the prompts have one shape (two forwards otherwise), with the values of
    separate forwards."""
    state, student, batch = _setup("wan22_ti2v_5b", tmp_path)
    assert state.sgf.real_guidance_scale != 1.0
    state.negative = torch.randn(negative_tokens, student.cfg.dims.text_dim, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    cond = state._conditions(batch, g)
    noisy = torch.randn(batch.latents.shape, generator=g)
    level = torch.rand(1, noisy.shape[2], generator=g) * 1000
    cams = cond.cameras[:, :noisy.shape[2]]
    calls = []
    hook = state.teacher.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        conditional, unconditional = state._teacher_velocities(noisy, level, cond, cams)
        hook.remove()
        alone = state._velocity(state.teacher, noisy, level, cond, cams=cams)
        negative = state._velocity(state.teacher, noisy, level, cond, negative=True, cams=cams)
    assert len(calls) == forwards
    assert (conditional - alone).abs().max().item() <= 1e-5
    assert (unconditional - negative).abs().max().item() <= 1e-5
