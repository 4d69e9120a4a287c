"""The supported-route table: which (family, stage, causal mode, objective, variant) exist,
which actions each allows, and which example configs exercise it.

A route key is ``family:stage:causal_mode:objective[:variant]``. Anything not in the table is
rejected at resolve time with the routes allowed for that family — before any model exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from solar.config.families import CONFIG_DIRS


@dataclass(frozen=True, order=True)
class Route:
    family: str
    stage: str
    causal_mode: str
    objective: str
    variant: str | None = None

    @property
    def key(self) -> str:
        parts = [self.family, self.stage, self.causal_mode, self.objective]
        return ":".join(parts + ([self.variant] if self.variant else []))

    @property
    def causal(self) -> bool:
        return self.causal_mode != "bidirectional"


@dataclass(frozen=True)
class RouteInfo:
    route: Route
    actions: tuple[str, ...]
    config_files: tuple[str, ...]  # file names inside configs/solar_wm/<family-dir>/ (and tiny/)
    description: str

    @property
    def configs(self) -> list[str]:
        folder = CONFIG_DIRS[self.route.family]
        released = [f"configs/solar_wm/{folder}/{name}" for name in self.config_files]
        tiny = [f"configs/solar_wm/tiny/{folder}/{name}" for name in self.config_files]
        return sorted(released + tiny)


def _r(family: str, stage: str, causal: str, objective: str, variant: str | None,
       actions: tuple[str, ...], files: tuple[str, ...], description: str) -> RouteInfo:
    return RouteInfo(Route(family, stage, causal, objective, variant), actions, files, description)


SUPPORTED: tuple[RouteInfo, ...] = (
    _r("wan22_ti2v_5b", "stage0p5", "bidirectional", "flow_matching", None, ("train", "infer"),
       ("train_stage0p5_fm_81f.yaml", "train_stage0p5_fm_153f.yaml", "infer_stage0p5_fm_81f.yaml"),
       "Stage0.5 bidirectional full-clip FM"),
    _r("wan22_ti2v_5b", "stage1", "teacher_forcing", "flow_matching", None, ("train",),
       ("train_stage1_tf_fm_81f.yaml",),
       "Stage1 TF-FM baseline (not the Stage2 initializer)"),
    _r("wan22_ti2v_5b", "stage1", "teacher_forcing", "anyflow_forward_map", "v1_5", ("train", "infer"),
       ("train_stage1_tf_anyflow_81f.yaml", "infer_stage1_tf_anyflow_81f.yaml"),
       "Stage1 teacher forcing + AnyFlow flow map"),
    _r("wan22_ti2v_5b", "stage2", "self_gradient_forcing", "flow_matching", None, ("train", "infer"),
       ("train_stage2_sgf_81f.yaml", "infer_stage2_sgf_81f.yaml", "infer_stage2_sgf_camera_length.yaml"),
       "Stage2 DMD via self-gradient forcing"),
    _r("wan22_i2v_a14b", "stage0p5", "bidirectional", "flow_matching", None, ("train", "infer"),
       ("train_stage0p5_fm_81f.yaml", "train_stage0p5_fm_153f.yaml", "infer_stage0p5_fm_81f.yaml"),
       "Stage0.5 FM of the high-noise expert"),
    _r("ltx25_video", "stage0p5", "bidirectional", "native_rectified_flow", None, ("train", "infer"),
       ("train_stage0p5_fm_153f.yaml", "infer_stage0p5_fm_153f.yaml"),
       "Stage0.5 native rectified flow, LoRA"),
    _r("minimax_h3", "stage0p5", "bidirectional", "flow_matching", None, ("train", "infer"),
       ("train_stage0p5_fm_158f.yaml", "infer_stage0p5_fm_158f.yaml"),
       "Stage0.5 reversed-time FM, LoRA"),
    _r("minimax_h3", "stage1", "teacher_forcing", "anyflow_forward_map", "v1_5", ("train", "infer"),
       ("train_stage1_tf_anyflow_158f.yaml", "infer_stage1_tf_anyflow_158f.yaml"),
       "Stage1 teacher forcing + AnyFlow flow map (unguided, W6)"),
    _r("minimax_h3", "stage2", "self_gradient_forcing", "flow_matching", None, ("train", "infer"),
       ("train_stage2_sgf_158f.yaml", "infer_stage2_sgf_158f.yaml"),
       "Stage2 DMD via self-gradient forcing"),
)

_BY_ROUTE: dict[Route, RouteInfo] = {info.route: info for info in SUPPORTED}


def lookup(route: Route) -> RouteInfo | None:
    return _BY_ROUTE.get(route)


def allowed_for(family: str) -> list[str]:
    return sorted(info.route.key for info in SUPPORTED if info.route.family == family)


def table() -> list[dict]:
    """The route table as ``solar config routes --json`` prints it (sorted by route key)."""
    rows = [
        {
            "route": info.route.key,
            "family": info.route.family,
            "stage": info.route.stage,
            "causal_mode": info.route.causal_mode,
            "objective": info.route.objective,
            "variant": info.route.variant,
            "actions": list(info.actions),
            "configs": info.configs,
        }
        for info in SUPPORTED
    ]
    return sorted(rows, key=lambda row: row["route"])
