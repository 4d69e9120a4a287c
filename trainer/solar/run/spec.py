"""The ``SolarRun`` resource (contract.md §4): spec and status as pydantic models.

Field names are the resource's own (camelCase), so a model dumps to exactly the document the API
server stores. ``crds/solarwm.io_solarruns.yaml`` declares the same shape; a test keeps them equal.
Torch-free: shared by the operator and ``solar run``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

GROUP, VERSION, KIND, PLURAL, SHORT = "solarwm.io", "v1alpha1", "SolarRun", "solarruns", "srun"
API_VERSION = f"{GROUP}/{VERSION}"

DNSLabel = Annotated[str, StringConstraints(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
PosInt = Annotated[int, Field(ge=1)]
Family = Literal["wan22_ti2v_5b", "wan22_i2v_a14b", "ltx25_video", "minimax_h3"]
Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Suspended"]
Weights = Literal["live", "ema"]
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"
_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (``80Gi``, ``141G``, ``1.5Ti``, plain bytes) in bytes."""
    import re

    match = re.fullmatch(QUANTITY, text)
    if match is None:
        raise ValueError(f"{text!r} is not a memory quantity such as 80Gi")
    unit = match.group(2) or ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Topology(Doc):
    nodes: PosInt = Field(description="Nodes (PyTorchJob Master + Workers).")
    gpusPerNode: PosInt = Field(description="Processes per node (torchrun --nproc-per-node).")
    sequenceParallelSize: PosInt = Field(1, description="Ulysses SP degree.")
    microBatchSize: PosInt = Field(1, description="Clips per rank per micro-batch (training stages).")
    gradientAccumulation: PosInt = Field(1, description="Micro-batches per optimizer step (training stages).")
    globalBatchSize: PosInt | None = Field(None, description="Optional; must agree with the topology.")
    gpuMemory: Annotated[str, StringConstraints(pattern=QUANTITY)] | None = Field(
        None, description="Memory of one GPU, a Kubernetes quantity (e.g. 80Gi, 141Gi). A training stage whose "
                          "forecast (solar config memory) does not fit is refused before any job; without it the "
                          "forecast is only reported in the stage's status.")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpusPerNode


class Storage(Doc):
    volume: dict[str, Any] = Field(description="Any core/v1 volume source, e.g. {persistentVolumeClaim: {claimName: x}}.")
    mountPath: str = Field(pattern=r"^/", description="Where pods mount it.")
    path: str = Field(pattern=r"^[^/].*", description="Run root below the mount: <mountPath>/<path>.")

    @field_validator("path")
    @classmethod
    def _inside_the_volume(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError("must stay inside the volume (no '..' segments)")
        return value


class ExtraVolume(Doc):
    name: DNSLabel
    volume: dict[str, Any]
    mountPath: str = Field(pattern=r"^/")
    readOnly: bool = False


class InitSource(Doc):
    stage: DNSLabel = Field(description="An earlier stage whose final checkpoint feeds this one.")
    weights: Weights = Field(description="live or ema weights of that checkpoint.")


class Init(Doc):
    model: InitSource | None = None
    student: InitSource | None = None
    teacher: InitSource | None = None
    critic: InitSource | None = None

    def roles(self) -> dict[str, InitSource]:
        return {k: v for k, v in (("model", self.model), ("student", self.student), ("teacher", self.teacher),
                                  ("critic", self.critic)) if v is not None}


class Stage(Doc):
    name: DNSLabel
    config: str = Field(min_length=1, description="Config path relative to the repository root (the image's workdir).")
    set: list[str] = Field(default_factory=list, description="--set KEY=VALUE edits of that config.")
    init: Init | None = None
    topology: Topology | None = Field(None, description="This stage's topology when it differs from the run's "
                                                        "(e.g. inference on fewer GPUs, H3 Stage2 with SP 4).")
    resources: dict[str, Any] | None = Field(None, description="This stage's container resources when they differ "
                                                               "from spec.resources (e.g. fewer GPUs per pod).")


class RunPolicy(Doc):
    backoffLimit: Annotated[int, Field(ge=0)] = 3
    progressDeadlineSeconds: PosInt = 3600
    ttlSecondsAfterFinished: Annotated[int, Field(ge=0)] | None = None
    cleanPodPolicy: Literal["All", "Running", "None"] = "Running"
    suspend: bool = False


class SolarRunSpec(Doc):
    family: Family
    image: str = Field(min_length=1)
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    topology: Topology
    storage: Storage
    volumes: list[ExtraVolume] = Field(default_factory=list)
    stages: list[Stage] = Field(min_length=1)
    resources: dict[str, Any] = Field(default_factory=dict)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    priorityClassName: str = ""
    schedulerName: str = ""
    runPolicy: RunPolicy = Field(default_factory=RunPolicy)


# --- status ----------------------------------------------------------------------------------

class CheckpointStatus(Doc):
    step: int
    path: str
    verifiedAt: str


class ValidationStatus(Doc):
    step: int | None = None
    complete: bool


class MemoryStatus(Doc):
    peakBytes: int = Field(description="Forecast peak GPU memory per GPU (solar config memory).")
    gpuMemoryBytes: int | None = Field(None, description="The GPU memory it was checked against (topology.gpuMemory).")


class AttemptUsage(Doc):
    status: str = Field(description="How the launch ended: complete, stopped or failed.")
    worldSize: int
    gpuSeconds: float = Field(description="World size x wall time from the first rank's start to the end.")
    started: str | None = None
    ended: str | None = None


class StageUsage(Doc):
    gpuSeconds: float = Field(description="Every launch of the stage together (failed and retried ones included).")
    attempts: list[AttemptUsage] = Field(default_factory=list)


class StageStatus(Doc):
    name: str
    phase: Phase = "Pending"
    job: str | None = None
    attempt: int = 0
    failures: int = 0
    startTime: str | None = None
    completionTime: str | None = None
    checkpoint: CheckpointStatus | None = None
    validation: ValidationStatus | None = None
    message: str | None = None
    reason: str | None = None
    memory: MemoryStatus | None = None
    usage: StageUsage | None = None


class Condition(Doc):
    type: Literal["Validated", "Progressing", "Ready", "Failed", "Suspended"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    lastTransitionTime: str
    observedGeneration: int | None = None


class StatusTopology(Doc):
    worldSize: int
    logicalDataParallelSize: int
    globalBatchSize: int | None = None


class SolarRunStatus(Doc):
    phase: Phase = "Pending"
    currentStage: str | None = None
    step: int | None = None
    observedGeneration: int | None = None
    topology: StatusTopology | None = None
    gpuHours: float | None = Field(None, description="GPU time of every stage's launches so far (queueing and "
                                                     "suspended time excluded), from their run-result.json.")
    stages: list[StageStatus] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)

    def stage(self, name: str) -> StageStatus | None:
        return next((s for s in self.stages if s.name == name), None)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: DNSLabel
    namespace: str | None = None


class SolarRun(Doc):
    """A whole manifest (what ``kubectl apply`` and ``solar run`` read)."""

    apiVersion: Literal["solarwm.io/v1alpha1"]
    kind: Literal["SolarRun"]
    metadata: ObjectMeta
    spec: SolarRunSpec
    status: SolarRunStatus | None = None


def first_error(exc, prefix: str = "") -> str:
    """A pydantic ValidationError as one line: the dotted field and what is wrong with it."""
    first = exc.errors()[0]
    where = ".".join([p for p in [prefix] if p] + [str(part) for part in first["loc"]])
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
