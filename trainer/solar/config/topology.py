"""Distributed arithmetic: logical data parallelism over sequence-parallel groups.

    logical_dp_world_size = world_size / sequence_parallel_size      (must divide)
    global_batch_size     = logical_dp_world_size * micro_batch_size * gradient_accumulation

plus the family rules (required SP degrees, SP dividing the head count, at least one latent frame
per SP rank for whole-frame splits).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from solar.config import families
from solar.errors import ConfigError


@dataclass(frozen=True)
class Topology:
    world_size: int
    sequence_parallel_size: int
    logical_dp_world_size: int
    micro_batch_size: int
    gradient_accumulation: int
    global_batch_size: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def dp_rank(self, rank: int) -> int:
        return rank // self.sequence_parallel_size

    def sp_rank(self, rank: int) -> int:
        return rank % self.sequence_parallel_size


def compute(*, world_size: int, sequence_parallel_size: int, micro_batch_size: int,
            gradient_accumulation: int, global_batch_size: int | None) -> Topology:
    """Check divisibility and agreement; ``global_batch_size=None`` means derive it."""
    sp = sequence_parallel_size
    if world_size % sp:
        raise ConfigError(
            f"distributed.world_size={world_size} is not divisible by "
            f"distributed.sequence_parallel_size={sp}; choose a world size that is a multiple of {sp}"
        )
    dp = world_size // sp
    derived = dp * micro_batch_size * gradient_accumulation
    if global_batch_size is not None and global_batch_size != derived:
        raise ConfigError(
            f"train.global_batch_size={global_batch_size} disagrees with logical_dp_world_size {dp} "
            f"(world {world_size} / SP {sp}) x train.micro_batch_size {micro_batch_size} x "
            f"train.gradient_accumulation {gradient_accumulation} = {derived}; set "
            f"train.global_batch_size={derived} or change the topology"
        )
    return Topology(world_size, sp, dp, micro_batch_size, gradient_accumulation, derived)


def check_family_rules(*, family: str, profile: str, action: str, stage: str, sp: int,
                       num_heads: int, latent_frames: int) -> None:
    spec = families.spec(family)
    required = spec.sp_rules.get((action, stage))
    if required is not None and sp != required:
        raise ConfigError(
            f"distributed.sequence_parallel_size={sp}: {family} {stage} {action} requires "
            f"sequence parallelism {required}; set distributed.sequence_parallel_size={required}"
        )
    if num_heads % sp:
        options = ", ".join(str(d) for d in families.divisors(num_heads))
        raise ConfigError(
            f"distributed.sequence_parallel_size={sp} does not divide the {num_heads} attention heads "
            f"of {family} ({profile}); use one of {options}"
        )
    if sp > latent_frames:
        raise ConfigError(
            f"distributed.sequence_parallel_size={sp} exceeds the {latent_frames} latent frames of a "
            "clip; sequence parallelism splits whole frames"
        )
