"""What each benchmark profile runs: stock `vllm serve`, or stoker's own rendered invocations plus a lever.

Nothing here copies a stoker flag: the `stoker*` profiles take command, args and environment from
`stoker.render.engine_invocation`, exactly as the operator puts them into the seed Job and the Deployment.
A variant adds one named lever on top (an environment variable or a compilation-config key), so its effect
is measured side by side with what the operator renders today. `stock` is what a user runs without stoker:
the same model and the same user-level settings (served name, context length, memory share), nothing else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from stoker.api import VLLMService
from stoker.render import Role, engine_invocation, model_string
from stoker.render import seed_invocation as render_seed_invocation
from stoker.render.engine import served_model_name
from stoker.render.prefetch import read_ahead_command

COMPILATION_CONFIG_FLAG = "--compilation-config"
# The renderer forks the engine process by default (measured here first as the lever "stoker-fork", see
# docs/benchmarks/gpu-coldstart.md); "stoker-spawn" keeps vLLM's CLI default for comparison.
SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
STARTUP_PLAN = {"VLLM_ENABLE_STARTUP_PLAN": "1"}
# InstantTensor reads with direct I/O by default, which would pass the read-ahead's page cache by.
BUFFERED_INSTANTTENSOR = {"INSTANTTENSOR_BACKEND": "BUFFERED"}
# Exactly what the operator renders; every other serving profile is a lever on top of it.
DEFAULT_PROFILE = "stoker"


@dataclass(frozen=True)
class Variant:
    """A lever on top of the rendered serving invocation."""

    env: dict[str, str] = field(default_factory=dict)
    compilation: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    # Another --load-format in place of the rendered one (its streamer options dropped).
    load_format: str | None = None
    # Run the server under render.prefetch's read-ahead: None (off), "weights", or "everything" (the
    # runtime's shared libraries and bytecode, then the weights, then the compile cache volume).
    read_ahead: str | None = None
    # Also set on the seed, for a lever that reads what the seed wrote. Only variables outside vLLM's
    # compile-cache key belong here: the other profiles share the seed and must still hit its cache.
    seed_env: dict[str, str] = field(default_factory=dict)
    # After the usual probes: sleep (level 1), wake up, and serve again.
    sleep_check: bool = False
    note: str = ""


# Levers measured side by side; each entry says why it might help. All reuse the stoker seed's cache:
# VLLM_WORKER_MULTIPROC_METHOD is on vLLM's list of variables left out of the compile-cache key, and
# compilation mode 0 does not compile, so it neither reads nor needs a compile cache.
VARIANTS: dict[str, Variant] = {
    DEFAULT_PROFILE: Variant(note="exactly what the operator renders"),
    "stoker-spawn": Variant(
        env=SPAWN,
        note="the engine process spawned by a fresh interpreter that imports everything again (vLLM's CLI "
        "default) instead of forked from the API server",
    ),
    "stoker-nocompile": Variant(
        compilation={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"},
        note="no torch.compile (no Dynamo, no Inductor artifacts, no Triton JIT); decode still runs "
        "in full CUDA graphs",
    ),
    # A safety check rather than a lever: --enable-sleep-mode enters the compile-cache key, so this one
    # compiles; it shows whether a forked engine with the streamer can sleep, wake and serve.
    "stoker-sleep": Variant(
        env={"VLLM_SERVER_DEV_MODE": "1"},
        extra_args=("--enable-sleep-mode",),
        sleep_check=True,
        note="sleep mode: sleep level 1, wake up, serve",
    ),
    # vLLM >= 0.26: the seed saves its memory-profiling result under VLLM_CACHE_ROOT/startup_plan/, a
    # serving start with a matching fingerprint applies it and skips memory profiling. The variable is on
    # vLLM's list of variables left out of the compile-cache key (envs.compile_factors, 0.26.0).
    "stoker-plan": Variant(
        env=STARTUP_PLAN,
        seed_env=STARTUP_PLAN,
        note="the seed's persisted startup plan: memory profiling and CUDA-graph memory estimation skipped",
    ),
    # Weight loaders that vLLM 0.26.0 has besides the streamer; neither enters the compile-cache key.
    "stoker-instanttensor": Variant(
        load_format="instanttensor",
        note="InstantTensor: pipelined io_uring direct reads into GPU memory (vllm[instanttensor])",
    ),
    "stoker-fastsafetensors": Variant(
        load_format="fastsafetensors",
        note="fastsafetensors (a dependency of vLLM 0.26.0): pinned bounce buffers, GDS where present",
    ),
    "stoker-readahead": Variant(
        read_ahead="weights",
        note="the checkpoint read into the page cache while Python imports, the streamer as rendered",
    ),
    "stoker-readahead-plan": Variant(
        read_ahead="weights",
        env=STARTUP_PLAN,
        seed_env=STARTUP_PLAN,
        note="read-ahead of the checkpoint and the seed's startup plan, the streamer as rendered",
    ),
    "stoker-fast": Variant(
        read_ahead="weights",
        load_format="instanttensor",
        env={**BUFFERED_INSTANTTENSOR, **STARTUP_PLAN},
        seed_env=STARTUP_PLAN,
        note="read-ahead of the checkpoint, InstantTensor reading the page cache, the seed's startup plan",
    ),
    "stoker-fast-all": Variant(
        read_ahead="everything",
        load_format="instanttensor",
        env={**BUFFERED_INSTANTTENSOR, **STARTUP_PLAN},
        seed_env=STARTUP_PLAN,
        note="stoker-fast, reading ahead also the shared libraries and bytecode of torch, CUDA, Triton, "
        "transformers and vLLM (before the checkpoint) and the compile cache volume (after it)",
    ),
}


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    env: dict[str, str]
    port: int
    served_model_name: str
    cache_mount_path: str | None
    sleep_check: bool = False
    # The seed Job's wrapper stops the server itself (after one warm-up completion) and exits.
    exits_by_itself: bool = False


def _flag_value(args: list[str], flag: str) -> str | None:
    for index, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[index + 1]
    return None


def _with_compilation(args: list[str], overrides: dict[str, Any]) -> list[str]:
    """`args` with `overrides` merged into the rendered --compilation-config (added if absent)."""
    if not overrides:
        return list(args)
    current = _flag_value(args, COMPILATION_CONFIG_FLAG)
    merged = {**(json.loads(current) if current else {}), **overrides}
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
        elif arg == COMPILATION_CONFIG_FLAG:
            skip_value = True
        else:
            kept.append(arg)
    return [*kept, COMPILATION_CONFIG_FLAG, json.dumps(merged, separators=(",", ":"))]


def _with_load_format(args: list[str], load_format: str | None) -> list[str]:
    """`args` loading with `load_format` in place of the rendered format, without the streamer's extra
    config (the order the renderer would give it)."""
    if load_format is None:
        return list(args)
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
        elif arg == "--load-format":
            kept += [arg, load_format]
            skip_value = True
        elif arg == "--model-loader-extra-config":
            skip_value = True
        else:
            kept.append(arg)
    return kept


def _rendered(svc: VLLMService, role: Role, variant: Variant) -> Invocation:
    rendered = engine_invocation(svc, role)
    args = _with_compilation(list(rendered.args), variant.compilation) + list(variant.extra_args)
    args = _with_load_format(args, variant.load_format)
    port = _flag_value(args, "--port")
    served = _flag_value(args, "--served-model-name")
    command = list(rendered.command)
    if variant.read_ahead is not None:
        everything = variant.read_ahead == "everything"
        caches = (rendered.cache_mount_path,) if everything else ()
        command = [*read_ahead_command([model_string(svc)], everything, caches), *command]
    return Invocation(
        argv=[*command, *args],
        env={**rendered.env, **variant.env},
        port=int(port) if port else 8000,
        served_model_name=served or svc.spec.model.name,
        cache_mount_path=rendered.cache_mount_path,
        sleep_check=variant.sleep_check,
    )


def seed_engine_invocation(svc: VLLMService, profiles: tuple[str, ...] = ()) -> Invocation:
    """The seed's `vllm serve` alone, without the Job's wrapper (seedwarmup.py times the warm-up itself),
    with the seed environment that the serving `profiles` ask for."""
    seed_env = {key: value for name in profiles for key, value in VARIANTS[name].seed_env.items()}
    return _rendered(svc, "seed", Variant(env=seed_env))


def seed_invocation(svc: VLLMService, profiles: tuple[str, ...] = ()) -> Invocation:
    """What the seed Job runs: the wrapper around the seed's `vllm serve` (plus the profiles' seed_env)."""
    engine = seed_engine_invocation(svc, profiles)
    wrapped = render_seed_invocation(svc)
    return dataclasses.replace(engine, argv=[*wrapped.command, *wrapped.args], exits_by_itself=True)


def serve_invocation(svc: VLLMService, profile: str) -> Invocation:
    return _rendered(svc, "serve", VARIANTS[profile])


def stock_invocation(svc: VLLMService) -> Invocation:
    """Plain `vllm serve MODEL` with the user's own settings; the model path is the one stoker serves."""
    rendered = engine_invocation(svc, "serve")
    served = served_model_name(svc)
    args = [rendered.args[0], "--served-model-name", served]
    runtime = svc.spec.runtime
    if runtime.effective_tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(runtime.effective_tensor_parallel_size)]
    if runtime.max_model_len is not None:
        args += ["--max-model-len", str(runtime.max_model_len)]
    if runtime.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(runtime.gpu_memory_utilization)]
    return Invocation(
        argv=[*rendered.command, *args], env={}, port=8000, served_model_name=served, cache_mount_path=None
    )


def load_service(path: str) -> VLLMService:
    with open(path) as manifest:
        return VLLMService.model_validate(json.load(manifest))
