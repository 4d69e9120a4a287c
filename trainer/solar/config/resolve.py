"""``solar config resolve``: from a config file and ``--set`` edits to one explicit, checked document.

    read (strict YAML/JSON) -> --set -> inline-credential check -> ${VAR} -> schema
    -> action and route -> applicability -> defaults -> family values -> topology -> placeholders

Every step raises ``ConfigError`` with a one-line message naming the key; nothing is written
anywhere. The result is what ``resolved-config.json`` holds and what the launcher, the operator and
the trainer all act on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from solar.config import contracts, loader, topology
from solar.config.canonical import blake2s_hex, digest
from solar.config.guards import placeholder_keys, reject_inline_credentials
from solar.config.routes import Route
from solar.config.schema import RunConfig, validate_tree
from solar.config.topology import Topology
from solar.errors import ConfigError

RESOLVED_SCHEMA = "solar.resolved.v1"


@dataclass(frozen=True)
class Resolved:
    source: str
    source_digest: str
    route: Route
    topology: Topology
    config: RunConfig

    @property
    def config_dict(self) -> dict[str, Any]:
        return self.config.model_dump(by_alias=True, mode="json")

    @property
    def resolved_digest(self) -> str:
        return digest(self.config_dict)

    def document(self) -> dict[str, Any]:
        return {
            "schema": RESOLVED_SCHEMA,
            "source": self.source,
            "source_digest": self.source_digest,
            "resolved_digest": self.resolved_digest,
            "route": self.route.key,
            "topology": self.topology.as_dict(),
            "config": self.config_dict,
        }


def resolve_tree(tree: dict[str, Any], *, source: str, source_digest: str,
                 sets: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                 expected_action: str | None = None, placeholders: bool = True) -> Resolved:
    """``placeholders=False`` leaves ``/path/to/`` values unresolved (a forecast reads no path)."""
    environ = os.environ if environ is None else environ
    merged = loader.apply_sets(tree, list(sets))
    reject_inline_credentials(merged)
    expanded = loader.expand_env(merged, environ)
    cfg = validate_tree(expanded)
    with _reason("UnsupportedRoute"):
        route = contracts.derive_route(cfg, expected_action)
    contracts.check_applicability(cfg, route)
    cfg = contracts.fill_defaults(cfg, route)
    contracts.check_values(cfg, route)
    dims = contracts.effective_dims(cfg)
    with _reason("TopologyMismatch"):
        topology.check_family_rules(
            family=route.family, profile=cfg.model.profile, action=cfg.action, stage=route.stage,
            sp=cfg.distributed.sequence_parallel_size, num_heads=dims.num_heads,
            latent_frames=contracts.latent_frames(cfg))
        topo = _topology(cfg)
    if cfg.action == "train" and cfg.train.global_batch_size is None:
        cfg = cfg.model_copy(update={
            "train": cfg.train.model_copy(update={"global_batch_size": topo.global_batch_size})})
    dumped = cfg.model_dump(by_alias=True, mode="json")
    pending = placeholder_keys(dumped, contracts.is_read_by(cfg, route)) if placeholders else []
    if pending:
        raise ConfigError(
            f"unresolved placeholders in fields this {cfg.action} run reads: {', '.join(pending)}; "
            "supply them with --set KEY=VALUE", reason="UnresolvedPlaceholder")
    return Resolved(source, source_digest, route, topo, cfg)


@contextlib.contextmanager
def _reason(reason: str):
    """Tag the ConfigErrors of one pipeline step with the reason a SolarRun reports."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(exc.message, reason=reason) from None


def _topology(cfg: RunConfig) -> Topology:
    d, t = cfg.distributed, cfg.train
    if cfg.action == "train":
        return topology.compute(
            world_size=d.world_size, sequence_parallel_size=d.sequence_parallel_size,
            micro_batch_size=t.micro_batch_size, gradient_accumulation=t.gradient_accumulation,
            global_batch_size=t.global_batch_size)
    # Inference: one sample per logical DP rank per generation step.
    return topology.compute(world_size=d.world_size, sequence_parallel_size=d.sequence_parallel_size,
                            micro_batch_size=1, gradient_accumulation=1, global_batch_size=None)


def resolve_file(path: str | os.PathLike[str], sets: Sequence[str] = (),
                 environ: Mapping[str, str] | None = None,
                 expected_action: str | None = None, placeholders: bool = True) -> Resolved:
    """Resolve a config file (YAML, or JSON such as a previous ``resolved-config.json``)."""
    raw, tree = loader.read_document(path)
    return resolve_tree(tree, source=str(path), source_digest=blake2s_hex(raw), sets=sets,
                        environ=environ, expected_action=expected_action, placeholders=placeholders)
