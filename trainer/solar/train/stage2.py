"""Stage2: DMD via self-gradient forcing with three roles (semantics.md §4, §5).

Roles, each initialised through the real load path and checked before any model is allocated:

- student (trainable, causal): Stage1 AnyFlow weights (``checkpoint.roles.student``, usually EMA)
  with AnyFlow's delta embedding dropped; its EMA starts at student update ``train.ema.start_step``;
- teacher (frozen, bidirectional) and critic (trainable, bidirectional): the same Stage0.5 FM
  checkpoint; the critic has its own optimizer (``train.sgf.critic_optimizer``).

Outer step s: a student update first when ``dmd.student_updates(s)`` (outer steps 6, 11, 16, ...),
then a critic update, each on a fresh global batch from the stream. The student's rollout runs
chunk by chunk against the KV cache without grad, stopping each chunk at a randomly drawn exit
level; a second, teacher-forced pass over ``[committed chunks | noisy chunks at their exit
levels]`` recomputes every chunk's output with grad (the teacher-forcing mask reproduces the
windowed cache exactly). Checkpoints hold ``student`` (live, EMA, optimizer) and ``critic`` (live,
optimizer) roles; the teacher's source is recorded and re-verified on resume.

Randomness belongs to the clip (issue 39): one generator per clip and role, keyed by (seed, outer
step, the clip's position in the update's global batch, "student"|"critic") (``fm.ClipDraws`` at
``fm.first_position(dp_rank, dp_world, micro, micro_batch)``), so a clip draws the same values at
any topology with the same global batch, and SP peers (one dp rank) draw the same. Draw order of a
clip's generator: (H3: anchor noise, audio noise, audio time), rollout noise, its exit level of every
chunk, its re-noising noise (chunk by chunk, level by level, only below its exit), score level, score
noise. Each clip exits each chunk at its own level: a micro-batch runs a chunk's denoising to the
largest exit among its clips and takes each clip's state at its own exit (the later forwards of a
clip past its exit are discarded), so a clip's rollout does not depend on the micro-batch's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from solar.config.contracts import checkpoint_contract
from solar.launch import precision
from solar.launch.batch import Batch, collate, to_device
from solar.launch.distributed import CollectiveFailure
from solar.launch.materialize import (Lazy, checkpoint, local_part, materialize, module_tensors, released,
                                     role_tensors)
from solar.models.lora import active, adapters_of, role_name, shared_name
from solar.models.registry import model_from_config
from solar.models.weights import WeightsError
from solar.objectives import dmd, fm
from solar.storage.checkpoints import CheckpointError, read_manifest, require_valid
from solar.train import checkpoint_io as io
from solar.train.ema import EMA
from solar.train.optimizer import adamw
from solar.train.profiling import phase
from solar.train.schedule import lr_at
from solar.train.sources import check_roles, fm_objective, role_problem

N = fm.NUM_TRAIN_TIMESTEPS
ROLES = ("student", "teacher", "critic")  # the order roles are built in (a shared model's first is active)


# --- building the three roles -----------------------------------------------------------------

def _role_tensors(cfg, ck, resume: bool, sources: dict) -> dict[str, tuple[dict, str]]:
    """Each role's lazy weight sources and where they come from. Seeded random roles (a fresh start
    without sources, or a resume of one whose teacher was random) are built whole on the host in the
    order they always were (student, teacher, critic), so they keep their parameters; a LoRA base
    lies under every role."""
    base = released(cfg.model.family, cfg.model.pretrained_path) \
        if cfg.model.pretrained_path and cfg.model.training_mode == "lora" else {}
    random = None
    if sources.get("teacher") is None:
        random = {role: module_tensors(model_from_config(cfg, device="cpu"))
                  for role in ROLES}

    def member(path: str, role: str, weights: str) -> dict:
        tensors = checkpoint(Path(path), role, weights)
        return {**base, **tensors} if read_manifest(path).get("trainer_state", {}).get("adapter_only") else tensors

    if resume:
        out = {role: (member(ck.path, role, "live"), f"checkpoint.path {ck.path} ({role})")
               for role in ("student", "critic")}
        teacher = sources["teacher"]
        out["teacher"] = (member(teacher["path"], "model", teacher["weights"]), f"teacher source {teacher['path']}") \
            if teacher is not None else ({**random["teacher"], **base}, "the seeded random teacher")
        return out
    if sources:
        return {role: (member(src["path"], "model", src["weights"]), f"checkpoint.roles.{role}.path {src['path']}")
                for role, src in sources.items()}
    return {role: ({**random[role], **base}, f"the seeded random {role}") for role in ROLES}


def _same(a: Lazy, b: Lazy, digests: dict[int, str]) -> bool:
    """Whether two lazy tensors hold the same bytes: the same source member, else equal digests."""
    if a is b or (a.file is not None and (a.file, a.key) == (b.file, b.key)) or \
            (a.tensor is not None and a.tensor is b.tensor):
        return True
    if a.shape != b.shape:
        return False

    def digest(lazy: Lazy) -> str:
        if id(lazy) not in digests:
            t = lazy.read().contiguous()
            digests[id(lazy)] = f"{t.dtype}:" + hashlib.blake2b(t.view(torch.uint8).numpy().tobytes(),
                                                                 digest_size=16).hexdigest()
        return digests[id(lazy)]

    return digest(a) == digest(b)


def _base_groups(cfg, tensors: dict[str, dict[str, Lazy]]) -> list[tuple[str, ...]]:
    """The roles that build one model together: under LoRA, the roles whose frozen base holds the same
    bytes (checked, not assumed: the same source member or equal digests) share one base and differ
    only in their adapters; every other role (and every role of a full-weights run) has its own."""
    if cfg.model.training_mode != "lora" or os.environ.get("SOLAR_SHARED_LORA_BASE") == "0":
        return [(role,) for role in ROLES]
    base = [k for k in model_from_config(cfg, device="meta").state_dict() if ".lora_" not in k]
    digests: dict[int, str] = {}
    groups: list[list[str]] = []
    for role in ROLES:
        mine = tensors[role]
        for group in groups:
            theirs = tensors[group[0]]
            if all(k in mine and k in theirs and _same(theirs[k], mine[k], digests) for k in base):
                group.append(role)
                break
        else:
            groups.append([role])
    return [tuple(g) for g in groups]


def _group_tensors(group: tuple[str, ...], tensors: dict[str, dict[str, Lazy]]) -> dict[str, Lazy]:
    """One shared model's sources: the base once (the teacher's where it is in the group; the others
    hold the same bytes) and each role's adapters under its own name."""
    first = "teacher" if "teacher" in group else group[0]
    out = {k: v for k, v in tensors[first].items() if ".lora_" not in k}
    for role in group:
        out.update({shared_name(k, role): v for k, v in tensors[role].items() if ".lora_" in k})
    return out


def _models_record(groups: list[tuple[str, ...]], models: dict[str, torch.nn.Module],
                   fp8_linears: dict[tuple[str, ...], int]) -> list[dict]:
    """What each model holds on this rank (its local shards): the roles it serves, its bytes and its
    FP8 linear layers (model.fp8_linear)."""
    return [{"roles": list(group),
             "parameter_bytes": sum(local_part(p).numel() * p.element_size() for p in models[group[0]].parameters()),
             "fp8_linears": fp8_linears.get(group, 0)}
            for group in groups]


@dataclass
class Role:
    model: torch.nn.Module
    names: list[str]                       # as the role's own model names them (what it saves)
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    adapter: str | None = None             # its adapter's name when the model holds several roles


def _role(model, opt, role: str) -> Role:
    adapter = role if adapters_of(model) is not None else None
    params = {}
    for name, p in model.named_parameters():
        own = role_name(name, role) if adapter else name
        if p.requires_grad and own is not None:
            params[own] = p
    return Role(model, list(params), params, adamw(params, opt), adapter)


def build_stage2(resolved, rank: int, device: torch.device, *, world: int = 1, local_world: int | None = None,
                 sp=None):
    """(student Parts for the shared loop, the Stage2 state holding teacher and critic)."""
    import random

    from solar.data.from_config import train_stream
    from solar.data.prefetch import Prefetched
    from solar.train.setup import Parts

    cfg, route = resolved.config, resolved.route
    ck = cfg.checkpoint
    sharded = cfg.distributed.sharding != "none" and world > 1
    resume = ck.mode == "full_resume"
    trainer = None
    if resume:
        manifest = require_valid(ck.path, "checkpoint.path")
        saved = manifest.get("contract", {})
        expected = checkpoint_contract(cfg, route)
        for key in ("family", "stage", "causal_mode", "objective", "camera_translation_transform",
                    "sequence_parallel_size"):
            if saved.get(key) != expected[key]:
                raise CheckpointError(f"checkpoint.path {ck.path}: a full resume needs {key} {expected[key]!r}, the "
                                      f"checkpoint has {saved.get(key)!r}")
        if not {"student", "critic"} <= set(manifest.get("roles") or {}):
            raise CheckpointError(f"checkpoint.path {ck.path} lacks the student and critic roles of a Stage2 run")
        trainer = json.loads((Path(ck.path) / "trainer.json").read_text())
        teacher_src = trainer.get("teacher")
        if teacher_src is not None:  # the frozen teacher is not saved: its recorded source must still verify
            t_manifest = require_valid(teacher_src["path"], "the recorded teacher source")
            problem = role_problem("teacher", t_manifest, cfg, route.family, stage="stage0p5",
                                    objective=fm_objective(route.family), weights=teacher_src["weights"])
            if problem:
                raise CheckpointError(f"teacher source {teacher_src['path']}: {problem}")
        sources = {"teacher": teacher_src}
    elif ck.mode == "roles":
        check_roles(cfg, route)
        sources = {r: {"path": getattr(ck.roles, r).path, "weights": getattr(ck.roles, r).weights}
                   for r in ("student", "teacher", "critic")}
    else:  # none: seeded random roles (tiny smoke runs)
        sources = {}
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed * 1_000_003 + rank)
    tensors = _role_tensors(cfg, ck, resume, sources)
    groups = _base_groups(cfg, {role: t for role, (t, _) in tensors.items()})
    # Each model is built on the meta device: one per group of roles sharing a LoRA base, else one per
    # role. What does not train there (the teacher, a shared base) takes its storage dtype: bf16 when
    # the run computes in bf16 (half its memory; autocast casts weights to bf16 for every matmul
    # anyway), fp32 otherwise. Then each is materialised on the device and filled from its sources.
    from solar.launch.precision import computes_in_bf16
    from solar.train import fp8, parallelize

    mesh = None
    if sharded:  # one mesh for every model: each is sharded over it, frozen weights without optimizer state
        from solar.launch.precision import fsdp_policy

        mesh = parallelize.device_mesh(world=world, local_world=local_world or world,
                                       strategy=cfg.distributed.sharding, device=device)
    models: dict[str, torch.nn.Module] = {}
    fp8_linears: dict[tuple[str, ...], int] = {}
    for group in groups:
        model = model_from_config(cfg, device="meta", roles=group if len(group) > 1 else None)
        if group == ("teacher",):
            model.requires_grad_(False)
            if computes_in_bf16(cfg, device):
                model.to(dtype=torch.bfloat16)
        elif "teacher" in group:  # the teacher's adapter is frozen too; the base and it in storage dtype
            for name, param in model.named_parameters():
                if role_name(name, "teacher") is not None:
                    param.requires_grad_(False)
            if computes_in_bf16(cfg, device):
                for module in model.modules():
                    for name, param in module.named_parameters(recurse=False):
                        if not param.requires_grad:
                            module.register_parameter(name, torch.nn.Parameter(param.to(torch.bfloat16),
                                                                               requires_grad=False))
        fp8_linears[group] = fp8.convert(model, cfg.model.fp8_linear)  # before SP, checkpointing, compile, FSDP2
        if sp is not None and sp.size > 1:
            model.set_sequence_parallel(sp)
        if group != ("teacher",) and cfg.distributed.activation_checkpointing:
            parallelize.apply_activation_checkpointing(
                model, policy=cfg.distributed.activation_checkpointing_policy,
                skip_blocks=cfg.distributed.activation_checkpointing_skip_blocks)
        if cfg.runtime.compile and device.type == "cuda":  # each block, as the single-model routes do
            parallelize.apply_compile(model)
        if mesh is not None:
            parallelize.apply_fsdp(model, mesh, policy=fsdp_policy(cfg, device))
        source = tensors[group[0]][0] if len(group) == 1 else _group_tensors(group, {r: tensors[r][0] for r in group})
        where = "; ".join(tensors[r][1] for r in group)
        try:
            materialize(model, device, source, where=where, drop_delta="student" in group and ck.mode == "roles",
                        lora_seed=cfg.train.seed)
        except WeightsError as exc:
            raise CheckpointError(str(exc)) from None
        models.update({role: model for role in group})
    teacher = models["teacher"]
    if adapters_of(teacher) is None:
        teacher.eval()
    student = _role(models["student"], cfg.train.optimizer, "student")
    critic = _role(models["critic"], cfg.train.sgf.critic_optimizer or cfg.train.optimizer, "critic")
    e = cfg.train.ema
    ema = EMA(student.params, decay=e.decay, start_step=e.start_step, warmup_steps=e.warmup_steps, enabled=e.enabled)
    start_step, student_step, data_state = 0, 0, None
    if resume:
        path = Path(ck.path)
        io.load_optimizer(path, "student", student.optimizer, student.names, student.params)
        io.load_optimizer(path, "critic", critic.optimizer, critic.names, critic.params)
        if trainer["ema"].get("exists"):
            ema.load(io.local_tensors(role_tensors(path, "student", "ema"), student.params, f"{path} student EMA"),
                     trainer["ema"])
        start_step, student_step = trainer["step"], trainer["student_step"]
        if student_step != dmd.student_step_after(start_step, cfg.train.sgf.critic_updates_per_student):
            raise CheckpointError(f"checkpoint.path {path}: student step {student_step} does not follow outer step "
                                  f"{start_step}")
        data_state = io.load_rank_state(path, rank)
        init = {"mode": "full_resume", "sources": [{"role": "student+critic", "path": ck.path, "step": start_step}]}
    else:
        init = {"mode": ck.mode, "sources": [{"role": r, **s} for r, s in sources.items()]}
    if start_step > cfg.train.max_steps:  # == max_steps: the loop only finishes that step's validation
        raise CheckpointError(f"checkpoint.path {ck.path} is at step {start_step}, beyond train.max_steps="
                              f"{cfg.train.max_steps}")
    stream = Prefetched(train_stream(cfg, rank, data_state))  # the next clip read during the step
    parts = Parts(student.model, student.names, student.params, student.optimizer, ema, stream, start_step, init,
                  adapter_only=bool(cfg.model.pretrained_path) and cfg.model.training_mode == "lora", sharded=sharded,
                  fp8_linears=sum(fp8_linears.values()))
    state = Stage2(resolved, teacher, critic, student_step, sources.get("teacher"), student.adapter)
    state.models = _models_record(groups, models, fp8_linears)
    return parts, state


# --- the rollout and the two losses -------------------------------------------------------------

@contextlib.contextmanager
def _without_sp(model):
    saved = getattr(model, "sp", None)
    model.sp = None
    try:
        yield
    finally:
        model.sp = saved


@dataclass
class Conditions:
    """What every forward of one micro-batch shares."""

    prompt: torch.Tensor
    negative: torch.Tensor | None
    cameras: torch.Tensor          # [B, R, 4, 4] (the track's last camera repeated past its end)
    first: torch.Tensor | None     # Wan: the clean image-condition latent [B, C, h, w]
    anchor: torch.Tensor | None    # H3
    audio: torch.Tensor | None
    t_audio: torch.Tensor | None


class Stage2:
    def __init__(self, resolved, teacher, critic: Role, student_step: int, teacher_source: dict | None,
                 student_adapter: str | None = None) -> None:
        self.resolved, self.teacher, self.critic = resolved, teacher, critic
        self.student_adapter = student_adapter
        self.student_step = student_step
        self.teacher_source = teacher_source
        cfg = resolved.config
        self.h3 = cfg.model.family == "minimax_h3"
        self.sgf = cfg.train.sgf
        self.levels = dmd.denoising_levels(list(self.sgf.denoising_steps), cfg.model.timestep_shift)
        self.negative = None
        if not self.h3 and (self.sgf.real_guidance_scale or 1.0) != 1.0:
            from solar.launch.conditions import negative_prompt

            self.negative = negative_prompt(cfg, "train.sgf.real_guidance_scale != 1")

    @contextlib.contextmanager
    def _acting(self, model, role: str):
        """``model``'s calls inside act as ``role``: its adapter on a shared base, and the teacher in
        eval mode there (its own model is always in eval mode)."""
        with active(model, role):
            if role != "teacher" or adapters_of(model) is None:
                yield
                return
            training = model.training
            model.eval()
            try:
                yield
            finally:
                model.train(training)

    # conventions: every model below returns a velocity in sigma (dx/dsigma), fed levels in raw units
    def _velocity(self, model, x, level_BF, cond: Conditions, *, negative=False, chunk=None, cache=None,
                  clean=None, cams=None):
        prompt = cond.negative[None].expand(x.shape[0], -1, -1).to(x) if negative else cond.prompt
        if self.h3:
            t = 1.0 - level_BF / N
            if cache is not None:
                return -model.forward_chunk(x, t, cache, cameras=cams)
            if clean is not None:
                return -model.forward_teacher_forcing(clean, x, t, prompt, anchor=cond.anchor, audio=cond.audio,
                                                      audio_timestep=cond.t_audio, cameras=cams)
            return -model(x, t[:, 0], prompt, anchor=cond.anchor, audio=cond.audio, audio_timestep=cond.t_audio,
                          cameras=cams)
        if cache is not None:
            return model.forward_chunk(x, level_BF, cache, cameras=cams)
        if clean is not None:
            return model.forward_teacher_forcing(clean, x, level_BF, prompt, cameras=cams)
        return model(x, level_BF, prompt, cameras=cams)

    def _teacher_velocities(self, noisy, level_f, cond: Conditions, cams):
        """The teacher's velocity with the prompt and, under guidance (``real_guidance_scale`` != 1),
        with the negative prompt: one forward over both as a batch of 2B when the two prompts have one
        shape (the same per-sample computation, fewer and larger kernels), else two forwards."""
        if (self.sgf.real_guidance_scale or 1.0) == 1.0:
            return self._velocity(self.teacher, noisy, level_f, cond, cams=cams), None
        negative = cond.negative[None].expand(noisy.shape[0], -1, -1).to(noisy)
        if negative.shape != cond.prompt.shape:
            return (self._velocity(self.teacher, noisy, level_f, cond, cams=cams),
                    self._velocity(self.teacher, noisy, level_f, cond, negative=True, cams=cams))
        both = self.teacher(torch.cat([noisy, noisy]), torch.cat([level_f, level_f]),
                            torch.cat([cond.prompt, negative.to(cond.prompt.dtype)]), cameras=torch.cat([cams, cams]))
        return both.chunk(2)

    def _conditions(self, batch: Batch, draws: fm.ClipDraws) -> Conditions:
        cfg = self.resolved.config
        x0 = batch.latents
        B, device = x0.shape[0], x0.device
        R = self.sgf.rollout_latents
        cams = batch.cameras
        if cams.shape[1] < R:
            cams = torch.cat([cams, cams[:, -1:].expand(-1, R - cams.shape[1], -1, -1)], dim=1)
        cams = cams[:, :R]
        anchor = audio = t_audio = None
        if self.h3:
            k = cfg.train.fm.keyframe_anchor_t
            anchor = k * x0[:, :, :1] + (1 - k) * draws.noise(x0[:, :, :1].shape, device)
            if self.audio_silence is not None:
                silence = to_device(self.audio_silence, device).expand(B, *self.audio_silence.shape)
                audio_eps = draws.noise(silence.shape, device)
                shift = cfg.model.audio_timestep_shift
                t_audio = to_device(draws.each(lambda g: fm.sample_h3_times(1, shift, g)), device)
                audio = fm.noisy_h3(silence, audio_eps, t_audio)
        if self.negative is not None and self.negative.device != device:
            self.negative = to_device(self.negative, device)   # once: every update reads the same prompt
        return Conditions(batch.prompt, self.negative, cams, None if self.h3 else x0[:, :, 0], anchor, audio, t_audio)

    def _pin(self, x: torch.Tensor, cond: Conditions, start: int = 0) -> torch.Tensor:
        if cond.first is not None and start == 0:
            x = x.clone()
            x[:, :, 0] = cond.first
        return x

    def rollout(self, student, batch: Batch, cond: Conditions, draws: fm.ClipDraws, *, grad: bool) -> torch.Tensor:
        """The student's rollout [B, C, R, h, w]: no-grad chunked pass to each clip's exit of each
        chunk, then (with ``grad``) the teacher-forced replay that carries the gradient."""
        with self._acting(student, "student"):
            return self._rollout(student, batch, cond, draws, grad=grad)

    def _rollout(self, student, batch: Batch, cond: Conditions, draws: fm.ClipDraws, *, grad: bool) -> torch.Tensor:
        x0 = batch.latents
        B, C, _, h, w = x0.shape
        device = x0.device
        R, k = self.sgf.rollout_latents, student.cfg.chunk_latents
        chunks = R // k
        noise = draws.noise((B, C, R, h, w), device)
        # each clip's exit level of every chunk, from its own generator: [B][chunks]
        exits = draws.each(lambda g: torch.randint(0, len(self.levels), (1, chunks), generator=g)).tolist()
        last = [max(e[c] for e in exits) for c in range(chunks)]   # a chunk runs to its clips' largest exit
        # Under FSDP2 every forward is a collective, but each DP rank draws its own exit levels: the
        # ranks agree on the most chunk forwards any of them runs (before the first one) and the
        # others run discarded forwards after their rollout, so every rank enters the same gathers.
        calls = sum(e + 1 for e in last)
        padding = self.agree(calls) - calls if self.agree is not None else 0
        committed = torch.zeros_like(noise)
        at_exit = torch.zeros_like(noise)
        exit_level = torch.zeros(B, R, device=device)
        label = ("student" if grad else "critic") + "-forward/rollout-chunks"
        with torch.no_grad(), _without_sp(student), phase(label):
            if self.h3:
                cache = student.new_cache(cond.prompt, anchor=cond.anchor, audio=cond.audio,
                                          audio_timestep=1.0 if cond.t_audio is None else cond.t_audio,
                                          anchor_camera=cond.cameras[:, :1], height=h, width=w)
            else:
                cache = student.new_cache(cond.prompt)
            for c in range(chunks):
                lo, hi = c * k, (c + 1) * k
                cams = cond.cameras[:, lo:hi]
                x = self._pin(noise[:, :, lo:hi], cond, lo)
                for i, level in enumerate(self.levels[:last[c] + 1]):
                    t = torch.full((B, k), level, device=device)
                    if cond.first is not None and lo == 0:
                        t[:, 0] = 0.0
                    leaving = [b for b in range(B) if exits[b][c] == i]   # the clips exiting at this level
                    rows = [slice(None)] if len(leaving) == B else leaving  # all at once when all exit
                    for b in rows:
                        at_exit[b, :, lo:hi] = x[b]
                        exit_level[b, lo:hi] = t[b]
                    v = self._velocity(student, x, t, cond, cache=cache, cams=cams)
                    x0_hat = self._pin(x - (t / N)[:, None, :, None, None] * v, cond, lo)
                    for b in rows:
                        committed[b, :, lo:hi] = x0_hat[b]
                    if i < last[c]:   # re-noised to the next level: only the clips still before their exit draw
                        nxt = self.levels[i + 1] / N
                        fresh = draws.noise(x0_hat.shape, device, clips=[b for b in range(B) if i < exits[b][c]])
                        x = self._pin((1 - nxt) * x0_hat + nxt * fresh, cond, lo)
                if c < chunks - 1:  # the last chunk's keys and values would never be read
                    student.commit_chunk(committed[:, :, lo:hi], cache, cameras=cams)
            for _ in range(padding):  # read-only forwards over the last chunk: the cache is unchanged
                self._velocity(student, x, t, cond, cache=cache, cams=cams)
        if not grad:
            return committed
        with phase("student-forward/rollout-replay-with-grad"):
            v = self._velocity(student, at_exit, exit_level, cond, clean=committed, cams=cond.cameras)
        return self._pin(at_exit - (exit_level / N)[:, None, :, None, None] * v, cond)

    def _score_noise(self, x: torch.Tensor, cond: Conditions, draws: fm.ClipDraws):
        B, S = x.shape[0], x.shape[2]
        shift = self.resolved.config.model.timestep_shift
        level = to_device(draws.each(lambda g: dmd.score_levels(1, shift, g, low=self.sgf.score_timestep_min,
                                                                 high=self.sgf.score_timestep_max)), x.device)
        eps = draws.noise(x.shape, x.device)
        s = (level / N)[:, None, None, None, None]
        noisy = self._pin((1 - s) * x + s * eps, cond)
        level_f = level[:, None].expand(B, S).clone()
        if cond.first is not None:
            level_f[:, 0] = 0.0
        return noisy, level_f, eps

    def _mask(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[0], 1, x.shape[2], 1, 1, dtype=torch.bool, device=x.device)
        if not self.h3:
            mask[:, :, 0] = False   # the image condition
        return mask

    def student_loss(self, student, batch: Batch, draws: fm.ClipDraws) -> tuple[torch.Tensor, dict]:
        cond = self._conditions(batch, draws)
        S = self.sgf.supervised_latents
        output = self.rollout(student, batch, cond, draws, grad=True)[:, :, :S]
        cams = cond.cameras[:, :S]
        noisy, level_f, _ = self._score_noise(output.detach(), cond, draws)
        sig = (level_f / N)[:, None, :, None, None]
        with torch.no_grad():
            with phase("student-forward/critic-score"), self._acting(self.critic.model, "critic"):
                fake = noisy - sig * self._velocity(self.critic.model, noisy, level_f, cond, cams=cams)
            with phase("student-forward/teacher-score"), self._acting(self.teacher, "teacher"):
                conditional, unconditional = self._teacher_velocities(noisy, level_f, cond, cams)
            real = noisy - sig * conditional
            if unconditional is not None:
                real = dmd.guided(real, noisy - sig * unconditional, self.sgf.real_guidance_scale)
            mask = self._mask(output)
            gradient = dmd.kl_gradient(fake, real, output, mask)
        loss = dmd.student_loss(output, gradient, mask)
        return loss, {"dmd_gradient": gradient.abs().mean()}   # read after the update is queued

    def critic_loss(self, student, batch: Batch, draws: fm.ClipDraws) -> tuple[torch.Tensor, dict]:
        cond = self._conditions(batch, draws)
        S = self.sgf.supervised_latents
        output = self.rollout(student, batch, cond, draws, grad=False)[:, :, :S]
        noisy, level_f, eps = self._score_noise(output, cond, draws)
        with phase("critic-forward/critic-with-grad"), self._acting(self.critic.model, "critic"):
            v = self._velocity(self.critic.model, noisy, level_f, cond, cams=cond.cameras[:, :S])
        return dmd.critic_loss(v, eps - output, self._mask(output)), {}

    # --- one outer step --------------------------------------------------------------------
    audio_silence: torch.Tensor | None = None
    models: list[dict] = []  # built models: the roles each serves and its bytes on this rank
    agree = None  # sharded: (this rank's rollout chunk forwards) -> the most of any rank

    def _batches(self, loop, step: int):
        cfg, d = self.resolved.config, loop.dist
        for micro in range(cfg.train.gradient_accumulation):
            error, batch = None, None
            try:
                batch = collate([loop.parts.stream.next_clip() for _ in range(cfg.train.micro_batch_size)]).to(d.device)
            except Exception as exc:  # noqa: BLE001 - reported to every rank
                error = f"{type(exc).__name__}: {exc}"
            d.exchange_error(error, "data" if error and "DataError" in error else "error")
            if d.sp > 1:
                digests = d.all_gather_object(batch.digest(), "sp-identity", group=d.sp_group)
                if len(set(digests)) != 1:
                    raise CollectiveFailure(f"SP peers of dp rank {d.dp_rank} read different micro-batches at step "
                                            f"{step}", "sp_mismatch")
            yield micro, batch

    def _update(self, loop, step: int, role: str, model, params, optimizer, opt_cfg, lr: float, loss_fn):
        from solar.train.gradients import sync_and_clip

        cfg, d = self.resolved.config, loop.dist
        sharded = loop.parts.sharded
        if sharded and self.agree is None:
            def agree(calls: int) -> int:
                count = torch.tensor([float(calls)], device=d.device if d.backend == "nccl" else "cpu")
                return int(d.all_reduce(count, "rollout-forwards", op=torch.distributed.ReduceOp.MAX).item())
            self.agree = agree
        accum = cfg.train.gradient_accumulation
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        losses, extra, records = [], {}, []
        for micro, batch in self._batches(loop, step):
            B = batch.latents.shape[0]
            draws = fm.ClipDraws(cfg.train.seed, step, fm.first_position(d.dp_rank, d.dp_world, micro, B), B, purpose=role)
            loop.heartbeat.update(phase=f"{role}-forward", step=step)
            with precision.autocast(cfg, d.device, sharded=sharded), phase(f"{role}-forward"):
                loss, extra = loss_fn(loop.parts.model, batch, draws)
            loop.heartbeat.update(phase=f"{role}-backward", step=step)
            with phase(f"{role}-backward"):
                (loss / accum).backward()
            losses.append(loss.detach())
            records += [{**ident, "role": role} for ident in batch.identities]
        total = sum(v / accum for v in torch.stack(losses).tolist())   # one read per update, summed as before
        bad = None if math.isfinite(total) else f"non-finite {role} loss {total} at step {step}"
        d.exchange_error(bad, "non_finite")
        loop.heartbeat.update(phase="grad-sync", step=step)
        with phase(f"{role}-clip"):
            norm = sync_and_clip(d, params, opt_cfg.grad_clip, sharded)
        if not math.isfinite(norm):
            raise CollectiveFailure(f"non-finite {role} gradient norm {norm} at step {step}; the step was refused",
                                    "non_finite")
        with phase(f"{role}-optimizer"):
            optimizer.step()
        # the other role updates next: this role's gradients are not kept through it (memory.forecast
        # holds one role's gradients at a time)
        optimizer.zero_grad(set_to_none=True)
        return total, norm, extra, records

    def step(self, loop, step: int) -> dict:
        cfg, d, p = self.resolved.config, loop.dist, loop.parts
        started = time.perf_counter()
        self.audio_silence = loop.audio_silence
        ratio = self.sgf.critic_updates_per_student
        critic_opt = self.sgf.critic_optimizer or cfg.train.optimizer
        student_max = max(1, dmd.student_step_after(cfg.train.max_steps, ratio))
        event = {"step": step, "student_updated": False}
        records = []
        p.model.train()
        self.critic.model.train()
        if dmd.student_updates(step, ratio):
            lr = lr_at(self.student_step + 1, cfg.train.optimizer, student_max)
            loss, norm, extra, recs = self._update(loop, step, "student", p.model, p.params, p.optimizer,
                                                   cfg.train.optimizer, lr, self.student_loss)
            self.student_step += 1
            with phase("student-ema"):
                p.ema.update(self.student_step)
            records += recs
            event.update(student_updated=True, student_loss=loss, student_grad_norm=norm, student_lr=lr,
                         dmd_gradient=float(extra["dmd_gradient"]))
        lr = lr_at(step, critic_opt, cfg.train.max_steps)
        loss, norm, _, recs = self._update(loop, step, "critic", self.critic.model, self.critic.params,
                                           self.critic.optimizer, critic_opt, lr,
                                           lambda student, batch, draws: self.critic_loss(student, batch, draws))
        records += recs
        seconds = time.perf_counter() - started
        # both roles' means over the ranks in one reduction (every rank updates the student at the same steps)
        student = event["student_loss"] if event["student_updated"] else 0.0
        total = torch.tensor([loss, student], device=d.device if d.backend == "nccl" else "cpu")
        d.all_reduce(total, "loss-mean")
        mean, student_mean = (float(v) / d.world for v in total.tolist())
        losses, means = {"critic": loss}, {"critic": mean}
        if event["student_updated"]:
            losses["student"] = event["student_loss"]
            means["student"] = student_mean
            event["student_loss_mean"] = student_mean
        from solar.train.engine import memory_reading

        event.update(loss=loss, loss_mean=mean, losses=losses, grad_norm=norm, lr=lr, step_seconds=seconds,
                     student_step=self.student_step, samples=records, ema=p.ema.exists, memory=memory_reading())
        loop.events.write("step", **event)
        loop.last = {"step": step, "loss": mean, "grad_norm": norm, "step_seconds": seconds,
                     "student_step": self.student_step}
        from solar.train.metrics import observe_step

        observe_step(loop, step=step, losses=means, grad_norm=norm, seconds=seconds, clips=len(records),
                     grad_norms={"critic": norm, **({"student": event["student_grad_norm"]}
                                                    if event["student_updated"] else {})})
        return event

    # --- checkpoints -------------------------------------------------------------------------
    def capture(self, loop, partial: Path, step: int, staging):
        """Both trained roles' state for a checkpoint (``checkpoint_save.Capture``; rank 0 writes whole
        files, or under FSDP2 every rank its own shards)."""
        from solar.train import checkpoint_save as cs

        d, p = loop.dist, loop.parts
        roles, files = [], {}
        trainer_state = {"step": step, "student_step": self.student_step, "adapter_only": p.adapter_only,
                         "base": self.resolved.config.model.pretrained_path, "ema_exists": p.ema.exists,
                         "teacher": self.teacher_source}
        if p.sharded or d.rank == 0:
            shadow, meta = p.ema.state()
            student = io.snapshot(p.model, p.optimizer, p.names, sharded=p.sharded, adapter_only=p.adapter_only,
                                  ema=shadow, staging=staging, key="student", role=self.student_adapter)
            critic = io.snapshot(self.critic.model, self.critic.optimizer, self.critic.names, sharded=p.sharded,
                                 adapter_only=p.adapter_only, ema=None, staging=staging, key="critic",
                                 role=self.critic.adapter)
            roles = [cs.RoleCapture("student", student, p.names, ["live", "ema"] if p.ema.exists else ["live"]),
                     cs.RoleCapture("critic", critic, self.critic.names, ["live"])]
            if d.rank == 0:
                files = io.trainer_file({"step": step, "student_step": self.student_step, "ema": meta,
                                         "teacher": self.teacher_source})
        if p.sharded:  # every rank writes its own shards of both roles (checkpoint_shards)
            return cs.sharded(step, partial, roles, trainer_state, files, staging, d)
        return cs.Capture(step, partial, roles, trainer_state, files)
