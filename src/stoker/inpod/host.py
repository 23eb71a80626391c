"""The host facts a start's phases scale with, measured where the pods run (issue 26).

The seed Job (stoker.inpod.seed) runs `measure_host` in its facts thread, after the server is healthy (the
server idles then), in about two seconds, and reports the facts under the facts line's HOST_FACTS_KEY:

- `cpuSeconds`: wall seconds of a fixed single-thread Python workload (dicts, calls, strings, the work of
  imports and Dynamo's bytecode tracing), the best of three; a faster core or a less loaded node takes less.
  Python start-up, imports, model inspection, Dynamo, compiled-graph loading and engine start are CPU work
  on one thread mostly (the paper's finding), so their seconds scale with it.
- `diskBytesPerSecond`: one reader's sequential read of up to DISK_SAMPLE_BYTES (or DISK_SECONDS) of the
  largest weight file, its pages dropped from the page cache first; not reported when they stay cached
  (another process maps them, a tmpfs) or there is no weight file of at least 32 MiB (a hub model loaded as
  dummy weights, a streamer, a toy model).
- `gpuProduct`, `gpuMemoryBytes`, `gpuCount`: from `nvidia-smi` (what the pod was given), else nothing.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import time
from collections.abc import Callable

from stoker.inpod.pagecache import open_regular, resident_pages

HOST_FACTS_KEY = "host"
DISK_SAMPLE_BYTES = 256 << 20
# Less than this takes too little time to tell a disk's bandwidth: a smaller checkpoint is not timed.
DISK_MIN_BYTES = 32 << 20
DISK_SECONDS = 1.0


def measure_host(
    model_dir: str | None,
    skipped: Callable[[str, str], None] = lambda what, why: None,
) -> dict:
    """What the phases scale with on this host, camelCase keys (stoker.predict.model.HostFacts); a fact it
    cannot measure is left out, and `skipped(what, why)` says why."""
    chunk = 1 << 20  # one read of it takes 10 s at the slowest bandwidth allowed: the bound holds
    facts: dict = {}

    def workload() -> int:
        # Fixed work: the same operations in the same order on every host, about 0.1 s on a current core.
        table: dict = {}
        total = 0
        for number in range(150_000):
            key = f"k{number % 997}"
            table[key] = table.get(key, 0) + (number * 7 ^ (number >> 3))
            total += len(str(number)) + len(table)
        return total

    timings = []
    for _ in range(3):
        began = time.perf_counter()
        workload()
        timings.append(time.perf_counter() - began)
    facts["cpuSeconds"] = round(min(timings), 4)

    weights = []
    if model_dir:
        try:
            names = sorted(os.listdir(model_dir))[:100_000]
        except OSError as error:
            names = []
            skipped(model_dir, error.strerror or str(error))
        for name in names:
            if name[0] != "." and any(fnmatch.fnmatch(name, p) for p in ("*.safetensors", "*.bin", "*.pt")):
                try:
                    weights.append((os.stat(os.path.join(model_dir, name)).st_size, name))
                except OSError:
                    continue
    if weights and max(weights)[0] >= DISK_MIN_BYTES:
        path = os.path.join(model_dir or "", max(weights)[1])
        try:
            descriptor = open_regular(path)
        except OSError as error:
            skipped(path, f"no disk bandwidth measured: {error.strerror or error}")
        else:
            try:
                size = os.fstat(descriptor).st_size
                start = max(0, size - DISK_SAMPLE_BYTES) // chunk * chunk  # the tail: read last, if at all
                os.posix_fadvise(descriptor, start, size - start, os.POSIX_FADV_DONTNEED)
                cached = sum(
                    min(end, size) - max(begin, start)
                    for _, begin, end in resident_pages([path], skipped)
                    if end > start
                )
                if cached > (size - start) // 10:
                    skipped(path, "no disk bandwidth measured: its pages stay in the page cache (mapped)")
                else:
                    buffer = bytearray(chunk)
                    done, began = 0, time.perf_counter()
                    while start + done < size and time.perf_counter() - began < DISK_SECONDS:
                        read = os.preadv(descriptor, [buffer], start + done)
                        if read <= 0:
                            break
                        done += read
                    elapsed = time.perf_counter() - began
                    if done >= chunk and elapsed > 0:
                        facts["diskBytesPerSecond"] = round(done / elapsed)
            except OSError as error:
                skipped(path, f"no disk bandwidth measured: {error.strerror or error}")
            finally:
                os.close(descriptor)

    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.splitlines()[:1024]
    except (OSError, subprocess.SubprocessError):
        listed = []
    gpus = [line.rsplit(",", 1) for line in listed if line.count(",") >= 1]
    if gpus:
        product, memory = gpus[0]
        facts["gpuProduct"] = "-".join(product.split())[:63]
        if memory.strip().isdigit():
            facts["gpuMemoryBytes"] = int(memory.strip()) << 20  # nvidia-smi says MiB
        facts["gpuCount"] = len(gpus)
    return facts
