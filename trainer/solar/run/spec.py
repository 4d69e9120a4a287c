"""The ``SolarRun`` resource (contract.md §4): spec and status as pydantic models.

Field names are the resource's own (camelCase), so a model dumps to exactly the document the API
server stores. ``crds/solarwm.io_solarruns.yaml`` declares the same shape; a test keeps them equal.
Torch-free: shared by the operator and ``solar run``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

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


class Declared(BaseModel):
    """A part of the spec a person writes: typed as strictly as the CRD declares it (the API server refuses
    ``minNodes: '16'`` and ``growBack: "yes"``, so the models do too: no string for an integer or a boolean,
    no boolean or fraction for an integer)."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class Elastic(Declared):
    """A training stage that may continue on fewer nodes (and grow back) with the same global batch."""
    minNodes: PosInt = Field(description="The fewest nodes a training stage may continue on; every count from "
                                         "minNodes to nodes that keeps the global batch is allowed.")
    shrinkAfterSeconds: Annotated[int, Field(ge=0)] = Field(
        300, description="How long replacement pods may stay unschedulable before the stage shrinks.")
    growBack: bool = Field(True, description="Resume at a larger allowed shape when the cluster can hold it.")
    minSecondsBetweenChanges: Annotated[int, Field(ge=0)] = Field(
        600, description="The least time between two changes of shape (a flapping node does not thrash the run).")
    nodeLostSeconds: Annotated[int, Field(ge=0)] = Field(
        60, description="How long a pod's node may be gone or not Ready (counted from its kubelet's last "
                        "heartbeat) before the attempt is replaced while its job still runs (about Kubernetes' "
                        "node-monitor grace period plus a margin; the taint manager's eviction comes minutes "
                        "later).")


class Topology(Declared):
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
    elastic: Elastic | None = Field(None, description="Training stages may continue on fewer nodes, down to "
                                                      "minNodes, keeping the global batch with more accumulation: "
                                                      "the operator shrinks a stage whose pods were disrupted or "
                                                      "stay unschedulable, and grows it back when the cluster can "
                                                      "hold a larger allowed shape (docs/elastic.md).")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpusPerNode


class Storage(Declared):
    volume: dict[str, Any] = Field(description="Any core/v1 volume source, e.g. {persistentVolumeClaim: {claimName: x}}.")
    mountPath: str = Field(pattern=r"^/", description="Where pods mount it.")
    path: str = Field(pattern=r"^[^/].*", description="Run root below the mount: <mountPath>/<path>.")

    @field_validator("path")
    @classmethod
    def _inside_the_volume(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError("must stay inside the volume (no '..' segments)")
        return value


class ExtraVolume(Declared):
    name: DNSLabel
    volume: dict[str, Any]
    mountPath: str = Field(pattern=r"^/")
    readOnly: bool = False


class InitSource(Declared):
    stage: DNSLabel = Field(description="An earlier stage whose final checkpoint feeds this one.")
    weights: Weights = Field(description="live or ema weights of that checkpoint.")


class Init(Declared):
    model: InitSource | None = None
    student: InitSource | None = None
    teacher: InitSource | None = None
    critic: InitSource | None = None

    def roles(self) -> dict[str, InitSource]:
        return {k: v for k, v in (("model", self.model), ("student", self.student), ("teacher", self.teacher),
                                  ("critic", self.critic)) if v is not None}


class Stage(Declared):
    name: DNSLabel
    config: str = Field(min_length=1, description="Config path relative to the repository root (the image's workdir).")
    set: list[str] = Field(default_factory=list, description="--set KEY=VALUE edits of that config.")
    init: Init | None = None
    topology: Topology | None = Field(None, description="This stage's topology when it differs from the run's "
                                                        "(e.g. inference on fewer GPUs, H3 Stage2 with SP 4).")
    resources: dict[str, Any] | None = Field(None, description="This stage's container resources when they differ "
                                                               "from spec.resources (e.g. fewer GPUs per pod).")


class RunPolicy(Declared):
    backoffLimit: Annotated[int, Field(ge=0)] = 3
    progressDeadlineSeconds: PosInt = 3600
    ttlSecondsAfterFinished: Annotated[int, Field(ge=0)] | None = None
    cleanPodPolicy: Literal["All", "Running", "None"] = "Running"
    suspend: bool = False


# names the operator (or the training operator / Trainer runtime) sets in every trainer container
RESERVED_ENV_PREFIXES = ("SOLAR_", "PET_")
RESERVED_ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
BACKENDS = ("PyTorchJob", "TrainJob")
DEFAULT_RUNTIME = "torch-distributed"


class EnvVar(Declared):
    """A core/v1 EnvVar: a plain ``value`` or a ``valueFrom`` source (secretKeyRef, configMapKeyRef, ...)."""

    name: str = Field(min_length=1, pattern=r"^[^=]+$")
    value: str | None = None
    valueFrom: dict[str, Any] | None = Field(None, description="Any core/v1 EnvVarSource, e.g. "
                                                               "{secretKeyRef: {name: s3, key: id}}.")


class LocalObjectReference(Declared):
    name: str = Field(min_length=1)


def reserved_env(name: str) -> bool:
    return name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES


class SolarRunSpec(Declared):
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
    # contract.md §7: job backends, queueing and pod settings
    backend: Literal["PyTorchJob", "TrainJob"] | None = Field(
        None, description="The job kind of every stage; default: the operator's --default-backend.")
    trainingRuntime: DNSLabel | None = Field(
        None, description=f"TrainJob only: the ClusterTrainingRuntime the jobs reference (default {DEFAULT_RUNTIME}).")
    queueName: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63)] | None \
        = Field(None, description="Kueue LocalQueue in the run's namespace (label kueue.x-k8s.io/queue-name).")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment of the trainer containers "
                                                                "(core/v1 EnvVar; valueFrom allowed).")
    imagePullSecrets: list[LocalObjectReference] = Field(default_factory=list)
    serviceAccountName: str = ""
    podSecurityContext: dict[str, Any] = Field(default_factory=dict, description="core/v1 PodSecurityContext, "
                                                                                 "e.g. {fsGroup: 10001}.")
    sharedMemory: Annotated[str, StringConstraints(pattern=QUANTITY)] = Field(
        "16Gi", description="/dev/shm as a memory-backed emptyDir of this size; \"0\" mounts none.")

    @field_validator("volumes")
    @classmethod
    def _volume_names(cls, value: list[ExtraVolume]) -> list[ExtraVolume]:
        names = [v.name for v in value]
        for name in names:
            if name in ("solar-runs", "solar-shm"):
                raise ValueError(f"the name {name} is the operator's (run volume, /dev/shm); rename that volume")
            if names.count(name) > 1:
                raise ValueError(f"the name {name} appears twice; volume names are unique")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: list[EnvVar]) -> list[EnvVar]:
        seen = set()
        for item in value:
            if reserved_env(item.name):
                raise ValueError(f"{item.name} is set by the operator (SOLAR_*, PET_*, MASTER_ADDR, MASTER_PORT, "
                                 "WORLD_SIZE, RANK, LOCAL_RANK); remove it or use another name")
            if item.value is not None and item.valueFrom is not None:
                raise ValueError(f"{item.name}: give value or valueFrom, not both")
            if item.name in seen:
                raise ValueError(f"{item.name} appears twice")
            seen.add(item.name)
        return value

    @property
    def run_root(self) -> str:
        """Where the run's stage directories are, as the pods see it: ``<mountPath>/<path>``."""
        return f"{self.storage.mountPath}/{self.storage.path}"

    def pod_env(self) -> list[dict]:
        """``env`` as core/v1 EnvVar documents."""
        return [item.model_dump(exclude_none=True) for item in self.env]

    @model_validator(mode="after")
    def _shm_mount_is_free(self) -> SolarRunSpec:
        if quantity_bytes(self.sharedMemory) > 0:
            taken = [("storage.mountPath", self.storage.mountPath)] + [
                (f"volumes[{i}].mountPath", v.mountPath) for i, v in enumerate(self.volumes)]
            for where, path in taken:
                if path.rstrip("/") == "/dev/shm":
                    raise ValueError(f"{where} is /dev/shm, which sharedMemory ({self.sharedMemory}) mounts; "
                                     'set sharedMemory: "0" to bring your own')
        return self

    def shm_bytes(self) -> int:
        return quantity_bytes(self.sharedMemory)


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


class AttemptTopology(Doc):
    nodes: int
    gpusPerNode: int
    worldSize: int
    sequenceParallelSize: int
    microBatchSize: int | None = Field(None, description="Training stages: clips per rank per micro-batch.")
    gradientAccumulation: int | None = Field(None, description="Training stages: micro-batches per optimizer step.")
    globalBatchSize: int | None = Field(None, description="Training stages: worldSize / sequenceParallelSize x "
                                                          "microBatchSize x gradientAccumulation.")


class StageAttempt(Doc):
    attempt: int
    topology: AttemptTopology = Field(description="The shape this attempt was started at (spec.topology or the "
                                                  "stage's own, as they were then).")
    resumedFrom: int | None = Field(None, description="The checkpoint step it resumed from; none when it started "
                                                      "fresh (or was adopted, not started, by the operator).")
    startTime: str | None = None
    reason: str | None = Field(None, description="Why the attempt started at a shape other than the last "
                                                 "one's (elastic stages: TopologyShrunk or TopologyGrown, "
                                                 "with what caused it).")
    endTime: str | None = Field(None, description="When the operator saw the attempt end (its job gone or "
                                                  "failed), for its GPU-hours.")
    gpuHours: float | None = Field(None, description="The attempt's GPUs x the time from its start to its end "
                                                     "(or to now while it runs), as the operator saw them.")
    nodeNames: list[str] | None = Field(None, description="The nodes its pods were seen bound to (a failed "
                                                          "attempt whose node is gone or lost was disrupted, even "
                                                          "when its pods went before the operator saw why).")


class ElasticStatus(Doc):
    """An elastic training stage's shape now and what its changes cost."""
    nodes: int = Field(description="The node count the current (or next) attempt runs at.")
    changedAt: str | None = Field(None, description="When the shape last changed.")
    unschedulableSince: str | None = Field(None, description="Since when the current attempt's pods have "
                                                             "been seen unschedulable.")
    nextReason: str | None = Field(None, description="Why the next attempt starts at another shape (moved "
                                                     "to that attempt's record when it starts).")
    shrinks: int = 0
    grows: int = 0
    disruptedAt: str | None = Field(None, description="When the last disruption began (the pod's DisruptionTarget "
                                                      "or its node's loss, whichever was first; an unschedulable "
                                                      "shrink: when it was decided); cleared once it is recovered.")
    disruptedAttempt: int | None = Field(None, description="The attempt it replaced: a later attempt's first step "
                                                           "past the checkpoint it resumed recovers it.")
    disruptionSeconds: float = Field(0.0, description="Seconds disruptions cost so far: from each loss to the "
                                                      "first step past the newest checkpoint at the new shape.")


class StageStatus(Doc):
    name: str
    phase: Phase = "Pending"
    job: str | None = None
    attempt: int = 0
    failures: int = 0
    startTime: str | None = None
    completionTime: str | None = None
    admittedTime: str | None = Field(None, description="When its queue admitted the current attempt's job "
                                                       "(the progress deadline runs from then).")
    checkpoint: CheckpointStatus | None = None
    validation: ValidationStatus | None = None
    message: str | None = None
    reason: str | None = None
    memory: MemoryStatus | None = None
    usage: StageUsage | None = None
    attempts: list[StageAttempt] | None = Field(
        None, description="Every attempt's topology: a suspended or failed stage may resume at another shape "
                          "with the same global batch (its GPU time per launch is in usage); the last 50.")
    attemptsDropped: int | None = Field(None, description="Attempts left out of attempts[] (it keeps the last 50).")
    elastic: ElasticStatus | None = Field(None, description="Elastic training stages (spec.topology.elastic).")
    rewoundTo: int | None = Field(None, description="The step the stage's set rewinds it to (checkpoint.mode="
                                                    "full_resume, checkpoint.path), once that rewind is done: later "
                                                    "attempts resume the newest checkpoint.")


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
    backend: Literal["PyTorchJob", "TrainJob"] | None = Field(
        None, description="The job kind of this run's stages, fixed when it was validated.")
    topology: StatusTopology | None = None
    gpuHours: float | None = Field(None, description="GPU time of every stage's launches so far (queueing and "
                                                     "suspended time excluded), from their run-result.json.")
    stages: list[StageStatus] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    jobsToDelete: list[str] | None = Field(
        None, description="Jobs a final verdict (ProgressDeadlineExceeded) still deletes: written with the "
                          "verdict, before they go, and cleared once they are gone.")

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
    """A pydantic ValidationError as one line: the dotted field and what is wrong with it. An unknown
    field comes first (a misspelt key is also reported missing under its right name), with the known
    field of that mapping it is closest to, at any depth; a value outside a fixed set (``family``) with
    the choice it is closest to; a quoted number or boolean with what the CRD declares."""
    import difflib

    from solar.config.messages import choices_at, did_you_mean, model_at

    root = globals().get(exc.title)
    root = root if isinstance(root, type) and issubclass(root, BaseModel) else SolarRun
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    dotted = lambda loc: ".".join([p for p in [prefix] if p] + [str(part) for part in loc])  # noqa: E731
    where = dotted(first["loc"])
    if unknown:
        parent, name = first["loc"][:-1], str(first["loc"][-1])
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == parent]
        owner = model_at(root, tuple(parent))
        known = [f for f in (owner.model_fields if owner is not None else ()) if f not in missing]
        close = difflib.get_close_matches(name, missing, n=1) or difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {dotted((*parent, close[0]))}?)" if close else \
            f" (known: {', '.join(missing + known)})" if missing + known else ""
        return f"{where}: unknown field{hint}"
    value = first.get("input")
    choices = choices_at(root, tuple(first["loc"])) if first["type"] == "literal_error" else []
    if choices and isinstance(value, str):
        return f"{where}: {value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"
    declared = {"int_type": "an integer", "bool_type": "a boolean (true or false)"}.get(first["type"])
    if declared and (isinstance(value, (str, float)) or first["type"] == "int_type" and isinstance(value, bool)):
        kind = "a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool) else "a fraction"
        fix = _unquoted(value, first["type"])
        return f"{where}: {value!r} is {kind}; the SolarRun CRD declares {declared}{fix}"
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _unquoted(value, kind: str) -> str:
    """How to write a quoted number or boolean as the CRD types it."""
    text = str(value).strip()
    if kind == "int_type" and isinstance(value, str) and text.lstrip("+-").isdigit():
        return f": write {int(text)} without quotes"
    if kind == "int_type" and isinstance(value, float) and value.is_integer():
        return f": write {int(value)}"
    if kind == "bool_type" and isinstance(value, str) and text.lower() in ("true", "false", "yes", "no", "on", "off"):
        return f": write {'true' if text.lower() in ('true', 'yes', 'on') else 'false'} without quotes"
    return ""
