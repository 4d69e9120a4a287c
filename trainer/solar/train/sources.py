"""Every weight source a training launch reads, verified and compatible before anything is written
(rank 0, ``solar train``'s check), and the Stage2 role sources: the student from Stage1 AnyFlow
weights, the teacher and critic from one Stage0.5 flow-matching checkpoint."""

from __future__ import annotations

from solar.config.contracts import source_problem
from solar.config.resolve import Resolved
from solar.launch.weights import require_base
from solar.storage.checkpoints import CheckpointError, data_position, require_valid


def preflight_sources(resolved: Resolved) -> None:
    """Every weight source the launch reads is verified and compatible, before anything is written."""
    cfg, route = resolved.config, resolved.route
    ck = cfg.checkpoint
    if ck.mode == "roles":
        for role, manifest in check_roles(cfg, route).items():
            require_base(cfg, getattr(ck.roles, role).path, manifest, f"checkpoint.roles.{role}.path")
    elif ck.mode == "weights_only" or (ck.mode == "full_resume" and route.stage != "stage2"):
        manifest = require_valid(ck.path, "checkpoint.path")
        problem = source_problem(route, manifest.get("contract", {}), cfg, resume=ck.mode == "full_resume")
        if problem:
            raise CheckpointError(f"checkpoint.path {ck.path} cannot initialise this run: {problem}")
        require_base(cfg, ck.path, manifest)


def role_problem(role: str, manifest: dict, cfg, family: str, *, stage: str, objective: str, weights: str) -> str | None:
    """Why a verified checkpoint cannot start the Stage2 ``role`` (None when it can)."""
    c = manifest.get("contract", {})
    if c.get("family") != family:
        return f"it is a {c.get('family')} checkpoint, this run is {family}"
    if c.get("camera_translation_transform") != cfg.model.camera_translation_transform:
        return (f"its camera translation transform is {c.get('camera_translation_transform')}, this run uses "
                f"{cfg.model.camera_translation_transform}")
    if c.get("stage") != stage or c.get("objective") != objective:
        what = "Stage1 AnyFlow (anyflow_forward_map)" if role == "student" else "Stage0.5 flow matching"
        return f"the {role} starts from {what} weights; the checkpoint is {c.get('stage')} {c.get('objective')}"
    model_role = (manifest.get("roles") or {}).get("model")
    if model_role is None:
        return "it has no single-model weights (role model)"
    if weights not in model_role.get("weights", []):
        return f"it has no {weights} weights (it holds {', '.join(model_role.get('weights', []))})"
    return None


def check_roles(cfg, route) -> dict[str, dict]:
    """Verify every role source (before allocation); returns each role's checkpoint manifest."""
    roles = cfg.checkpoint.roles
    expected = {"student": ("stage1", "anyflow_forward_map"), "teacher": ("stage0p5", fm_objective(route.family)),
                "critic": ("stage0p5", fm_objective(route.family))}
    manifests = {}
    for role, (stage, objective) in expected.items():
        source = getattr(roles, role)
        manifest = require_valid(source.path, f"checkpoint.roles.{role}.path")
        problem = role_problem(role, manifest, cfg, route.family, stage=stage, objective=objective,
                                weights=source.weights)
        if problem:
            raise CheckpointError(f"checkpoint.roles.{role}.path {source.path} cannot initialise the {role}: {problem}")
        manifests[role] = manifest
    return manifests


def fm_objective(family: str) -> str:
    """The flow-matching objective a family's Stage0.5 checkpoints record."""
    return "native_rectified_flow" if family == "ltx25_video" else "flow_matching"


def require_global_batch(cfg, path: str) -> None:
    """A full resume may change the topology (world, nodes, SP, micro-batch, accumulation) but not the
    global batch: that would change the recipe (issue 39)."""
    position = data_position(path)
    if position is None or position.get("global_batch_size") is None:
        return
    saved, batch = position["global_batch_size"], cfg.train.global_batch_size
    if batch is not None and saved != batch:
        w = position.get("saved_with") or {}
        t = cfg.train
        dp = cfg.distributed.world_size // cfg.distributed.sequence_parallel_size
        keep = saved // (dp * t.micro_batch_size) if saved % (dp * t.micro_batch_size) == 0 else None
        hint = f"; train.gradient_accumulation={keep} keeps it at this topology" if keep else ""
        raise CheckpointError(f"checkpoint.path {path} was saved with global batch {saved} (world {w.get('world_size')}, "
                              f"SP {w.get('sequence_parallel_size')}, micro-batch {w.get('micro_batch_size')}, "
                              f"accumulation {w.get('gradient_accumulation')}); this run's is {batch}: a full resume "
                              f"keeps the global batch{hint}")
