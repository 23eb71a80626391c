"""Read a model's checkpoint into the page cache while its server imports Python, then get out of its way.

Runs COMMAND (`vllm serve ...`) in this process (same PID, signals and exit code) and reads the
*.safetensors files under each PATH into the page cache meanwhile, from a forked reader process: at nice
10, within a bounded address space, gone with the server's process group. The weight loader then finds the
checkpoint in memory instead of on a cold disk. The reader opens regular files only, does not follow
directory links, bounds its walk and the listing, and says on stderr what it read and why it skipped
anything, one line each behind `stoker read-ahead:`. Why the gentle phase, the request sizes and the deferred
collector: docs/concepts/loading.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import runpy
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

from stoker.inpod import (
    import_fixes,
    keep_bytecode,
    options_and_command,
    pin_ptxas,
    program_parser,
    working_directory_first,
)
from stoker.inpod.pagecache import SkipLines, data_segments, open_regular, server_has_child, walk_files

# What the reader process may map (RLIMIT_AS) beyond what it was forked with: its memory counts against the
# container vLLM runs in. It needs ~0.8 GiB at most (eight threads' stacks, malloc arenas and 16 MiB
# buffers); past the limit it stops with a line instead of growing.
READER_ADDRESS_SPACE = 2 << 30
LINE_PREFIX = "stoker read-ahead: "


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


def script_of_this_python(name: str) -> str | None:
    """The path of console script `name` when its `#!` line names this interpreter (same directory and same
    binary: a venv's pythons are links to one system binary), else None."""
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


def run_with_deferred_gc(script: str, arguments: list[str], reader: int, fix_imports: bool = False) -> None:
    """Run the Python console script in this process with the cyclic garbage collector off until the server
    starts a child other than `reader` (its imports are done), then freeze what the imports built (later
    collections, the forked engine's included, skip it, as vLLM's own gc.freeze after start-up does) and turn
    the collector on. With `fix_imports`, its imports run with stoker.inpod.import_fixes, and which applied
    is logged once the imports are done."""
    collecting = threading.Event()
    fixed = import_fixes.install() if fix_imports else None

    def collect_from_now_on() -> None:
        if not collecting.is_set():
            collecting.set()
            gc.freeze()
            gc.enable()
            if fixed is not None:
                applied = ", ".join(fixed) or "none (the modules differ from what the fixes were written for)"
                print(f"{LINE_PREFIX}import fixes applied: {applied}", file=sys.stderr, flush=True)

    def watch() -> None:
        while not collecting.is_set() and not server_has_child(os.getpid(), reader):
            time.sleep(0.5)  # late is harmless: the collector stays off a little longer
        collect_from_now_on()

    gc.disable()
    # A forked engine process starts with the collector on; a spawned one is a child that watch sees.
    os.register_at_fork(before=collect_from_now_on)
    threading.Thread(target=watch, daemon=True).start()
    sys.argv = [script, *arguments]
    if working_directory_first():
        sys.path[0] = os.path.dirname(script)  # what python3 SCRIPT puts first, not the working directory
    runpy.run_path(script, run_name="__main__")


def parser() -> argparse.ArgumentParser:
    usage = "%(prog)s [--gentle BYTES] [--request BYTES] [--pages LISTING] [--gc {deferred,on}] [--pin-ptxas]"
    usage += " [--bytecode DIR] PATH... -- COMMAND..."
    described = program_parser("stoker.inpod.read_ahead", __doc__, usage)
    described.add_argument(
        "--gentle",
        type=int,
        default=0,
        metavar="BYTES",
        help="until COMMAND starts a child (vLLM's engine process), one reader with one BYTES request in"
        " flight, so that the imports' own reads do not queue behind it; 0 (default): all readers at once",
    )
    described.add_argument(
        "--request",
        type=int,
        default=0,
        metavar="BYTES",
        help="once all readers read, requests of at most BYTES and no kernel read-ahead; 0 (default): each"
        " 16 MiB range in one request",
    )
    described.add_argument(
        "--pages",
        default="",
        metavar="LISTING",
        help="first read the pages LISTING lists (`path start end` lines: what the seed Job's server read"
        " before it started its engine process)",
    )
    described.add_argument(
        "--gc",
        choices=["deferred", "on"],
        default="on",
        help="deferred: run COMMAND's console script in this process, its garbage collector off until the"
        " engine process starts (exec'd if it is not a script of this python3); on (default): exec COMMAND",
    )
    described.add_argument(
        "--import-fixes",
        action="store_true",
        help="with --gc deferred: fix what COMMAND's imports do twice or needlessly, with the same results"
        " (stoker.inpod.import_fixes)",
    )
    described.add_argument(
        "--pin-ptxas",
        action="store_true",
        help="set TRITON_PTXAS_PATH to torch's ptxas for COMMAND, unless it is set, as the seed Job does"
        " (Triton keys its kernel cache by the ptxas version)",
    )
    described.add_argument(
        "--bytecode",
        metavar="DIR",
        help="where the image has no bytecode for vLLM, load Python's from (and write it under) DIR, where"
        " the seed Job wrote it (stoker.inpod.keep_bytecode)",
    )
    described.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a checkpoint's file or directory, or a Hugging Face model id (read from the local cache)",
    )
    return described


def read_in_this_child(server: int, paths: list[str], gentle: int, request: int, pages: str) -> NoReturn:
    """The reader: out of the imports' way on the CPU, gone with the server's process group, within its
    address space whatever the tree holds."""
    os.nice(10)
    with open("/proc/self/statm") as statm:
        space = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + READER_ADDRESS_SPACE
    _, most = resource.getrlimit(resource.RLIMIT_AS)
    if most != resource.RLIM_INFINITY:
        space = min(space, most)
    resource.setrlimit(resource.RLIMIT_AS, (space, most))
    began, widened = time.monotonic(), []
    skipped = SkipLines(LINE_PREFIX, sys.stderr)

    def engine_started() -> bool:
        if server_has_child(server, os.getpid()):
            widened.append(time.monotonic() - began)
        return bool(widened)

    try:
        if pages:
            read = read_ranges(listed_ranges(pages, skipped=skipped), exact=True, request=request)
            seconds = time.monotonic() - began
            print(
                f"{LINE_PREFIX}{read} bytes of the imports' pages in {seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        read = read_ahead(
            paths, gentle=gentle, engine_started=engine_started, request=request, skipped=skipped
        )
        how = f"all readers from {widened[0]:.1f} s" if widened else "one reader" if gentle else "all readers"
        seconds = time.monotonic() - began
        skipped.close()
        print(f"{LINE_PREFIX}{read} bytes in {seconds:.1f} s, {how}", file=sys.stderr, flush=True)
    except BaseException as error:
        print(f"{LINE_PREFIX}stopped ({error!r:.200})", file=sys.stderr, flush=True)
    finally:
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    options, command = options_and_command(sys.argv[1:] if argv is None else argv)
    described = parser()
    settings = described.parse_args(options)
    if not command:
        described.error("no COMMAND after --")
    if settings.pin_ptxas:
        print(f"{LINE_PREFIX}{pin_ptxas()}", file=sys.stderr, flush=True)
    if settings.bytecode:
        print(f"{LINE_PREFIX}{keep_bytecode(settings.bytecode)}", file=sys.stderr, flush=True)
    server = os.getpid()
    reader = os.fork()
    if reader == 0:
        read_in_this_child(server, settings.paths, settings.gentle, settings.request, settings.pages)
    script = script_of_this_python(command[0]) if settings.gc == "deferred" else None
    if script:
        run_with_deferred_gc(script, command[1:], reader, settings.import_fixes)
        return 0
    if settings.gc == "deferred":
        print(f"stoker: {command[0]} is not a script of {sys.executable}: exec'd", file=sys.stderr)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
