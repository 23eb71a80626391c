"""The `vllm serve` invocation shared by the seed Job and the serving pods.

One function builds both so that everything vLLM hashes into its compile-cache key is identical between
them. The only difference is the weight loader: the seed loads dummy weights (`--load-format dummy`), which
vLLM's key ignores (LoadConfig hashes to a constant), so the seed needs the model's config and tokenizer
but not its weights.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Literal

from stoker.api import RUNTIME_IMAGE_REPOSITORY, EnvVar, VLLMService
from stoker.api.owned import CACHE_MOUNT_PATH, MODEL_CACHE_MOUNT_PATH, MODEL_SOURCE_MOUNT_PATH
from stoker.engines import EngineFlags, EngineProfile, split_image

Role = Literal["seed", "serve"]

PORT = 8000
ENGINE_COMMAND = ["vllm", "serve"]
SEED_LOAD_FORMAT = "dummy"
STREAMER = "runai_streamer"
INSTANTTENSOR = "instanttensor"
# coldStart.peerWeights: serving pods load through ModelExpress, which falls back to storage (render.peers).
MODELEXPRESS = "modelexpress"

# With standby replicas: vLLM's sleep endpoints exist only in dev mode, on the serving port, so this
# middleware (on the pods' programs volume, render.pods) answers them only to a caller holding the control
# token.
CONTROL_GUARD = "stoker.guard.ControlGuard"
MEGA_AOT_ARTIFACT_ENV = "VLLM_USE_MEGA_AOT_ARTIFACT"
# The standby pool tells a sleep-capable pod by this flag in its args.
SLEEP_MODE_FLAG = EngineFlags().sleep_mode


@dataclass(frozen=True)
class EngineInvocation:
    image: str
    command: list[str]
    args: list[str]
    # Plain values only; secret-sourced variables are added by the pod builders.
    env: dict[str, str] = field(default_factory=dict)
    cache_mount_path: str = CACHE_MOUNT_PATH

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


def model_string(svc: VLLMService) -> str:
    """What `vllm serve` gets as its model; vLLM hashes this literal string into the cache key."""
    source = svc.spec.model.source
    if source.pvc is not None:
        return posixpath.normpath(posixpath.join(MODEL_SOURCE_MOUNT_PATH, source.pvc.path.lstrip("/")))
    if source.s3 is not None:
        return source.s3.uri
    return svc.spec.model.name


def served_model_name(svc: VLLMService) -> str:
    return svc.spec.model.served_model_name or svc.spec.model.name


def weights_from_volume(svc: VLLMService) -> bool:
    return svc.spec.model.source.pvc is not None or svc.spec.cold_start.model_cache.enabled


def _image_has_instanttensor(svc: VLLMService) -> bool:
    runtime = svc.spec.runtime
    in_every_image = runtime.engine_profile.capabilities.instanttensor_in_every_image
    return in_every_image or split_image(runtime.image)[0] == RUNTIME_IMAGE_REPOSITORY


def load_format(svc: VLLMService) -> str:
    """The serving pods' --load-format: the spec's, else InstantTensor for weights on a volume in an image
    that has it (measured on an H100 with the read-ahead: 16 GB in 2.5-3.5 s, against 14-16 s for the
    streamer from a cold disk; bench/results/coldstart-h100-v0.26.0-fast.json), else the streamer (which
    also reads object stores, and takes the streamer options)."""
    loader = svc.spec.cold_start.loader
    if loader.format is not None:
        return loader.format
    streamer_options = loader.concurrency is not None or loader.memory_limit_bytes is not None
    if weights_from_volume(svc) and _image_has_instanttensor(svc) and not streamer_options:
        return INSTANTTENSOR
    return STREAMER


def reads_ahead(svc: VLLMService) -> bool:
    """Whether serving pods read the checkpoint into the page cache while vLLM imports (render.prefetch):
    only weights on a volume can be read ahead; by default with InstantTensor, which then reads buffered
    (with the streamer the read-ahead gained nothing: the streamer is as slow from memory)."""
    wanted = svc.spec.cold_start.loader.read_ahead
    if wanted is None:
        wanted = load_format(svc) == INSTANTTENSOR
    return wanted and weights_from_volume(svc)


def _user_mega_aot_artifact(svc: VLLMService) -> EnvVar | None:
    return next((var for var in svc.spec.runtime.env if var.name == MEGA_AOT_ARTIFACT_ENV), None)


def loads_mega_aot_artifact(svc: VLLMService) -> bool:
    """Whether the engine compiles into, and serving pods load, vLLM's mega AOT artifact: as
    VLLM_USE_MEGA_AOT_ARTIFACT in runtime.env says (vLLM takes "1" for on), else the engine profile's
    default (stoker's or vLLM's). One from a Secret or ConfigMap is taken as on: it costs the seed a second
    start at most (render.seed)."""
    var = _user_mega_aot_artifact(svc)
    if var is not None:
        return var.value_from is not None or var.value == "1"
    return svc.spec.runtime.engine_profile.capabilities.mega_aot_artifact != "off"


def engine_env(svc: VLLMService) -> dict[str, str]:
    profile = svc.spec.runtime.engine_profile
    env = {
        "VLLM_CACHE_ROOT": CACHE_MOUNT_PATH,
        # For s3 models vLLM copies config and tokenizer under the assets cache and hashes that path, so it
        # must not depend on HOME.
        "VLLM_ASSETS_CACHE": f"{CACHE_MOUNT_PATH}/assets",
        # JIT caches outside VLLM_CACHE_ROOT: measured, losing them costs every new pod about 10 s.
        "TRITON_CACHE_DIR": f"{CACHE_MOUNT_PATH}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT_PATH}/inductor",
        "FLASHINFER_WORKSPACE_BASE": f"{CACHE_MOUNT_PATH}/flashinfer",
        # vLLM before 0.28 hashes these two paths into its compile-cache key and defaults them from HOME, so
        # seed and serving pods with different HOMEs would split the key (measured on 0.26.0).
        "VLLM_CONFIG_ROOT": f"{CACHE_MOUNT_PATH}/config",
        "VLLM_XLA_CACHE_PATH": f"{CACHE_MOUNT_PATH}/xla",
        # Ignored by the key; a cluster workload should not report usage.
        "VLLM_NO_USAGE_STATS": "1",
        # vLLM's CLI forces spawn, so the engine process and every tensor-parallel worker import
        # everything again. Measured (bench/results/coldstart-h100-v0.22.1.json): engine start
        # 13.0 -> 3.5 s on one H100, 22.7 -> 3.9 s with TP 2; decode speed unchanged; streamer and
        # sleep mode work. vLLM falls back to spawn by itself where CUDA is already initialised.
        # Ignored by the key; runtime.env wins.
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    }
    for name, directory in profile.cache_env:
        env[name] = f"{CACHE_MOUNT_PATH}/{directory}"
    if svc.spec.cold_start.startup_plan and profile.capabilities.startup_plan:
        # The seed writes the plan under VLLM_CACHE_ROOT/startup_plan/, serving pods whose GPU and config
        # match apply it and skip memory profiling. Ignored by the key.
        env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
    if profile.capabilities.mega_aot_artifact == "stoker" and _user_mega_aot_artifact(svc) is None:
        # Where vLLM leaves the artifact off (0.26, torch 2.11) but it pays (engines.profiles). It enters
        # the key, as the user's own setting would.
        env[MEGA_AOT_ARTIFACT_ENV] = "1"
    if svc.spec.cold_start.standby is not None:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # ignored by the key
    if svc.spec.cold_start.model_cache.enabled:
        env["HF_HOME"] = MODEL_CACHE_MOUNT_PATH
    if weights_from_volume(svc):
        # Skips hub round trips on every start. It also rewrites a repo id to its snapshot path, which
        # enters the key, so seed and serving pods must agree on it (they do: same env).
        env["HF_HUB_OFFLINE"] = "1"
    s3 = svc.spec.model.source.s3
    if s3 is not None and s3.endpoint:
        env["AWS_ENDPOINT_URL"] = s3.endpoint
    env.update(literal_env(svc))
    return env


def literal_env(svc: VLLMService) -> dict[str, str]:
    """runtime.env's variables that have a value in the spec (not from a Secret or ConfigMap), as the
    container gets them: a variable without a value is empty."""
    return {var.name: var.value or "" for var in svc.spec.runtime.env if var.value_from is None}


def _loader_args(svc: VLLMService, role: Role, profile: EngineProfile) -> list[str]:
    flags = profile.flags
    if role == "seed":
        return [flags.load_format, SEED_LOAD_FORMAT]
    loader = svc.spec.cold_start.loader
    peers = svc.spec.cold_start.peer_weights.enabled
    args = [flags.load_format, MODELEXPRESS if peers else load_format(svc)]
    extra: dict[str, object] = {}
    if loader.concurrency is not None:
        extra["concurrency"] = loader.concurrency
    if loader.memory_limit_bytes is not None:
        extra["memory_limit"] = loader.memory_limit_bytes
    if extra:
        # Lenient releases drop unknown keys and wrongly typed values without a word, strict ones refuse
        # to start: both are caught here, before a pod exists.
        profile.loader_config.check(extra)
        args += [flags.loader_extra_config, json.dumps(extra, sort_keys=True, separators=(",", ":"))]
    return args


def _cuda_graph_args(svc: VLLMService, flags: EngineFlags) -> list[str]:
    graphs = svc.spec.cold_start.cuda_graphs
    if graphs.mode == "eager":
        return [flags.enforce_eager]
    if graphs.max_capture_size is not None:
        return [flags.max_capture_size, str(graphs.max_capture_size)]
    return [flags.capture_sizes, *(str(size) for size in graphs.capture_sizes or [])]


def parallel_args(svc: VLLMService) -> list[str]:
    """The replica's parallel layout beyond tensor parallel, the same for the seed and every pod of a
    replica (vLLM hashes the sizes into its compile-cache key): pipeline and data parallel sizes, expert
    parallel, and for a multi-node replica the node count. Each rank's own flags (render.group) are not
    here: vLLM leaves them out of its key, and so does stoker's."""
    runtime = svc.spec.runtime
    flags = runtime.engine_profile.flags
    args: list[str] = []
    if runtime.effective_pipeline_parallel_size > 1:
        args += [flags.pipeline_parallel_size, str(runtime.effective_pipeline_parallel_size)]
    if runtime.effective_data_parallel_size > 1:
        args += [flags.data_parallel_size, str(runtime.effective_data_parallel_size)]
    if runtime.expert_parallel:
        args.append(flags.expert_parallel)
    if runtime.nodes_per_replica > 1:
        args += [flags.nnodes, str(runtime.nodes_per_replica)]
    return args


def engine_invocation(svc: VLLMService, role: Role) -> EngineInvocation:
    spec = svc.spec
    runtime = spec.runtime
    profile = runtime.engine_profile
    flags = profile.flags
    args = [
        model_string(svc),
        flags.port,
        str(PORT),
        flags.served_model_name,
        served_model_name(svc),
        flags.tensor_parallel_size,
        str(runtime.effective_tensor_parallel_size),
    ]
    args += parallel_args(svc)
    if spec.model.revision and spec.model.source.hugging_face is not None:
        args += [flags.revision, spec.model.revision]
    if runtime.max_model_len is not None:
        args += [flags.max_model_len, str(runtime.max_model_len)]
    if runtime.gpu_memory_utilization is not None:
        args += [flags.gpu_memory_utilization, str(runtime.gpu_memory_utilization)]
    args += _loader_args(svc, role, profile)
    args += _cuda_graph_args(svc, flags)
    if spec.cold_start.standby is not None:
        # The same for the seed: the sleep-mode flag is part of the compile-cache key.
        args += [flags.sleep_mode, flags.middleware, CONTROL_GUARD]
    args += runtime.extra_args
    return EngineInvocation(
        image=runtime.image,
        command=list(ENGINE_COMMAND),
        args=args,
        env=engine_env(svc),
        cache_mount_path=CACHE_MOUNT_PATH,
    )


def key_relevant_args(args: list[str], profile: EngineProfile) -> list[str]:
    """`args` without the flags (and their values) that the release's compile-cache key ignores."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
        elif arg in profile.key_ignored_flags:
            skip_value = True
        else:
            kept.append(arg)
    return kept
