"""What each benchmark profile runs: stock `vllm serve`, or stoker's own rendered invocations plus a lever.

Nothing here copies a stoker flag: the `stoker*` profiles take command, args and environment from stoker's
builders (`render.seed_invocation`, `render.prefetch.serving_invocation`), exactly as the operator puts them
into the seed Job and the Deployment. A variant changes one lever, as a spec setting that the builders
render (the single levers are set on `stoker-previous`, what the operator rendered before) or, where no
spec setting exists, as an environment variable, a compilation-config key or an argument, so its effect is
measured side by side with what the operator renders today. `stock` is what a user runs without stoker:
the same model and the same user-level settings (served name, context length, memory share), nothing else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from stoker.api import VLLMService
from stoker.render import Role, cache_key, engine_invocation
from stoker.render import seed_invocation as render_seed_invocation
from stoker.render.engine import literal_env, served_model_name
from stoker.render.prefetch import GENTLE_BYTES, WIDE_REQUEST_BYTES, serving_invocation

COMPILATION_CONFIG_FLAG = "--compilation-config"
# The renderer forks the engine process by default (measured here first as the lever "stoker-fork", see
# docs/benchmarks/gpu-coldstart.md); "stoker-spawn" keeps vLLM's CLI default for comparison.
SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
# Exactly what the operator renders; every other serving profile is a lever on top of it.
DEFAULT_PROFILE = "stoker"
# What the operator rendered before the read-ahead, InstantTensor and the startup plan became its default
# (2026-11-23): the streamer with 16 readers, no read-ahead, no plan. The single levers are measured on it.
PREVIOUS = {
    "coldStart": {
        "loader": {"format": "runai_streamer", "concurrency": 16, "readAhead": False},
        "startupPlan": False,
    }
}


@dataclass(frozen=True)
class Variant:
    """A lever on top of the rendered serving invocation: spec settings (rendered by stoker's builders),
    or what no spec setting gives (environment, compilation config, arguments, a wider read-ahead)."""

    # Merged into the manifest's spec before rendering (a JSON merge patch).
    spec: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    compilation: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    # The read-ahead's gentle-phase request size (render.prefetch.read_ahead), if not the rendered one.
    gentle: int | None = None
    # False: the read-ahead reads the checkpoint alone, not the seed's import pages first.
    import_pages: bool = True
    # The read-ahead's request size once all readers read (render.prefetch.read_ranges), if not the rendered
    # one; 0: each 16 MiB range in one request.
    request: int | None = None
    # False: vLLM runs with its garbage collector on during its imports (exec'd, as before 2026-11-24).
    defer_gc: bool = True
    # False: vLLM's imports run without stoker.inpod.import_fixes.
    import_fixes: bool = True
    # After the usual probes: sleep (level 1), wake up, and serve again.
    sleep_check: bool = False
    # Started on a node stoker warmed (coldstart.py: harness.warm_node, what the node warmer keeps resident).
    warm_node: bool = False
    # The engine's stacks sampled into the log after graph capture (harness.StackSampler).
    stack_samples: bool = False
    note: str = ""


LOADER_KEYS = ("format", "concurrency", "readAhead")
MEGA_AOT = {"runtime": {"env": [{"name": "VLLM_USE_MEGA_AOT_ARTIFACT", "value": "1"}]}}
NO_MEGA_AOT = {"runtime": {"env": [{"name": "VLLM_USE_MEGA_AOT_ARTIFACT", "value": "0"}]}}


def _previous_with(**changes: Any) -> dict[str, Any]:
    """PREVIOUS with `changes` merged into its loader (loader keys) or its coldStart (the others)."""
    loader = {**PREVIOUS["coldStart"]["loader"], **{k: v for k, v in changes.items() if k in LOADER_KEYS}}
    rest = {k: v for k, v in changes.items() if k not in LOADER_KEYS}
    return {"coldStart": {**PREVIOUS["coldStart"], "loader": loader, **rest}}


# Levers measured side by side; each entry says why it might help. All but the two that say otherwise
# (mega AOT: its own seed; sleep: compiles) reuse the default's seeded cache: the load format, the
# read-ahead and VLLM_ENABLE_STARTUP_PLAN are outside vLLM's compile-cache key, as is
# VLLM_WORKER_MULTIPROC_METHOD, and compilation mode 0 neither reads nor needs a compile cache.
VARIANTS: dict[str, Variant] = {
    DEFAULT_PROFILE: Variant(note="exactly what the operator renders"),
    "stoker-warm": Variant(warm_node=True, note="exactly what the operator renders, on a node stoker warmed"),
    "stoker-previous": Variant(spec=PREVIOUS, note="what the operator rendered before 2026-11-23"),
    "stoker-readahead": Variant(
        spec=_previous_with(readAhead=True),
        note="previous + the checkpoint read into the page cache while Python imports (streamer kept)",
    ),
    "stoker-instanttensor": Variant(
        spec=_previous_with(format="instanttensor", concurrency=None),
        note="previous + InstantTensor: pipelined io_uring direct reads into GPU memory",
    ),
    "stoker-plan": Variant(
        spec=_previous_with(startupPlan=True),
        note="previous + the seed's persisted startup plan: memory profiling and CUDA-graph memory "
        "estimation skipped",
    ),
    "stoker-fastsafetensors": Variant(
        spec=_previous_with(format="fastsafetensors", concurrency=None),
        note="previous + fastsafetensors (a dependency of vLLM 0.26.0): pinned bounce buffers, GDS where "
        "present",
    ),
    "stoker-readahead-plan": Variant(
        spec=_previous_with(readAhead=True, startupPlan=True),
        note="previous + the read-ahead and the startup plan, the streamer kept",
    ),
    "stoker-eager": Variant(
        gentle=0,
        note="stoker with all eight read-ahead readers on the checkpoint from the start (right after the "
        "import pages), not one gentle reader until the engine process exists",
    ),
    # Before 2026-11-24 (noon) each reader read its whole 16 MiB range in one request, with the kernel's own
    # read-ahead on top, once all eight read.
    "stoker-whole-ranges": Variant(
        request=0,
        note="stoker with each 16 MiB range in one request (and the kernel's read-ahead), not 1 MiB "
        "requests, once all eight readers read",
    ),
    # Before 2026-11-24 (afternoon) the wrapper exec'd vLLM, whose imports ran with Python's collector on:
    # ~1,600 collections over a heap growing to a million objects, ~1/6 of the import time on CPU.
    "stoker-gc": Variant(
        defer_gc=False,
        note="stoker with vLLM exec'd, its garbage collector on during its imports and its heap not frozen "
        "for the engine process",
    ),
    "stoker-no-import-fixes": Variant(
        import_fixes=False,
        note="stoker without the import fixes (transformers' models scanned twice, torch's get_source "
        "reading source lines)",
    ),
    "stoker-nopages": Variant(
        import_pages=False,
        note="stoker without the seed's import pages: the gentle read-ahead of the checkpoint alone",
    ),
    # Each cold read of the importing server waits behind the reader's request in flight (~3 ms for 4 MiB
    # at 1.4 GB/s, over thousands of module reads): smaller requests, shorter waits, if the reader keeps up.
    "stoker-gentle-4m": Variant(
        gentle=4 << 20,
        note="stoker with 4 MiB requests, not 512 KiB, in the read-ahead's gentle phase",
    ),
    "stoker-gentle-128k": Variant(
        gentle=128 << 10,
        note="stoker with 128 KiB requests, not 512 KiB, in the read-ahead's gentle phase",
    ),
    # vLLM 0.26 on torch 2.11 leaves the mega AOT artifact off (on by default from torch 2.12): one artifact
    # replaces Dynamo and the compiled graphs on a hit. It enters the cache key, so it has its own seed.
    # Measured on 0.26.0 (bench/results/coldstart-h100-v0.26.0-gentle-run1.json, and on an H200 on
    # 2026-11-27): torch.compile 0.4-0.8 s instead of 5.4-7.7 s, but 11-14 s more between graph capture and
    # "Kernel JIT monitor activated" (0.5-0.8 s otherwise), where the V2 runner warms its kernels up: the
    # start JIT-compiles 22 Triton kernels the seed compiled under other cache keys (docs/benchmarks/h200.md).
    "stoker-mega-aot": Variant(spec=MEGA_AOT, note="stoker with VLLM_USE_MEGA_AOT_ARTIFACT=1 (its own seed)"),
    "stoker-mega-aot-warm": Variant(
        spec=MEGA_AOT, warm_node=True, note="stoker-mega-aot on a node stoker warmed"
    ),
    # Since run 3 (docs/benchmarks/h200.md) the artifact is the 0.26 default: this is the default before.
    "stoker-no-mega-aot": Variant(
        spec=NO_MEGA_AOT, note="stoker with VLLM_USE_MEGA_AOT_ARTIFACT=0, the 0.26 default before run 3"
    ),
    "stoker-no-mega-aot-warm": Variant(
        spec=NO_MEGA_AOT, warm_node=True, note="stoker-no-mega-aot on a node stoker warmed"
    ),
    "stoker-mega-aot-stacks": Variant(
        spec=MEGA_AOT,
        stack_samples=True,
        note="stoker-mega-aot with the engine's stacks sampled every 0.5 s after graph capture",
    ),
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
    # compiles; it shows whether a forked engine can sleep, wake and serve.
    "stoker-sleep": Variant(
        env={"VLLM_SERVER_DEV_MODE": "1"},
        extra_args=("--enable-sleep-mode",),
        sleep_check=True,
        note="sleep mode: sleep level 1, wake up, serve",
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
    stack_samples: bool = False
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


def patched_spec(svc: VLLMService, patch: dict[str, Any]) -> VLLMService:
    """`svc` with `patch` merged into its spec (None removes a key, as in a JSON merge patch)."""

    def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
        merged = dict(base)
        for key, value in changes.items():
            if value is None:
                merged.pop(key, None)
            elif isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
        return merged

    raw = svc.model_dump(mode="json", by_alias=True, exclude_none=True)
    return VLLMService.model_validate({**raw, "spec": merge(raw["spec"], patch)})


def _rendered(svc: VLLMService, role: Role, variant: Variant) -> Invocation:
    svc = patched_spec(svc, variant.spec)
    if role != "serve":
        rendered = engine_invocation(svc, role)
    else:
        gentle = GENTLE_BYTES if variant.gentle is None else variant.gentle
        request = WIDE_REQUEST_BYTES if variant.request is None else variant.request
        rendered = serving_invocation(
            svc, gentle, variant.import_pages, request, variant.defer_gc, variant.import_fixes
        )
    args = _with_compilation(list(rendered.args), variant.compilation) + list(variant.extra_args)
    port = _flag_value(args, "--port")
    served = _flag_value(args, "--served-model-name")
    return Invocation(
        argv=[*rendered.command, *args],
        env={**rendered.env, **variant.env},
        port=int(port) if port else 8000,
        served_model_name=served or svc.spec.model.name,
        cache_mount_path=rendered.cache_mount_path,
        sleep_check=variant.sleep_check,
        stack_samples=variant.stack_samples,
    )


def seed_engine_invocation(svc: VLLMService) -> Invocation:
    """The seed's `vllm serve` alone, without the Job's wrapper (seedwarmup.py times the warm-up itself)."""
    return _rendered(svc, "seed", Variant())


def patched_service(svc: VLLMService, profile: str) -> VLLMService:
    """`svc` with `profile`'s spec changes (its cache key, so its import-pages listing, may differ)."""
    return patched_spec(svc, VARIANTS[profile].spec)


def seed_key(svc: VLLMService, profile: str) -> str:
    """stoker's compile-cache key of `profile`'s spec: profiles with the default's share its seed."""
    return cache_key(patched_service(svc, profile))


def seed_invocation(svc: VLLMService, profile: str = DEFAULT_PROFILE) -> Invocation:
    """What the seed Job of `profile`'s spec runs: the wrapper around the seed's `vllm serve`."""
    patched = patched_service(svc, profile)
    engine = seed_engine_invocation(patched)
    wrapped = render_seed_invocation(patched)
    return dataclasses.replace(engine, argv=[*wrapped.command, *wrapped.args], exits_by_itself=True)


def serve_invocation(svc: VLLMService, profile: str) -> Invocation:
    return _rendered(svc, "serve", VARIANTS[profile])


def stock_invocation(svc: VLLMService) -> Invocation:
    """Plain `vllm serve MODEL` with the user's own settings (its runtime.env included); the model path is
    the one stoker serves."""
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
        argv=[*rendered.command, *args],
        env=literal_env(svc),
        port=8000,
        served_model_name=served,
        cache_mount_path=None,
    )


def load_service(path: str) -> VLLMService:
    with open(path) as manifest:
        return VLLMService.model_validate(json.load(manifest))
