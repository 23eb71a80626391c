"""Does the read-ahead slow the imports it overlaps, and what keeps it out of their way?

Each trial drops the page cache, starts render.prefetch.read_ahead over a checkpoint in a reader process
(as the serving pod's wrapper forks it: nice 10), and times a cold `import vllm.entrypoints.cli.serve` in
the vLLM venv beside it; `none` is the import alone. Variants: eight readers from the start, and
read_ahead's gentle phase (one reader, one request of the given size in flight, until the imports are
done). Prints one JSON line per trial. Needs root (drop_caches). On the GPU host eight readers from the
start made the imports ~8 s longer (bench/results/coldstart-h100-v0.26.0-fast.json); this reproduces it
on a CPU VM. The kernel's idle I/O class made no consistent difference
(bench/results/readahead-contention-cpu.txt, from this script's previous revision).

usage: PYTHONPATH=src .venv/bin/python bench/readahead/contention.py [--repetitions 2] [--checkpoint-gb 6]
       [--venv DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from stoker.render.prefetch import read_ahead

CHECKPOINT = Path("/tmp/stoker-readahead-checkpoint")
# The importer's mark that its imports are done: in a pod, the server forking its engine process.
IMPORTED = Path("/tmp/stoker-readahead-imported")
# readers, chunk bytes, gentle bytes: render.prefetch.read_ahead's parameters
VARIANTS: dict[str, tuple[int, int, int] | None] = {
    "none": None,
    "8x16MiB": (8, 16 << 20, 0),
    "gentle-512KiB": (8, 16 << 20, 512 << 10),
    "gentle-4MiB": (8, 16 << 20, 4 << 20),
}
# read_ahead's own source, as the serving pod's wrapper embeds it (the reader imports nothing of stoker's).
READER = (
    "from __future__ import annotations\nimport os, sys, threading, time\n\n\n"
    + inspect.getsource(read_ahead)
    + """
readers, chunk, gentle = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.nice(10)
started = time.monotonic()
imported = lambda: os.path.exists(sys.argv[5])
read = read_ahead([sys.argv[4]], readers, chunk, gentle, imported)
print(round(time.monotonic() - started, 2), read)
"""
)


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


def trial(venv: Path, variant: tuple[int, int, int] | None) -> dict[str, object]:
    IMPORTED.unlink(missing_ok=True)
    drop_page_cache()
    time.sleep(1)
    reader = None
    if variant is not None:
        argv = [sys.executable, "-c", READER, *map(str, variant), str(CHECKPOINT), str(IMPORTED)]
        reader = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    started = time.monotonic()
    subprocess.run([str(venv / "bin" / "python"), "-c", "import vllm.entrypoints.cli.serve"], check=True)
    result: dict[str, object] = {"importSeconds": round(time.monotonic() - started, 2)}
    IMPORTED.touch()
    if reader is not None:
        seconds, read = reader.communicate()[0].split()
        result.update(readAheadSeconds=float(seconds), readAheadBytes=int(read))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--checkpoint-gb", type=int, default=6)
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache/stoker/vllm/0.26.0")
    args = parser.parse_args()
    write_checkpoint(args.checkpoint_gb)
    print(json.dumps({"kernel": os.uname().release, "cpus": os.cpu_count(), "loadavg": os.getloadavg()}))
    for repetition in range(1, args.repetitions + 1):
        for name, variant in VARIANTS.items():
            result = trial(args.venv, variant)
            print(json.dumps({"repetition": repetition, "variant": name, **result}), flush=True)


if __name__ == "__main__":
    main()
