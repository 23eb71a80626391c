"""Does the read-ahead slow the imports it overlaps, and what keeps it out of their way?

Each trial drops the page cache, starts stoker.inpod.read_ahead.read_ahead over a checkpoint in a reader
process (as the serving pod's wrapper forks it: nice 10), and times a cold `import vllm.entrypoints.cli.serve`
in the vLLM venv beside it; `none` is the import alone. Variants: eight readers from the start, read_ahead's
gentle phase (one reader, one request of the given size in flight, until the imports are done), and a
candidate lever: reading first, with eight threads, the very pages a cold import read (recorded once at the
start: an audit hook lists the files the import opens and the shared objects it maps, mincore says which of
their pages it brought in). Prints one JSON line per trial. Needs root (drop_caches). On the GPU host eight
readers from the start made the imports ~8 s longer (bench/results/coldstart-h100-v0.26.0-fast.json); this
reproduces it on a CPU VM. The kernel's idle I/O class made no consistent difference
(bench/results/readahead-contention-cpu.txt, from this script's previous revision).

usage: PYTHONPATH=src .venv/bin/python bench/readahead/contention.py [--repetitions 2] [--checkpoint-gb 6]
       [--venv DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT = Path("/tmp/stoker-readahead-checkpoint")
# The importer's mark that its imports are done: in a pod, the server forking its engine process.
IMPORTED = Path("/tmp/stoker-readahead-imported")
# The pages a cold import read, "path start end" per line, in the order the import opened the files.
IMPORT_PAGES = Path("/tmp/stoker-readahead-import-pages")
IMPORT = "import vllm.entrypoints.cli.serve"


@dataclass(frozen=True)
class Variant:
    # stoker.inpod.read_ahead.read_ahead's parameters; readers 0: no weights read
    readers: int = 0
    chunk: int = 16 << 20
    gentle: int = 0
    # Read the pages a cold import read (IMPORT_PAGES, eight threads) before anything else.
    import_pages: bool = False


VARIANTS: dict[str, Variant | None] = {
    "none": None,
    "8x16MiB": Variant(readers=8),
    "gentle-512KiB": Variant(readers=8, gentle=512 << 10),
    "gentle-4MiB": Variant(readers=8, gentle=4 << 20),
    "import-pages": Variant(import_pages=True),
    "import-pages+gentle-512KiB": Variant(readers=8, gentle=512 << 10, import_pages=True),
}
# The serving pod's reader functions in a process of their own (stoker.inpod, from PYTHONPATH as in the pod).
READER = """
import os, sys, time

from stoker.inpod.read_ahead import listed_ranges, read_ahead, read_ranges

readers, chunk, gentle, import_pages = (int(a) for a in sys.argv[1:5])
os.nice(10)
started = time.monotonic()
if import_pages:
    read_ranges(listed_ranges(sys.argv[7]), exact=True)
pages_read = time.monotonic() - started
imported = lambda: os.path.exists(sys.argv[6])
read = read_ahead([sys.argv[5]], readers, chunk, gentle, imported) if readers else 0
print(round(time.monotonic() - started, 2), read, round(pages_read, 2))
"""
# A cold import under an audit hook: every file it opened (bytecode, sources, data) in order, then the shared
# objects mapped by the end.
RECORDER = f"""
import os, sys
opened = []


def hook(event, args):
    if event == "open" and isinstance(args[0], str):
        opened.append(args[0])


sys.addaudithook(hook)
{IMPORT}
maps = [line.split() for line in open("/proc/self/maps")]
mapped = [fields[5] for fields in maps if len(fields) > 5 and ".so" in fields[5]]
# vLLM logs to stdout: the list goes to the file named by the first argument.
with open(sys.argv[1], "w") as listing:
    listing.write("\\n".join(p for p in dict.fromkeys(opened + mapped) if os.path.isfile(p)))
"""
# For each listed file, the byte ranges resident in the page cache (mincore over a read-only mapping).
RESIDENT = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c = ctypes
libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
for path in sys.stdin.read().splitlines():
    size = os.path.getsize(path)
    if not size:
        continue
    descriptor = os.open(path, os.O_RDONLY)
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0)
    pages = -(-size // mmap.PAGESIZE)
    resident = ctypes.create_string_buffer(pages)
    libc.mincore(address, size, resident)
    libc.munmap(address, size)
    os.close(descriptor)
    start = None
    for page, flag in enumerate([*resident.raw, 0]):
        if flag & 1 and start is None:
            start = page
        elif not flag & 1 and start is not None:
            print(path, start * mmap.PAGESIZE, min(page * mmap.PAGESIZE, size))
            start = None
"""


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def write_checkpoint(gigabytes: int) -> None:
    """Random bytes (no sparse or compressible file), 2 GB a shard, written once."""
    CHECKPOINT.mkdir(exist_ok=True)
    for shard in range(gigabytes // 2):
        path = CHECKPOINT / f"model-{shard + 1:05d}.safetensors"
        if not path.exists() or path.stat().st_size != 2 * 10**9:
            with path.open("wb") as out:
                for _ in range(2000):
                    out.write(os.urandom(10**6))


def record_import_pages(venv: Path) -> None:
    """IMPORT_PAGES: what a cold import read (whole pages the kernel brought in, its read-ahead included)."""
    drop_page_cache()
    python = str(venv / "bin" / "python")
    listing = IMPORT_PAGES.with_suffix(".files")
    subprocess.run([python, "-c", RECORDER, str(listing)], check=True)
    files = listing.read_text()
    ranges = subprocess.run(
        [sys.executable, "-c", RESIDENT], input=files, check=True, capture_output=True, text=True
    )
    IMPORT_PAGES.write_text(ranges.stdout)
    spans = [line.rsplit(" ", 2) for line in ranges.stdout.splitlines()]
    print(
        json.dumps(
            {
                "importFiles": len(files.split("\n")),
                "importPagesBytes": sum(int(e) - int(s) for _, s, e in spans),
            }
        )
    )


def trial(venv: Path, variant: Variant | None) -> dict[str, object]:
    IMPORTED.unlink(missing_ok=True)
    drop_page_cache()
    time.sleep(1)
    reader = None
    if variant is not None:
        parameters = (variant.readers, variant.chunk, variant.gentle, int(variant.import_pages))
        argv = [
            sys.executable,
            "-c",
            READER,
            *map(str, parameters),
            str(CHECKPOINT),
            str(IMPORTED),
            str(IMPORT_PAGES),
        ]
        reader = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    started = time.monotonic()
    subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT], check=True)
    result: dict[str, object] = {"importSeconds": round(time.monotonic() - started, 2)}
    IMPORTED.touch()
    if reader is not None:
        seconds, read, pages_seconds = reader.communicate()[0].split()
        result.update(
            readAheadSeconds=float(seconds), readAheadBytes=int(read), importPagesSeconds=float(pages_seconds)
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--checkpoint-gb", type=int, default=6)
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache/stoker/vllm/0.26.0")
    args = parser.parse_args()
    write_checkpoint(args.checkpoint_gb)
    print(json.dumps({"kernel": os.uname().release, "cpus": os.cpu_count(), "loadavg": os.getloadavg()}))
    record_import_pages(args.venv)
    for repetition in range(1, args.repetitions + 1):
        for name, variant in VARIANTS.items():
            result = trial(args.venv, variant)
            print(json.dumps({"repetition": repetition, "variant": name, **result}), flush=True)


if __name__ == "__main__":
    main()
