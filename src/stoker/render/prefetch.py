"""Read-ahead: while a new pod's vLLM spends its first 15-25 s importing Python (mostly one busy core),
read the checkpoint into the page cache, so that the weight loader finds it in memory instead of on a cold
disk.

The serving container runs `python3 -m stoker.inpod.read_ahead --gentle BYTES ... PATH... -- vllm serve ...`
(the program ships on the pod's programs volume, docs/in-pod-programs.md). It forks a reader and runs the
server in its own process (same PID, same signals, same exit code), so nothing of the pod's behaviour
changes but what sits in the page cache and when Python collects. The reader exits when it has read
everything or when the server's process group is stopped.

Measured on an H100 (bench/results/coldstart-h100-v0.26.0-fast.json): with InstantTensor reading the page
cache, 16 GB load in ~3 s instead of ~15 s, but eight readers of 16 MiB ranges from the start made the
imports ~8 s longer, since each of the imports' thousands of cold reads queues behind the reader's requests
(reproduced on CPU by bench/readahead/contention.py). Hence the gentle phase: until the server has forked its
engine process (its imports are done by then), one reader keeps a single `gentle`-byte request in flight,
without the kernel's own read-ahead; then all read.

With `--gc deferred` (rendered by default) the program runs `vllm`'s console script in its own process, as
`python3 SCRIPT` would, with the cyclic garbage collector off until the engine process starts, and then
freezes the import heap: vLLM's imports leave ~650,000 objects that the collector tracks, and CPython
collects ~1,600 times on the way, each older-generation pass walking a growing heap (~1.2 s of a 6.7 s
warm import on CPU, bench/results/gc-imports-cpu.txt). Measured on two H100 hosts
(bench/results/coldstart-h100.json and -run5.json, 6 repetitions each): imports 13.1 and 14.9 s instead of
17.0 and 19.3 s (means), ready 26.6 and 27.6 s instead of 31.6 and 37.6 s (medians), decode unchanged. A
`vllm` that is not a script of this python3 is exec'd as before.
"""

from __future__ import annotations

import dataclasses

from stoker.api import VLLMService
from stoker.api.owned import CACHE_MOUNT_PATH
from stoker.inpod import read_ahead
from stoker.render.cachekey import short_cache_key
from stoker.render.engine import (
    INSTANTTENSOR,
    EngineInvocation,
    engine_invocation,
    load_format,
    model_string,
    reads_ahead,
)

# The gentle phase's request size rendered by default (0: all readers from the start). Measured on an H100
# host (bench/results/coldstart-h100-v0.26.0-gentle.json): with 512 KiB the imports took 0.8-7.6 s longer
# than stock's (paired) instead of 7.8-13.6 s (eight readers from the start), and one reader still read 16 GB
# in ~21 s, before the engine process asked for it; 4 MiB requests kept the imports as slow as eight readers,
# 128 KiB read too slowly.
GENTLE_BYTES = 512 << 10
# Once all readers read, each request is at most this size, with no kernel read-ahead: with the import pages
# in memory the imports end sooner, half the checkpoint is still unread when vLLM forks its engine process,
# and the engine process's own cold reads wait behind whatever the readers have in flight. Measured on an
# H100 host (bench/results/coldstart-h100-v0.26.0-pages.json, `stoker-wide-1m`): engine start 3.0 s instead
# of 3.9 s (lower in 4 of 4 repetitions) with whole 16 MiB ranges and the kernel's 8 MiB read-ahead.
WIDE_REQUEST_BYTES = 1 << 20


# Python's bytecode, where the image has none for vLLM (stoker.inpod.keep_bytecode): the seed writes it,
# serving pods load it. Not keyed: Python checks each file against its source, and the seed of a new key
# empties the volume.
BYTECODE_DIRECTORY = f"{CACHE_MOUNT_PATH}/stoker/bytecode"


def read_ahead_command(
    paths: list[str],
    gentle: int = GENTLE_BYTES,
    pages: str = "",
    request: int = 0,
    defer_gc: bool = False,
    import_fixes: bool = False,
) -> list[str]:
    """The command that runs the read-ahead (stoker.inpod.read_ahead) over `paths` (after the pages listed
    in `pages`, if given; in requests of at most `request` bytes, if given; the server in this process with
    its garbage collector off during its imports, if `defer_gc`, and then with stoker.inpod.import_fixes,
    if `import_fixes`); the server's argv follows. The server runs with torch's ptxas pinned, as the seed's
    does (render.seed): the Triton kernels the seed compiled are keyed as these pods look them up; and with
    the seed's bytecode where the image has none."""
    options = ["--gentle", str(gentle), *(["--request", str(request)] if request else [])]
    in_process = ["--gc", "deferred", *(["--import-fixes"] if import_fixes else [])] if defer_gc else []
    return [
        "python3",
        "-m",
        read_ahead.__name__,
        *options,
        *(["--pages", pages] if pages else []),
        *in_process,
        "--pin-ptxas",
        "--bytecode",
        BYTECODE_DIRECTORY,
        *paths,
        "--",
    ]


def import_pages_listing(svc: VLLMService) -> str:
    """Where the seed Job records, on the cache volume, the pages its vLLM read before starting the engine
    process (stoker.inpod.seed), and serving pods of the same compile-cache key (so the same image) read
    them first. Keyed, since the volume outlives the seeds of earlier keys."""
    return f"{CACHE_MOUNT_PATH}/stoker/import-pages-{short_cache_key(svc)}"


def read_ahead_paths(svc: VLLMService) -> list[str]:
    """The checkpoint paths the read-ahead reads, as `vllm serve` names the model (a directory on the
    model volume, or a hub name the programs resolve in HF_HOME); the node warmer reads the same."""
    return [model_string(svc)]


def serving_invocation(
    svc: VLLMService,
    gentle: int = GENTLE_BYTES,
    import_pages: bool = True,
    request: int = WIDE_REQUEST_BYTES,
    defer_gc: bool = True,
    import_fixes: bool = True,
) -> EngineInvocation:
    """The serving pods' invocation: vLLM as engine_invocation renders it, under the read-ahead where
    `reads_ahead` says so (reading the seed's import pages first, unless `import_pages` is off; running
    vLLM with its garbage collector off until its imports are done, unless `defer_gc` is off, and the
    import fixes, unless `import_fixes` is off). The wrapper
    is outside the compile-cache key's factors (render.cachekey reads engine_invocation): it changes what is
    in the page cache and when Python collects, not what vLLM compiles."""
    engine = engine_invocation(svc, "serve")
    if not reads_ahead(svc):
        return engine
    pages = import_pages_listing(svc) if import_pages else ""
    wrapper = read_ahead_command(read_ahead_paths(svc), gentle, pages, request, defer_gc, import_fixes)
    env = dict(engine.env)
    if load_format(svc) == INSTANTTENSOR:
        # InstantTensor reads with direct I/O by default, which would pass the read-ahead's page cache by.
        env.setdefault("INSTANTTENSOR_BACKEND", "BUFFERED")  # runtime.env wins
    return dataclasses.replace(engine, command=[*wrapper, *engine.command], env=env)
