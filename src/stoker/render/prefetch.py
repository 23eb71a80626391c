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

The tree it reads is the VLLMService author's: it opens regular files only, does not follow directory links,
bounds its walk, the listing and its own address space, and says in one line why it skips anything
(docs/in-pod-programs.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

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
    ranges: Iterable[tuple[str, int, int]],
    readers: int = 8,
    gentle: int = 0,
    engine_started: Callable[[], bool] = lambda: True,
    exact: bool = False,
    request: int = 0,
) -> int:
    """Read the `(path, offset, length)` ranges into the page cache: `readers` threads take them in order
    from one iterable (checkpoint_ranges and listed_ranges generate them as they go), each range in one
    request (`request` > 0: requests of at most that size). With `gentle` > 0, until `engine_started()`
    (polled) one thread reads alone, `gentle` bytes a request. `exact` (or small requests): no kernel
    read-ahead beyond them. Returns the bytes read; raises what generating the ranges raised. Each thread
    holds one file open at a time, and a buffer of the longest range it read; a file that is not (or no
    longer) a regular file is passed by (the generators report them)."""
    taken = iter(ranges)
    failed: list[Exception] = []
    lock = threading.Lock()
    total = [0]
    all_readers = threading.Event()
    if not gentle:
        all_readers.set()

    def reader() -> None:
        buffer = memoryview(bytearray(0))
        opened, descriptor = "", -1
        while True:
            with lock:
                try:
                    item = next(taken, None)
                except Exception as error:  # raised again below, once: the ranges end here
                    failed.append(error)
                    item = None
            if item is None:
                break
            name, offset, length = item
            if len(buffer) < length:
                buffer = memoryview(bytearray(length))
            done = 0
            try:
                if name != opened:
                    if descriptor >= 0:
                        os.close(descriptor)
                    opened, descriptor = name, -1
                    descriptor = open_regular(name)
                    if exact or request or not all_readers.is_set():
                        # No kernel read-ahead (up to read_ahead_kb, 8 MiB on the H100 host) beyond each
                        # request: a gentle reader keeps one request in flight, no more.
                        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
                while descriptor >= 0 and done < length:
                    step = (request or length) if all_readers.is_set() else gentle
                    step = min(step, length - done)
                    read = os.preadv(descriptor, [buffer[done : done + step]], offset + done)
                    if read <= 0:
                        break
                    done += read
            except OSError:
                pass
            with lock:
                total[0] += done
        if descriptor >= 0:
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
    if failed:
        raise failed[0]
    return total[0]


class SkipLines:
    """Reports what a program in a pod skips: one line per skipped path that says why, behind `prefix` on
    `stream` (None: sys.stdout), at most `limit` of them (`close` then prints how many more), so that a
    tree of a million FIFOs writes 21 lines. A name or reason that is not printable (a newline in a file
    name) is shown escaped: no file name can start a line of its own, such as a forged facts line."""

    def __init__(self, prefix: str, stream: TextIO | None = None, limit: int = 20) -> None:
        self.prefix, self.stream, self.limit, self.count = prefix, stream, limit, 0
        self.lock = threading.Lock()

    def __call__(self, what: str, why: str) -> None:
        with self.lock:
            self.count += 1
            if self.count <= self.limit:
                what, why = (text if text.isprintable() else ascii(text) for text in (what, why))
                print(f"{self.prefix}skipped {what}: {why}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.count > self.limit:
            more = self.count - self.limit
            print(f"{self.prefix}and {more} more skipped, not listed", file=self.stream, flush=True)


def open_regular(path: str) -> int:
    """A read-only descriptor of `path` (links followed) if it is a regular file; else OSError saying why
    not. A FIFO would block the open until a writer came, a device reads forever (/dev/zero): neither is
    opened, and the open itself cannot block (O_NONBLOCK, checked again on the descriptor)."""
    import stat

    def kind(mode: int) -> str:
        for test, name in (
            (stat.S_ISDIR, "a directory"),
            (stat.S_ISFIFO, "a FIFO"),
            (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"),
        ):
            if test(mode):
                return f"{name}, not a regular file"
        return "not a regular file"

    found = os.stat(path)
    if not stat.S_ISREG(found.st_mode):
        raise OSError(kind(found.st_mode))
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    opened = os.fstat(descriptor)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
        os.close(descriptor)
        raise OSError("replaced while it was opened")
    return descriptor


def walk_files(
    root: str, skipped: Callable[[str, str], None], max_entries: int = 100_000, max_depth: int = 32
) -> Iterator[str]:
    """The paths of everything but directories under directory `root`, in the order of os.walk top-down
    with sorted names, without following a link to a directory below `root` (`a -> .` would loop, `b -> /`
    would walk the node): each such link, an unreadable directory, one deeper than `max_depth` and the rest
    past `max_entries` entries is skipped with a line."""
    import itertools

    def linked_directory(entry: os.DirEntry) -> bool:
        try:
            return entry.is_symlink() and entry.is_dir()
        except OSError:  # a link loop: its reader says so
            return False

    entries = 0
    pending = [(root, 0)]
    while pending:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as scan:
                found = list(itertools.islice(scan, max_entries - entries + 1))
        except OSError as error:
            skipped(directory, error.strerror or str(error))
            continue
        full = entries + len(found) > max_entries
        found = sorted(found[: max_entries - entries], key=lambda entry: entry.name)
        entries += len(found)
        subdirectories = []
        for entry in found:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.path)
            elif linked_directory(entry):
                skipped(entry.path, "a link to a directory, not followed")
            else:
                yield entry.path
        if full:
            skipped(root, f"more than {max_entries} entries, the rest not read")
            return
        for subdirectory in reversed(subdirectories):
            if depth < max_depth:
                pending.append((subdirectory, depth + 1))
            else:
                skipped(subdirectory, f"more than {max_depth} directories below {root}")


def data_segments(descriptor: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The `(start, end)` runs of the file's data within [start, end), its holes left out (a sparse file of
    a petabyte holds next to none). A file system without SEEK_DATA reports everything as data."""
    import errno

    position = start
    while position < end:
        try:
            data = os.lseek(descriptor, position, os.SEEK_DATA)
            hole = os.lseek(descriptor, data, os.SEEK_HOLE)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: no data from `position` on
                yield position, end
            return
        if data >= end:
            return
        yield data, min(hole, end)
        position = max(hole, data + 1)


def checkpoint_ranges(
    paths: list[str], chunk: int = 16 << 20, skipped: Callable[[str, str], None] = lambda what, why: None
) -> Iterator[tuple[str, int, int]]:
    """`chunk`-byte ranges of the data of every `*.safetensors` file under `paths` (files or directories,
    walked by walk_files; a hub id is looked up in the Hugging Face cache), each file once, generated as
    they are read. What is not a regular file, or not there, is skipped with a line."""

    def hub_cache_dir(model: str) -> str:
        home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        cache = os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))
        return os.path.join(cache, "models--" + model.replace("/", "--"), "snapshots")

    def safetensors_under(path: str) -> Iterator[str]:
        if "://" in path:
            skipped(path, "a URI, not a local path")
        elif os.path.isdir(path):
            yield from (name for name in walk_files(path, skipped) if name.endswith(".safetensors"))
        elif os.path.lexists(path):
            yield path
        elif os.path.isdir(hub_cache_dir(path)):
            yield from safetensors_under(hub_cache_dir(path))
        else:
            skipped(path, f"no such file or directory, nor a model in {hub_cache_dir(path)}")

    read = set()
    for path in paths:
        for name in safetensors_under(path):
            try:
                descriptor = open_regular(name)
            except OSError as error:
                skipped(name, error.strerror or str(error))
                continue
            try:
                found = os.fstat(descriptor)
                if (found.st_dev, found.st_ino) in read:
                    continue  # a second link to a file already read
                read.add((found.st_dev, found.st_ino))
                for start, end in data_segments(descriptor, 0, found.st_size):
                    yield from (
                        (name, offset, min(chunk, end - offset)) for offset in range(start, end, chunk)
                    )
            finally:
                os.close(descriptor)


def listed_ranges(
    listing: str,
    chunk: int = 4 << 20,
    skipped: Callable[[str, str], None] = lambda what, why: None,
    max_lines: int = 1_000_000,
    max_size: int = 64 << 20,
    max_bytes: int = 16 << 30,
) -> Iterator[tuple[str, int, int]]:
    """The `path start end` lines of a page listing (the seed's, from resident_pages) in `chunk`-byte
    ranges, generated as they are read, each clamped to the data its file holds. An absent or unreadable
    listing is none; a file in it that is not a regular file is skipped; a line that is not an absolute
    path and two decimals, the first below the second, or one past `max_lines` lines, `max_size` bytes of
    listing or `max_bytes` listed bytes, ends the listing: each with a line that says why."""
    try:
        descriptor = open_regular(listing)
    except OSError as error:
        skipped(listing, f"no import pages listing ({error.strerror or error})")
        return
    current, file, size, listed = "", -1, 0, 0
    with os.fdopen(descriptor, "rb") as lines:
        try:
            for number in range(1, max_lines + 2):
                line = lines.readline(8192)  # a path is at most 4096 bytes (PATH_MAX)
                size += len(line)
                if not line:
                    return
                if number > max_lines or size > max_size:
                    why = (
                        f"more than {max_lines} lines" if number > max_lines else f"over {max_size >> 20} MiB"
                    )
                    skipped(f"{listing} from line {number}", why)
                    return
                fields = line.removesuffix(b"\n").rsplit(b" ", 2)
                valid = line.endswith(b"\n") or len(line) < 8192
                valid = valid and len(fields) == 3 and fields[0].startswith(b"/") and b"\0" not in fields[0]
                valid = valid and all(field.isdigit() and len(field) < 20 for field in fields[1:])
                if not valid or int(fields[1]) >= int(fields[2]):
                    why = f"not `path start end` ({ascii(line[:80])[1:]})"
                    skipped(f"{listing} from line {number}", why)
                    return
                path, start, end = os.fsdecode(fields[0]), int(fields[1]), int(fields[2])
                if path != current:
                    if file >= 0:
                        os.close(file)
                    current, file = path, -1
                    try:
                        file = open_regular(path)
                    except OSError as error:
                        skipped(path, error.strerror or str(error))
                if file < 0:
                    continue
                for data_start, data_end in data_segments(file, start, min(end, os.fstat(file).st_size)):
                    for offset in range(data_start, data_end, chunk):
                        length = min(chunk, data_end - offset)
                        listed += length
                        if listed > max_bytes:
                            skipped(
                                f"{listing} from line {number}", f"more than {max_bytes >> 30} GiB listed"
                            )
                            return
                        yield path, offset, length
        finally:
            if file >= 0:
                os.close(file)


def read_ahead(
    paths: list[str],
    readers: int = 8,
    chunk: int = 16 << 20,
    gentle: int = 0,
    engine_started: Callable[[], bool] = lambda: True,
    request: int = 0,
    skipped: Callable[[str, str], None] = lambda what, why: None,
) -> int:
    """Read the checkpoint under `paths` (checkpoint_ranges) with `readers` threads, gently until
    `engine_started()` (read_ranges). Returns the bytes read."""
    ranges = checkpoint_ranges(paths, chunk, skipped)
    return read_ranges(ranges, readers, gentle, engine_started, request=request)


def files_under(roots: list[str], skipped: Callable[[str, str], None] = lambda what, why: None) -> list[str]:
    """The regular files under `roots` (files or directories, walked by walk_files), each once (by real
    path), in the roots' order; anything else (a device, a dangling link) is passed by."""
    import stat

    found: dict[str, None] = {}
    for root in roots:
        for path in walk_files(root, skipped, max_entries=500_000) if os.path.isdir(root) else [root]:
            real = os.path.realpath(path)
            try:
                regular = stat.S_ISREG(os.stat(real).st_mode)
            except OSError:
                continue
            if regular:
                found.setdefault(real)
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


def resident_pages(
    files: list[str],
    skipped: Callable[[str, str], None] = lambda what, why: None,
    max_file: int = 64 << 30,
    max_runs: int = 1_000_000,
) -> list[tuple[str, int, int]]:
    """`(path, start, end)` for every run of the files' pages that is in the page cache (mincore, 1 GiB of
    a file at a time). A file over `max_file` bytes, and the runs past `max_runs` (as many lines as
    listed_ranges reads), are skipped with a line."""
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
    window = 1 << 30
    # mincore's byte per page: bit 0 says resident, the other bits are reserved.
    resident_bit = bytes(range(256)).translate(bytes(b & 1 for b in range(256)))
    runs: list[tuple[str, int, int]] = []
    for path in files:
        try:
            descriptor = open_regular(path)
        except OSError:
            continue  # gone since files_under found it
        try:
            size = os.fstat(descriptor).st_size
            if size > max_file:
                skipped(path, f"larger than {max_file >> 30} GiB")
                continue
            for start in range(0, size, window):
                length = min(window, size - start)
                address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, start)
                if address in (None, failed):
                    break
                flags = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
                known = libc.mincore(address, length, flags) == 0
                libc.munmap(address, length)
                if not known:
                    break
                for run in re.finditer(rb"\x01+", flags.raw.translate(resident_bit)):
                    begin = start + run.start() * mmap.PAGESIZE
                    end = min(start + run.end() * mmap.PAGESIZE, size)
                    if runs and runs[-1][0] == path and runs[-1][2] == begin:
                        runs[-1] = (path, runs[-1][1], end)  # a run across two windows
                    elif len(runs) < max_runs:
                        runs.append((path, begin, end))
                    else:
                        skipped(path, f"more than {max_runs} runs of pages in all")
                        return runs
        finally:
            os.close(descriptor)
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
        with os.fdopen(open_regular(path or ""), "rb") as script:
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


# The reader's functions, as READ_AHEAD_PROGRAM embeds them (bench/readahead/contention.py runs them too).
READER_FUNCTIONS = (
    read_ranges,
    SkipLines,
    open_regular,
    walk_files,
    data_segments,
    checkpoint_ranges,
    listed_ranges,
    read_ahead,
)
# What the reader process may map (RLIMIT_AS) beyond what it was forked with: its memory counts against the
# container vLLM runs in. It needs ~0.8 GiB at most (eight threads' stacks, malloc arenas and 16 MiB
# buffers); past the limit it stops with a line instead of growing.
READER_ADDRESS_SPACE = 2 << 30
READ_AHEAD_PROGRAM = (
    "from __future__ import annotations\n\nimport os, sys, threading, time\n\n\n"
    + "\n\n".join(
        inspect.getsource(f)
        for f in (*READER_FUNCTIONS, server_has_child, script_of_this_python, run_with_deferred_gc)
    )
    + f"\nREADER_ADDRESS_SPACE = {READER_ADDRESS_SPACE}\n"
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
    # The reader: out of the imports' way on the CPU, gone with the server's process group, within its
    # address space whatever the tree holds.
    import resource

    os.nice(10)
    with open("/proc/self/statm") as statm:
        space = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + READER_ADDRESS_SPACE
    _, most = resource.getrlimit(resource.RLIMIT_AS)
    if most != resource.RLIM_INFINITY:
        space = min(space, most)
    resource.setrlimit(resource.RLIMIT_AS, (space, most))
    began, widened = time.monotonic(), []
    skipped = SkipLines("stoker read-ahead: ", sys.stderr)

    def engine_started():
        if server_has_child(server, os.getpid()):
            widened.append(time.monotonic() - began)
        return bool(widened)

    try:
        if pages:
            read = read_ranges(listed_ranges(pages, skipped=skipped), exact=True, request=request)
            seconds = time.monotonic() - began
            pages_line = f"stoker read-ahead: {read} bytes of the imports' pages in {seconds:.1f} s"
            print(pages_line, file=sys.stderr, flush=True)
        reading = {"engine_started": engine_started, "request": request, "skipped": skipped}
        read = read_ahead(paths, gentle=gentle, **reading)
        how = f"all readers from {widened[0]:.1f} s" if widened else "one reader" if gentle else "all readers"
        seconds = time.monotonic() - began
        skipped.close()
        print(f"stoker read-ahead: {read} bytes in {seconds:.1f} s, {how}", file=sys.stderr, flush=True)
    except BaseException as error:
        print(f"stoker read-ahead: stopped ({error!r:.200})", file=sys.stderr, flush=True)
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
