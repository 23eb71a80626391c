"""Pydantic models of the VLLMService custom resource: the single source of truth for its CRD schema.

Cross-field rules exist twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the API server)
and as pydantic validators (for `stoker render` without a cluster). Both sit on the same class and share
the message text, so they are read and changed together.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict, JsonValue

from stoker.api.flags import (
    API_KEY_ENV,
    API_KEY_REGEX,
    FIRST_ARG_REGEX,
    JSON_LONG_FLAGS,
    JSON_SHORT_FLAGS,
    OWNED_FLAG_REGEX,
    OWNED_JSON_KEYS,
    OWNED_LONG_FLAGS,
    OWNED_SHORT_FLAGS,
    sets_api_key,
    sets_owned_flag,
)
from stoker.engines import (
    DEFAULT_ENGINE_VERSION,
    VERSION_PATTERN,
    EngineProfile,
    UnsupportedEngineVersion,
    profile_for,
    resolve_engine_version,
)

GROUP = "stoker.dev"
VERSION = "v1alpha1"
KIND = "VLLMService"
PLURAL = "vllmservices"
SINGULAR = "vllmservice"
SHORT_NAMES = ["vsvc"]
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = f"ghcr.io/stoker-dev/stoker-vllm:{DEFAULT_ENGINE_VERSION}"
DEFAULT_CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64]

# The seed Job is named `<name>-seed-<10 hex>` and its pods carry that name in a 63-character label.
MAX_NAME_LENGTH = 47

# Environment variables stoker sets on the engine container; a user value would split seed and serving
# pods or move the caches off the volume.
OWNED_ENV = (
    "VLLM_CACHE_ROOT",
    "VLLM_ASSETS_CACHE",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "VLLM_SERVER_DEV_MODE",
    "STOKER_CONTROL_TOKEN",
)

# Kubernetes' resource.Quantity pattern.
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^(\+|-)?{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"


def _int_to_str(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Quantity = Annotated[
    str,
    BeforeValidator(_int_to_str),
    Field(pattern=QUANTITY_PATTERN),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
FreeFormObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _validations(*rules: JsonDict) -> JsonDict:
    """json_schema_extra that becomes the CRD's `x-kubernetes-validations` for this object."""
    rule_list: list[JsonValue] = list(rules)
    return {"x-kubernetes-validations": rule_list}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# ---------------------------------------------------------------------------------------------- spec


class SecretKeyRef(_Model):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field(default="token", min_length=1, max_length=253)


class SecretRef(_Model):
    name: str = Field(min_length=1, max_length=253)


class HuggingFaceSource(_Model):
    """Weights from the Hugging Face hub; the token secret is needed for gated models only."""

    token_secret_ref: SecretKeyRef | None = None


_PATH_ESCAPES = "path must not contain '..' segments"
_PARENT_SEGMENT = "(^|/)[.][.](/|$)"


class PVCSource(_Model):
    """Weights on an existing claim, mounted read-only; `path` is the model directory inside it."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(f"!self.path.matches('{_PARENT_SEGMENT}')", _PATH_ESCAPES, ".path")
        )
    )

    claim_name: str = Field(min_length=1, max_length=253)
    path: str = Field(default="/", max_length=1024)

    @model_validator(mode="after")
    def _no_parent_segments(self) -> PVCSource:
        if re.search(_PARENT_SEGMENT, self.path):
            raise ValueError(_PATH_ESCAPES)
        return self


class S3Source(_Model):
    """Weights streamed from object storage by the Run:ai streamer (`s3://bucket/prefix`)."""

    uri: str = Field(pattern=r"^s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?$", max_length=1024)
    credentials_secret_ref: SecretRef | None = Field(
        default=None, description="Secret whose keys (AWS_ACCESS_KEY_ID, ...) become environment variables."
    )
    endpoint: str | None = Field(
        default=None, max_length=1024, description="AWS_ENDPOINT_URL, for S3-compatible stores."
    )


_ONE_SOURCE = "exactly one of huggingFace, pvc or s3 must be set"


class ModelSource(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "(has(self.huggingFace) ? 1 : 0) + (has(self.pvc) ? 1 : 0) + (has(self.s3) ? 1 : 0) == 1",
                _ONE_SOURCE,
            )
        )
    )

    hugging_face: HuggingFaceSource | None = None
    pvc: PVCSource | None = None
    s3: S3Source | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if sum(source is not None for source in (self.hugging_face, self.pvc, self.s3)) != 1:
            raise ValueError(_ONE_SOURCE)
        return self


_NAME_IS_FLAG = "model.name must not start with '-' (vLLM would read it as a flag)"
_SERVED_NAME_IS_FLAG = "model.servedModelName must not start with '-' (vLLM would read it as a flag)"


class ModelSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel("!self.name.startsWith('-')", _NAME_IS_FLAG, ".name"),
            _cel(
                "!has(self.servedModelName) || !self.servedModelName.startsWith('-')",
                _SERVED_NAME_IS_FLAG,
                ".servedModelName",
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model id (e.g. meta-llama/Llama-3.1-8B-Instruct); the default served model name.",
    )
    revision: str | None = Field(default=None, min_length=1, max_length=256)
    served_model_name: str | None = Field(default=None, min_length=1, max_length=256)
    source: ModelSource = Field(default_factory=lambda: ModelSource(hugging_face=HuggingFaceSource()))

    @model_validator(mode="after")
    def _not_flags(self) -> ModelSpec:
        if self.name.startswith("-"):
            raise ValueError(_NAME_IS_FLAG)
        if self.served_model_name is not None and self.served_model_name.startswith("-"):
            raise ValueError(_SERVED_NAME_IS_FLAG)
        return self


class Toleration(_Model):
    key: str | None = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class Resources(_Model):
    cpu: Quantity | None = None
    memory: Quantity | None = None


_VALUE_XOR_VALUE_FROM = "value and valueFrom are mutually exclusive"


class EnvVar(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel("!(has(self.value) && has(self.valueFrom))", _VALUE_XOR_VALUE_FROM)
        )
    )

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)
    value: str | None = Field(default=None, max_length=32768)
    value_from: FreeFormObject | None = Field(default=None, description="A core/v1 EnvVarSource.")

    @model_validator(mode="after")
    def _value_xor_value_from(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(_VALUE_XOR_VALUE_FROM)
        return self


_TP_DIVIDES_GPUS = "tensorParallelSize must divide gpus"
_NO_OWNED_FLAGS = (
    "extraArgs must not set flags stoker owns, in any spelling or abbreviation vLLM accepts: "
    + ", ".join(f"--{flag}" for flag in OWNED_LONG_FLAGS)
    + "".join(f", -{flag}" for flag in OWNED_SHORT_FLAGS)
    + "".join(f", --{flag} as a JSON value" for flag in JSON_LONG_FLAGS)
    + "".join(f" or the dotted keys -{flag}.{{{','.join(OWNED_JSON_KEYS)}}}" for flag in JSON_SHORT_FLAGS)
)
_FIRST_ARG_IS_FLAG = "extraArgs must start with a flag (a bare value would extend stoker's own last flag)"
_NO_OWNED_ENV = "env must not set variables stoker owns: " + ", ".join(OWNED_ENV)
_UNIQUE_ENV = "env names must be unique"


def _quoted_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


class RuntimeSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "!has(self.tensorParallelSize) || self.gpus % self.tensorParallelSize == 0",
                _TP_DIVIDES_GPUS,
                ".tensorParallelSize",
            ),
            _cel(
                f"!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('{OWNED_FLAG_REGEX}'))",
                _NO_OWNED_FLAGS,
                ".extraArgs",
            ),
            _cel(
                f"!has(self.extraArgs) || size(self.extraArgs) == 0"
                f" || self.extraArgs[0].matches('{FIRST_ARG_REGEX}')",
                _FIRST_ARG_IS_FLAG,
                ".extraArgs",
            ),
            _cel(
                f"!has(self.env) || self.env.all(e, !(e.name in {_quoted_list(OWNED_ENV)}))",
                _NO_OWNED_ENV,
                ".env",
            ),
            _cel(
                "!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
                _UNIQUE_ENV,
                ".env",
            ),
        )
    )

    image: str = Field(default=DEFAULT_IMAGE, min_length=1, max_length=512)
    engine_version: str | None = Field(
        default=None,
        pattern=VERSION_PATTERN,
        max_length=32,
        description="vLLM version of the image (e.g. 0.26.0); defaults to the version in the image's tag."
        " Flags, environment, the cache key and log parsing follow it; a version stoker does not support"
        " is an error (Ready=False, InvalidSpec), never a guess.",
    )
    replicas: int = Field(default=1, ge=0, le=1000)
    gpus: int = Field(default=1, ge=1, le=16, description="GPUs per replica.")
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=16, description="Defaults to gpus.")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    resources: Resources = Field(default_factory=Resources)
    max_model_len: int | None = Field(default=None, ge=1, le=16_777_216)
    gpu_memory_utilization: float | None = Field(default=None, ge=0.05, le=1.0)
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(default_factory=list, max_length=64)
    env: list[EnvVar] = Field(default_factory=list, max_length=64)

    @property
    def effective_tensor_parallel_size(self) -> int:
        return self.tensor_parallel_size or self.gpus

    @property
    def resolved_engine_version(self) -> str:
        return resolve_engine_version(self.engine_version, self.image)

    @property
    def engine_profile(self) -> EngineProfile:
        return profile_for(self.resolved_engine_version)

    @model_validator(mode="after")
    def _supported_engine(self) -> RuntimeSpec:
        try:
            resolve_engine_version(self.engine_version, self.image)
        except UnsupportedEngineVersion as error:
            raise ValueError(str(error)) from None
        return self

    @model_validator(mode="after")
    def _cross_field(self) -> RuntimeSpec:
        if self.tensor_parallel_size and self.gpus % self.tensor_parallel_size:
            raise ValueError(_TP_DIVIDES_GPUS)
        if any(sets_owned_flag(arg) for arg in self.extra_args):
            raise ValueError(_NO_OWNED_FLAGS)
        if self.extra_args and not re.match(FIRST_ARG_REGEX, self.extra_args[0]):
            raise ValueError(_FIRST_ARG_IS_FLAG)
        names = [env.name for env in self.env]
        if set(names) & set(OWNED_ENV):
            raise ValueError(_NO_OWNED_ENV)
        if len(set(names)) != len(names):
            raise ValueError(_UNIQUE_ENV)
        return self


_STREAMER_ONLY = "concurrency and memoryLimitBytes apply only to format runai_streamer"


class LoaderSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "self.format == 'runai_streamer' || (!has(self.concurrency) && !has(self.memoryLimitBytes))",
                _STREAMER_ONLY,
            )
        )
    )

    format: Literal["runai_streamer", "auto", "safetensors", "fastsafetensors"] = "runai_streamer"
    concurrency: int | None = Field(
        default=None, ge=1, le=256, description="Streamer reader threads (streamer default: 16)."
    )
    memory_limit_bytes: int | None = Field(
        default=None, ge=-1, description="Streamer CPU buffer cap in bytes; -1 = unlimited."
    )

    @model_validator(mode="after")
    def _streamer_only(self) -> LoaderSpec:
        if self.format != "runai_streamer" and (
            self.concurrency is not None or self.memory_limit_bytes is not None
        ):
            raise ValueError(_STREAMER_ONLY)
        return self


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class CompileCacheSpec(_Model):
    """The volume behind VLLM_CACHE_ROOT (torch.compile, Triton, Inductor and model-info caches)."""

    enabled: bool = True
    size: Quantity = "20Gi"
    storage_class_name: str | None = Field(default=None, max_length=253)
    access_mode: AccessMode = "ReadWriteMany"
    retention_policy: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description=(
            "What happens to the cache PVC when the VLLMService is deleted. Retain (the default, as for a"
            " StatefulSet's volumes): the PVC carries no owner reference and stays, and the next VLLMService"
            " of the same name in the namespace takes it back and skips the seed if the cache key it"
            " records matches. Delete: the PVC is garbage-collected with the VLLMService."
        ),
    )


class ModelCacheSpec(_Model):
    """A volume for HF_HOME: weights are downloaded once and served offline afterwards."""

    enabled: bool = False
    size: Quantity = "40Gi"
    storage_class_name: str | None = Field(default=None, max_length=253)
    access_mode: AccessMode = "ReadWriteMany"


_ONE_GRAPH_SETTING = "exactly one of captureSizes, maxCaptureSize or mode must be set"
_SORTED_SIZES = "captureSizes must be strictly increasing (sorted, no duplicates)"


class CudaGraphsSpec(_Model):
    """CUDA-graph capture: an explicit size list, a maximum size, or eager mode (no graphs, no compile)."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "(has(self.captureSizes) ? 1 : 0) + (has(self.maxCaptureSize) ? 1 : 0)"
                " + (has(self.mode) ? 1 : 0) == 1",
                _ONE_GRAPH_SETTING,
            ),
            _cel(
                "!has(self.captureSizes) || (self.captureSizes.isSorted()"
                " && self.captureSizes.all(s, self.captureSizes.exists_one(t, t == s)))",
                _SORTED_SIZES,
                ".captureSizes",
            ),
        )
    )

    capture_sizes: list[Annotated[int, Field(ge=1, le=8192)]] | None = Field(
        default=None, min_length=1, max_length=64
    )
    max_capture_size: int | None = Field(default=None, ge=1, le=8192)
    mode: Literal["eager"] | None = None

    @model_validator(mode="after")
    def _one_setting(self) -> CudaGraphsSpec:
        settings = (self.capture_sizes, self.max_capture_size, self.mode)
        if sum(setting is not None for setting in settings) != 1:
            raise ValueError(_ONE_GRAPH_SETTING)
        if self.capture_sizes is not None and any(
            a >= b for a, b in zip(self.capture_sizes, self.capture_sizes[1:], strict=False)
        ):
            raise ValueError(_SORTED_SIZES)
        return self


class SeedSpec(_Model):
    enabled: bool = Field(default=True, description="Compile into the cache once, in a Job, before serving.")
    gate_rollout: bool = Field(
        default=True, description="Hold serving pods at 0 until the seed Job succeeded."
    )


class StandbySpec(_Model):
    """Extra replicas kept started and Ready but asleep (vLLM sleep mode), out of the Service, and woken when
    the active replica count rises. Level 1 keeps the weights in the pod's CPU memory, so the pod needs
    host memory for them (`runtime.resources.memory`)."""

    replicas: int = Field(
        default=1, ge=0, le=100, description="Sleeping replicas kept beside the active ones."
    )
    level: Literal[1] = Field(
        default=1, description="vLLM sleep level; 1 offloads weights to CPU memory and drops the KV cache."
    )
    wake_timeout_seconds: int = Field(
        default=30, ge=1, le=600, description="A pod not served after this long is replaced, not served."
    )


class ColdStartSpec(_Model):
    loader: LoaderSpec = Field(default_factory=LoaderSpec)
    compile_cache: CompileCacheSpec = Field(default_factory=CompileCacheSpec)
    model_cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec)
    cuda_graphs: CudaGraphsSpec = Field(
        default_factory=lambda: CudaGraphsSpec(capture_sizes=list(DEFAULT_CAPTURE_SIZES))
    )
    seed: SeedSpec = Field(default_factory=SeedSpec)
    standby: StandbySpec | None = Field(
        default=None,
        description="Sleeping standby replicas. Setting it (even with replicas 0) adds --enable-sleep-mode,"
        " which is part of the compile-cache key, to the seed and every pod.",
    )


_MODEL_CACHE_NEEDS_HF = "coldStart.modelCache applies only to model.source.huggingFace"
_S3_NEEDS_STREAMER = "model.source.s3 needs coldStart.loader.format runai_streamer or auto"
_S3_FORMATS = ("runai_streamer", "auto")
# The operator's wake-up check sends a completion without a key; a key would fail every wake (401).
_STANDBY_API_KEY = "coldStart.standby does not work with an API key: remove --api-key from runtime.extraArgs"
_STANDBY_API_KEY_ENV = (
    f"coldStart.standby does not work with an API key: remove {API_KEY_ENV} from runtime.env"
)


class VLLMServiceSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "!self.coldStart.modelCache.enabled || has(self.model.source.huggingFace)",
                _MODEL_CACHE_NEEDS_HF,
                ".coldStart.modelCache.enabled",
            ),
            _cel(
                f"!has(self.model.source.s3) || self.coldStart.loader.format in {_quoted_list(_S3_FORMATS)}",
                _S3_NEEDS_STREAMER,
                ".coldStart.loader.format",
            ),
            _cel(
                "!has(self.coldStart.standby) || !has(self.runtime.extraArgs)"
                f" || self.runtime.extraArgs.all(a, !a.matches('{API_KEY_REGEX}'))",
                _STANDBY_API_KEY,
                ".runtime.extraArgs",
            ),
            _cel(
                "!has(self.coldStart.standby) || !has(self.runtime.env)"
                f" || self.runtime.env.all(e, e.name != '{API_KEY_ENV}')",
                _STANDBY_API_KEY_ENV,
                ".runtime.env",
            ),
        )
    )

    model: ModelSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    cold_start: ColdStartSpec = Field(default_factory=ColdStartSpec)

    @model_validator(mode="after")
    def _cross_field(self) -> VLLMServiceSpec:
        if self.cold_start.model_cache.enabled and self.model.source.hugging_face is None:
            raise ValueError(_MODEL_CACHE_NEEDS_HF)
        if self.model.source.s3 is not None and self.cold_start.loader.format not in _S3_FORMATS:
            raise ValueError(_S3_NEEDS_STREAMER)
        if self.cold_start.standby is not None:
            if any(sets_api_key(arg) for arg in self.runtime.extra_args):
                raise ValueError(_STANDBY_API_KEY)
            if any(var.name == API_KEY_ENV for var in self.runtime.env):
                raise ValueError(_STANDBY_API_KEY_ENV)
        return self


# -------------------------------------------------------------------------------------------- status


class _StatusModel(BaseModel):
    # Status is written by the controller and read back; unknown fields from newer versions are ignored.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_StatusModel):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


class CacheStatus(_StatusModel):
    key: str | None = None
    seeded_key: str | None = None
    seeded_at: datetime | None = None
    last_hit: bool | None = None


class StartupRecord(_StatusModel):
    """One replica's (or seed run's) start: engine phases plus scheduling/imagePull/containerStart.

    totalSeconds counts from process start to `Starting vLLM server`; the Kubernetes phases precede it.
    """

    pod: str | None = None
    total_seconds: float | None = None
    compile_cache: Literal["hit", "miss", "none"] | None = None
    compile_cache_reason: Literal["loadFailed"] | None = Field(
        default=None,
        description="Why a miss: loadFailed means a kept compile cache was there but could not be loaded.",
    )
    engine_version: str | None = Field(
        default=None, max_length=64, description="vLLM version the log announced, else the spec's."
    )
    phases: dict[str, float] = Field(default_factory=dict)
    cache_key: str | None = Field(default=None, description="Short compile-cache key of the pod.")
    pod_template_hash: str | None = Field(
        default=None,
        max_length=64,
        description="The pod's ReplicaSet (pod-template-hash); `last` is cleared once no pod of it runs.",
    )
    failed: bool | None = None
    reason: str | None = None
    finished_at: datetime | None = None


class StartupSample(_StatusModel):
    """A parsed container start; (uid, restarts) identifies it so each start is parsed once."""

    pod: str
    uid: str
    restarts: int = 0
    pod_template_hash: str | None = Field(default=None, max_length=64)
    total_seconds: float | None = None
    compile_cache: Literal["hit", "miss", "none"] | None = None


class StartupSummary(_StatusModel):
    samples: int = 0
    p50_total_seconds: float | None = None
    max_total_seconds: float | None = None


class StartupStatus(_StatusModel):
    last: StartupRecord | None = None
    seed: StartupRecord | None = None
    recent: StartupSummary | None = None
    history: list[StartupSample] = Field(default_factory=list, max_length=100)


class PodRole(_StatusModel):
    """A serving pod's role: active pods are behind the Service, standby pods are not."""

    pod: str
    role: Literal["active", "standby"]
    asleep: bool = False


class WakeRecord(_StatusModel):
    """The last standby wake: seconds from POST /wake_up to each step, ending at a served completion."""

    pod: str
    wake_seconds: float | None = None
    health_seconds: float | None = None
    served_seconds: float | None = Field(default=None, description="Wake to first served completion.")
    failed: bool | None = None
    reason: str | None = None
    at: datetime | None = None


class StandbyStatus(_StatusModel):
    pods: list[PodRole] = Field(default_factory=list, max_length=1100)
    last_wake: WakeRecord | None = None


class VLLMServiceStatus(_StatusModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int | None = None
    ready_replicas: int | None = None
    standby_replicas: int | None = Field(default=None, description="Standby pods asleep.")
    selector: str | None = None
    cache: CacheStatus | None = None
    startup: StartupStatus | None = None
    standby: StandbyStatus | None = None


# ------------------------------------------------------------------------------------------ resource

_DNS_1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NAME_RULES = [
    _cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters (child names add a suffix)",
    ),
    _cel(
        f"self.metadata.name.matches('{_DNS_1035}')",
        "metadata.name must be a DNS-1035 label (it names a Service)",
    ),
]


class VLLMService(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        json_schema_extra=_validations(*_NAME_RULES),
    )

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VLLMServiceSpec
    status: VLLMServiceStatus | None = None

    @model_validator(mode="after")
    def _valid_name(self) -> VLLMService:
        name = self.metadata.get("name")
        if name is not None and (len(name) > MAX_NAME_LENGTH or not re.fullmatch(_DNS_1035, name)):
            raise ValueError(
                f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters"
            )
        return self

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str | None:
        namespace = self.metadata.get("namespace")
        return str(namespace) if namespace else None
