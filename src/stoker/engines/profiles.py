"""One profile per supported vLLM release range: everything stoker knows that depends on the engine's version.

Read from each release's wheel (`pip download --no-deps vllm==X`; file:line relative to its `vllm/`
package). A range's profile takes the lowest release's facts where they differ inside it, so that a key
or a schema never promises what the oldest release of the range does not do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from stoker.engines.markers import (
    COMMON,
    JIT_MONITOR,
    JIT_WARMUP_LOGGED,
    KV_CACHE_ANY_DEVICE,
    KV_CACHE_GPU,
    PRE_0_22,
    TAGGED_COMPILE,
    UNTAGGED_COMPILE,
    WEIGHT_MEMORY,
    WEIGHT_MEMORY_EITHER_RUNNER,
    Marker,
)
from stoker.inpod.seed import PORT_FLAG, REVISION_FLAG, SERVED_MODEL_NAME_FLAG

Release = tuple[int, int]  # (major, minor)
_GIB = 1 << 30


@dataclass(frozen=True)
class EngineFlags:
    """`vllm serve` flags stoker renders, as the release spells them (unchanged from 0.22 to 0.33, read from
    each release's wheel)."""

    # The seed Job's program reads these three from its server's argv: one spelling for both.
    port: str = PORT_FLAG
    served_model_name: str = SERVED_MODEL_NAME_FLAG
    tensor_parallel_size: str = "--tensor-parallel-size"
    revision: str = REVISION_FLAG
    max_model_len: str = "--max-model-len"
    gpu_memory_utilization: str = "--gpu-memory-utilization"
    load_format: str = "--load-format"
    loader_extra_config: str = "--model-loader-extra-config"
    enforce_eager: str = "--enforce-eager"
    max_capture_size: str = "--max-cudagraph-capture-size"
    capture_sizes: str = "--cudagraph-capture-sizes"
    sleep_mode: str = "--enable-sleep-mode"
    middleware: str = "--middleware"
    # Parallel layouts (engine/arg_utils.py, 0.22.1 `:946-1058` to 0.33.0 `:1177-1305`).
    pipeline_parallel_size: str = "--pipeline-parallel-size"
    data_parallel_size: str = "--data-parallel-size"
    expert_parallel: str = "--enable-expert-parallel"
    # vLLM's own multi-node processes, no Ray: with --nnodes > 1 the executor is `mp` (config/parallel.py);
    # a node of rank > 0 runs `--headless`, its workers joining the leader's torch.distributed group at
    # --master-addr:--master-port (entrypoints/cli/serve.py run_headless, 0.22.1 to 0.33.0). vLLM leaves
    # these four out of its compile-cache key (ParallelConfig.compute_hash), so every node's ranks share
    # the key; the ranks' compile caches are directories rank_<rank>_<dp rank> under it.
    nnodes: str = "--nnodes"
    node_rank: str = "--node-rank"
    master_addr: str = "--master-addr"
    master_port: str = "--master-port"
    headless: str = "--headless"


@dataclass(frozen=True)
class LoaderConfigSchema:
    """What the Run:ai streamer accepts in `--model-loader-extra-config`.

    Lenient releases silently drop unknown keys and wrongly typed values; strict ones refuse to start.
    """

    strict: bool
    keys: frozenset[str] = frozenset({"distributed", "concurrency", "memory_limit"})

    def check(self, config: Mapping[str, object]) -> None:
        """Raises ValueError for what the release would reject or silently ignore."""
        unknown = sorted(set(config) - self.keys)
        if unknown:
            verdict = "rejects" if self.strict else "silently ignores"
            raise ValueError(f"the runai_streamer loader {verdict} extra-config keys {unknown}")
        for key, value in config.items():
            valid = isinstance(value, bool) if key == "distributed" else _is_int(value)
            if not valid:
                raise ValueError(f"runai_streamer extra-config {key} must be a JSON {_TYPES[key]}: {value!r}")


_TYPES = {"distributed": "boolean", "concurrency": "integer", "memory_limit": "integer"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Capabilities:
    sleep_levels: frozenset[int]
    # VLLM_ENABLE_STARTUP_PLAN: memory profiling persisted under VLLM_CACHE_ROOT (v1/worker/startup_plan.py).
    startup_plan: bool
    # Serving pods load vLLM's mega AOT artifact (one artifact replaces Dynamo and the compiled graphs on a
    # cache hit), and the seed starts twice to fill the Triton kernels such a start keys anew (render.seed).
    # "engine": vLLM's own default with torch >= 2.12 (envs.py use_mega_aot_artifact, 0.26.0 to 0.33.0), so
    # from 0.27 (torch 2.13); "stoker": vLLM leaves it off and stoker renders VLLM_USE_MEGA_AOT_ARTIFACT=1;
    # "off": not used.
    mega_aot_artifact: Literal["off", "stoker", "engine"]
    # none: no kernel warm-up phase; silent: Model Runner V2 warms kernels after graph capture without a
    # line until the JIT monitor starts; logged: `JIT kernel warmup starting.` ... `finished in` before it.
    jit_warmup: Literal["none", "silent", "logged"]
    # `--load-format ipc_cache` with the `vllm preload` weight daemon (model_loader/weight_cache/).
    ipc_cache: bool
    # `vllm snapshot create|restore` (snapshot/), CRIU-based and privileged.
    snapshot: bool
    # A caller's TRITON_CACHE_DIR is kept; older releases move it under the compile-cache directory.
    keeps_triton_cache_dir: bool
    # `--load-format instanttensor` needs the instanttensor package: an extra (vllm[instanttensor], which
    # stoker's runtime image installs) up to 0.32, a dependency of vLLM itself from 0.33 (METADATA).
    instanttensor_in_every_image: bool
    # `--load-format modelexpress` (model_executor/model_loader/modelexpress_loader.py, registered in
    # model_loader/__init__.py): weights from a peer replica through the modelexpress package, which the
    # image must add. The wrapper is byte-identical from 0.26.0 to 0.33.0; ModelExpress 0.7.0 against
    # these releases' loader internals is untested upstream (its docs name 0.23 and older).
    modelexpress_loader: bool = False

    def loads_mega_aot_artifact(self, env_value: str | None) -> bool:
        """Whether vLLM loads its mega AOT artifact with VLLM_USE_MEGA_AOT_ARTIFACT set to `env_value` (None:
        unset): "1" turns it on, anything else off; unset, vLLM's own default says."""
        return env_value == "1" if env_value is not None else self.mega_aot_artifact == "engine"


@dataclass(frozen=True)
class CaptureSizeDefaults:
    """The CUDA graph capture sizes vLLM picks when none are given (config/vllm.py, 0.22.1 `:1655-1700`
    to 0.33.0 `:2560-2600`): 1, 2, 4, every 8 below 256, every 16 from 256, up to a maximum that defaults to
    min(2 x max_num_seqs, 512); the API server's default max_num_seqs (256 or 1024) gives 512, 51 sizes."""

    max_size_limit: int = 512

    def count(self, max_size: int | None = None, max_num_seqs: int | None = None) -> int:
        """How many sizes vLLM captures up to `max_size` (else the default for `max_num_seqs`)."""
        if max_size is None:
            max_size = (
                self.max_size_limit if max_num_seqs is None else min(2 * max_num_seqs, self.max_size_limit)
            )
        sizes = {size for size in (1, 2, 4) if size <= max_size}
        sizes.update(range(8, min(max_size + 1, 256), 8))
        sizes.update(range(256, max_size + 1, 16))
        return len(sizes)


@dataclass(frozen=True)
class EngineProfile:
    first: Release
    last: Release
    flags: EngineFlags
    loader_config: LoaderConfigSchema
    # Flags (each with one value) whose values vLLM leaves out of its compile-cache key.
    key_ignored_flags: frozenset[str]
    # envs.py `compile_factors()` ignore list: every other registered VLLM_* variable enters the key.
    key_ignored_env: frozenset[str]
    # Variables the engine needs pointed at the cache volume: (name, directory under the volume).
    cache_env: tuple[tuple[str, str], ...]
    capabilities: Capabilities
    # Log wordings this range prints, and the phases they end, in the order the engine runs them.
    log_markers: tuple[tuple[Marker, str], ...]
    phase_ends: tuple[tuple[str, Marker], ...]
    # The LOADED wording with the weights' device memory in GiB as its one group.
    weight_memory: str
    capture_sizes: CaptureSizeDefaults = CaptureSizeDefaults()
    # --gpu-memory-utilization when not given (config/cache.py CacheConfig, 0.22.1 to 0.27.0).
    default_gpu_memory_utilization: float = 0.92

    @property
    def name(self) -> str:
        first, last = (f"{major}.{minor}" for major, minor in (self.first, self.last))
        return first if first == last else f"{first}-{last}"

    def covers(self, release: Release) -> bool:
        return self.first <= release <= self.last

    def logged_weight_bytes(self, message: str) -> int | None:
        """Bytes one worker's weights took in device memory, if `message` (a LOADED one) says."""
        found = re.match(self.weight_memory, message)
        return round(float(found.group(1)) * _GIB) if found is not None else None


# Phases before torch.compile: the same on every supported release.
_EARLY_PHASES = (
    ("bootstrap", Marker.ARGS),
    ("modelInfo", Marker.ARCHITECTURE),
    ("engineStart", Marker.LOAD_START),
    ("weightLoad", Marker.LOADED),
    ("dynamo", Marker.DYNAMO),
    ("compile", Marker.COMPILED),
    ("profiling", Marker.KV_CACHE),
)
_PHASES_NO_WARMUP = (*_EARLY_PHASES, ("graphCapture", Marker.GRAPHS), ("apiReady", Marker.SERVER))
# 0.26-0.28: V2 kernel warm-up after graph capture (v1/worker/gpu_worker.py:863), ended by the monitor (:904).
_PHASES_SILENT_WARMUP = (
    *_EARLY_PHASES,
    ("graphCapture", Marker.GRAPHS),
    ("jitWarmup", Marker.JIT_MONITOR),
    ("apiReady", Marker.SERVER),
)
# 0.29+: the logged warm-up runs before graph capture (kernel_warmup.py:124, gpu_worker.py:784 then :788).
_PHASES_LOGGED_WARMUP = (
    *_EARLY_PHASES,
    ("jitWarmup", Marker.JIT_WARMUP_DONE),
    ("graphCapture", Marker.GRAPHS),
    ("apiReady", Marker.SERVER),
)

# 0.22.1 envs.py:2060 `compile_factors` ignored_factors.
_IGNORED_ENV_0_22 = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH",
        "LOCAL_RANK",
        "MAX_JOBS",
        "NO_COLOR",
        "S3_ACCESS_KEY_ID",
        "S3_ENDPOINT_URL",
        "S3_SECRET_ACCESS_KEY",
        "VLLM_ASSETS_CACHE",
        "VLLM_ASSETS_CACHE_MODEL_CLEAN",
        "VLLM_AUDIO_FETCH_TIMEOUT",
        "VLLM_CACHE_ROOT",
        "VLLM_CI_USE_S3",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_MOE_PREPACK",
        "VLLM_CUDA_COMPATIBILITY_PATH",
        "VLLM_DEBUG_DUMP_PATH",
        "VLLM_DEBUG_LOG_API_SERVER_RESPONSE",
        "VLLM_DO_NOT_TRACK",
        "VLLM_DP_MASTER_IP",
        "VLLM_DP_MASTER_PORT",
        "VLLM_ENABLE_CUDA_COMPATIBILITY",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_ENGINE_ITERATION_TIMEOUT_S",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "VLLM_FORCE_AOT_LOAD",
        "VLLM_HOST_IP",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "VLLM_IMAGE_FETCH_TIMEOUT",
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
        "VLLM_LOGGING_COLOR",
        "VLLM_LOGGING_CONFIG_PATH",
        "VLLM_LOGGING_LEVEL",
        "VLLM_LOGGING_PREFIX",
        "VLLM_LOGGING_STREAM",
        "VLLM_LOG_STATS_INTERVAL",
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
        "VLLM_MEDIA_CACHE",
        "VLLM_MEDIA_CACHE_MAX_SIZE_MB",
        "VLLM_MEDIA_CACHE_TTL_HOURS",
        "VLLM_MEDIA_CONNECTOR",
        "VLLM_MEDIA_FETCH_MAX_RETRIES",
        "VLLM_MEDIA_LOADING_THREAD_COUNT",
        "VLLM_MEDIA_URL_ALLOW_REDIRECTS",
        "VLLM_MODEL_REDIRECT_PATH",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NO_USAGE_STATS",
        "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",
        "VLLM_PORT",
        "VLLM_RANDOMIZE_DP_DUMMY_INPUTS",
        "VLLM_RINGBUFFER_WARNING_INTERVAL",
        "VLLM_RPC_BASE_PATH",
        "VLLM_SERVER_DEV_MODE",
        "VLLM_SKIP_MODEL_NAME_VALIDATION",
        "VLLM_TEST_FORCE_LOAD_FORMAT",
        "VLLM_TUNED_CONFIG_FOLDER",
        "VLLM_USAGE_STATS_SERVER",
        "VLLM_USE_MODELSCOPE",
        "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
        "VLLM_VIDEO_FETCH_TIMEOUT",
        "VLLM_VIDEO_LOADER_BACKEND",
        "VLLM_WORKER_MULTIPROC_METHOD",
        "VLLM_ZENTORCH_WEIGHT_PREPACK",
    }
)

_KEY_IGNORED_FLAGS_0_22 = frozenset(
    {
        "--port",
        "--served-model-name",
        "--gpu-memory-utilization",
        "--load-format",
        "--model-loader-extra-config",
        "--middleware",
    }
)

V0_22 = EngineProfile(
    first=(0, 22),
    last=(0, 23),
    flags=EngineFlags(),
    # runai_streamer_loader.py:31-40: isinstance checks, anything else dropped without a word.
    loader_config=LoaderConfigSchema(strict=False),
    # --kv-cache-memory-bytes is hashed: config/cache.py compute_hash does not ignore it.
    key_ignored_flags=_KEY_IGNORED_FLAGS_0_22,
    key_ignored_env=_IGNORED_ENV_0_22,
    cache_env=(),
    capabilities=Capabilities(
        sleep_levels=frozenset({1, 2}),
        startup_plan=False,
        mega_aot_artifact="off",
        jit_warmup="none",
        ipc_cache=False,
        snapshot=False,
        keeps_triton_cache_dir=False,
        instanttensor_in_every_image=False,
    ),
    log_markers=(*COMMON, *UNTAGGED_COMPILE, *KV_CACHE_GPU),
    phase_ends=_PHASES_NO_WARMUP,
    weight_memory=WEIGHT_MEMORY_EITHER_RUNNER,
)

# 0.24.0: unknown extra-config keys and wrong types raise (runai_streamer_loader.py:34-60).
V0_24 = replace(
    V0_22,
    first=(0, 24),
    last=(0, 25),
    loader_config=LoaderConfigSchema(strict=True),
    key_ignored_env=V0_22.key_ignored_env
    | {
        "VLLM_MAX_AUDIO_DECODE_DURATION_S",
        "VLLM_MAX_AUDIO_PREPROCESS_WORKERS",
        "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS",
    },
)

# 0.26.0: --kv-cache-memory-bytes leaves the key (config/cache.py:206), the startup plan arrives
# (v1/worker/startup_plan.py), Model Runner V2 warms kernels silently after graph capture, and the
# `modelexpress` loader is registered (model_executor/model_loader/__init__.py:58). torch 2.11 leaves
# the mega AOT artifact off; stoker turns it on: measured on an H200 with the seed's second start and the
# ptxas pin (bench/results/coldstart-h200-run3.json), 4.7 s off a start on a warmed node (23.8 -> 19.1 s,
# medians) and no serving start compiled a Triton kernel; 4.0 s off a cold one before the pin
# (coldstart-h200.json, 24.4 -> 20.4 s).
V0_26 = replace(
    V0_24,
    first=(0, 26),
    last=(0, 26),
    key_ignored_flags=V0_24.key_ignored_flags | {"--kv-cache-memory-bytes"},
    key_ignored_env=(
        V0_24.key_ignored_env
        | {"VLLM_MAX_IMAGE_PIXELS", "VLLM_ENABLE_STARTUP_PLAN", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS"}
    )
    - {"VLLM_CI_USE_S3"},
    capabilities=replace(
        V0_24.capabilities,
        startup_plan=True,
        jit_warmup="silent",
        mega_aot_artifact="stoker",
        modelexpress_loader=True,
    ),
    log_markers=(*COMMON, *UNTAGGED_COMPILE, *KV_CACHE_GPU, *JIT_MONITOR),
    phase_ends=_PHASES_SILENT_WARMUP,
)

# 0.27.0: torch 2.13 (METADATA), with which vLLM loads the mega AOT artifact by default; the config and XLA
# cache paths leave the key (envs.py compile_factors).
V0_27 = replace(
    V0_26,
    first=(0, 27),
    last=(0, 28),
    key_ignored_env=V0_26.key_ignored_env | {"VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"},
    capabilities=replace(V0_26.capabilities, mega_aot_artifact="engine"),
)

# 0.29.0: the JIT warm-up is logged and runs before graph capture (model_executor/warmup/kernel_warmup.py).
V0_29 = replace(
    V0_27,
    first=(0, 29),
    last=(0, 29),
    key_ignored_env=V0_27.key_ignored_env
    | {"VLLM_MAX_AUDIO_DECODE_BYTES", "VLLM_API_KEY", "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH"},
    capabilities=replace(V0_27.capabilities, jit_warmup="logged"),
    log_markers=(*COMMON, *UNTAGGED_COMPILE, *KV_CACHE_GPU, *JIT_WARMUP_LOGGED),
    phase_ends=_PHASES_LOGGED_WARMUP,
    # Both runners say `GiB memory and` from 0.28.0 (v1/worker/gpu/model_runner.py:381).
    weight_memory=WEIGHT_MEMORY,
)

# 0.30.0: the weight daemon (`--load-format ipc_cache`); the KV line names its device (kv_cache_utils.py:2396)
V0_30 = replace(
    V0_29,
    first=(0, 30),
    last=(0, 30),
    key_ignored_env=V0_29.key_ignored_env | {"VLLM_MAX_EMBED_DECODE_BYTES"},
    capabilities=replace(V0_29.capabilities, ipc_cache=True),
    log_markers=(*COMMON, *UNTAGGED_COMPILE, *KV_CACHE_ANY_DEVICE, *JIT_WARMUP_LOGGED),
)

# 0.31.0: `vllm snapshot`; a caller's TRITON_CACHE_DIR is kept (compilation/compiler_interface.py:468-475).
V0_31 = replace(
    V0_30,
    first=(0, 31),
    last=(0, 31),
    key_ignored_env=V0_30.key_ignored_env
    | {"FORCE_COLOR", "VLLM_SKIP_VERSION_SUFFIX", "VLLM_TRITON_JIT_WARMUP_NUM_THREADS"},
    capabilities=replace(V0_30.capabilities, snapshot=True, keeps_triton_cache_dir=True),
)

# 0.32.0: compile lines carry the component tag (`[backbone] `); /sleep takes level 0 (pause scheduling
# only, entrypoints/serve/dev/sleep/api_router.py:29).
V0_32 = replace(
    V0_31,
    first=(0, 32),
    last=(0, 32),
    key_ignored_env=V0_31.key_ignored_env - {"VLLM_ENGINE_ITERATION_TIMEOUT_S"},
    capabilities=replace(V0_31.capabilities, sleep_levels=frozenset({0, 1, 2})),
    log_markers=(*COMMON, *TAGGED_COMPILE, *KV_CACHE_ANY_DEVICE, *JIT_WARMUP_LOGGED),
)

# 0.33.0: FlashInfer's managed autotune store lives outside VLLM_CACHE_ROOT unless told
# (model_executor/warmup/flashinfer_autotune_cache.py:79-124);
# Model Runner V2 is the default runner (config/vllm.py:731-767); JSON logs with
# `--logging-config.formatter json` (logger.py:240).
V0_33 = replace(
    V0_32,
    first=(0, 33),
    last=(0, 33),
    key_ignored_env=V0_32.key_ignored_env
    | {"VLLM_CHAT_TEMPLATE_FUEL", "VLLM_HTTP_MAX_REQUEST_BODY_SIZE", "VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES"}
    | {"VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB", "VLLM_RAY_BUNDLE_INDICES", "VLLM_REQUEST_BODY_LOG_LEVEL"},
    cache_env=(("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "flashinfer-autotune"),),
    capabilities=replace(V0_32.capabilities, instanttensor_in_every_image=True),
)

SUPPORTED: tuple[EngineProfile, ...] = (V0_22, V0_24, V0_26, V0_27, V0_29, V0_30, V0_31, V0_32, V0_33)

# For a log whose version is unknown or unsupported: every wording any supported release prints, and older
# ones, phases in the newest releases' order (a silent warm-up then falls into apiReady).
TOLERANT = replace(
    V0_33,
    first=(0, 0),
    weight_memory=WEIGHT_MEMORY_EITHER_RUNNER,
    log_markers=tuple(
        dict.fromkeys([*(marker for profile in SUPPORTED for marker in profile.log_markers), *PRE_0_22])
    ),
)
