"""Read-ahead: while a new pod's vLLM spends its first 15-25 s importing Python (mostly one busy core),
read the checkpoint into the page cache, so that the weight loader finds it in memory instead of on a cold
disk.

The serving container runs `python3 -c READ_AHEAD_PROGRAM --gentle BYTES ... PATH... -- vllm serve ...`. The
program forks a reader and runs the server in its own process (same PID, same signals, same exit code),
so nothing of the pod's behaviour changes but what sits in the page cache and when Python collects. The
reader exits when it has read everything or when the server's process group is stopped. The functions it
runs are embedded verbatim (like the seed's facts reader), so the vLLM image needs no stoker: only python3.

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
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable

from stoker.api import VLLMService
from stoker.api.owned import CACHE_MOUNT_PATH
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


def read_ranges(
    ranges: list[tuple[str, int, int]],
    readers: int = 8,
    gentle: int = 0,
    engine_started: Callable[[], bool] = lambda: True,
    exact: bool = False,
    request: int = 0,
) -> int:
    """Read the `(path, offset, length)` ranges into the page cache: `readers` threads take them in order
    from one list, each range in one request (`request` > 0: requests of at most that size). With `gentle`
    > 0, until `engine_started()` (polled) one thread reads alone, `gentle` bytes a request. `exact` (or
    small requests): no kernel read-ahead beyond them. Returns the bytes read; unreadable files are skipped
    (their reader will report them)."""
    taken = iter(ranges)
    lock = threading.Lock()
    total = [0]
    all_readers = threading.Event()
    if not gentle:
        all_readers.set()

    def reader() -> None:
        buffer = memoryview(bytearray(max((length for _, _, length in ranges), default=0)))
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
                    if exact or request or not all_readers.is_set():
                        # No kernel read-ahead (up to read_ahead_kb, 8 MiB on the H100 host) beyond each
                        # request: a gentle reader keeps one request in flight, no more.
                        os.posix_fadvise(descriptors[name], 0, 0, os.POSIX_FADV_RANDOM)
                while done < length:
                    step = (request or length) if all_readers.is_set() else gentle
                    step = min(step, length - done)
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


def checkpoint_ranges(paths: list[str], chunk: int = 16 << 20) -> list[tuple[str, int, int]]:
    """`chunk`-byte ranges of every `*.safetensors` file under `paths` (files or directories, symlinks
    followed; a hub id is looked up in the Hugging Face cache)."""

    def safetensors_under(root: str) -> list[str]:
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
        files += safetensors_under(path if os.path.exists(path) or "://" in path else hub_cache_dir(path))
    ranges = []
    for name in dict.fromkeys(files):
        try:
            size = os.path.getsize(name)
        except OSError:
            continue
        ranges += [(name, offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]
    return ranges


def listed_ranges(listing: str, chunk: int = 4 << 20) -> list[tuple[str, int, int]]:
    """The `path start end` lines of a page listing (the seed's, from resident_pages) in `chunk`-byte
    ranges; an absent or unreadable listing is none."""
    ranges = []
    try:
        with open(listing, encoding="utf-8") as lines:
            for line in lines:
                path, start, end = line.rstrip("\n").rsplit(" ", 2)
                ranges += [(path, o, min(chunk, int(end) - o)) for o in range(int(start), int(end), chunk)]
    except (OSError, ValueError):
        return []
    return ranges


def read_ahead(
    paths: list[str],
    readers: int = 8,
    chunk: int = 16 << 20,
    gentle: int = 0,
    engine_started: Callable[[], bool] = lambda: True,
    request: int = 0,
) -> int:
    """Read the checkpoint under `paths` (checkpoint_ranges) with `readers` threads, gently until
    `engine_started()` (read_ranges). Returns the bytes read."""
    return read_ranges(checkpoint_ranges(paths, chunk), readers, gentle, engine_started, request=request)


def files_under(roots: list[str]) -> list[str]:
    """The regular files under `roots` (files or directories; directory links not followed), each once
    (by real path), in the roots' order."""
    found: dict[str, None] = {}
    for root in roots:
        if os.path.isfile(root):
            found.setdefault(os.path.realpath(root))
        for directory, subdirectories, names in os.walk(root):
            subdirectories.sort()
            for name in sorted(names):
                path = os.path.realpath(os.path.join(directory, name))
                if os.path.isfile(path):
                    found.setdefault(path)
    return list(found)


def evict_pages(files: list[str]) -> None:
    """Drop the files' pages from the page cache (POSIX_FADV_DONTNEED: no privilege needed; pages that a
    process has mapped stay)."""
    for path in files:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(descriptor)


def resident_pages(files: list[str]) -> list[tuple[str, int, int]]:
    """`(path, start, end)` for every run of the files' pages that is in the page cache (mincore)."""
    import ctypes
    import mmap
    import re

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    failed = ctypes.c_void_p(-1).value
    # mincore's byte per page: bit 0 says resident, the other bits are reserved.
    resident_bit = bytes(range(256)).translate(bytes(b & 1 for b in range(256)))
    runs = []
    for path in files:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            size = os.fstat(descriptor).st_size
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0) if size else None
            if address in (None, failed):
                continue
            flags = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
            known = libc.mincore(address, size, flags) == 0
            libc.munmap(address, size)
        finally:
            os.close(descriptor)
        if known:
            for run in re.finditer(rb"\x01+", flags.raw.translate(resident_bit)):
                runs.append((path, run.start() * mmap.PAGESIZE, min(run.end() * mmap.PAGESIZE, size)))
    return runs


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


def script_of_this_python(name: str) -> str | None:
    """The path of console script `name` when its `#!` line names this interpreter (same directory and same
    binary: a venv's pythons are links to one system binary), else None."""
    import shutil

    path = shutil.which(name)
    try:
        with open(path or "", "rb") as script:
            line = script.readline(1024)
    except OSError:
        return None
    words = [os.fsdecode(word) for word in line[2:].split()] if line.startswith(b"#!") else []
    if words[:1] and os.path.basename(words[0]) == "env":
        words = words[1:]
    interpreter = shutil.which(words[0]) if len(words) == 1 else None
    if interpreter is None:
        return None
    same_directory = os.path.dirname(os.path.abspath(interpreter)) == os.path.dirname(sys.executable)
    same_binary = os.path.realpath(interpreter) == os.path.realpath(sys.executable)
    return path if same_directory and same_binary else None


def run_with_deferred_gc(script: str, arguments: list[str], reader: int) -> None:
    """Run the Python console script in this process with the cyclic garbage collector off until the server
    starts a child other than `reader` (its imports are done), then freeze what the imports built (later
    collections, the forked engine's included, skip it, as vLLM's own gc.freeze after start-up does) and turn
    the collector on."""
    import gc
    import runpy

    collecting = threading.Event()

    def collect_from_now_on() -> None:
        if not collecting.is_set():
            collecting.set()
            gc.freeze()
            gc.enable()

    def watch() -> None:
        while not collecting.is_set() and not server_has_child(os.getpid(), reader):
            time.sleep(0.5)  # late is harmless: the collector stays off a little longer
        collect_from_now_on()

    gc.disable()
    # A forked engine process starts with the collector on; a spawned one is a child that watch sees.
    os.register_at_fork(before=collect_from_now_on)
    threading.Thread(target=watch, daemon=True).start()
    sys.argv = [script, *arguments]
    if sys.path[:1] == [""]:
        sys.path[0] = os.path.dirname(script)  # what python3 SCRIPT puts first, not the working directory
    runpy.run_path(script, run_name="__main__")


READ_AHEAD_PROGRAM = (
    "from __future__ import annotations\n\nimport os, sys, threading, time\n\n\n"
    + "\n\n".join(
        inspect.getsource(f)
        for f in (
            read_ranges,
            checkpoint_ranges,
            listed_ranges,
            read_ahead,
            server_has_child,
            script_of_this_python,
            run_with_deferred_gc,
        )
    )
    + """

arguments = sys.argv[1:]
split = arguments.index("--")
options, command = arguments[:split], arguments[split + 1 :]
settings = {"--gentle": "0", "--request": "0", "--pages": "", "--gc": "on"}
# --gentle BYTES [--request BYTES] [--pages LISTING] [--gc deferred] PATH...
while options[:1] and options[0] in settings:
    settings[options[0]], options = options[1], options[2:]
gentle, request, pages = int(settings["--gentle"]), int(settings["--request"]), settings["--pages"]
paths = options
server = os.getpid()
reader = os.fork()
if reader == 0:
    # The reader: out of the imports' way on the CPU, gone with the server's process group.
    os.nice(10)
    began, widened = time.monotonic(), []

    def engine_started():
        if server_has_child(server, os.getpid()):
            widened.append(time.monotonic() - began)
        return bool(widened)

    try:
        if pages:
            read = read_ranges(listed_ranges(pages), exact=True, request=request)
            seconds = time.monotonic() - began
            pages_line = f"stoker read-ahead: {read} bytes of the imports' pages in {seconds:.1f} s"
            print(pages_line, file=sys.stderr, flush=True)
        read = read_ahead(paths, gentle=gentle, engine_started=engine_started, request=request)
        how = f"all readers from {widened[0]:.1f} s" if widened else "one reader" if gentle else "all readers"
        seconds = time.monotonic() - began
        print(f"stoker read-ahead: {read} bytes in {seconds:.1f} s, {how}", file=sys.stderr, flush=True)
    finally:
        os._exit(0)
script = script_of_this_python(command[0]) if settings["--gc"] == "deferred" else None
if script:
    run_with_deferred_gc(script, command[1:], reader)
else:
    if settings["--gc"] == "deferred":
        print(f"stoker: {command[0]} is not a script of {sys.executable}: exec'd", file=sys.stderr)
    os.execvp(command[0], command)
"""
)


def read_ahead_command(
    paths: list[str], gentle: int = GENTLE_BYTES, pages: str = "", request: int = 0, defer_gc: bool = False
) -> list[str]:
    """The command that runs READ_AHEAD_PROGRAM over `paths` (after the pages listed in `pages`, if
    given; in requests of at most `request` bytes, if given; the server in this process with its garbage
    collector off during its imports, if `defer_gc`); the server's argv follows."""
    options = ["--gentle", str(gentle), *(["--request", str(request)] if request else [])]
    return [
        "python3",
        "-c",
        READ_AHEAD_PROGRAM,
        *options,
        *(["--pages", pages] if pages else []),
        *(["--gc", "deferred"] if defer_gc else []),
        *paths,
        "--",
    ]


def import_pages_listing(svc: VLLMService) -> str:
    """Where the seed Job records, on the cache volume, the pages its vLLM read before starting the engine
    process (seed.SEED_WRAPPER), and serving pods of the same compile-cache key (so the same image) read
    them first. Keyed, since the volume outlives the seeds of earlier keys."""
    return f"{CACHE_MOUNT_PATH}/stoker/import-pages-{short_cache_key(svc)}"


def serving_invocation(
    svc: VLLMService,
    gentle: int = GENTLE_BYTES,
    import_pages: bool = True,
    request: int = WIDE_REQUEST_BYTES,
    defer_gc: bool = True,
) -> EngineInvocation:
    """The serving pods' invocation: vLLM as engine_invocation renders it, under the read-ahead where
    `reads_ahead` says so (reading the seed's import pages first, unless `import_pages` is off; running
    vLLM with its garbage collector off until its imports are done, unless `defer_gc` is off). The wrapper
    is outside the compile-cache key's factors (render.cachekey reads engine_invocation): it changes what is
    in the page cache and when Python collects, not what vLLM compiles."""
    engine = engine_invocation(svc, "serve")
    if not reads_ahead(svc):
        return engine
    pages = import_pages_listing(svc) if import_pages else ""
    wrapper = read_ahead_command([model_string(svc)], gentle, pages, request, defer_gc)
    env = dict(engine.env)
    if load_format(svc) == INSTANTTENSOR:
        # InstantTensor reads with direct I/O by default, which would pass the read-ahead's page cache by.
        env.setdefault("INSTANTTENSOR_BACKEND", "BUFFERED")  # runtime.env wins
    return dataclasses.replace(engine, command=[*wrapper, *engine.command], env=env)
