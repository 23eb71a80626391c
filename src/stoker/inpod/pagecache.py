"""What the in-pod programs share: reading a tree the VLLMService's author controls without blocking or
looping on it, the page cache (what is in it, dropping pages from it), a line for each thing passed by, and
when vLLM's API server has started its engine process.

The tree is the author's: the readers open regular files only, do not follow directory links, bound their
walks and listings, and say in one line why they skip anything (docs/in-pod-programs.md).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from typing import TextIO


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


def files_under(roots: list[str], skipped: Callable[[str, str], None] = lambda what, why: None) -> list[str]:
    """The regular files under `roots` (files or directories, walked by walk_files), each once (by real
    path), in the roots' order; anything else (a device, a dangling link) is passed by."""
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
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as proc_stat:
                fields = proc_stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == server:
            return True
    return False
