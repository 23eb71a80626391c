"""The predictor's documents: a model's facts, the engine settings of a start, coefficient sets, predictions.

All serialise with camelCase keys (`model_dump(by_alias=True)`), as they appear in the seed's facts line,
the shipped coefficient files, the operator's ConfigMap and `stoker predict --json`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from stoker.inpod.facts import (
    MAX_CHECKPOINT_BYTES,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_IMPORT_PAGES_BYTES,
    MAX_LAYERS,
    MAX_TOKENIZER_BYTES,
    MAX_VOCABULARY,
    MAX_WIDTH,
)
from stoker.phases import ENGINE_PHASES, CompileCache

CoefficientSource = Literal["shipped", "fleet"]
# Where checkpointBytes came from when not from the weight files' sizes.
CheckpointBytesSource = Literal["indexMetadata", "seedLog"]

# `<gpu product>_x<gpu count>_v<major.minor>`: the GPU product label never contains `_`.
_HARDWARE_KEY = re.compile(r"^(?P<product>[^_\s]+)_x(?P<count>\d+)_v(?P<version>\d+\.\d+)$")
_MAJOR_MINOR = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+.]\S*)?$")

# The model facts' physical ranges are the seed's (stoker.inpod.facts), which refuses to print facts outside
# them: one definition for both.
# A start's phase, and all of them together: longer than any start a deployment would wait for.
MAX_PHASE_SECONDS = 6 * 3600.0
MAX_CAPTURE_SIZES = 1 << 12
MAX_TENSOR_PARALLEL = 1 << 10
# `bfloat16`, `float8_e4m3fn`, `torch.float16`, `auto`: a short identifier, nothing else.
_DTYPE = r"^[A-Za-z][A-Za-z0-9_.]{0,31}$"
# A start's label is `<namespace>/<pod>#<restarts>`.
MAX_LABEL_LENGTH = 63 + 1 + 253 + 1 + 10
# Starts kept per namespace and hardware class (the operator keeps fewer: `coefficients_observations`).
MAX_NAMESPACE_STARTS = 50
_SHORT_TEXT = 64
# The host facts' physical ranges: the seed's workload (stoker.inpod.host) takes ~0.1 s on a current core
# and more than a minute on none; a volume reads between 100 kB/s (a starved network share) and 1 TB/s
# (beyond any disk: a read that fast came from memory); a GPU holds at most a few TiB.
MAX_CPU_SECONDS = 60.0
MIN_DISK_BYTES_PER_SECOND = 1e5
MAX_DISK_BYTES_PER_SECOND = 1e12
MAX_GPU_MEMORY_BYTES = 1 << 42

PhaseSeconds = Annotated[float, Field(ge=0.0, le=MAX_PHASE_SECONDS, allow_inf_nan=False)]


class _Document(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    def to_json_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class HostFacts(_Document):
    """What the phases scale with on the host a start ran on (`stoker.inpod.host.measure_host`); each
    fact is absent where it was not measured."""

    # Wall seconds of the seed's fixed single-thread Python workload: the CPU-bound phases scale with it.
    cpu_seconds: float | None = Field(
        default=None, gt=0.0, le=MAX_CPU_SECONDS, allow_inf_nan=False, exclude_if=lambda value: value is None
    )
    # One reader's sequential read of the checkpoint's volume: weight loading from the disk scales with it.
    disk_bytes_per_second: float | None = Field(
        default=None,
        ge=MIN_DISK_BYTES_PER_SECOND,
        le=MAX_DISK_BYTES_PER_SECOND,
        allow_inf_nan=False,
        exclude_if=lambda value: value is None,
    )
    gpu_product: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[^_\s]+$",
        exclude_if=lambda value: value is None,
    )
    gpu_memory_bytes: int | None = Field(
        default=None, ge=0, le=MAX_GPU_MEMORY_BYTES, exclude_if=lambda value: value is None
    )
    gpu_count: int | None = Field(
        default=None, ge=0, le=MAX_TENSOR_PARALLEL, exclude_if=lambda value: value is None
    )


class ModelFacts(_Document):
    """What `read_model_facts` reads from a model directory, and the host facts the seed measured next to
    it (`host`, absent from a directory read elsewhere, e.g. by `stoker predict`)."""

    checkpoint_bytes: int = Field(ge=0, le=MAX_CHECKPOINT_BYTES)
    layers: int = Field(ge=0, le=MAX_LAYERS)
    hidden_size: int = Field(ge=0, le=MAX_WIDTH)
    intermediate_size: int = Field(ge=0, le=MAX_WIDTH)
    attention_heads: int = Field(ge=0, le=MAX_HEADS)
    kv_heads: int = Field(ge=0, le=MAX_HEADS)
    vocab_size: int = Field(ge=0, le=MAX_VOCABULARY)
    tokenizer_bytes: int = Field(ge=0, le=MAX_TOKENIZER_BYTES)
    moe: bool
    experts: int = Field(ge=0, le=MAX_EXPERTS)
    dtype: str | None = Field(default=None, pattern=_DTYPE)
    checkpoint_bytes_source: CheckpointBytesSource | None = Field(
        default=None, exclude_if=lambda source: source is None
    )
    # What the seed recorded of the image's files that a cold start's imports read (its `--pages` listing).
    import_pages_bytes: int | None = Field(
        default=None, ge=0, le=MAX_IMPORT_PAGES_BYTES, exclude_if=lambda size: size is None
    )
    host: HostFacts | None = Field(default=None, exclude_if=lambda host: host is None)


class EngineSettings(_Document):
    """What a start's `vllm serve` invocation sets that moves its phases (`engine_settings` reads it)."""

    loader: str = Field(default="auto", max_length=_SHORT_TEXT)
    compiled: bool = True
    capture_sizes: int = Field(ge=0, le=MAX_CAPTURE_SIZES)
    tensor_parallel: int = Field(default=1, ge=1, le=MAX_TENSOR_PARALLEL)
    sleep_mode: bool = False
    # Expected (or, for an observed start, logged) compile-cache state: none when nothing is compiled.
    cache_state: CompileCache
    # A kept compile cache (a seeded volume) was there at start. A miss with one differs from a miss
    # without: vLLM's CPU runner never loads a kept cache, yet its warm model-info and Inductor caches
    # spare most of the work (bench/results/predictor-cpu-regime-diagnosis.txt).
    kept_cache: bool = False
    # VLLM_WORKER_MULTIPROC_METHOD=fork: the engine process is forked instead of spawned (imports once).
    forked_engine: bool = False
    # The read-ahead wrapper (stoker.render.prefetch) pulls the checkpoint into the page cache while vLLM
    # imports: the imports share the disk with it, and the weight loader then reads memory.
    read_ahead: bool = False
    # ...held back to one reader with one request in flight until the engine process exists (its gentle
    # phase), so that the imports' page faults do not queue behind it.
    gentle_read_ahead: bool = False
    # ...after the pages the seed recorded of a cold start's imports (`--pages`): the imports find them in
    # memory, and the engine process's start shares the disk with the rest of the checkpoint.
    import_pages: bool = False
    # ...running vLLM with Python's garbage collector off until its engine process starts (`--gc
    # deferred`): the imports and the engine start skip ~1,600 collections of a growing heap.
    deferred_gc: bool = False
    # vLLM loads its mega AOT artifact (VLLM_USE_MEGA_AOT_ARTIFACT, or the release's default): on a cache hit
    # it replaces Dynamo's tracing, and the log has no Dynamo phase.
    mega_aot_artifact: bool = False
    # The weights came (observed) or are expected to come from a running replica through ModelExpress, not
    # from storage: the weight phase is then a network transfer, not a read of the disk.
    weights_from_peer: bool = False
    # The vLLM release the argv was read for: its phases are the ones predicted, whichever set is used.
    engine_version: str | None = Field(default=None, max_length=_SHORT_TEXT)


class HardwareClass(_Document):
    """Where coefficients hold: the GPU product label (`cpu`, count 0, for CPU builds), GPUs per replica,
    engine major.minor."""

    # A node label's value is at most 63 characters.
    gpu_product: str = Field(min_length=1, max_length=63, pattern=r"^[^_\s]+$")
    gpu_count: int = Field(ge=0, le=MAX_TENSOR_PARALLEL)
    engine_version: str = Field(max_length=_SHORT_TEXT)

    @field_validator("engine_version")
    @classmethod
    def _major_minor(cls, version: str) -> str:
        found = _MAJOR_MINOR.match(version.strip())
        if found is None:
            raise ValueError(f"engine version {version!r} is not X.Y or X.Y.Z")
        return f"{found.group(1)}.{found.group(2)}"

    @property
    def key(self) -> str:
        """Stable and usable as a file name and a ConfigMap key, e.g. `NVIDIA-H100-80GB-HBM3_x1_v0.26`."""
        return f"{self.gpu_product}_x{self.gpu_count}_v{self.engine_version}"

    @classmethod
    def from_key(cls, key: str) -> HardwareClass:
        found = _HARDWARE_KEY.match(key.strip())
        if found is None:
            raise ValueError(
                f"hardware key {key!r} is not <gpu product>_x<gpu count>_v<major.minor>"
                " (e.g. NVIDIA-H100-80GB-HBM3_x1_v0.26, cpu_x0_v0.26)"
            )
        return cls(
            gpu_product=found.group("product"),
            gpu_count=int(found.group("count")),
            engine_version=found.group("version"),
        )


class PhaseFit(_Document):
    """seconds = intercept + sum(weight x feature); `samples` starts behind it (prior ones included)."""

    intercept: float
    weights: dict[str, float] = Field(default_factory=dict)
    samples: int = Field(ge=0)


class Observation(_Document):
    """One observed start: the model, the settings it ran with, and its parsed engine phases (seconds)."""

    facts: ModelFacts
    settings: EngineSettings
    phases: dict[str, PhaseSeconds]
    # Where it came from (a benchmark's shape/profile/repetition, a pod), for people reading the set.
    label: str | None = Field(default=None, max_length=MAX_LABEL_LENGTH)

    @model_validator(mode="after")
    def _a_start(self) -> Observation:
        unknown = sorted(set(self.phases) - set(ENGINE_PHASES))
        if unknown:
            raise ValueError(f"phases {unknown} are not engine phases ({', '.join(ENGINE_PHASES)})")
        total = sum(self.phases.values())
        if not 0.0 < total <= MAX_PHASE_SECONDS:
            raise ValueError(f"the phases add up to {total:.1f} s, not within (0, {MAX_PHASE_SECONDS:.0f}] s")
        return self


class CoefficientSet(_Document):
    """Per phase, per regime (see `stoker.predict.predictor.regime_of`), one linear fit."""

    hardware: str
    source: CoefficientSource
    phases: dict[str, dict[str, PhaseFit]]
    # What the fit saw, in words (shape names, a note); the observations themselves when shipped.
    fitted_on: list[str] = Field(default_factory=list)
    observations: list[Observation] = Field(default_factory=list)
    # The host the fits hold for: a start on another host is predicted scaled by their host facts
    # (stoker.predict.predictor.host_factor), and a start observed on another host is fitted scaled back.
    host: HostFacts | None = Field(default=None, exclude_if=lambda host: host is None)


class Prediction(_Document):
    """Expected engine phases in the order the engine runs them; their sum is the total."""

    phases: dict[str, float]
    total_seconds: float
    # The hardware key of the coefficient set used, and where that set came from.
    coefficient_set: str
    source: CoefficientSource
    # Phases whose regime the set has no fit for, with the regime whose fit stood in.
    fallbacks: dict[str, str] = Field(default_factory=dict)


class NamespaceStarts(_Document):
    """One namespace's observed starts of one hardware class, as the coefficients ConfigMap keeps them:
    the newest ones, oldest first, and when they were last written (unix seconds), which decides what
    goes first when the ConfigMap is full."""

    updated_at: float = Field(ge=0.0, allow_inf_nan=False)
    observations: list[Observation] = Field(max_length=MAX_NAMESPACE_STARTS)
