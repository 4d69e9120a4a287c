"""Stage2 rollout and losses on tiny models: the teacher-forced replay reproduces the chunked
KV-cache pass, and gradients reach only the role being trained."""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.objectives import fm
from solar.train.stage2 import Role, Stage2, _role
from tests.conftest import CONFIGS

TINY = {
    "wan22_ti2v_5b": (CONFIGS / "tiny" / "wan22_ti2v_5b" / "train_stage2_sgf_81f.yaml", []),
    "minimax_h3": (CONFIGS / "tiny" / "minimax_h3" / "train_stage2_sgf_158f.yaml",
                   ["sgf.rollout_latents=10", "sgf.supervised_latents=7"]),
}


def _setup(family, root, clips=1):
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
    batch = Batch(latents=torch.randn(clips, channels, frames, 4, 6, generator=g),
                  prompt=torch.randn(clips, 5, d.text_dim, generator=g), prompt_mask=torch.ones(clips, 5),
                  cameras=torch.eye(4).expand(clips, frames, 4, 4).clone(), image_condition=None,
                  identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(clips)])
    return state, student, batch


@pytest.mark.parametrize("family", ["wan22_ti2v_5b", "minimax_h3"])
def test_replay_reproduces_the_chunked_rollout(family, tmp_path):
    state, student, batch = _setup(family, tmp_path)
    g = fm.ClipDraws(5, 1, 0, 1)
    committed = state.rollout(student, batch, state._conditions(batch, g), g, grad=False)
    g = fm.ClipDraws(5, 1, 0, 1)  # the same draws again, now with the gradient-carrying replay
    replayed = state.rollout(student, batch, state._conditions(batch, g), g, grad=True)
    assert replayed.shape == committed.shape == (1, batch.latents.shape[1], state.sgf.rollout_latents, 4, 6)
    assert replayed.requires_grad and not committed.requires_grad
    assert torch.allclose(replayed, committed, atol=1e-5), (replayed - committed).abs().max()
    if family == "wan22_ti2v_5b":
        assert torch.equal(replayed[:, :, 0], batch.latents[:, :, 0])  # the image condition


@pytest.mark.parametrize("family", ["wan22_ti2v_5b", "minimax_h3"])
def test_each_loss_trains_only_its_role(family, tmp_path):
    state, student, batch = _setup(family, tmp_path)
    loss, extra = state.student_loss(student, batch, fm.ClipDraws(2, 6, 0, 1, "student"))
    loss.backward()
    assert torch.isfinite(loss) and extra["dmd_gradient"] >= 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters() if p.requires_grad)
    assert all(p.grad is None for p in state.critic.model.parameters())
    assert all(p.grad is None for p in state.teacher.parameters())
    student.zero_grad(set_to_none=True)
    loss, _ = state.critic_loss(student, batch, fm.ClipDraws(2, 6, 0, 1, "critic"))
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
    draws = fm.ClipDraws(3, 1, 0, 1)
    cond = state._conditions(batch, draws)
    g = torch.Generator().manual_seed(3)
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


def _clip(batch: Batch, i: int) -> Batch:
    return Batch(latents=batch.latents[i:i + 1], prompt=batch.prompt[i:i + 1], prompt_mask=batch.prompt_mask[i:i + 1],
                 cameras=batch.cameras[i:i + 1], image_condition=None, identities=batch.identities[i:i + 1])


def _exits(state, student, batch, seed, step, position, role):
    """A clip's exit levels, replaying its generator's documented draw order: (H3: anchor noise, audio
    noise, audio time), rollout noise, its exit level of every chunk."""
    g = fm.clip_generator(seed, step, position, role)
    C, _, _, h, w = batch.latents.shape
    if state.h3:
        torch.randn((C, 1, h, w), generator=g)
        torch.randn(state.audio_silence.shape, generator=g)
        torch.rand(1, generator=g)
    torch.randn((C, state.sgf.rollout_latents, h, w), generator=g)
    chunks = state.sgf.rollout_latents // student.cfg.chunk_latents
    return torch.randint(0, len(state.levels), (chunks,), generator=g).tolist()


@pytest.mark.parametrize("family", ["wan22_ti2v_5b", "minimax_h3"])
def test_each_clip_rolls_out_as_it_would_alone(family, tmp_path):
    """Issue 39: every draw of a clip (noise, its exit level of each chunk, its re-noising, the score
    level and noise) comes from its own generator, keyed by its global-batch position, so a clip of a
    micro-batch of 3 gets the rollout, the score level and the noise it gets alone in a micro-batch of
    1 at the same position, although the clips exit their chunks at different levels."""
    state, student, batch = _setup(family, tmp_path, clips=3)
    seed, step, first = 7, 11, 4
    exits = [_exits(state, student, batch, seed, step, first + i, "student") for i in range(3)]
    assert len({tuple(e) for e in exits}) > 1, exits   # the clips leave some chunk at different levels
    together = fm.ClipDraws(seed, step, first, 3, "student")
    cond = state._conditions(batch, together)
    joint = state.rollout(student, batch, cond, together, grad=True)
    noisy_joint, level_joint, eps_joint = state._score_noise(joint.detach(), cond, together)
    for i in range(3):
        draws = fm.ClipDraws(seed, step, first + i, 1, "student")
        clip = _clip(batch, i)
        cond_i = state._conditions(clip, draws)
        again = fm.ClipDraws(seed, step, first + i, 1, "student")   # the same draws, without the replay
        committed = state.rollout(student, clip, state._conditions(clip, again), again, grad=False)
        alone = state.rollout(student, clip, cond_i, draws, grad=True)
        assert torch.allclose(joint[i:i + 1], alone, atol=1e-5), (family, i, (joint[i:i + 1] - alone).abs().max())
        assert torch.allclose(committed, alone, atol=1e-5)
        _, level_i, eps_i = state._score_noise(alone.detach(), cond_i, draws)
        assert torch.equal(level_joint[i:i + 1], level_i) and torch.equal(eps_joint[i:i + 1], eps_i)


def test_a_role_holds_no_gradients_through_the_other_roles_update(tmp_path):
    """The memory forecast holds one role's gradients at a time: the student's are gone before the
    critic's update of the same outer step starts, and the critic's before the next student update
    (the real loop, one process on the CPU; torch's global optimizer hook sees each update's step)."""
    from solar.data.synth import synthesize
    from solar.launch.distributed import Dist
    from solar.storage.run_dir import EventLog, Heartbeat
    from solar.train.engine import Loop
    from solar.train.stage2 import build_stage2

    data, out = tmp_path / "data", tmp_path / "out"
    synthesize("wan22_ti2v_5b", data, samples=2, seed=1)
    resolved = resolve_file(TINY["wan22_ti2v_5b"][0], [
        f"data.root={data}", f"runtime.output_dir={out}", "runtime.validate_every=0", "runtime.validation_steps=[]",
        "train.sgf.critic_updates_per_student=1", "train.sgf.rollout_latents=6", "train.sgf.supervised_latents=6"])
    d = Dist(rank=0, world=1, local_rank=0, local_world=1, sp=1, device=torch.device("cpu"), backend=None)
    parts, stage2 = build_stage2(resolved, 0, d.device)
    loop = Loop(resolved, d, parts, out, EventLog(out, 0), Heartbeat(out, 0), None, stage2=stage2, term="critic")
    roles = {"student": list(parts.params.values()), "critic": list(stage2.critic.params.values())}
    seen = []

    def before_step(optimizer, args, kwargs):
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        role = next(r for r, ps in roles.items() if id(ps[0]) in mine)
        other = "critic" if role == "student" else "student"
        seen.append((role, sum(p.grad is not None for p in roles[role]), sum(p.grad is not None for p in roles[other])))

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        for step in (1, 2, 3):   # critic only, then student and critic at each outer step
            loop.step(step)
    finally:
        handle.remove()
    assert [r for r, _, _ in seen] == ["critic", "student", "critic", "student", "critic"]
    assert all(own > 0 and other == 0 for _, own, other in seen), seen
    assert all(p.grad is None for ps in roles.values() for p in ps)   # none kept after the last update
