"""Read-ahead: while a new pod's vLLM spends its first 15-25 s importing Python (mostly one busy core),
read the checkpoint into the page cache, so that the weight loader finds it in memory instead of on a cold
disk.

The serving container runs `python3 -c READ_AHEAD_PROGRAM --gentle BYTES PATH... -- vllm serve ...`. The
program forks a reader and execs the server in its own process (same PID, same signals, same exit code),
so nothing of the pod's behaviour changes but what sits in the page cache. The reader exits when it has
read everything or when the server's process group is stopped. `read_ahead` and `server_has_child` are
embedded verbatim (like the seed's facts reader), so the vLLM image needs no stoker: only python3.

Measured on an H100 (bench/results/coldstart-h100-v0.26.0-fast.json): with InstantTensor reading the page
cache, 16 GB load in ~3 s instead of ~15 s, but eight readers of 16 MiB ranges from the start made the
imports ~8 s longer, since each of the imports' thousands of cold reads queues behind the reader's requests
(reproduced on CPU by bench/readahead/contention.py). Hence the gentle phase: until the server has forked its
engine process (its imports are done by then), one reader keeps a single `gentle`-byte request in flight,
without the kernel's own read-ahead; then all read.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
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

# The gentle phase's request size rendered by default (0: all readers from the start). Measured on an H100
# host (bench/results/coldstart-h100-v0.26.0-gentle.json): with 512 KiB the imports took 0.8-7.6 s longer
# than stock's (paired) instead of 7.8-13.6 s (eight readers from the start), and one reader still read 16 GB
# in ~21 s, before the engine process asked for it; 4 MiB requests kept the imports as slow as eight readers,
# 128 KiB read too slowly.
GENTLE_BYTES = 512 << 10


def read_ahead(
    paths: list[str],
    readers: int = 8,
    chunk: int = 16 << 20,
    gentle: int = 0,
    engine_started: Callable[[], bool] = lambda: True,
) -> int:
    """Read every `*.safetensors` file under `paths` (files or directories, symlinks followed; a hub id is
    looked up in the Hugging Face cache): `readers` threads take `chunk`-byte ranges from one list. With
    `gentle` > 0, until `engine_started()` (polled) one thread reads alone, `gentle` bytes a request.
    Returns the bytes read; unreadable files are skipped (their reader will report them)."""

    def files_under(root: str) -> list[str]:
        if os.path.isfile(root):
            return [root]
        found = []
        for directory, subdirectories, names in os.walk(root, followlinks=True):
            subdirectories.sort()
            found += [
                os.path.join(directory, name) for name in sorted(names) if name.endswith(".safetensors")
            ]
        return found

    def hub_cache_dir(model: str) -> str:
        home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        cache = os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))
        return os.path.join(cache, "models--" + model.replace("/", "--"), "snapshots")

    files: list[str] = []
    for path in paths:
        files += files_under(path if os.path.exists(path) or "://" in path else hub_cache_dir(path))
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
    all_readers = threading.Event()
    if not gentle:
        all_readers.set()

    def reader() -> None:
        buffer = memoryview(bytearray(chunk))
        descriptors: dict[str, int] = {}
        while True:
            with lock:
                item = next(taken, None)
            if item is None:
                break
            name, offset, length = item
            done = 0
            try:
                if name not in descriptors:
                    descriptors[name] = os.open(name, os.O_RDONLY)
                    if not all_readers.is_set():
                        # No kernel read-ahead (up to read_ahead_kb, 8 MiB on the H100 host) beyond each
                        # gentle request: one request in flight, no more.
                        os.posix_fadvise(descriptors[name], 0, 0, os.POSIX_FADV_RANDOM)
                while done < length:
                    step = length - done if all_readers.is_set() else min(gentle, length - done)
                    read = os.preadv(descriptors[name], [buffer[done : done + step]], offset + done)
                    if read <= 0:
                        break
                    done += read
            except OSError:
                pass
            with lock:
                total[0] += done
        for descriptor in descriptors.values():
            os.close(descriptor)

    first = threading.Thread(target=reader, daemon=True)
    first.start()
    while gentle and first.is_alive() and not engine_started():
        first.join(0.2)
    all_readers.set()
    others = [threading.Thread(target=reader, daemon=True) for _ in range(readers - 1)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join()
    return total[0]


def server_has_child(server: int, reader: int) -> bool:
    """Whether process `server` has a child other than `reader`: vLLM's API server starts its engine
    process only once its own imports are done."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == reader:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == server:
            return True
    return False


READ_AHEAD_PROGRAM = (
    "from __future__ import annotations\n\nimport os, sys, threading, time\n\n\n"
    + inspect.getsource(read_ahead)
    + "\n\n"
    + inspect.getsource(server_has_child)
    + """

arguments = sys.argv[1:]
split = arguments.index("--")
options, command = arguments[:split], arguments[split + 1 :]
gentle, paths = int(options[1]), options[2:]  # --gentle BYTES PATH...
server = os.getpid()
if os.fork() == 0:
    # The reader: out of the imports' way on the CPU, gone with the server's process group.
    os.nice(10)
    began, widened = time.monotonic(), []

    def engine_started():
        if server_has_child(server, os.getpid()):
            widened.append(time.monotonic() - began)
        return bool(widened)

    try:
        read = read_ahead(paths, gentle=gentle, engine_started=engine_started)
        how = f"all readers from {widened[0]:.1f} s" if widened else "one reader" if gentle else "all readers"
        seconds = time.monotonic() - began
        print(f"stoker read-ahead: {read} bytes in {seconds:.1f} s, {how}", file=sys.stderr, flush=True)
    finally:
        os._exit(0)
os.execvp(command[0], command)
"""
)


def read_ahead_command(paths: list[str], gentle: int = GENTLE_BYTES) -> list[str]:
    """The command that runs READ_AHEAD_PROGRAM over `paths`; the server's argv follows."""
    return ["python3", "-c", READ_AHEAD_PROGRAM, "--gentle", str(gentle), *paths, "--"]


def serving_invocation(svc: VLLMService, gentle: int = GENTLE_BYTES) -> EngineInvocation:
    """The serving pods' invocation: vLLM as engine_invocation renders it, under the read-ahead where
    `reads_ahead` says so. The wrapper is outside the compile-cache key's factors (render.cachekey reads
    engine_invocation): it changes what is in the page cache, not what vLLM compiles."""
    engine = engine_invocation(svc, "serve")
    if not reads_ahead(svc):
        return engine
    wrapper = read_ahead_command([model_string(svc)], gentle)
    env = dict(engine.env)
    if load_format(svc) == INSTANTTENSOR:
        # InstantTensor reads with direct I/O by default, which would pass the read-ahead's page cache by.
        env.setdefault("INSTANTTENSOR_BACKEND", "BUFFERED")  # runtime.env wins
    return dataclasses.replace(engine, command=[*wrapper, *engine.command], env=env)
