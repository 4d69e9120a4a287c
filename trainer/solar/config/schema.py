"""The run configuration schema (``schema: solar.run.v1``): one pydantic model per block.

Every block forbids unknown keys and non-finite numbers and is strict about types (``"8"`` is not
an int). Fields that only some actions or routes read default to ``None``; ``solar.config.resolve``
fills the route's defaults and rejects values the route would silently ignore. Cross-field and
per-family rules live in ``contracts.py`` and ``topology.py``, not here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from solar.config.families import ALIASES
from solar.config.messages import format_validation_error
from solar.errors import ConfigError

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")]
PassName = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")]
PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Weights = Literal["live", "ema"]


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                              validate_default=True, populate_by_name=False)


# --- model -------------------------------------------------------------------------------------

class DimsBlock(Block):
    """Overrides of the profile's backbone dimensions (unset fields keep the profile's value)."""

    num_layers: PosInt | None = Field(None, description="Transformer blocks.")
    hidden_size: PosInt | None = Field(None, description="Residual stream width.")
    num_heads: PosInt | None = Field(None, description="Self-attention heads (SP must divide it).")
    head_dim: PosInt | None = Field(None, description="Channels per attention head.")
    ffn_dim: PosInt | None = Field(None, description="Feed-forward hidden width.")
    text_dim: PosInt | None = Field(None, description="Prompt embedding width.")
    freq_dim: PosInt | None = Field(None, description="Sinusoidal timestep embedding width.")


class LoraBlock(Block):
    rank: PosInt = Field(384, description="LoRA rank r.")
    alpha: Annotated[float, Field(gt=0)] = Field(384.0, description="LoRA alpha (scale alpha/r).")
    targets: list[Literal["q", "k", "v", "o", "ffn"]] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "ffn"],
        min_length=1, description="Linear layers of each block that get adapters.")
    dropout: Fraction = Field(0.0, description="Dropout on the adapter input.")


class CausalBlock(Block):
    """Chunked causal attention for teacher forcing and autoregressive generation."""

    chunk_latents: PosInt | None = Field(None, description="Latents per chunk (Wan 3, H3 5).")
    max_prior_clean_chunks: PosInt | None = Field(
        None, description="Clean chunks a noisy chunk may attend to (5).")
    kv_cache_latents: PosInt | None = Field(
        None, description="Attention window of chunk-by-chunk generation, current chunk included.")


class ModelBlock(Block):
    family: Literal["wan22_ti2v_5b", "wan22_i2v_a14b", "ltx25_video", "minimax_h3"] = Field(
        description="Backbone family (aliases wan2.2-ti2v-5b, wan2.2-i2v-a14b, ltx-2.5, minimax-h3).")
    profile: Literal["released", "tiny"] = Field(
        "released", description="Dimension profile: published dims or a CPU-sized twin.")
    dims: DimsBlock | None = Field(None, description="Overrides of the profile's dims.")
    pretrained_path: str | None = Field(
        None, description="Base weights used when checkpoint.mode is none (and the base of LoRA routes): "
                          "a Solar export or checkpoint directory (its EMA where it has one) or one of its "
                          "model/*.safetensors files, a `solar model convert` directory or a diffusers release "
                          "(docs/base-model.md); null initialises randomly from train.seed.")
    vae_path: str | None = Field(
        None, description="VAE weights for decoding validation and inference videos; null builds a "
                          "randomly initialised codec (tiny profiles only).")
    camera_translation_transform: Literal["linear", "logd4"] = Field(
        description="Camera translation transform applied inside the model (H3 requires logd4).")
    camera_intrinsics_mode: Literal["wan_fixed"] = Field(
        "wan_fixed", description="Intrinsics used for PRoPE (fixed Wan intrinsics, principal point zeroed).")
    training_mode: Literal["full", "lora"] | None = Field(
        None, description="Full-parameter training or LoRA (default: the family's released recipe).")
    lora: LoraBlock | None = Field(None, description="LoRA adapter settings (training_mode lora).")
    timestep_shift: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Shift of the sigma grid (Wan 5B 5, A14B 3, H3 video 12; LTX has none).")
    audio_timestep_shift: Annotated[float, Field(gt=0)] | None = Field(
        None, description="H3 only: shift of the audio branch's grid (3).")
    causal: CausalBlock | None = Field(None, description="Causal chunking (Stage1/Stage2 routes).")
    anyflow_gate: Fraction | None = Field(
        None, description="AnyFlow routes: weight of the endpoint embedding, (1-g)*emb(t) + g*emb(r) (0.25).")
    attention_backend: Literal["auto", "sdpa", "flex", "reference"] = Field(
        "auto", description="Attention implementation chosen once at build time.")
    sdpa_kernel: Literal["flash", "efficient", "cudnn", "math"] | None = Field(
        None, description="Pin torch SDPA to one kernel (default: torch's choice).")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="Compute dtype (auto: bfloat16 on CUDA, float32 on CPU).")
    fp8_linear: Literal["off", "tensorwise", "rowwise"] = Field(
        "off", description="FP8 training of the transformer blocks' attention and FFN linear layers through "
                           "torchao's float8 recipe of this name (opt-in; needs the fp8 extra, CUDA with compute "
                           "capability >= 8.9 and bf16 compute, not LoRA). Applies to every DiT a training run "
                           "builds: the trained model and its forwards without grad (Stage1), Stage2's roles and "
                           "frozen teacher. Embeddings, modulation and the output projection stay bf16, as do "
                           "validation generation and solar infer. Master weights stay fp32.")

    @field_validator("family", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        if isinstance(value, str):
            return ALIASES.get(value.strip().lower(), value)
        return value

    @field_validator("fp8_linear", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare off as false


# --- data --------------------------------------------------------------------------------------

class DataBlock(Block):
    root: str | None = Field(None, description="Dataset root; shards resolve under it.")
    train_index: str | None = Field(None, description="Training index (relative to root or absolute).")
    test_index: str | None = Field(None, description="Test index for validation and inference.")
    negative_prompt: str | None = Field(
        None, description="Negative prompt embedding (safetensors, relative to root) for guided "
                          "targets and classifier-free guidance.")
    pixel_frames: PosInt = Field(description="Pixel frames per clip (the family/stage frame profile).")
    height: PosInt = Field(description="Pixel height of a clip.")
    width: PosInt = Field(description="Pixel width of a clip.")
    fps: Annotated[float, Field(gt=0)] | None = Field(None, description="Frames per second of the clips.")
    sampling: Literal["global_occurrence", "node_shard"] = Field(
        "global_occurrence", description="How occurrences are assigned to logical DP readers.")
    shuffle_buffer: NonNegInt = Field(64, description="Shuffle buffer per reader (0: index order).")
    random_start: bool = Field(False, description="Draw each clip's start frame at random.")
    num_workers: PosInt = Field(1, description="Reader workers per rank.")
    seed: NonNegInt | None = Field(None, description="Data plan seed (default: train.seed).")
    max_relative_translation: Annotated[float, Field(gt=0)] = Field(
        20.0, description="Camera guard: max relative translation norm in the first guard seconds.")
    max_camera_abs: Annotated[float, Field(gt=0)] = Field(
        20.0, description="Camera guard: max absolute entry of the rebased camera.")
    camera_guard_seconds: Annotated[float, Field(gt=0)] = Field(
        10.0, description="Seconds from the clip start the camera guards look at.")


# --- distributed -------------------------------------------------------------------------------

class DistributedBlock(Block):
    world_size: PosInt = Field(description="Raw ranks (torchrun's WORLD_SIZE must equal it).")
    sequence_parallel_size: PosInt = Field(
        1, description="Ulysses SP degree; divides world_size and the head count.")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Process-group backend (auto: nccl on CUDA, gloo on CPU).")
    sharding: Literal["none", "full_shard", "hybrid_shard"] = Field(
        "none", description="FSDP2 parameter sharding (GPU only).")
    activation_checkpointing: bool = Field(False, description="Recompute block activations in backward.")
    activation_checkpointing_policy: Literal["full", "save_attention"] = Field(
        "full", description="full: recompute whole blocks; save_attention: keep the attention kernels' outputs "
                            "(one activation per block) and recompute the rest.")
    activation_checkpointing_skip_blocks: NonNegInt | Literal["auto"] = Field(
        0, description="The last N blocks keep all their activations (memory for speed); auto: at launch, "
                       "the most blocks the memory forecast lets this GPU and topology keep with a margin.")
    timeout_seconds: PosInt = Field(1800, description="Collective timeout before a rank gives up.")


# --- train -------------------------------------------------------------------------------------

class OptimizerBlock(Block):
    name: Literal["adamw"] = Field("adamw", description="AdamW with fp32 master weights.")
    lr: Annotated[float, Field(gt=0)] = Field(description="Peak learning rate.")
    betas: list[Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        default_factory=lambda: [0.9, 0.95], min_length=2, max_length=2, description="Adam betas.")
    eps: Annotated[float, Field(gt=0)] = Field(1e-8, description="Adam epsilon.")
    weight_decay: Annotated[float, Field(ge=0)] = Field(0.0, description="Decoupled weight decay.")
    grad_clip: Annotated[float, Field(gt=0)] | None = Field(None, description="Max global grad norm.")
    warmup_steps: NonNegInt = Field(0, description="Linear warmup steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Decay after warmup, over train.max_steps.")
    min_lr_ratio: Fraction = Field(1.0, description="Final lr as a fraction of lr (decaying schedules).")


class EmaBlock(Block):
    enabled: bool = Field(True, description="Keep an fp32 EMA shadow of the trainable weights.")
    decay: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(0.9999, description="EMA decay.")
    start_step: NonNegInt = Field(
        0, description="First update that feeds the EMA (Stage2: counted in student updates).")
    warmup_steps: NonNegInt = Field(0, description="Updates with decay 0 (shadow = live) after start.")


class FlowMatchingBlock(Block):
    """Flow-matching settings; which fields apply depends on the family (contracts.FM_FIELDS)."""

    weighting: Literal["gaussian", "uniform"] | None = Field(
        None, description="Loss weight over t (Wan: gaussian).")
    image_condition_dropout: Fraction | None = Field(
        None, description="Probability the first-latent image condition is dropped (Wan 0.1).")
    timestep_sampling: Literal["uniform", "shifted_logit_normal"] | None = Field(
        None, description="How training timesteps are drawn (LTX: shifted_logit_normal).")
    logit_normal_std: Annotated[float, Field(gt=0)] | None = Field(None, description="LTX: std (1).")
    logit_normal_eps: Annotated[float, Field(gt=0, lt=0.5)] | None = Field(
        None, description="LTX: clamp of t away from 0 and 1 (1e-3).")
    uniform_probability: Fraction | None = Field(
        None, description="LTX: share of uniformly drawn timesteps (0.1).")
    keyframe_anchor_t: Fraction | None = Field(
        None, description="H3: time level held by the keyframe anchor (0.999).")
    audio_loss_weight: Annotated[float, Field(ge=0)] | None = Field(
        None, description="H3: weight of the audio loss (0: encoded silence only conditions).")


class AnyFlowBlock(Block):
    guidance_scale: Annotated[float, Field(ge=1.0)] | None = Field(
        None, description="Wan: guidance g of the fused target (3); H3 is unguided.")
    central_difference_epsilon: Annotated[float, Field(gt=0)] = Field(
        5.0, description="Central-difference step along v, in raw timestep units.")
    diffusion_ratio: Fraction = Field(0.5, description="Share of diffusion samples (r = t).")
    consistency_ratio: Fraction = Field(0.25, description="Share of consistency samples (r = 0).")
    rescale_non_diffusion: bool = Field(
        True, description="Rescale non-diffusion losses by mean(diffusion losses)/loss.")
    trained_latents: PosInt | None = Field(
        None, description="Latents that carry loss (H3: the first 45); null: all.")


class SgfBlock(Block):
    critic_updates_per_student: PosInt = Field(5, description="Outer steps per student update.")
    denoising_steps: list[Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=lambda: [1000, 750, 500, 250], min_length=1,
        description="Timesteps of the student's few-step rollout (descending).")
    score_timestep_min: Annotated[float, Field(ge=0, le=1000)] = Field(20.0, description="Score noise min.")
    score_timestep_max: Annotated[float, Field(ge=0, le=1000)] = Field(980.0, description="Score noise max.")
    real_guidance_scale: Annotated[float, Field(ge=1.0)] | None = Field(
        None, description="Wan: CFG of the teacher's real score (3); H3 is unguided.")
    rollout_latents: PosInt | None = Field(None, description="Latents rolled out (Wan 21, H3 50).")
    supervised_latents: PosInt | None = Field(None, description="Latents supervised (Wan 21, H3 47).")
    critic_optimizer: OptimizerBlock | None = Field(None, description="The critic's optimizer.")


class TrainBlock(Block):
    stage: Literal["stage0p5", "stage1", "stage2"] = Field(description="Recipe stage.")
    causal_mode: Literal["bidirectional", "teacher_forcing", "self_gradient_forcing"] = Field(
        description="Attention layout of the stage.")
    objective: Literal["flow_matching", "anyflow_forward_map", "native_rectified_flow"] = Field(
        description="Training objective.")
    objective_variant: str | None = Field(None, description="Objective variant (AnyFlow: v1_5).")
    micro_batch_size: PosInt | None = Field(None, description="Clips per rank per micro-batch (1).")
    gradient_accumulation: PosInt | None = Field(None, description="Micro-batches per optimizer step (1).")
    global_batch_size: PosInt | None = Field(
        None, description="Clips per optimizer step; must equal dp x micro x accumulation.")
    max_steps: PosInt | None = Field(None, description="Last optimizer step (the LR schedule horizon).")
    seed: NonNegInt | None = Field(None, description="Base seed (42).")
    optimizer: OptimizerBlock | None = Field(None, description="Optimizer of the trained model.")
    ema: EmaBlock | None = Field(None, description="EMA of the trained weights.")
    fm: FlowMatchingBlock | None = Field(None, description="Flow-matching settings.")
    anyflow: AnyFlowBlock | None = Field(None, description="AnyFlow settings (Stage1 AnyFlow).")
    sgf: SgfBlock | None = Field(None, description="DMD via SGF settings (Stage2).")


# --- validation, checkpoint, inference, runtime ------------------------------------------------

class PassBlock(Block):
    name: PassName = Field(description="Pass name; also its directory name.")
    weights: Literal["live", "ema", "model"] = Field(
        description="Weights generating the pass (model: a released package's default role).")
    solver: Literal["unipc", "euler", "flowmap", "self_forcing"] = Field(description="Sampler.")
    steps: PosInt = Field(description="Solver steps (NFE).")


class ValidationBlock(Block):
    passes: list[PassBlock] = Field(default_factory=list, description="Generation passes.")
    sample_count: PosInt | None = Field(None, description="Test rows selected for validation.")
    selection_seed: NonNegInt = Field(42, description="Seed of the test-row selection.")
    noise_seed: NonNegInt = Field(42, description="Seed of the per-slot noise identities.")
    rollout_latents: PosInt | None = Field(None, description="Latents generated per slot.")
    decode_latents: PosInt | None = Field(None, description="Latents decoded to video (H3 47).")
    guidance_scale: Annotated[float, Field(ge=1.0)] | None = Field(
        None, description="Classifier-free guidance of bidirectional sampling (LTX 3).")
    decode_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="The VAE decode of slots: auto = bf16 on a GPU (50.6 dB PSNR against fp32 "
                            "on the released Wan 2.2 decoder's shape, 1.6x faster), fp32 on the CPU.")


class RoleSource(Block):
    path: str = Field(description="Source checkpoint directory.")
    weights: Weights = Field(description="Which weights of the source: live or ema.")


class RolesBlock(Block):
    student: RoleSource | None = Field(None, description="Stage2 student (Stage1 AnyFlow EMA).")
    teacher: RoleSource | None = Field(None, description="Frozen teacher (Stage0.5 FM).")
    critic: RoleSource | None = Field(None, description="Trainable critic (same source as teacher).")


class CheckpointBlock(Block):
    mode: Literal["none", "weights_only", "full_resume", "roles"] | None = Field(
        None, description="none | weights_only | full_resume | roles (train); infer loads weights.")
    path: str | None = Field(None, description="Source checkpoint directory.")
    weights: Weights | None = Field(
        None, description="live or ema (infer: default from release-manifest.json).")
    roles: RolesBlock | None = Field(None, description="Per-role sources (checkpoint.mode roles).")
    accept_changes: list[str] = Field(
        default_factory=list, description="full_resume: the recipe keys (dotted, e.g. train.optimizer.lr) this "
                                          "resume may change; each change is recorded (docs/resume.md).")


class InferenceBlock(Block):
    sample_count: PosInt | None = Field(None, description="LTX: test rows generated.")
    length: Literal["fixed", "camera"] = Field(
        "fixed", description="camera: each sample's longest whole-chunk rollout its camera supports "
                             "(Wan Stage2).")


class RuntimeBlock(Block):
    output_dir: str = Field(description="Run directory (new or empty unless resuming).")
    save_every: NonNegInt = Field(0, description="Save every N optimizer steps (0: never).")
    save_every_seconds: Annotated[float, Field(ge=0)] = Field(
        0.0, description="Also save once this many seconds of training have passed on rank 0's clock since the "
                         "launch's first step or the last save (every rank saves at the same step; combinable with "
                         "save_every; 0: off). docs/resume.md sizes it from a save's cost and the failure rate.")
    validate_every: NonNegInt = Field(0, description="Validate every N optimizer steps (0: never).")
    save_steps: list[PosInt] = Field(default_factory=list, description="Extra save steps.")
    validation_steps: list[PosInt] = Field(default_factory=list, description="Extra validation steps.")
    exit_after_step: PosInt | None = Field(
        None, description="Save at this step and exit cleanly (status stopped) for a later resume.")
    checkpoint_on_stop: bool | None = Field(
        None, description="Save a checkpoint on SIGTERM/SIGINT (default true for training).")
    stop_grace_seconds: Annotated[float, Field(gt=0)] = Field(
        120.0, description="Seconds to finish or abandon a step after a stop signal.")
    log_every: PosInt = Field(1, description="Print progress every N steps.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Device (auto: cuda if present).")
    deterministic: bool = Field(False, description="Deterministic algorithms (bit-exact CPU resume).")
    compile: bool = Field(False, description="torch.compile each block.")
    profile_steps: list[PosInt] = Field(
        default_factory=list, description="Profile these optimizer steps with torch.profiler; each rank writes "
                                          "profile/rank-NNNNN-step-NNNNNNNN.txt/.json (GPU time by phase, kernel "
                                          "and operator) in the run directory. Off when empty.")
    async_checkpoint: bool = Field(
        False, description="Copy checkpoint state to reused (pinned) host buffers, write it in a background "
                           "thread and commit when every rank's files are written; training goes on meanwhile.")


class RunConfig(Block):
    schema_version: Literal["solar.run.v1"] = Field(alias="schema", description="Config schema.")
    action: Literal["train", "infer"] = Field(description="train or infer; must equal the CLI verb.")
    name: Name = Field(description="Run name (lowercase DNS-style).")
    model: ModelBlock
    data: DataBlock
    distributed: DistributedBlock
    train: TrainBlock
    validation: ValidationBlock = Field(default_factory=ValidationBlock)
    checkpoint: CheckpointBlock = Field(default_factory=CheckpointBlock)
    inference: InferenceBlock | None = Field(None, description="Inference settings (action infer).")
    runtime: RuntimeBlock
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form labels; not read.")


def validate_tree(tree: dict[str, Any]) -> RunConfig:
    """The run config a loaded (and expanded) tree describes; a schema error is one ConfigError line."""
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, RunConfig, tree)) from None
