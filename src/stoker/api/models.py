"""Pydantic models of the VLLMService custom resource: the single source of truth for its CRD schema.

Cross-field rules exist twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the API server)
and as pydantic validators (for `stoker render` without a cluster). Both sit on the same class and share
the message text, so they are read and changed together; the validator raises FieldError with the field the
CEL rule names (`fieldPath`), so that both refusals name the same field.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict, JsonValue

from stoker.api.errors import FieldError
from stoker.api.flags import (
    API_KEY_ENV,
    API_KEY_REGEX,
    FIRST_ARG_REGEX,
    JSON_LONG_FLAGS,
    JSON_SHORT_FLAGS,
    LAYOUT_FLAG_REGEX,
    LAYOUT_LONG_FLAGS,
    LAYOUT_SHORT_FLAGS,
    OPTIMIZATION_LEVELS,
    OWNED_FLAG_REGEX,
    OWNED_JSON_KEYS,
    OWNED_LONG_FLAGS,
    OWNED_SHORT_FLAGS,
    sets_api_key,
    sets_owned_flag,
)
from stoker.api.owned import (
    OWNED_ANNOTATIONS,
    OWNED_KEY_PREFIX,
    OWNED_LABELS,
    OWNED_MOUNT_PATHS,
    OWNED_VOLUMES,
    owned_annotation,
    owned_label,
    shadows_owned_path,
)
from stoker.engines import (
    DEFAULT_ENGINE_VERSION,
    VERSION_PATTERN,
    EngineProfile,
    UnsupportedEngineVersion,
    profile_for,
    resolve_engine_version,
)
from stoker.engines.serve_options import check_extra_args

GROUP = "stoker.dev"
VERSION = "v1alpha1"
KIND = "VLLMService"
PLURAL = "vllmservices"
SINGULAR = "vllmservice"
SHORT_NAMES = ["vsvc"]
API_VERSION = f"{GROUP}/{VERSION}"

# stoker's runtime image (Dockerfile, target runtime): vLLM plus the streamer and InstantTensor.
RUNTIME_IMAGE_REPOSITORY = "ghcr.io/stoker-dev/stoker-vllm"
DEFAULT_IMAGE = f"{RUNTIME_IMAGE_REPOSITORY}:{DEFAULT_ENGINE_VERSION}"
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


def _cel_literal(regex: str) -> str:
    """`regex` inside a single-quoted CEL string: its backslashes escaped."""
    return regex.replace("\\", "\\\\")


def _refusing(regex: str, message: str) -> tuple[AfterValidator, Any]:
    """Validators of a string that `regex` must not find anything in: pydantic's and the CRD's."""

    def check(value: str) -> str:
        if re.search(regex, value):
            raise ValueError(message)
        return value

    cel = _cel(f"!self.matches('{_cel_literal(regex)}')", message)
    return AfterValidator(check), Field(json_schema_extra=_validations(cel))


# A value stoker passes on as an argument of vLLM's, in an environment variable or in a URL holds one line
# of printable text: a newline, NUL or escape there would split or end what a program or a person reads.
CONTROL_CHARACTER = r"[\x00-\x1f\x7f]"
_NO_CONTROL_CHARACTERS = "must not contain control characters (newline, tab, NUL, ...)"
SingleLine = Annotated[str, *_refusing(CONTROL_CHARACTER, _NO_CONTROL_CHARACTERS)]
# Free text (a chat template in an argument, a certificate in a variable) may span lines, but neither a
# process's arguments nor its environment can carry NUL.
_NO_NUL = "must not contain NUL characters (a process's arguments and environment cannot carry them)"
WithoutNul = Annotated[str, *_refusing(r"\x00", _NO_NUL)]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# ---------------------------------------------------------------------------------------------- spec


class SecretKeyRef(_Model):
    """One key of a Secret in the VLLMService's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    key: str = Field(default="token", min_length=1, max_length=253, description="Key inside the Secret.")


class SecretRef(_Model):
    """A Secret in the VLLMService's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")


class HuggingFaceSource(_Model):
    """Weights from the Hugging Face hub; the token secret is needed for gated models only."""

    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a Hugging Face token, exported as HF_TOKEN."
    )


_PATH_ESCAPES = "path must not contain '..' segments"
_PARENT_SEGMENT = "(^|/)[.][.](/|$)"


class PVCSource(_Model):
    """Weights on an existing claim, mounted read-only; `path` is the model directory inside it."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(f"!self.path.matches('{_PARENT_SEGMENT}')", _PATH_ESCAPES, ".path")
        )
    )

    claim_name: str = Field(
        min_length=1, max_length=253, description="PersistentVolumeClaim in the same namespace."
    )
    path: SingleLine = Field(default="/", max_length=1024, description="Model directory inside the claim.")

    @model_validator(mode="after")
    def _no_parent_segments(self) -> PVCSource:
        if re.search(_PARENT_SEGMENT, self.path):
            raise FieldError("path", _PATH_ESCAPES)
        return self


# http(s), a host name or [IPv6 address], an optional port and path of printable ASCII: no user info (the
# credentials are the Secret's), no spaces, no other scheme (file:// would read the pod's own files).
HTTP_URL = (
    r"^https?://([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[!-~]*)?$"
)
_ENDPOINT_IS_HTTP_URL = (
    "endpoint must be an http:// or https:// URL with a host, and no user info, spaces or control characters"
)


S3_URI_PATTERN = r"^s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?$"


class S3Source(_Model):
    """Weights streamed from object storage by the Run:ai streamer (`s3://bucket/prefix`)."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                f"!has(self.endpoint) || self.endpoint.matches('{_cel_literal(HTTP_URL)}')",
                _ENDPOINT_IS_HTTP_URL,
                ".endpoint",
            )
        )
    )

    uri: SingleLine = Field(
        pattern=S3_URI_PATTERN,
        max_length=1024,
        description="s3://bucket/prefix of the model directory.",
    )
    credentials_secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret whose keys (AWS_ACCESS_KEY_ID, ...) become environment variables; leave it"
        " out to use the pod's service account (pod.serviceAccountName: IRSA, workload identity).",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=1024,
        description="AWS_ENDPOINT_URL, for S3-compatible stores: http(s)://, a host, a port, a path.",
    )

    @model_validator(mode="after")
    def _endpoint_is_http_url(self) -> S3Source:
        if self.endpoint is not None and not re.fullmatch(HTTP_URL, self.endpoint):
            raise FieldError("endpoint", _ENDPOINT_IS_HTTP_URL)
        return self


_ONE_SOURCE = "exactly one of huggingFace, pvc or s3 must be set"


class ModelSource(_Model):
    """Where the weights come from: exactly one of huggingFace, pvc or s3."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "(has(self.huggingFace) ? 1 : 0) + (has(self.pvc) ? 1 : 0) + (has(self.s3) ? 1 : 0) == 1",
                _ONE_SOURCE,
            )
        )
    )

    hugging_face: HuggingFaceSource | None = Field(default=None, description="The Hugging Face hub.")
    pvc: PVCSource | None = Field(default=None, description="An existing PersistentVolumeClaim.")
    s3: S3Source | None = Field(default=None, description="S3 or an S3-compatible object store.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if sum(source is not None for source in (self.hugging_face, self.pvc, self.s3)) != 1:
            raise ValueError(_ONE_SOURCE)
        return self


_NAME_IS_FLAG = "model.name must not start with '-' (vLLM would read it as a flag)"
_SERVED_NAME_IS_FLAG = "model.servedModelName must not start with '-' (vLLM would read it as a flag)"
_REVISION_IS_FLAG = "model.revision must not start with '-' (vLLM would read it as a flag)"


class ModelSpec(_Model):
    """The model to serve and where its weights come from."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel("!self.name.startsWith('-')", _NAME_IS_FLAG, ".name"),
            _cel(
                "!has(self.servedModelName) || !self.servedModelName.startsWith('-')",
                _SERVED_NAME_IS_FLAG,
                ".servedModelName",
            ),
            _cel("!has(self.revision) || !self.revision.startsWith('-')", _REVISION_IS_FLAG, ".revision"),
        )
    )

    name: SingleLine = Field(
        min_length=1,
        max_length=256,
        description="Model id (e.g. meta-llama/Llama-3.1-8B-Instruct); the default served model name.",
    )
    revision: SingleLine | None = Field(
        default=None, min_length=1, max_length=256, description="Hub revision (branch, tag or commit)."
    )
    served_model_name: SingleLine | None = Field(
        default=None, min_length=1, max_length=256, description="Model name clients send; defaults to name."
    )
    source: ModelSource = Field(
        default_factory=lambda: ModelSource(hugging_face=HuggingFaceSource()),
        description="Where the weights come from; defaults to the Hugging Face hub.",
    )

    @model_validator(mode="after")
    def _not_flags(self) -> ModelSpec:
        if self.name.startswith("-"):
            raise FieldError("name", _NAME_IS_FLAG)
        if self.served_model_name is not None and self.served_model_name.startswith("-"):
            raise FieldError("servedModelName", _SERVED_NAME_IS_FLAG)
        if self.revision is not None and self.revision.startswith("-"):
            raise FieldError("revision", _REVISION_IS_FLAG)
        return self


class Toleration(_Model):
    """A core/v1 Toleration."""

    key: str | None = Field(default=None, max_length=317, description="Taint key; empty matches every key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Defaults to Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value, for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class Resources(_Model):
    """CPU and memory of the engine container (GPUs come from gpus)."""

    cpu: Quantity | None = Field(default=None, description="CPU request.")
    memory: Quantity | None = Field(
        default=None,
        description="Memory request and limit. Unset: a request only (no limit), 6 GiB plus 2 GiB per GPU"
        " for vLLM's host side, plus, in serving pods that read the checkpoint ahead or may sleep"
        " (standby level 1), the checkpoint's size once the seed has read it.",
    )


_VALUE_XOR_VALUE_FROM = "value and valueFrom are mutually exclusive"


ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class EnvVar(_Model):
    """An environment variable of the engine container (a core/v1 EnvVar)."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel("!(has(self.value) && has(self.valueFrom))", _VALUE_XOR_VALUE_FROM)
        )
    )

    name: str = Field(pattern=ENV_NAME_PATTERN, max_length=256, description="Variable name.")
    value: WithoutNul | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: FreeFormObject | None = Field(default=None, description="A core/v1 EnvVarSource.")

    @model_validator(mode="after")
    def _value_xor_value_from(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(_VALUE_XOR_VALUE_FROM)
        return self


_TP_DIVIDES_GPUS = "tensorParallelSize must divide gpus"
# The ranks of one replica: tensor x pipeline x data parallel. On one node they share its pod's GPUs; across
# nodes (a LeaderWorkerSet group) every GPU of the group holds one rank, the same number on every node.
_RANKS = "tensorParallelSize x pipelineParallelSize x dataParallelSize"
_LAYOUT_ON_ONE_NODE = f"{_RANKS} must divide gpus"
_LAYOUT_ACROSS_NODES = (
    f"with nodesPerReplica above 1, {_RANKS} must equal gpus x nodesPerReplica (every GPU of the group"
    " holds one rank; pipelineParallelSize defaults to nodesPerReplica, tensorParallelSize to gpus)"
)
_NODES_KIND_FIXED = (
    "nodesPerReplica cannot change between 1 and above 1: a replica on one node is a Deployment, one across"
    " nodes a LeaderWorkerSet; delete the VLLMService and create it again"
)
_NO_DATA_PARALLEL_ACROSS_NODES = (
    "dataParallelSize above 1 is not supported with nodesPerReplica above 1: spread a replica across nodes"
    " with pipeline or tensor parallel (each data-parallel rank of a group would need its own start rank)"
)
# CEL of the effective sizes (the properties of RuntimeSpec below).
_GPUS_CEL = "(has(self.gpus) ? self.gpus : 1)"
_TP_CEL = f"(has(self.tensorParallelSize) ? self.tensorParallelSize : {_GPUS_CEL})"
_DP_CEL = "(has(self.dataParallelSize) ? self.dataParallelSize : 1)"
_PP_CEL = (
    "(has(self.pipelineParallelSize) ? self.pipelineParallelSize"
    " : (has(self.nodesPerReplica) && self.nodesPerReplica > 1 ? self.nodesPerReplica : 1))"
)
_NODES_CEL = "(has(self.nodesPerReplica) ? self.nodesPerReplica : 1)"
_NO_OWNED_FLAGS = (
    "extraArgs must not set flags stoker owns, in any spelling or abbreviation vLLM accepts: "
    + ", ".join(f"--{flag}" for flag in (*OWNED_LONG_FLAGS, *LAYOUT_LONG_FLAGS))
    + "".join(f", -{flag}" for flag in (*OWNED_SHORT_FLAGS, *LAYOUT_SHORT_FLAGS))
    + "".join(
        f", --{flag} or -{short} as a JSON value"
        for flag, short in zip(JSON_LONG_FLAGS, JSON_SHORT_FLAGS, strict=True)
    )
    + f", -O other than -O{OPTIMIZATION_LEVELS[0]} to -O{OPTIMIZATION_LEVELS[-1]},"
    + f" or any argument naming {', '.join(OWNED_JSON_KEYS)}"
)
_FIRST_ARG_IS_FLAG = "extraArgs must start with a flag (a bare value would extend stoker's own last flag)"
_NO_OWNED_ENV = "env must not set variables stoker owns: " + ", ".join(OWNED_ENV)
_UNIQUE_ENV = "env names must be unique"
# render.pods puts the programs volume in front of the user's PYTHONPATH, which it must be able to read.
_LITERAL_PYTHONPATH = "env PYTHONPATH must be a value, not valueFrom: stoker puts its programs in front of it"


def _quoted_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


class RuntimeSpec(_Model):
    """How each replica runs: image, replica count, GPUs, placement, resources and engine options."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                f"{_NODES_CEL} > 1 || !has(self.tensorParallelSize)"
                f" || {_GPUS_CEL} % self.tensorParallelSize == 0",
                _TP_DIVIDES_GPUS,
                ".tensorParallelSize",
            ),
            _cel(
                f"{_NODES_CEL} > 1 || {_GPUS_CEL} % ({_TP_CEL} * {_PP_CEL} * {_DP_CEL}) == 0",
                _LAYOUT_ON_ONE_NODE,
                ".gpus",
            ),
            _cel(
                f"{_NODES_CEL} == 1 || {_TP_CEL} * {_PP_CEL} * {_DP_CEL} == {_GPUS_CEL} * {_NODES_CEL}",
                _LAYOUT_ACROSS_NODES,
                ".nodesPerReplica",
            ),
            _cel(f"{_NODES_CEL} == 1 || {_DP_CEL} == 1", _NO_DATA_PARALLEL_ACROSS_NODES, ".dataParallelSize"),
            # A transition rule (oldSelf): the API server checks it on updates only; stoker would otherwise
            # have to delete the workload of the other kind, which it is not allowed to.
            _cel(
                f"({_NODES_CEL.replace('self', 'oldSelf')} > 1) == ({_NODES_CEL} > 1)",
                _NODES_KIND_FIXED,
                ".nodesPerReplica",
            ),
            *(
                _cel(
                    f"!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('{regex}'))",
                    _NO_OWNED_FLAGS,
                    ".extraArgs",
                )
                for regex in (OWNED_FLAG_REGEX, LAYOUT_FLAG_REGEX)
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
            _cel(
                "!has(self.env) || self.env.all(e, e.name != 'PYTHONPATH' || !has(e.valueFrom))",
                _LITERAL_PYTHONPATH,
                ".env",
            ),
        )
    )

    image: SingleLine = Field(
        default=DEFAULT_IMAGE, min_length=1, max_length=512, description="vLLM image; part of the cache key."
    )
    engine_version: str | None = Field(
        default=None,
        pattern=VERSION_PATTERN,
        max_length=32,
        description="vLLM version of the image (e.g. 0.26.0); defaults to the version in the image's tag."
        " Flags, environment, the cache key and log parsing follow it; a version stoker does not support"
        " is an error (Ready=False, InvalidSpec), never a guess.",
    )
    replicas: int = Field(
        default=1, ge=0, le=1000, description="Serving replicas (the scale subresource sets it)."
    )
    gpus: int = Field(
        default=1, ge=1, le=16, description="GPUs per pod: per replica, or per node of a multi-node replica."
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="--tensor-parallel-size; defaults to gpus."
    )
    pipeline_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="--pipeline-parallel-size; defaults to nodesPerReplica (pipeline stages across nodes,"
        " tensor parallel within each).",
    )
    data_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="--data-parallel-size: engines of one replica, each with tensor x pipeline parallel"
        " ranks; defaults to 1. One node only.",
    )
    expert_parallel: bool = Field(
        default=False,
        description="--enable-expert-parallel: a mixture of experts' experts spread over the tensor and"
        " data parallel ranks instead of each expert split by tensor parallel.",
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pods, one per node, of each replica. Above 1 a replica is a LeaderWorkerSet group"
        " (leaderworkerset.x-k8s.io, its controller must run in the cluster) running vLLM's own multi-node"
        " processes, no Ray: the leader serves, the others run --headless; every pod has `gpus` GPUs."
        " The group is Ready when all its pods are, and restarts whole when one of them fails"
        " (docs/concepts/multi-node.md).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pods need. It picks the GPU model, so it is part of the cache key.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the seed and serving pods."
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory per replica.")
    max_model_len: int | None = Field(
        default=None, ge=1, le=16_777_216, description="--max-model-len: context length in tokens."
    )
    gpu_memory_utilization: float | None = Field(
        default=None, ge=0.05, le=1.0, description="--gpu-memory-utilization: share of GPU memory vLLM uses."
    )
    extra_args: list[Annotated[WithoutNul, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=64, description="More `vllm serve` arguments, after stoker's own."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Environment variables of the engine container."
    )

    @property
    def effective_tensor_parallel_size(self) -> int:
        return self.tensor_parallel_size or self.gpus

    @property
    def effective_pipeline_parallel_size(self) -> int:
        return self.pipeline_parallel_size or self.nodes_per_replica

    @property
    def effective_data_parallel_size(self) -> int:
        return self.data_parallel_size or 1

    @property
    def ranks(self) -> int:
        """Ranks (GPUs in use) of one replica."""
        return (
            self.effective_tensor_parallel_size
            * self.effective_pipeline_parallel_size
            * self.effective_data_parallel_size
        )

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
            raise FieldError("engineVersion", str(error)) from None
        return self

    @model_validator(mode="after")
    def _cross_field(self) -> RuntimeSpec:
        if self.nodes_per_replica == 1:
            if self.tensor_parallel_size and self.gpus % self.tensor_parallel_size:
                raise FieldError("tensorParallelSize", _TP_DIVIDES_GPUS)
            if self.gpus % self.ranks:
                raise FieldError("gpus", _LAYOUT_ON_ONE_NODE)
        else:
            if self.ranks != self.gpus * self.nodes_per_replica:
                raise FieldError("nodesPerReplica", _LAYOUT_ACROSS_NODES)
            if self.effective_data_parallel_size != 1:
                raise FieldError("dataParallelSize", _NO_DATA_PARALLEL_ACROSS_NODES)
        if any(sets_owned_flag(arg) for arg in self.extra_args):
            raise FieldError("extraArgs", _NO_OWNED_FLAGS)
        if self.extra_args and not re.match(FIRST_ARG_REGEX, self.extra_args[0]):
            raise FieldError("extraArgs", _FIRST_ARG_IS_FLAG)
        # The engine version decides which flags exist: a rule the CRD cannot hold, so the operator reports
        # it (Ready=False, InvalidSpec) before it creates anything, and `stoker render` refuses it.
        refused = check_extra_args(self.extra_args, self.resolved_engine_version)
        if refused is not None:
            raise FieldError(f"extraArgs[{refused.index}]", refused.message)
        names = [env.name for env in self.env]
        if set(names) & set(OWNED_ENV):
            raise FieldError("env", _NO_OWNED_ENV)
        if len(set(names)) != len(names):
            raise FieldError("env", _UNIQUE_ENV)
        if any(env.name == "PYTHONPATH" and env.value_from is not None for env in self.env):
            raise FieldError("env", _LITERAL_PYTHONPATH)
        return self


_STREAMER_ONLY = "concurrency and memoryLimitBytes apply only to format runai_streamer"
LoadFormat = Literal["runai_streamer", "instanttensor", "fastsafetensors", "safetensors", "auto"]


class LoaderSpec(_Model):
    """How serving pods load the weights (--load-format); nothing here is part of the cache key."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "!has(self.format) || self.format == 'runai_streamer'"
                " || (!has(self.concurrency) && !has(self.memoryLimitBytes))",
                _STREAMER_ONLY,
            )
        )
    )

    format: LoadFormat | None = Field(
        default=None,
        description="vLLM --load-format. Unset: instanttensor where the weights are on a volume and the image"
        " has it (stoker's runtime image; any vLLM image from 0.33), runai_streamer otherwise or when"
        " concurrency or memoryLimitBytes is set.",
    )
    concurrency: int | None = Field(
        default=None, ge=1, le=256, description="Streamer reader threads (streamer default: 16)."
    )
    memory_limit_bytes: int | None = Field(
        default=None, ge=-1, description="Streamer CPU buffer cap in bytes; -1 = unlimited."
    )
    read_ahead: bool | None = Field(
        default=None,
        description="Read the checkpoint on the volume into the page cache while vLLM imports Python, so"
        " that the loader reads memory, not a cold disk. Unset: on with instanttensor (which then reads"
        " buffered).",
    )

    @model_validator(mode="after")
    def _streamer_only(self) -> LoaderSpec:
        if self.format not in (None, "runai_streamer") and (
            self.concurrency is not None or self.memory_limit_bytes is not None
        ):
            raise ValueError(_STREAMER_ONLY)
        return self


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class _CacheVolumeSpec(_Model):
    """A cache PVC; subclasses set whether it is on by default and its size (fields keep this order)."""

    enabled: bool
    size: Quantity
    storage_class_name: str | None = Field(
        default=None, max_length=253, description="StorageClass of the PVC; the cluster default if unset."
    )
    access_mode: AccessMode = Field(
        default="ReadWriteMany", description="PVC access mode; ReadWriteMany lets replicas share it."
    )


class CompileCacheSpec(_CacheVolumeSpec):
    """The volume behind VLLM_CACHE_ROOT (torch.compile, Triton, Inductor and model-info caches)."""

    enabled: bool = Field(default=True, description="Keep the cache on a PVC; false uses an emptyDir.")
    size: Quantity = Field(default="20Gi", description="Requested size of the PVC.")
    retention_policy: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description=(
            "What happens to the cache PVC when the VLLMService is deleted. Retain (the default, as for a"
            " StatefulSet's volumes): the PVC carries no owner reference and stays, for this VLLMService"
            " alone; a later VLLMService of the same name takes it only with reuseRetained. Delete: the PVC"
            " is garbage-collected with the VLLMService."
        ),
    )
    reuse_retained: bool = Field(
        default=False,
        description=(
            "Take over the compile-cache PVC retained from a deleted VLLMService of this name. Admitted only"
            " from an author who may `use` that PersistentVolumeClaim (verb use, resource"
            " persistentvolumeclaims, name <name>-cache). The claim then belongs to this VLLMService and is"
            " seeded again, emptied first; without it such a claim is a conflict, never mounted."
        ),
    )


class ModelCacheSpec(_CacheVolumeSpec):
    """A volume for HF_HOME: weights are downloaded once and served offline afterwards."""

    enabled: bool = Field(default=False, description="Download into a PVC once (huggingFace source only).")
    size: Quantity = Field(default="40Gi", description="Requested size of the PVC.")


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
        default=None, min_length=1, max_length=64, description="Batch sizes to capture, increasing."
    )
    max_capture_size: int | None = Field(
        default=None, ge=1, le=8192, description="Capture vLLM's default sizes up to this batch size."
    )
    mode: Literal["eager"] | None = Field(
        default=None, description="eager: --enforce-eager, no CUDA graphs and no torch.compile."
    )

    @model_validator(mode="after")
    def _one_setting(self) -> CudaGraphsSpec:
        settings = (self.capture_sizes, self.max_capture_size, self.mode)
        if sum(setting is not None for setting in settings) != 1:
            raise ValueError(_ONE_GRAPH_SETTING)
        if self.capture_sizes is not None and any(
            a >= b for a, b in zip(self.capture_sizes, self.capture_sizes[1:], strict=False)
        ):
            raise FieldError("captureSizes", _SORTED_SIZES)
        return self


class SeedSpec(_Model):
    """The seed Job that fills the compile cache before serving pods start."""

    enabled: bool = Field(default=True, description="Compile into the cache once, in a Job, before serving.")
    gate_rollout: bool = Field(
        default=True, description="Hold serving pods at 0 until the seed Job succeeded."
    )


# Kubernetes' names and keys (object names here, and in spec.pod below).
_DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Absolute, no empty, "." or ".." segments and no trailing slash, so that prefix checks are exact.
_MOUNT_PATH = r"^(/([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+))+$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Label and annotation keys: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_1123_SUBDOMAIN)]


class SharedGpuSpec(_Model):
    """One GPU shared by sleeping engines through Dynamic Resource Allocation (resource.k8s.io/v1): every
    serving pod references the named ResourceClaim, so all of this service's engines, and those of every
    other VLLMService in the namespace naming the same claim, run on its one device. The operator starts
    one engine at a time on it and keeps awake only what its memory fits (the sum of the awake engines'
    runtime.gpuMemoryUtilization), putting one to sleep before waking another; set
    runtime.gpuMemoryUtilization so that the engines meant to be awake together fit."""

    resource_claim_name: ObjectName = Field(
        description="A ResourceClaim in the VLLMService's namespace asking for one device (e.g. of"
        " DeviceClass gpu.nvidia.com); created by its owner, not by stoker. Admission checks that the"
        " author may use it (create pods in the namespace, or `use` on resourceclaims of that name)."
    )


class StandbySpec(_Model):
    """Extra replicas kept started and Ready but asleep (vLLM sleep mode), out of the Service, and woken when
    the active replica count rises. Level 1 keeps the weights in the pod's CPU memory: the default memory
    request of serving pods counts them (`runtime.resources.memory`). With sharedGpu the engines share one
    GPU instead of having one each: `replicas` is then the number of engines on it in all, and
    runtime.replicas how many of them are awake."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=100,
        description="Sleeping replicas kept beside the active ones. With sharedGpu: the engines kept on the"
        " shared GPU in all, awake or asleep (runtime.replicas of them awake, at most this many).",
    )
    level: Literal[1] = Field(
        default=1, description="vLLM sleep level; 1 offloads weights to CPU memory and drops the KV cache."
    )
    wake_timeout_seconds: int = Field(
        default=30, ge=1, le=600, description="A pod not served after this long is replaced, not served."
    )
    shared_gpu: SharedGpuSpec | None = Field(
        default=None,
        description="Share one GPU, a DRA ResourceClaim's device, among sleeping engines instead of one GPU"
        " each. The Deployment runs `replicas` pods, each referencing the claim (no nvidia.com/gpu), so"
        " they and the engines of every other VLLMService in the namespace naming the same claim run on"
        " its one device; runtime.replicas of them are awake (0 allowed: all asleep), at most"
        " `replicas`. The operator starts one engine at a time on the GPU (pods wait behind the"
        " scheduling gate stoker.dev/gpu-share) and keeps awake only what its memory fits, the sum of"
        " the awake engines' runtime.gpuMemoryUtilization, putting one to sleep before waking another:"
        " set runtime.gpuMemoryUtilization accordingly. Needs runtime.gpus 1; the seed Job still takes"
        " a GPU of its own (nvidia.com/gpu).",
    )


class NodeWarmingSpec(_Model):
    """Keep this service's checkpoint and the seed's import pages in the page cache of every node its
    replicas can land on (runtime.nodeSelector, pod.affinity's required node affinity), through a
    DaemonSet `<name>-node-warmer` running the serving image, so that a new replica there reads its weights
    from memory and pulls no image. Within the operator's per-node budget (STOKER_NODE_WARMING_BUDGET_GIB),
    shared by every warming service in creation order; needs weights on a volume (a pvc source or
    coldStart.modelCache). The NodeWarming condition says what is warm, or why warming is skipped."""

    enabled: bool = Field(
        default=False,
        description="Warm the nodes the replicas can land on: the checkpoint and the import pages stay in"
        " their page cache (host memory, charged as page cache to the warmer pods; given back under memory"
        " pressure), and the serving image stays pulled there.",
    )


# The receive bound ModelExpress puts on one transfer from a peer (MX_TRANSFER_TIMEOUT), after which the
# replica loads from storage instead.
PEER_TRANSFER_TIMEOUT_SECONDS = (10, 120, 1800)


class PeerWeightsSpec(_Model):
    """Serving replicas take their weights from a Ready replica of this VLLMService (vLLM's `modelexpress`
    loader, over NIXL/UCX), and load from storage as coldStart.loader says when no peer answers. Every
    serving pod is then a source as well: stoker keeps one Service per tensor-parallel rank (no selector;
    its EndpointSlice lists the Ready serving pods of this service with the current cache key) and a
    NetworkPolicy admitting the peer ports from this service's pods only; the peer path has no
    authentication of its own (docs/concepts/peer-weights.md). The image needs the modelexpress and nixl
    packages. Not part of the cache key; the seed Job loads no weights and uses no peer."""

    enabled: bool = Field(
        default=False, description="Load weights from a Ready replica of this service when there is one."
    )
    transfer_timeout_seconds: int = Field(
        default=PEER_TRANSFER_TIMEOUT_SECONDS[1],
        ge=PEER_TRANSFER_TIMEOUT_SECONDS[0],
        le=PEER_TRANSFER_TIMEOUT_SECONDS[2],
        description="How long one transfer from a peer may take before the replica loads from storage"
        " instead (MX_TRANSFER_TIMEOUT); finding a peer and its handshake add at most 150 s more.",
    )


class ColdStartSpec(_Model):
    """What makes a replica start fast: weight loading, caches, CUDA graphs, seeding and standby."""

    loader: LoaderSpec = Field(default_factory=LoaderSpec, description="Weight loading.")
    compile_cache: CompileCacheSpec = Field(
        default_factory=CompileCacheSpec, description="The persistent VLLM_CACHE_ROOT volume."
    )
    model_cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec, description="The HF_HOME volume.")
    cuda_graphs: CudaGraphsSpec = Field(
        default_factory=lambda: CudaGraphsSpec(capture_sizes=list(DEFAULT_CAPTURE_SIZES)),
        description="CUDA-graph capture; part of the cache key.",
    )
    seed: SeedSpec = Field(default_factory=SeedSpec, description="The seed Job.")
    startup_plan: bool = Field(
        default=True,
        description="The seed persists vLLM's memory-profiling result on the cache volume and serving pods"
        " skip profiling (VLLM_ENABLE_STARTUP_PLAN, vLLM 0.26 and later; a pod whose GPU does not match"
        " profiles as usual). Not part of the cache key.",
    )
    standby: StandbySpec | None = Field(
        default=None,
        description="Sleeping standby replicas. Setting it (even with replicas 0) adds --enable-sleep-mode,"
        " which is part of the compile-cache key, to the seed and every pod.",
    )
    node_warming: NodeWarmingSpec = Field(
        default_factory=NodeWarmingSpec,
        description="Keep the checkpoint in the page cache of the nodes the replicas can land on"
        " (docs/concepts/node-warming.md). Not part of the cache key.",
    )
    peer_weights: PeerWeightsSpec = Field(
        default_factory=PeerWeightsSpec,
        description="Weights from a Ready replica of this service, storage as the fallback"
        " (docs/concepts/peer-weights.md). Not part of the cache key.",
    )


# ------------------------------------------------------------------------------------ inference pool


class EndpointPickerRef(_Model):
    """The endpoint picker (EPP) of the Gateway API Inference Extension that routes this pool's requests."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=_DNS_1123_LABEL,
        description="Name of the EPP's Service, in the VLLMService's namespace; never a Service of stoker's"
        " (this VLLMService's own is refused here, another's when read: condition ScaleFromZero).",
    )
    port: int = Field(
        default=9002,
        ge=1,
        le=65535,
        description="The EPP Service's port serving ext_proc gRPC (the gateway's).",
    )


class ScaleFromZeroSpec(_Model):
    """Scale from zero on queued requests: while runtime.replicas is 0, the operator reads the EPP's queue
    gauge (inference_extension_flow_control_queue_size for this pool; the EPP must run with flow control on,
    so that a request with no pod to go to waits instead of failing) and sets replicas to 1 as soon as a
    request waits. It never scales down: an autoscaler (KEDA, HPA) or the user does."""

    metrics_port: int = Field(
        default=9090,
        ge=1024,
        le=65535,
        description="Port of the EPP's Prometheus metrics (`--metrics-port`), read on the ready addresses of"
        " the EPP Service's EndpointSlices (pods of this namespace only); served without authentication"
        " (`--metrics-endpoint-auth=false`). Not a privileged port (1024 or above).",
    )


class InferencePoolSpec(_Model):
    """An InferencePool (inference.networking.k8s.io/v1) of this VLLMService's serving pods, for a gateway
    of the Gateway API Inference Extension. It has the VLLMService's name and selects the pods the Service
    does: with standby replicas, only the awake ones. Needs the InferencePool CRD in the cluster."""

    endpoint_picker: EndpointPickerRef = Field(description="The endpoint picker (EPP) the pool refers to.")
    scale_from_zero: ScaleFromZeroSpec | None = Field(
        default=None,
        description="Scale from 0 to 1 replica when a request waits in the EPP's queue for this pool.",
    )


# ----------------------------------------------------------------------------------------------- pod


class LocalObjectReference(_Model):
    """An object in the VLLMService's namespace, by name."""

    name: ObjectName = Field(description="Name of the object.")


class Affinity(_Model):
    """A core/v1 Affinity. Each part keeps Kubernetes' own shape (free-form here: the CRD would otherwise
    copy hundreds of lines of core/v1 schema); the API server checks it when stoker applies the pods."""

    node_affinity: FreeFormObject | None = Field(default=None, description="A core/v1 NodeAffinity.")
    pod_affinity: FreeFormObject | None = Field(default=None, description="A core/v1 PodAffinity.")
    pod_anti_affinity: FreeFormObject | None = Field(default=None, description="A core/v1 PodAntiAffinity.")


class TopologySpreadConstraint(_Model):
    """A core/v1 TopologySpreadConstraint of the serving pods."""

    max_skew: int = Field(ge=1, description="Largest allowed difference in matching pods between domains.")
    topology_key: str = Field(
        min_length=1, max_length=317, description="Node label that defines a domain (zone, hostname)."
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="What the scheduler does when the skew cannot be met."
    )
    label_selector: FreeFormObject | None = Field(
        default=None,
        description="A metav1.LabelSelector of the pods to count; defaults to this VLLMService's serving"
        " pods.",
    )
    match_label_keys: list[Annotated[str, Field(max_length=317)]] | None = Field(
        default=None, max_length=16, description="Pod label keys whose values narrow the selector."
    )
    min_domains: int | None = Field(default=None, ge=1, description="Minimum number of eligible domains.")
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether node affinity limits the domains counted."
    )
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether node taints limit the domains counted."
    )


class PodVolume(_Model):
    """A core/v1 Volume: `name` plus one volume source (configMap, secret, csi, emptyDir, ...) in
    Kubernetes' own shape, which the API server checks when stoker applies the pods."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    name: str = Field(max_length=63, pattern=_DNS_1123_LABEL, description="Volume name.")


class PodVolumeMount(_Model):
    """A mount of one of pod.volumes into the engine container."""

    name: str = Field(max_length=63, pattern=_DNS_1123_LABEL, description="Name of a volume in pod.volumes.")
    mount_path: str = Field(
        max_length=1024, pattern=_MOUNT_PATH, description="Absolute path in the container, no trailing '/'."
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None, max_length=1024, description="Path inside the volume to mount instead of its root."
    )


_OWNED_LABELS = (
    "pod.labels must not set keys stoker owns: "
    + ", ".join(OWNED_LABELS)
    + f" or any key under {OWNED_KEY_PREFIX}"
)
_OWNED_ANNOTATIONS = (
    "pod.annotations must not set keys stoker owns: "
    + ", ".join(OWNED_ANNOTATIONS)
    + f" or any key under {OWNED_KEY_PREFIX}"
)
_OWNED_VOLUMES = "pod.volumes must not be named like stoker's own volumes: " + ", ".join(OWNED_VOLUMES)
_UNIQUE_VOLUMES = "pod.volumes names must be unique"
_MOUNT_NEEDS_VOLUME = "pod.volumeMounts must each name a volume in pod.volumes"
_OWNED_MOUNT_PATHS = "pod.volumeMounts must not mount at, inside or above stoker's mount paths: " + ", ".join(
    OWNED_MOUNT_PATHS
)
_UNIQUE_MOUNT_PATHS = "pod.volumeMounts mount paths must be unique"


_QUALIFIED_KEYS = (
    "pod.labels and pod.annotations keys must be qualified names: an optional DNS-subdomain prefix and '/',"
    " then at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
)


def _qualified_keys_cel(field: str) -> str:
    return f"!has(self.{field}) || self.{field}.all(k, k.matches('{_QUALIFIED_NAME}'))"


def _owned_keys_cel(field: str, owned: tuple[str, ...]) -> str:
    return (
        f"!has(self.{field}) || self.{field}.all(k, !(k in {_quoted_list(owned)})"
        f" && !k.startsWith('{OWNED_KEY_PREFIX}'))"
    )


class PodSettings(_Model):
    """Fits the pods to a cluster: identity, image pulls, placement, priority, metadata and extra volumes.

    All apply to the seed Job's pod and the serving pods alike (the seed must run where, and as, the
    replicas do), except topologySpreadConstraints, which spread serving pods only. None enters the
    compile-cache key: vLLM does not hash them. The GPU model, which vLLM does hash, is the cache key's
    runtime.nodeSelector; an affinity or runtime class that picks a different GPU model than nodeSelector
    says is not seen by the key, so pin the GPU model with runtime.nodeSelector.
    """

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(_qualified_keys_cel("labels"), _QUALIFIED_KEYS, ".labels"),
            _cel(_qualified_keys_cel("annotations"), _QUALIFIED_KEYS, ".annotations"),
            _cel(_owned_keys_cel("labels", OWNED_LABELS), _OWNED_LABELS, ".labels"),
            _cel(_owned_keys_cel("annotations", OWNED_ANNOTATIONS), _OWNED_ANNOTATIONS, ".annotations"),
            _cel(
                f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_quoted_list(OWNED_VOLUMES)}))",
                _OWNED_VOLUMES,
                ".volumes",
            ),
            _cel(
                "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
                _UNIQUE_VOLUMES,
                ".volumes",
            ),
            _cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m,"
                " has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                _MOUNT_NEEDS_VOLUME,
                ".volumeMounts",
            ),
            _cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m,"
                f" {_quoted_list(OWNED_MOUNT_PATHS)}.all(p, m.mountPath != p"
                " && !m.mountPath.startsWith(p + '/') && !p.startsWith(m.mountPath + '/')))",
                _OWNED_MOUNT_PATHS,
                ".volumeMounts",
            ),
            _cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m,"
                " self.volumeMounts.exists_one(n, n.mountPath == m.mountPath))",
                _UNIQUE_MOUNT_PATHS,
                ".volumeMounts",
            ),
        )
    )

    service_account_name: ObjectName | None = Field(
        default=None,
        description="ServiceAccount the pods run as (IRSA or workload identity for an s3 source).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the image."
    )
    affinity: Affinity | None = Field(default=None, description="Node and pod (anti-)affinity.")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=8, description="How serving pods spread across zones or nodes."
    )
    priority_class_name: ObjectName | None = Field(default=None, description="PriorityClass of the pods.")
    runtime_class_name: ObjectName | None = Field(default=None, description="RuntimeClass of the pods.")
    labels: dict[str, Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]] = Field(
        default_factory=dict, max_length=64, description="Extra pod labels (not stoker's own keys)."
    )
    annotations: dict[str, Annotated[str, Field(max_length=65536)]] = Field(
        default_factory=dict, max_length=64, description="Extra pod annotations (not stoker's own keys)."
    )
    volumes: list[PodVolume] = Field(
        default_factory=list, max_length=32, description="Extra volumes (not named like stoker's)."
    )
    volume_mounts: list[PodVolumeMount] = Field(
        default_factory=list, max_length=32, description="Mounts of pod.volumes into the engine container."
    )

    @model_validator(mode="after")
    def _nothing_of_stokers(self) -> PodSettings:
        checks = (
            ("labels", _OWNED_LABELS, [key for key in self.labels if owned_label(key)]),
            ("annotations", _OWNED_ANNOTATIONS, [key for key in self.annotations if owned_annotation(key)]),
            (
                "labels",
                _QUALIFIED_KEYS,
                [key for key in self.labels if not re.fullmatch(_QUALIFIED_NAME, key)],
            ),
            (
                "annotations",
                _QUALIFIED_KEYS,
                [key for key in self.annotations if not re.fullmatch(_QUALIFIED_NAME, key)],
            ),
            ("volumes", _OWNED_VOLUMES, [v.name for v in self.volumes if v.name in OWNED_VOLUMES]),
            ("volumes", _UNIQUE_VOLUMES, _repeated([v.name for v in self.volumes])),
            (
                "volumeMounts",
                _MOUNT_NEEDS_VOLUME,
                [m.name for m in self.volume_mounts if m.name not in {v.name for v in self.volumes}],
            ),
            (
                "volumeMounts",
                _OWNED_MOUNT_PATHS,
                [m.mount_path for m in self.volume_mounts if shadows_owned_path(m.mount_path)],
            ),
            ("volumeMounts", _UNIQUE_MOUNT_PATHS, _repeated([m.mount_path for m in self.volume_mounts])),
        )
        for field, message, offending in checks:
            if offending:
                raise FieldError(field, f"{message} (found: {', '.join(offending)})")
        return self


def _repeated(items: list[str]) -> list[str]:
    return sorted({item for item in items if items.count(item) > 1})


_MODEL_CACHE_NEEDS_HF = "coldStart.modelCache applies only to model.source.huggingFace"
_S3_NEEDS_STREAMER = "model.source.s3 needs coldStart.loader.format runai_streamer or auto (or unset)"
_S3_FORMATS = ("runai_streamer", "auto")
# The operator's wake-up check sends a completion without a key; a key would fail every wake (401).
_STANDBY_API_KEY = "coldStart.standby does not work with an API key: remove --api-key from runtime.extraArgs"
_STANDBY_API_KEY_ENV = (
    f"coldStart.standby does not work with an API key: remove {API_KEY_ENV} from runtime.env"
)

# A ResourceClaim shares one device: the engines on it are the standby pool, of which runtime.replicas awake.
_SHARED_GPU_REPLICAS = (
    "runtime.replicas must not exceed coldStart.standby.replicas when coldStart.standby.sharedGpu is set"
    " (standby.replicas is the number of engines on the shared GPU, awake or asleep)"
)
_SHARED_GPU_ONE_GPU = (
    "runtime.gpus must be 1 when coldStart.standby.sharedGpu is set (the claim has one device)"
)
_HAS_SHARED_GPU = "has(self.coldStart.standby) && has(self.coldStart.standby.sharedGpu)"

# What cannot work across the nodes of a multi-node replica (a LeaderWorkerSet group).
_MULTI_NODE_CEL = "has(self.runtime.nodesPerReplica) && self.runtime.nodesPerReplica > 1"
_GROUP_STANDBY = (
    "coldStart.standby does not work with runtime.nodesPerReplica above 1: a sleeping group is not"
    " supported (the operator wakes one pod's engine, a group's engine spans all of its pods)"
)
_GROUP_SHARED_VOLUME = (
    "must be ReadWriteMany with runtime.nodesPerReplica above 1: the pods of a group run on different"
    " nodes and share the volume, each rank filling its own directory"
)


# What ModelExpress's peer path cannot do (docs/concepts/peer-weights.md): each a refusal naming the field.
_PEERS_CEL = "has(self.coldStart.peerWeights) && self.coldStart.peerWeights.enabled"
_PEER_REFUSALS = (
    (
        "has(self.coldStart.loader.format) && self.coldStart.loader.format == 'fastsafetensors'",
        "coldStart.peerWeights does not work with coldStart.loader.format fastsafetensors: ModelExpress"
        " has no fastsafetensors fallback, so a replica without a peer would not load as the loader says;"
        " choose instanttensor, safetensors, auto or runai_streamer",
        "coldStart.loader.format",
    ),
    (
        "has(self.coldStart.standby)",
        "coldStart.peerWeights does not work with coldStart.standby: ModelExpress withdraws a sleeping"
        " engine's weights as a source, and sleep mode moves them",
        "coldStart.standby",
    ),
    (
        f"{_MULTI_NODE_CEL}",
        "coldStart.peerWeights does not work with runtime.nodesPerReplica above 1: the per-rank peer"
        " Services serve the ranks of one pod",
        "runtime.nodesPerReplica",
    ),
    (
        "has(self.runtime.pipelineParallelSize) && self.runtime.pipelineParallelSize > 1",
        "coldStart.peerWeights does not work with runtime.pipelineParallelSize above 1 (untested with"
        " ModelExpress's per-rank sources): use tensor parallel",
        "runtime.pipelineParallelSize",
    ),
    (
        "has(self.runtime.dataParallelSize) && self.runtime.dataParallelSize > 1",
        "coldStart.peerWeights does not work with runtime.dataParallelSize above 1 (a pod's ranks beyond"
        " tensor parallel have no peer Service)",
        "runtime.dataParallelSize",
    ),
)
_PEERS_NEED_LOADER = "coldStart.peerWeights needs vLLM's modelexpress loader"


def _peer_refusal(spec: VLLMServiceSpec) -> tuple[str, str] | None:
    """The field and message of the first _PEER_REFUSALS rule `spec` breaks, pydantic's side of the CEL."""
    runtime, cold_start = spec.runtime, spec.cold_start
    broken = (
        cold_start.loader.format == "fastsafetensors",
        cold_start.standby is not None,
        runtime.nodes_per_replica > 1,
        runtime.effective_pipeline_parallel_size > 1,
        runtime.effective_data_parallel_size > 1,
    )
    return next(
        ((field, message) for (_, message, field), hit in zip(_PEER_REFUSALS, broken, strict=True) if hit),
        None,
    )


class VLLMServiceSpec(_Model):
    """The desired state: a model, how replicas run, how they start fast, and how pods fit the cluster."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "!self.coldStart.modelCache.enabled || has(self.model.source.huggingFace)",
                _MODEL_CACHE_NEEDS_HF,
                ".coldStart.modelCache.enabled",
            ),
            _cel(
                "!has(self.model.source.s3) || !has(self.coldStart.loader.format)"
                f" || self.coldStart.loader.format in {_quoted_list(_S3_FORMATS)}",
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
            _cel(
                f"!({_HAS_SHARED_GPU}) || self.runtime.replicas <= self.coldStart.standby.replicas",
                _SHARED_GPU_REPLICAS,
                ".runtime.replicas",
            ),
            _cel(f"!({_HAS_SHARED_GPU}) || self.runtime.gpus == 1", _SHARED_GPU_ONE_GPU, ".runtime.gpus"),
            _cel(
                f"!({_MULTI_NODE_CEL}) || !has(self.coldStart.standby)", _GROUP_STANDBY, ".coldStart.standby"
            ),
            *(
                _cel(
                    f"!({_MULTI_NODE_CEL}) || !self.coldStart.{volume}.enabled"
                    f" || self.coldStart.{volume}.accessMode == 'ReadWriteMany'",
                    f"coldStart.{volume}.accessMode {_GROUP_SHARED_VOLUME}",
                    f".coldStart.{volume}.accessMode",
                )
                for volume in ("compileCache", "modelCache")
            ),
            *(
                _cel(f"!({_PEERS_CEL}) || !({rule})", message, f".{field}")
                for rule, message, field in _PEER_REFUSALS
            ),
        )
    )

    model: ModelSpec = Field(description="The model to serve.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="How each replica runs.")
    cold_start: ColdStartSpec = Field(
        default_factory=ColdStartSpec,
        description="Cold-start settings: loader, caches, graphs, seed, standby.",
    )
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description="How the seed and serving pods fit the cluster: identity, image pulls, placement,"
        " priority, metadata, extra volumes. None enters the compile-cache key, so pin the GPU model with"
        " runtime.nodeSelector, not with affinity or a runtime class.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description="Serve behind a gateway of the Gateway API Inference Extension: the operator keeps an"
        " InferencePool of the serving pods that refers to the given endpoint picker, and optionally scales"
        " from zero when a request waits for this pool.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> VLLMServiceSpec:
        if self.cold_start.model_cache.enabled and self.model.source.hugging_face is None:
            raise FieldError("coldStart.modelCache.enabled", _MODEL_CACHE_NEEDS_HF)
        if self.model.source.s3 is not None and self.cold_start.loader.format not in (None, *_S3_FORMATS):
            raise FieldError("coldStart.loader.format", _S3_NEEDS_STREAMER)
        if self.cold_start.standby is not None:
            if any(sets_api_key(arg) for arg in self.runtime.extra_args):
                raise FieldError("runtime.extraArgs", _STANDBY_API_KEY)
            if any(var.name == API_KEY_ENV for var in self.runtime.env):
                raise FieldError("runtime.env", _STANDBY_API_KEY_ENV)
            if self.cold_start.standby.shared_gpu is not None:
                if self.runtime.replicas > self.cold_start.standby.replicas:
                    raise FieldError("runtime.replicas", _SHARED_GPU_REPLICAS)
                if self.runtime.gpus != 1:
                    raise FieldError("runtime.gpus", _SHARED_GPU_ONE_GPU)
        if self.runtime.nodes_per_replica > 1:
            if self.cold_start.standby is not None:
                raise FieldError("coldStart.standby", _GROUP_STANDBY)
            volumes = (
                ("compileCache", self.cold_start.compile_cache),
                ("modelCache", self.cold_start.model_cache),
            )
            for name, volume in volumes:
                if volume.enabled and volume.access_mode != "ReadWriteMany":
                    raise FieldError(
                        f"coldStart.{name}.accessMode", f"coldStart.{name}.accessMode {_GROUP_SHARED_VOLUME}"
                    )
        if self.cold_start.peer_weights.enabled:
            refusal = _peer_refusal(self)
            if refusal is not None:
                raise FieldError(*refusal)
            # The engine version decides whether the loader exists: the operator reports it (InvalidSpec).
            if not self.runtime.engine_profile.capabilities.modelexpress_loader:
                version = self.runtime.resolved_engine_version
                raise FieldError(
                    "coldStart.peerWeights.enabled",
                    f"{_PEERS_NEED_LOADER} (--load-format modelexpress), which vLLM {version} does not have",
                )
        return self


# Each `pattern` of the spec in words, for refusals in the user's terms (stoker.api.errors).
_ALPHANUMERIC_ENDS = "starting and ending with a letter or digit"
PATTERN_RULES = {
    QUANTITY_PATTERN: "must be a quantity such as 20Gi, 500m or 8",
    S3_URI_PATTERN: "must be s3://bucket/prefix, the bucket 3 to 63 lowercase letters, digits, '.' or '-'",
    ENV_NAME_PATTERN: "must be a variable name: letters, digits and '_', not starting with a digit",
    VERSION_PATTERN: "must be a version such as 0.26.0",
    _DNS_1123_SUBDOMAIN: f"must be a DNS name: lowercase letters, digits, '-' and '.', {_ALPHANUMERIC_ENDS}",
    _DNS_1123_LABEL: f"must be a DNS label: lowercase letters, digits and '-', {_ALPHANUMERIC_ENDS}",
    _MOUNT_PATH: "must be an absolute path without empty, '.' or '..' segments or a trailing '/'",
    _LABEL_VALUE: f"must be a label value: letters, digits, '-', '_' and '.', {_ALPHANUMERIC_ENDS}",
}


# -------------------------------------------------------------------------------------------- status


class _StatusModel(BaseModel):
    # Status is written by the controller and read back; unknown fields from newer versions are ignored.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_StatusModel):
    """A metav1.Condition: Ready, Progressing or Degraded."""

    type: str = Field(max_length=316, description="Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason, for machines.")
    message: str = Field(default="", max_length=32768, description="What happened, for people.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )


class CacheStatus(_StatusModel):
    """The compile cache: the key the spec asks for and the key the seed Job filled."""

    key: str | None = Field(default=None, description="Compile-cache key of the current spec.")
    seeded_key: str | None = Field(default=None, description="Key the last successful seed Job filled.")
    seeded_at: datetime | None = Field(default=None, description="When that seed Job succeeded.")
    claim_uid: str | None = Field(
        default=None,
        description="uid of the cache claim that seed filled: a claim re-created since is seeded again.",
    )
    last_hit: bool | None = Field(
        default=None, description="Whether the last serving start loaded its graphs from the cache."
    )


class StartupRecord(_StatusModel):
    """One replica's (or seed run's) start: engine phases plus scheduling/imagePull/containerStart.

    totalSeconds counts from process start to `Starting vLLM server`; the Kubernetes phases precede it.
    """

    pod: str | None = Field(default=None, description="Pod name.")
    total_seconds: float | None = Field(
        default=None, description="Seconds from process start to `Starting vLLM server on`."
    )
    compile_cache: Literal["hit", "miss", "none"] | None = Field(
        default=None, description="hit: graphs loaded from the cache; miss: compiled; none: no compile."
    )
    compile_cache_reason: Literal["loadFailed"] | None = Field(
        default=None,
        description="Why a miss: loadFailed means a kept compile cache was there but could not be loaded.",
    )
    engine_version: str | None = Field(
        default=None, max_length=64, description="vLLM version the log announced, else the spec's."
    )
    phases: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds per phase (scheduling, imagePull, ..., apiReady, podReady).",
    )
    cache_key: str | None = Field(default=None, description="Short compile-cache key of the pod.")
    pod_template_hash: str | None = Field(
        default=None,
        max_length=64,
        description="The pod's ReplicaSet (pod-template-hash); `last` is cleared once no pod of it runs.",
    )
    failed: bool | None = Field(default=None, description="The start failed before serving.")
    reason: str | None = Field(default=None, description="Why it failed, from the log.")
    ready_gap_seconds: float | None = Field(
        default=None,
        description="Seconds from the engine's `Starting vLLM server on` line (its log's timestamp) to the"
        " pod's Ready condition: the readiness probes' delay, also the podReady phase. Serving pods only;"
        " the condition's time has whole seconds.",
    )
    finished_at: datetime | None = Field(default=None, description="When the start finished or failed.")
    weights_source: Literal["peer", "storage"] | None = Field(
        default=None,
        description="coldStart.peerWeights: peer when ModelExpress read the weights from a Ready replica,"
        " storage when it loaded them as coldStart.loader says (no peer, or the peer path failed).",
    )
    peer_transfer_seconds: float | None = Field(
        default=None, description="Seconds the peer transfer took (the slowest rank's)."
    )
    peer_transfer_gigabytes: float | None = Field(
        default=None, description="Gigabytes (1e9 bytes) read from the peer, all ranks together."
    )
    peer_transfer_gigabytes_per_second: float | None = Field(
        default=None, description="peerTransferGigabytes over peerTransferSeconds."
    )
    peer_fallback_reason: str | None = Field(
        default=None, max_length=256, description="Why the peer path failed, as ModelExpress logged it."
    )
    snapshot: Literal["restored", "started"] | None = Field(
        default=None,
        description="Snapshot and restore (the operator's snapshot setting): restored when the node's agent"
        " restored an engine of the cache key into the pod, started when the pod started its engine itself.",
    )
    snapshot_reason: str | None = Field(
        default=None, max_length=256, description="Why a pod made for snapshots started its engine itself."
    )
    snapshot_restore_seconds: float | None = Field(
        default=None, description="Seconds from the pod's start to its restored engine."
    )
    gpu_product: str | None = Field(
        default=None,
        max_length=253,
        description="The node's GPU product (label nvidia.com/gpu.product); cpu when the pod asked for no"
        " GPU, unknown when the node does not say. Part of the hardware class of startup predictions.",
    )


class StartupSample(_StatusModel):
    """A parsed container start; (uid, restarts) identifies it so each start is parsed once."""

    pod: str = Field(description="Pod name.")
    uid: str = Field(description="Pod uid.")
    restarts: int = Field(default=0, description="Container restarts before this start.")
    pod_template_hash: str | None = Field(
        default=None, max_length=64, description="The pod's ReplicaSet (pod-template-hash)."
    )
    total_seconds: float | None = Field(
        default=None, description="Seconds from process start to `Starting vLLM server on`."
    )
    compile_cache: Literal["hit", "miss", "none"] | None = Field(
        default=None, description="hit, miss or none (no compile)."
    )
    ready_gap_seconds: float | None = Field(
        default=None,
        description="Seconds from the engine's `Starting vLLM server on` line (its log's timestamp) to the"
        " pod's Ready condition: the readiness probes' delay, also the podReady phase. Serving pods only;"
        " the condition's time has whole seconds.",
    )


class StartupSummary(_StatusModel):
    """totalSeconds over the recent serving starts."""

    samples: int = Field(default=0, description="Starts summarised.")
    p50_total_seconds: float | None = Field(default=None, description="Median totalSeconds.")
    max_total_seconds: float | None = Field(default=None, description="Largest totalSeconds.")


class HostFactsStatus(_StatusModel):
    """What the phases scale with on the node the seed ran on, measured by the seed (stoker.inpod.host)."""

    cpu_seconds: float | None = Field(
        default=None,
        description="Wall seconds of a fixed single-thread Python workload (best of 3): the CPU-bound phases"
        " (imports, model inspection, Dynamo, compiled-graph loading, engine start) scale with it.",
    )
    disk_bytes_per_second: float | None = Field(
        default=None,
        description="Sequential read bandwidth of the volume holding the checkpoint (up to 256 MiB of its"
        " largest weight file, read from the disk): weight loading scales with it.",
    )
    gpu_product: str | None = Field(default=None, description="GPU product, as nvidia-smi names it.")
    gpu_memory_bytes: int | None = Field(default=None, description="Memory of one GPU.")
    gpu_count: int | None = Field(default=None, description="GPUs the seed pod was given.")


class ModelFactsStatus(_StatusModel):
    """The model's facts as the seed Job read them from the model directory (stoker.predict.facts)."""

    checkpoint_bytes: int = Field(
        description="Bytes of the weight files (*.safetensors, else *.bin/*.pt); see checkpointBytesSource."
    )
    layers: int = Field(description="Hidden layers.")
    hidden_size: int = Field(description="Hidden size.")
    intermediate_size: int = Field(description="MLP intermediate size.")
    attention_heads: int = Field(description="Attention heads.")
    kv_heads: int = Field(description="Key/value heads.")
    vocab_size: int = Field(description="Vocabulary size.")
    tokenizer_bytes: int = Field(description="Bytes of the tokenizer files.")
    moe: bool = Field(description="A mixture-of-experts model.")
    experts: int = Field(description="Experts per MoE layer (0: dense).")
    dtype: str | None = Field(default=None, description="The config's torch_dtype.")
    checkpoint_bytes_source: Literal["indexMetadata", "seedLog"] | None = Field(
        default=None,
        description=(
            "Where checkpointBytes came from when the model directory held no weight files (absent: their"
            " sizes). indexMetadata: the total_size of the sharded checkpoint's index. seedLog: the seed's"
            " `Model loading took X GiB` line times the tensor-parallel size; the seed loads dummy weights,"
            " so a hub model's snapshot has none, and their device memory is the model's size in its dtype"
            " (to 0.01 GiB)."
        ),
    )
    import_pages_bytes: int | None = Field(
        default=None,
        description="Bytes of the image's files a cold start's imports read, as the seed recorded them:"
        " serving pods read them first, and node warming keeps them resident.",
    )
    host: HostFactsStatus | None = Field(
        default=None,
        description="The host facts the seed measured next to the model's: a hardware class without"
        " observed starts is predicted from them.",
    )


class ExpectedStartup(_StatusModel):
    """The predicted start of the next serving replica, per engine phase, with what it was predicted from."""

    phases: dict[str, float] = Field(
        default_factory=dict, description="Predicted seconds per engine phase (bootstrap, ..., apiReady)."
    )
    total_seconds: float | None = Field(
        default=None, description="Predicted seconds from process start to `Starting vLLM server on`."
    )
    cache_state: Literal["hit", "miss", "none"] | None = Field(
        default=None,
        description="Compile-cache state predicted for: hit once the cache is seeded for the current key.",
    )
    hardware: str | None = Field(
        default=None, description="Hardware class: GPU product, GPUs per replica, engine major.minor."
    )
    coefficients: str | None = Field(default=None, description="Hardware key of the coefficient set used.")
    source: Literal["shipped", "fleet"] | None = Field(
        default=None,
        description="shipped: the defaults stoker ships; fleet: refitted from this cluster's starts.",
    )
    until_serving_seconds: float | None = Field(
        default=None,
        description="Expected seconds from a new serving pod's creation until it serves: totalSeconds plus"
        " the Kubernetes phases of the last serving start (scheduling, imagePull, containerStart and"
        " podReady, its readiness gap). An autoscaler's scale-up lead time (docs/prediction.md, For"
        " autoscalers).",
    )
    reason: str | None = Field(
        default=None, description="Why there is no prediction (no model facts, no coefficients)."
    )


class StartupRecording(_StatusModel):
    """Why the last observed start did not reach the fleet's startup coefficients."""

    refused: str = Field(max_length=1024, description="What refused or failed to record it.")
    at: datetime | None = Field(default=None, description="When.")


class StartupStatus(_StatusModel):
    """Where replicas' start-up seconds went, parsed from their logs, and where they are expected to go."""

    last: StartupRecord | None = Field(default=None, description="The latest serving replica's start.")
    seed: StartupRecord | None = Field(default=None, description="The latest seed Job run.")
    recent: StartupSummary | None = Field(default=None, description="Summary of recent serving starts.")
    history: list[StartupSample] = Field(
        default_factory=list, max_length=100, description="Recent serving starts, oldest first."
    )
    model: ModelFactsStatus | None = Field(
        default=None, description="The model's facts, from the `stoker-model-facts:` line of the seed's log."
    )
    model_cache_key: str | None = Field(
        default=None, description="Short compile-cache key of the seed run that read the model's facts."
    )
    expected: ExpectedStartup | None = Field(
        default=None, description="Predicted phases of the next serving start (stoker.predict)."
    )
    recording: StartupRecording | None = Field(
        default=None,
        description="Set while observed starts cannot be added to the fleet's startup coefficients; cleared"
        " by the next start recorded.",
    )


class PodRole(_StatusModel):
    """A serving pod's role: active pods are behind the Service, standby pods are not."""

    pod: str = Field(description="Pod name.")
    role: Literal["active", "standby"] = Field(description="active: serving; standby: out of the Service.")
    asleep: bool = Field(default=False, description="The pod's engine is in sleep mode.")


class WakeRecord(_StatusModel):
    """The last standby wake: seconds from POST /wake_up to each step, ending at a served completion."""

    pod: str = Field(description="Pod woken.")
    wake_seconds: float | None = Field(default=None, description="POST /wake_up until it answered.")
    health_seconds: float | None = Field(default=None, description="Wake to a healthy /health.")
    served_seconds: float | None = Field(default=None, description="Wake to first served completion.")
    failed: bool | None = Field(default=None, description="The pod was not served in time and was replaced.")
    reason: str | None = Field(default=None, description="Why the wake failed.")
    at: datetime | None = Field(default=None, description="When the wake started.")


class SharedGpuEngine(_StatusModel):
    """An engine on the shared GPU, of this or another VLLMService of the namespace."""

    pod: str = Field(description="Pod name.")
    service: str = Field(description="The VLLMService the pod serves.")
    awake: bool = Field(description="The engine holds its share of the GPU (awake or starting).")
    share: float = Field(description="Its --gpu-memory-utilization: the fraction of the GPU it holds awake.")


class SharedGpuStatus(_StatusModel):
    """Which engines share the GPU of coldStart.standby.sharedGpu, and what waits for it."""

    resource_claim_name: str = Field(description="The ResourceClaim whose device the engines share.")
    engines: list[SharedGpuEngine] = Field(
        default_factory=list, max_length=1100, description="Every engine on the device, started or starting."
    )
    waiting: str | None = Field(
        default=None, description="Why a wake or a start of this service waits for the GPU, if one does."
    )


class StandbyStatus(_StatusModel):
    """Standby replicas: each serving pod's role and the last wake."""

    pods: list[PodRole] = Field(default_factory=list, max_length=1100, description="Each serving pod's role.")
    last_wake: WakeRecord | None = Field(default=None, description="The last wake of a standby pod.")
    shared_gpu: SharedGpuStatus | None = Field(
        default=None, description="With coldStart.standby.sharedGpu: the engines sharing its GPU."
    )


class WarmNode(_StatusModel):
    """A node the warmer runs on, and whether everything wanted is resident there."""

    node: str = Field(description="Node name.")
    warm: bool = Field(description="The warmer pod there is Ready: the checkpoint is in its page cache.")


# Nodes listed in status.nodeWarming at most (the counts cover them all).
WARM_NODES_LISTED = 100


class NodeWarmingStatus(_StatusModel):
    """coldStart.nodeWarming: what is wanted in each node's page cache and where it is resident."""

    wanted_bytes: int | None = Field(
        default=None,
        description="Bytes kept in each node's page cache: the checkpoint (the seed's facts) plus the"
        " import pages.",
    )
    budget_bytes: int = Field(description="The per-node budget shared by every warming service.")
    desired_nodes: int = Field(default=0, description="Nodes the warmer DaemonSet runs on.")
    warm_nodes: int = Field(default=0, description="Of those, nodes where everything wanted is resident.")
    nodes: list[WarmNode] = Field(
        default_factory=list,
        max_length=WARM_NODES_LISTED,
        description=f"The warmer's nodes (the first {WARM_NODES_LISTED} by name).",
    )


class VLLMServiceStatus(_StatusModel):
    """What the operator observed; written through the status subresource."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the operator last reconciled."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, Degraded.")
    replicas: int | None = Field(default=None, description="Active serving pods (the scale subresource's).")
    ready_replicas: int | None = Field(default=None, description="Active serving pods that are Ready.")
    ready: str | None = Field(
        default=None,
        description="Ready serving replicas of those spec.runtime.replicas asks for, as `1/2` (kubectl get's"
        " READY column, as a Deployment's).",
    )
    standby_replicas: int | None = Field(default=None, description="Standby pods asleep.")
    selector: str | None = Field(
        default=None, description="Label selector of the active serving pods, for an HPA."
    )
    cache: CacheStatus | None = Field(default=None, description="Compile-cache keys.")
    startup: StartupStatus | None = Field(default=None, description="Start-up timings per phase.")
    standby: StandbyStatus | None = Field(default=None, description="Standby pods and wakes.")
    inference_pool: str | None = Field(
        default=None,
        description="The InferencePool the operator keeps for spec.inferencePool (deleted when it is unset).",
    )
    node_warming: NodeWarmingStatus | None = Field(
        default=None, description="With coldStart.nodeWarming: what is wanted and where it is warm."
    )


# ------------------------------------------------------------------------------------------ resource

_DNS_1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
_PICKER_IS_OWN_SERVICE = (
    "spec.inferencePool.endpointPicker.name names this VLLMService's own Service (stoker's): name the"
    " endpoint picker's Service"
)
_NAME_RULES = [
    _cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters (child names add a suffix)",
    ),
    _cel(
        f"self.metadata.name.matches('{_DNS_1035}')",
        "metadata.name must be a DNS-1035 label (it names a Service)",
    ),
    _cel(
        "!has(self.spec.inferencePool) || self.spec.inferencePool.endpointPicker.name != self.metadata.name",
        _PICKER_IS_OWN_SERVICE,
        ".spec.inferencePool.endpointPicker.name",
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
    spec: VLLMServiceSpec = Field(description="The desired state.")
    status: VLLMServiceStatus | None = Field(default=None, description="The observed state.")

    @model_validator(mode="after")
    def _valid_name(self) -> VLLMService:
        name = self.metadata.get("name")
        if name is not None and (len(name) > MAX_NAME_LENGTH or not re.fullmatch(_DNS_1035, name)):
            raise FieldError(
                "metadata.name",
                f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters",
            )
        pool = self.spec.inference_pool
        if pool is not None and name is not None and pool.endpoint_picker.name == name:
            raise FieldError("spec.inferencePool.endpointPicker.name", _PICKER_IS_OWN_SERVICE)
        return self

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str | None:
        namespace = self.metadata.get("namespace")
        return str(namespace) if namespace else None
