"""Read-ahead: while a new pod's vLLM spends its first 15-25 s importing Python (mostly one busy core),
read the checkpoint into the page cache, so that the weight loader finds it in memory instead of on a cold
disk.

The serving container runs `python3 -c READ_AHEAD_PROGRAM [--libraries] [--cache DIR] PATH... -- vllm
serve ...`. The program forks a reader and execs the server in its own process (same PID, same signals,
same exit code), so nothing of the pod's behaviour changes but what sits in the page cache. The reader
exits when it has read everything or when the server's process group is stopped. `read_ahead` is embedded
verbatim (like the seed's facts reader), so the vLLM image needs no stoker: only python3.

Measured on an H100 (bench/results/coldstart-h100-v0.26.0-fast.json): with InstantTensor reading the page
cache, 16 GB load in ~3 s instead of ~15 s, but the imports take ~8 s longer, since their own reads queue
behind the reader's (reproduced on CPU by bench/readahead/contention.py): a net 4.9 s.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import threading
from collections.abc import Callable

from stoker.api import VLLMService
from stoker.render.engine import (
    INSTANTTENSOR,
    EngineInvocation,
    engine_invocation,
    load_format,
    model_string,
    reads_ahead,
)


def read_ahead(
    paths: list[str], libraries: bool, caches: list[str], readers: int = 8, chunk: int = 16 << 20
) -> int:
    """Read, in this order: the shared libraries and bytecode that this interpreter imports for vLLM (if
    `libraries`), every `*.safetensors` file under `paths` (files or directories, symlinks followed; a hub
    id is looked up in the Hugging Face cache), every file under `caches` (compile artifacts). `readers`
    threads take `chunk`-byte ranges from one list. Returns the bytes read; unreadable files are skipped
    (their reader will report them)."""

    def files_under(root: str, wanted: Callable[[str], bool]) -> list[str]:
        if os.path.isfile(root):
            return [root]
        found = []
        for directory, subdirectories, names in os.walk(root, followlinks=True):
            subdirectories.sort()
            found += [os.path.join(directory, name) for name in sorted(names) if wanted(name)]
        return found

    def hub_cache_dir(model: str) -> str:
        home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        cache = os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))
        return os.path.join(cache, "models--" + model.replace("/", "--"), "snapshots")

    def imported(name: str) -> bool:
        # cuDNN's engine libraries are loaded on first use, which an LLM's forward pass never makes.
        library = (name.endswith(".so") or ".so." in name) and not name.startswith("libcudnn_")
        return library or name.endswith(".pyc")

    files: list[str] = []
    if libraries:
        packages = ("torch", "nvidia", "triton", "transformers", "vllm")
        for entry in dict.fromkeys(p for p in sys.path if os.path.isdir(p)):
            for package in packages:
                if os.path.isdir(os.path.join(entry, package)):
                    files += files_under(os.path.join(entry, package), imported)
    for path in paths:
        root = path if os.path.exists(path) or "://" in path else hub_cache_dir(path)
        files += files_under(root, lambda name: name.endswith(".safetensors"))
    for cache in caches:
        files += files_under(cache, lambda name: True)
    ranges = []
    for name in dict.fromkeys(files):
        try:
            size = os.path.getsize(name)
        except OSError:
            continue
        ranges += [(name, offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]
    taken = iter(ranges)
    lock = threading.Lock()
    total = [0]

    def reader() -> None:
        buffer = bytearray(chunk)
        descriptors: dict[str, int] = {}
        while True:
            with lock:
                item = next(taken, None)
            if item is None:
                break
            name, offset, length = item
            try:
                if name not in descriptors:
                    descriptors[name] = os.open(name, os.O_RDONLY)
                done = os.preadv(descriptors[name], [memoryview(buffer)[:length]], offset)
            except OSError:
                continue
            with lock:
                total[0] += done
        for descriptor in descriptors.values():
            os.close(descriptor)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total[0]


READ_AHEAD_PROGRAM = (
    "from __future__ import annotations\n\nimport os, sys, threading\n\n\n"
    + inspect.getsource(read_ahead)
    + """

arguments = sys.argv[1:]
split = arguments.index("--")
options, command = arguments[:split], arguments[split + 1 :]
paths, caches, given = [], [], iter(options)
for option in given:
    if option == "--cache":
        caches.append(next(given))
    elif option != "--libraries":
        paths.append(option)
if os.fork() == 0:
    # The reader: out of the imports' way on the CPU, gone with the server's process group.
    os.nice(10)
    try:
        read_ahead(paths, "--libraries" in options, caches)
    finally:
        os._exit(0)
os.execvp(command[0], command)
"""
)


def read_ahead_command(paths: list[str], libraries: bool, caches: tuple[str, ...] = ()) -> list[str]:
    """The command that runs READ_AHEAD_PROGRAM over `paths` (and `caches`); the server's argv follows."""
    options = [*(["--libraries"] if libraries else []), *(a for cache in caches for a in ("--cache", cache))]
    return ["python3", "-c", READ_AHEAD_PROGRAM, *options, *paths, "--"]


def serving_invocation(svc: VLLMService) -> EngineInvocation:
    """The serving pods' invocation: vLLM as engine_invocation renders it, under the read-ahead where
    `reads_ahead` says so. The wrapper is outside the compile-cache key's factors (render.cachekey reads
    engine_invocation): it changes what is in the page cache, not what vLLM compiles."""
    engine = engine_invocation(svc, "serve")
    if not reads_ahead(svc):
        return engine
    wrapper = read_ahead_command([model_string(svc)], libraries=False)
    env = dict(engine.env)
    if load_format(svc) == INSTANTTENSOR:
        # InstantTensor reads with direct I/O by default, which would pass the read-ahead's page cache by.
        env.setdefault("INSTANTTENSOR_BACKEND", "BUFFERED")  # runtime.env wins
    return dataclasses.replace(engine, command=[*wrapper, *engine.command], env=env)
