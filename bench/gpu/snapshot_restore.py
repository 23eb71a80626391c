"""Snapshot and restore on the GPU (issue 40): a served replica of stoker's rendered serving invocation is
snapshotted once (the driver's checkpoint API moves its device memory into its host memory, then CRIU dumps
the process tree), and later starts restore it, against stock vLLM and stoker's own start on a cold node.

Once: the seed Job's invocation (the compile cache), then the snapshot's source: what the operator renders
for a serving pod made for snapshots (render.snapshot), on the seeded cache: stoker.inpod.engine_init around
the serving invocation (its engine spawned, under bench/snapshot/no_io_uring.c: CRIU cannot dump io_uring; a
pod's default seccomp profile denies it the same way). This driver plays the node agent's part through
engine_init's handshake files, with the agent's CUDA steps (stoker.snapshot.cuda): it answers engine_init's
wait (no snapshot yet), takes the offer of the warmed engine, checkpoints the engine's CUDA processes, dumps
the engine's tree (bench/snapshot/criu_tree.py, left running), puts the processes back on the GPU and tells
engine_init the dump's outcome; the source then serves one completion and the decode probe. Two kinds
(--snapshot-kind): `full`, the replica as it serves (weights and KV cache in the image), and `minimized`,
the service in sleep mode (`--enable-sleep-mode` in its extraArgs), which engine_init puts to sleep at level
2 before the offer (weights discarded, the rest offloaded) through stoker.guard with the pod's control token,
and wakes (weights reloaded) after the dump and, by the same code, after each restore, as `vllm snapshot`
does. Per repetition, in this order:
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

import contextlib
import ctypes
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.snapshot.criu_tree import SHM, dump, put_back, reap_orphans, restore, stop_group
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
    sh,
    start_and_measure,
    tree_bytes,
    wait_ready,
    warm_node,
)
from profiles import (
    DEFAULT_PROFILE,
    Invocation,
    patched_spec,
    seed_invocation,
    serve_invocation,
    stock_invocation,
)

from stoker.api import VLLMService
from stoker.guard import CONTROL_TOKEN_ENV
from stoker.inpod import engine_init
from stoker.inpod.engine_init import PR_SET_CHILD_SUBREAPER
from stoker.render.children import render_children
from stoker.render.pods import ENGINE_CONTAINER
from stoker.render.snapshot import Snapshots
from stoker.snapshot import cuda
from stoker.snapshot.agent import children, tree

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
# What each kind of snapshot changes in the service's spec: a minimized one's engine runs in sleep mode.
SOURCE_SPEC: dict[str, dict[str, Any]] = {"full": {}, "minimized": {"extraArgs": ["--enable-sleep-mode"]}}
# The operator's settings as the source is rendered with them (the restore wait is this driver's to answer).
SNAPSHOTS = Snapshots(
    "benchmark-control-key-0123456789",
    restore_wait_seconds=60,
    restore_bound_seconds=120,
    offer_bound_seconds=900,
)
CONTROL_TOKEN = "benchmark-pod-control-token"
# The rendered pod's environment that the invocation lacks (loopback, a spawned engine, dev mode).
RENDERED_ENV = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_SERVER_DEV_MODE")


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
            inv.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=HOME,
            start_new_session=True,
            text=True,
        )


def gpus_in_use() -> list[str]:
    """The UUIDs of the GPUs that processes hold contexts on."""
    return sorted(set(sh("nvidia-smi", "--query-compute-apps=gpu_uuid", "--format=csv,noheader").split()))


def until_gone(pids: list[int]) -> None:
    """Until none of `pids` is left, zombies included (this driver, their subreaper, reaps them)."""
    deadline = time.monotonic() + 60
    while any(Path("/proc", str(pid)).exists() for pid in pids) and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.1)


def taken_pid(error: str) -> str:
    """What holds the PID a failed restore could not take, from /proc."""
    match = re.search(r"Can't fork for ([0-9]+)", error)
    if match is None:
        return ""
    stat = Path("/proc", match.group(1), "stat")
    return stat.read_text()[:300] if stat.exists() else "gone"


def said(event: str) -> bool:
    """Whether the source's engine_init has said `event` in its log."""
    return any(
        line.startswith(engine_init.LINE_PREFIX)
        and json.loads(line.removeprefix(engine_init.LINE_PREFIX))["event"] == event
        for line in SOURCE_LOG.read_text(errors="replace").splitlines()
    )


def until(check: Any, source: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 900
    while not check():
        if source.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the snapshot's source never {what}: {SOURCE_LOG.read_text()[-3000:]}")
        time.sleep(0.1)


def tell(name: str, text: str) -> None:
    if not engine_init.create_once(str(Path(engine_init.HANDSHAKE_DIRECTORY) / name), text):
        raise RuntimeError(f"engine_init's {name} is taken")


def take_snapshot(inv: Invocation, kind: str) -> dict[str, Any]:
    """Start the source on the seeded cache under engine_init, answer as the node agent, take its offer:
    checkpoint its CUDA processes, dump its tree, put them back; then it serves."""
    prepare(inv.cache_mount_path, restore_seed=True)
    shm_before = set(os.listdir(SHM))
    Path(engine_init.HANDSHAKE_DIRECTORY).mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    source = source_process(inv)
    taken: dict[str, Any] = {"kind": kind}
    base = f"http://127.0.0.1:{inv.port}"
    try:
        until(lambda: said("waiting"), source, "waited")
        tell(engine_init.DECISION, f"{engine_init.START} no snapshot yet (the benchmark's agent)")
        until(lambda: (Path(engine_init.HANDSHAKE_DIRECTORY) / engine_init.OFFER).exists(), source, "offered")
        taken["offeredSeconds"] = round(time.monotonic() - began, 3)
        taken["gpuMemoryUsedMiBOffered"] = gpu_memory_used_mib()  # asleep, for a minimized one
        tell(engine_init.DUMP, engine_init.DUMPING)
        taken["sourceGpus"] = gpus_in_use()
        (engine,) = children(source.pid)
        pids = tree(engine)
        checkpointed = cuda.holding(pids)
        checkpointing = time.monotonic()
        cuda.checkpoint(checkpointed)
        taken["cudaCheckpointSeconds"] = round(time.monotonic() - checkpointing, 3)
        taken["gpuMemoryUsedMiBCheckpointed"] = gpu_memory_used_mib()
        taken.update(cudaProcesses=len(checkpointed), processes=len(pids))
        try:
            taken.update(
                dump(engine, IMAGE, shm_before, SOURCE_LOG, CONTAINER_LOCAL, CRIU_OPTIONS, leave_running=True)
            )
        finally:
            resuming = time.monotonic()
            cuda.resume(checkpointed)
            taken["cudaResumeSeconds"] = round(time.monotonic() - resuming, 3)
        tell(engine_init.DUMPED, engine_init.DUMPED)
        until(lambda: said("serving"), source, "served after its dump")  # woken first, if asleep
        taken["servingSeconds"] = round(time.monotonic() - began, 3)
        taken["firstCompletion"] = first_completion(base, inv.served_model_name)
        taken["decode"] = decode_rate(base, inv.served_model_name)
        taken["gpuMemoryUsedMiB"] = gpu_memory_used_mib()
    finally:
        # Every process of the source, each of its groups (one of vLLM's may lead its own): the restores
        # need every PID of the dumped tree free ("Can't fork for PID: File exists").
        pids = tree(source.pid)
        groups = set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        for group in groups:
            stop_group(group)
        source.wait()
        until_gone(pids)
    assert inv.cache_mount_path, "stoker's serving invocation has a cache volume"
    shutil.rmtree(SOURCE_CACHE, ignore_errors=True)
    shutil.copytree(inv.cache_mount_path, SOURCE_CACHE, symlinks=True)
    taken["imageFilesBytes"] = tree_bytes(IMAGE)
    return taken


def source_invocation(svc: VLLMService, kind: str) -> Invocation:
    """The snapshot's source as the operator renders its pod: engine_init's options, the guard and the
    environment from the rendered pod (render.snapshot), around the serving invocation of the source's spec
    under the io_uring wrapper; the pod's control token from its Secret is this driver's."""
    source = patched_spec(svc, {"runtime": SOURCE_SPEC[kind]})
    inv = serve_invocation(source, DEFAULT_PROFILE)
    rendered = {
        child["kind"]: child
        for child in render_children(source, snapshots=SNAPSHOTS, control_token=CONTROL_TOKEN)
    }
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    engine = next(c for c in pod["containers"] if c["name"] == ENGINE_CONTAINER)
    command = engine["command"]
    wrapper = command[1 : command.index("--") + 1]  # "python3" is the bundle's interpreter here
    guard = command[-2:] if "--sleep" in wrapper else []
    env = {e["name"]: e["value"] for e in engine["env"] if e["name"] in RENDERED_ENV}
    if "--sleep" in wrapper:
        env[CONTROL_TOKEN_ENV] = CONTROL_TOKEN
    argv = [sys.executable, *wrapper, os.environ["NO_IO_URING"], *inv.argv, *guard]
    return dataclasses.replace(inv, argv=argv, env={**inv.env, **env})


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
        record["pidTakenBy"] = taken_pid(str(error))
        return record
    record.update(criuRestoreSeconds=round(time.monotonic() - began, 3), restoreAttempts=attempts)
    try:
        cuda_began = time.monotonic()
        # As the agent does after a restore. The cold-disk one moves the engine onto another GPU of the host
        # where it has one (the source's paired to itself on a host of one GPU), as the agent does for a pod
        # given another GPU than the source's (stoker.snapshot.cuda.RestoreArgs).
        source = taken["sourceGpus"]
        others = sorted(set(taken["gpus"].values()) - set(source))
        moved = name == "restore" and len(source) == 1
        remap = [(source[0], others[0] if others else source[0])] if moved else []
        cuda.resume(cuda.holding(tree(root), "checkpointed"), remap)
        record["gpuPairs"] = remap
        record["gpusInUse"] = gpus_in_use()
        record["cudaRestoreSeconds"] = round(time.monotonic() - cuda_began, 3)
        ready = wait_ready(None, base, began)
        if ready is None:
            raise RuntimeError("no /health after the restore")
        record["readySeconds"] = round(ready, 3)
        if taken["kind"] == "minimized":
            waking = time.monotonic()  # as the restored pod's engine_init does
            record["wakeSteps"] = engine_init.woken(f"{base}/health", CONTROL_TOKEN)
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
        reap_orphans()
    return record


def snapshot_restore(
    svc: VLLMService, out: Path, repetitions: int, stop_after_s: float, kind: str, warm: tuple[str, str]
) -> None:
    budget = Budget(stop_after_s, ESTIMATE_S)
    # What outlives its parent among the processes this driver starts (the source's engine once engine_init
    # is gone, a restored tree once CRIU exits, CRIU's own tasks of a failed attempt) becomes its child, and
    # is reaped here (criu_tree.reap_orphans), not left to PID 1: a zombie keeps a PID a restore needs.
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    seed_inv, serve_inv = seed_invocation(svc), serve_invocation(svc, DEFAULT_PROFILE)
    seed = started("seed", 0, seed_inv, out, None)
    emit(out, seed)
    if seed["readySeconds"] is None or not seed_inv.cache_mount_path:
        raise RuntimeError("the seed did not start")
    shutil.rmtree(SEED_SNAPSHOT, ignore_errors=True)
    shutil.copytree(seed_inv.cache_mount_path, SEED_SNAPSHOT, symlinks=True)
    source = source_invocation(svc, kind)
    taken = take_snapshot(source, kind)
    taken["gpus"] = cuda.node_gpus()  # what the agent records of a container's GPUs, for the host's
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
