"""Does a CUDA process survive CRIU on this host? A PyTorch process holding GPU_GIB of known data on the GPU
is locked and checkpointed by the driver (stoker.snapshot.cuda), dumped by CRIU (the process is gone),
restored by CRIU, given its GPU back, and asked to sum its data again: the sum must equal the one it printed
before. Prints one JSON line with each step's seconds. Run it before the GPU snapshot benchmark spends
a lease.

usage (repository root, root, CUDA host): CRIU=... python3 -m bench.snapshot.cuda_smoke WORK_DIR [GPU_GIB]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.snapshot.criu_tree import SHM, criu_binary, dump, put_back, restore, stop_group

from stoker.snapshot import cuda

# Sums its tensor once at start and again each time `go` appears, then waits for the next.
HOLDER = """
import os, sys, time, torch
data = torch.arange(int(sys.argv[1]) * (1 << 28), device="cuda", dtype=torch.float32).remainder_(977)
print("sum", float(data.sum()), flush=True)
go = sys.argv[2]
while True:
    if os.path.exists(go):
        os.unlink(go)
        print("sum", float(data.sum()), flush=True)
    time.sleep(0.05)
"""


def sums(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("sum ")]


def wait_sums(log: Path, count: int, limit_s: float = 120) -> list[str]:
    deadline = time.monotonic() + limit_s
    while len(sums(log)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no sum {count} in {limit_s} s: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return sums(log)


def main() -> None:
    work, gib = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
    work.mkdir(parents=True, exist_ok=True)
    log, go, image = work / "holder.log", work / "go", work / "image"
    check = subprocess.run([criu_binary(), "check"], capture_output=True, text=True)
    report: dict[str, object] = {"criuCheck": (check.stdout + check.stderr).strip()[-500:], "gib": gib}
    shm_before = set(os.listdir(SHM))
    with log.open("w") as out:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(gib), str(go)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        before = wait_sums(log, 1)[0]
        report["state"] = cuda.state(holder.pid)
        began = time.monotonic()
        cuda.checkpoint([holder.pid])
        report["cudaCheckpointSeconds"] = round(time.monotonic() - began, 3)
        report.update(dump(holder.pid, image, shm_before, log))
    except Exception:
        stop_group(holder.pid)
        raise
    holder.wait()
    put_back(image, log)
    began = time.monotonic()
    restored, attempts = restore(image, "smoke")
    report["restoreSeconds"] = round(time.monotonic() - began, 3)
    try:
        began = time.monotonic()
        cuda.resume([restored])
        report["cudaRestoreSeconds"] = round(time.monotonic() - began, 3)
        go.touch()
        after = wait_sums(log, 2)[1]
    finally:
        stop_group(os.getpgid(restored))
    report.update(restoreAttempts=attempts, sumBefore=before, sumAfter=after, equal=before == after)
    print(json.dumps(report), flush=True)
    if before != after:
        sys.exit(1)


if __name__ == "__main__":
    main()
