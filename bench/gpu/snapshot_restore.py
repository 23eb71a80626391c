"""Snapshot and restore on the GPU (issue 40): a served replica of stoker's rendered serving invocation is
snapshotted once (the driver's checkpoint API moves its device memory into its host memory, then CRIU dumps
the process tree), and later starts restore it, against stock vLLM and stoker's own start on a cold node.

Once: the seed Job's invocation (the compile cache), then the snapshot's source: the rendered serving
invocation on the seeded cache with its engine spawned, under bench/snapshot/no_io_uring.c (CRIU cannot dump
io_uring; a pod's default seccomp profile denies it the same way), serving one completion and the decode
probe; then every process of its tree that holds a CUDA context is locked and checkpointed, and the tree
dumped (bench/snapshot/criu_tree.py). Two kinds (--snapshot-kind): `full`, the replica as it serves (weights
and KV cache in the image), and `minimized`, the source in sleep mode put to sleep at level 2 before its
checkpoint (weights discarded, the rest offloaded), woken and its weights reloaded after each restore, as
`vllm snapshot` does. Per repetition, in this order:
- `restore`: `criu restore` of the snapshot read from a dropped page cache (a node that keeps the snapshot
  on its disk), then the driver's restore and unlock of each CUDA process;
- `restore-warm`: the same with the snapshot's files in the page cache (a node that keeps it in memory); for
  a minimized snapshot, whose restore reloads the weights, the checkpoint resident too (stoker's node warmer);
- `stock`: plain `vllm serve`, empty caches, page cache dropped;
- `stoker`: the rendered serving invocation on a fresh copy of the seeded cache (cold node), if it fits.
Every profile is timed to /health and to its first completion (`servedSeconds`, from the process start or
`criu restore`), whose greedy answer (text and token IDs) must equal the snapshot source's; then the decode
probe.

Output as the other modes': OUT/runs.jsonl, OUT/logs/, OUT/host.json, OUT/snapshot.json (what the snapshot
took and cost). Needs root, $CRIU (`hack/criu bundle`, carried) and $NO_IO_URING (the wrapper, built static).

A mode of the one driver:
`coldstart.py MANIFEST OUT --snapshot [--snapshot-kind full|minimized] [--repetitions 3] [--stop-after 1300]`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.snapshot import cuda_checkpoint
from bench.snapshot.criu_tree import SHM, dump, put_back, restore, stop_group
from harness import (
    CONTAINER_LOCAL,
    HOME,
    SEED_SNAPSHOT,
    Budget,
    decode_rate,
    first_completion,
    gpu_memory_used_mib,
    host_env,
    prepare,
    start_and_measure,
    tree_bytes,
    wait_ready,
    warm_node,
)
from profiles import DEFAULT_PROFILE, SPAWN, Invocation, seed_invocation, serve_invocation, stock_invocation

from stoker.api import VLLMService
from stoker.snapshot.agent import tree

IMAGE = HOME / "snapshot-image"
SOURCE_LOG = HOME / "snapshot-source.log"
# The cache volume as the source left it: the files its processes map (Triton's launchers, for one) must be
# there for a restore, and a minimized source compiles its own (sleep mode enters the compile-cache key).
SOURCE_CACHE = HOME / "snapshot-source-cache"
# The tree's only TCP connections (gloo's, torch.distributed's store) are loopback pairs inside it, frozen
# with it: nothing outside can write to them, so CRIU need not lock the network (the GPU hosts have no
# iptables). Files deleted while open are kept in the image up to a size (CRIU's default: 1 MiB).
CRIU_OPTIONS = ("--network-lock", "skip", "--ghost-limit", "256M")
ESTIMATE_S = {"stock": 110.0, "restore": 40.0, "restore-warm": 30.0, DEFAULT_PROFILE: 40.0}
# Starts that must fit in every later repetition before the last profile (stoker's own start) runs; the
# restores first, so that a snapshot that cannot be restored ends the run before stock's minute and a half.
REQUIRED = ("restore", "restore-warm", "stock")
# The source of each kind of snapshot (a profile of profiles.py, spawned as `SPAWN` says).
SOURCE_PROFILE = {"full": "stoker-spawn", "minimized": "stoker-sleep"}
# A minimized snapshot's source sleeps at level 2 before its checkpoint (weights discarded, the rest of the
# device memory offloaded), as `vllm snapshot` does; after a restore these wake it and reload the weights
# from the model (its own load format), before the first completion.
SLEEP = "/sleep?level=2"
WAKE = (
    ("/wake_up?tags=weights", None),
    ("/collective_rpc", {"method": "reload_weights"}),
    ("/wake_up?tags=kv_cache", None),
)


def emit(out: Path, record: dict[str, Any]) -> None:
    with (out / "runs.jsonl").open("a") as runs:
        runs.write(json.dumps(record) + "\n")
    keys = ("profile", "repetition", "readySeconds", "servedSeconds", "greedyEqual", "error")
    summary = {key: record[key] for key in keys if key in record}
    summary["tps"] = record.get("decode", {}).get("tokensPerSecond")
    print(json.dumps(summary), flush=True)


def served_seconds(result: dict[str, Any]) -> float | None:
    """From the process start to the first completion's end (the probe runs right after /health)."""
    first = result.get("firstCompletion", {})
    if result.get("readySeconds") is None or "seconds" not in first:
        return None
    return round(result["readySeconds"] + first["seconds"], 3)


def greedy(first: dict[str, Any]) -> list[Any]:
    """What two greedy completions of the same prompt must share."""
    return [first.get("text"), first.get("tokenIds")]


def started(name: str, rep: int, inv: Invocation, out: Path, expected: list[Any] | None) -> dict[str, Any]:
    """A start of `inv` as harness runs every other profile (seed: no probe)."""
    seed = name == "seed"
    dropped = prepare(inv.cache_mount_path, restore_seed=name == DEFAULT_PROFILE)
    result = start_and_measure(out / "logs" / f"r{rep}-{name}.log", inv, measure=not seed)
    record = {"profile": name, "repetition": rep, **result, "pageCacheDropped": dropped}
    if not seed:
        record["servedSeconds"] = served_seconds(result)
        record["greedyEqual"] = greedy(result.get("firstCompletion", {})) == expected
    return record


def source_process(inv: Invocation) -> subprocess.Popen[str]:
    """The snapshot's source, started as harness starts a server but logging into SOURCE_LOG, a file (a
    restored tree must find what it writes to; a pipe to this driver would not be there)."""
    env = {**host_env(), **inv.env}
    with SOURCE_LOG.open("w") as log:
        return subprocess.Popen(
            [os.environ["NO_IO_URING"], *inv.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=HOME,
            start_new_session=True,
            text=True,
        )


def take_snapshot(inv: Invocation, kind: str) -> dict[str, Any]:
    """Start the source on the seeded cache, serve, (minimized) sleep, checkpoint its CUDA processes, dump
    the tree."""
    prepare(inv.cache_mount_path, restore_seed=True)
    shm_before = set(os.listdir(SHM))
    began = time.monotonic()
    source = source_process(inv)
    base = f"http://127.0.0.1:{inv.port}"
    ready = wait_ready(source, base, began)
    if ready is None:
        stop_group(source.pid)
        raise RuntimeError(f"the snapshot's source never served: {SOURCE_LOG.read_text()[-3000:]}")
    taken: dict[str, Any] = {"kind": kind, "source": SOURCE_PROFILE[kind], "readySeconds": round(ready, 3)}
    try:
        taken["firstCompletion"] = first_completion(base, inv.served_model_name)
        taken["decode"] = decode_rate(base, inv.served_model_name)
        taken["gpuMemoryUsedMiB"] = gpu_memory_used_mib()
        if kind == "minimized":
            sleeping = time.monotonic()
            post(base, SLEEP)
            taken["sleepSeconds"] = round(time.monotonic() - sleeping, 3)
            taken["gpuMemoryUsedMiBAsleep"] = gpu_memory_used_mib()
        cuda_pids = [pid for pid in tree(source.pid) if cuda_checkpoint.state(pid) == "running"]
        checkpointing = time.monotonic()
        for pid in cuda_pids:
            cuda_checkpoint.lock(pid)
        for pid in cuda_pids:
            cuda_checkpoint.checkpoint(pid)
        taken["cudaCheckpointSeconds"] = round(time.monotonic() - checkpointing, 3)
        taken["gpuMemoryUsedMiBCheckpointed"] = gpu_memory_used_mib()
        taken.update(cudaPids=cuda_pids, processes=len(tree(source.pid)))
        taken.update(dump(source.pid, IMAGE, shm_before, SOURCE_LOG, CONTAINER_LOCAL, CRIU_OPTIONS))
    except Exception:
        stop_group(source.pid)
        raise
    source.wait()
    assert inv.cache_mount_path, "stoker's serving invocation has a cache volume"
    shutil.rmtree(SOURCE_CACHE, ignore_errors=True)
    shutil.copytree(inv.cache_mount_path, SOURCE_CACHE, symlinks=True)
    taken["imageFilesBytes"] = tree_bytes(IMAGE)
    return taken


def post(base: str, path: str, body: dict[str, Any] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        f"{base}{path}", method="POST", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300):
        pass


def source_invocation(svc: VLLMService, kind: str) -> Invocation:
    """The snapshot's source. It spawns its engine: a forked engine inherits the API server's CUDA device
    files, which the driver's checkpoint of either process leaves open and CRIU cannot dump (`vllm snapshot`
    spawns too)."""
    inv = serve_invocation(svc, SOURCE_PROFILE[kind])
    return dataclasses.replace(inv, env={**inv.env, **SPAWN})


def restored(
    name: str, rep: int, inv: Invocation, taken: dict[str, Any], expected: list[Any], warm: tuple[str, str]
) -> dict[str, Any]:
    """A start from the snapshot: what a new pod of the key has (the cache volume, the container's kept
    files), the snapshot's files on a cold disk or (restore-warm) resident, then restore and time. `warm`:
    what the node warmer keeps resident (the checkpoint, the import pages) for a minimized restore-warm."""
    dropped = prepare(inv.cache_mount_path, restore_seed=True, snapshot=SOURCE_CACHE)
    put_back(IMAGE, SOURCE_LOG)
    record: dict[str, Any] = {"profile": name, "repetition": rep, "pageCacheDropped": dropped}
    record["imageResident"] = name == "restore-warm"
    if name == "restore-warm":
        subprocess.run(["sh", "-c", f"cat {IMAGE}/*.img > /dev/null"], check=True)
        if taken["kind"] == "minimized":
            record["residentBytes"] = warm_node(*warm)
    base = f"http://127.0.0.1:{inv.port}"
    began = time.monotonic()
    try:
        root, attempts = restore(IMAGE, f"r{rep}-{name}", CRIU_OPTIONS)
    except RuntimeError as error:  # a failed restore is a result to record, with CRIU's log
        record["error"] = str(error)
        return record
    record.update(criuRestoreSeconds=round(time.monotonic() - began, 3), restoreAttempts=attempts)
    try:
        cuda_began = time.monotonic()
        for pid in taken["cudaPids"]:
            cuda_checkpoint.restore(pid)
        for pid in taken["cudaPids"]:
            cuda_checkpoint.unlock(pid)
        record["cudaRestoreSeconds"] = round(time.monotonic() - cuda_began, 3)
        ready = wait_ready(None, base, began)
        if ready is None:
            raise RuntimeError("no /health after the restore")
        record["readySeconds"] = round(ready, 3)
        if taken["kind"] == "minimized":
            waking = time.monotonic()
            steps = record["wakeSteps"] = {}
            for path, body in WAKE:
                step = time.monotonic()
                post(base, path, body)
                steps[body["method"] if body else path] = round(time.monotonic() - step, 3)
            record["wakeSeconds"] = round(time.monotonic() - waking, 3)
        record["firstCompletion"] = first_completion(base, inv.served_model_name)
        record["servedSeconds"] = round(time.monotonic() - began, 3)
        record["greedyEqual"] = greedy(record["firstCompletion"]) == expected
        record["decode"] = decode_rate(base, inv.served_model_name)
        record["gpuMemoryUsedMiB"] = gpu_memory_used_mib()
    except Exception as error:  # so is a restored server that does not serve
        record["error"] = repr(error)
    finally:
        stop_group(os.getpgid(root))
    return record


def snapshot_restore(
    svc: VLLMService, out: Path, repetitions: int, stop_after_s: float, kind: str, warm: tuple[str, str]
) -> None:
    budget = Budget(stop_after_s, ESTIMATE_S)
    seed_inv, serve_inv = seed_invocation(svc), serve_invocation(svc, DEFAULT_PROFILE)
    seed = started("seed", 0, seed_inv, out, None)
    emit(out, seed)
    if seed["readySeconds"] is None or not seed_inv.cache_mount_path:
        raise RuntimeError("the seed did not start")
    shutil.rmtree(SEED_SNAPSHOT, ignore_errors=True)
    shutil.copytree(seed_inv.cache_mount_path, SEED_SNAPSHOT, symlinks=True)
    source = source_invocation(svc, kind)
    taken = take_snapshot(source, kind)
    (out / "snapshot.json").write_text(json.dumps(taken, indent=1) + "\n")
    shutil.copy2(IMAGE / "dump.log", out / "logs" / "criu-dump.log")
    shutil.copy2(SOURCE_LOG, out / "logs" / "snapshot-source.log")
    print(json.dumps({"snapshot": {k: v for k, v in taken.items() if k != "decode"}}), flush=True)
    expected = greedy(taken["firstCompletion"])
    for rep in range(1, repetitions + 1):
        restores: list[dict[str, Any]] = []
        for name in (*REQUIRED, DEFAULT_PROFILE):
            reserve = [] if name in REQUIRED else list(REQUIRED) * (repetitions - rep)
            if not budget.fits(budget.estimate(name) + sum(budget.estimate(later) for later in reserve)):
                emit(out, {"profile": name, "repetition": rep, "skipped": "time budget"})
                continue
            began = time.monotonic()
            if name == "stock":
                record = started(name, rep, stock_invocation(svc), out, expected)
            elif name == DEFAULT_PROFILE:
                record = started(name, rep, serve_inv, out, expected)
            else:
                record = restored(name, rep, source, taken, expected, warm)
                restores.append(record)
                # What the restored tree printed (after the source's lines), and CRIU's own log.
                shutil.copy2(SOURCE_LOG, out / "logs" / f"r{rep}-{name}.log")
                criu_log = IMAGE / f"restore-r{rep}-{name}.log"
                if criu_log.exists():
                    shutil.copy2(criu_log, out / "logs" / f"criu-{criu_log.name}")
            budget.record(name, time.monotonic() - began)
            emit(out, record)
            if rep == 1 and name == "restore-warm" and all(r.get("error") for r in restores):
                # Later repetitions could only repeat it; the device time is worth more.
                print(json.dumps({"stopped": "every restore of the first repetition failed"}), flush=True)
                return
