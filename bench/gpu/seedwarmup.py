"""Seed with one warm-up completion: does the serving pods' first completion stop paying Triton's JIT?

Every serving run JIT-compiles `_compute_slot_mapping_kernel` on its first request (docs/benchmarks/
gpu-coldstart.md), because the seed Job stops at /health and never serves, so the kernel never reaches the
Triton cache on the volume. Per repetition this driver runs the rendered seed invocation ONCE:
  1. until /health answers; the cache volume is then copied as `plain` (what today's seed, stopped at
     /health, leaves behind);
  2. then one completion (a prompt other than the one the serving runs are timed with), then stopped; the
     volume is copied again as `warm`;
then the rendered serving invocation (`stoker`) starts on a fresh copy of each (`stoker` on `plain`,
`stoker-warmseed` on `warm`; their order alternates per repetition). Page cache dropped and container-local
JIT caches wiped before every start (harness.prepare). Output as the other modes': OUT/runs.jsonl,
OUT/logs/r<rep>-<profile>.log, OUT/host.json, plus the files the warm-up added to the volume.

A mode of the one driver: `coldstart.py MANIFEST OUT --seed-warmup [--repetitions 3] [--stop-after 600]`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import (
    HOME,
    Budget,
    completion_request,
    first_completion,
    prepare,
    run_server,
    start_and_measure,
    tree_bytes,
)
from profiles import seed_engine_invocation, serve_invocation

from stoker.api import VLLMService

WARMUP_BODY = {"prompt": "Hello", "max_tokens": 16, "temperature": 0}
SNAPSHOTS = {"plain": HOME / "seed-plain", "warm": HOME / "seed-warm"}
PROFILE_OF = {"plain": "stoker", "warm": "stoker-warmseed"}


def files_under(root: Path) -> dict[str, int]:
    return {
        str(Path(d, f).relative_to(root)): os.path.getsize(Path(d, f))
        for d, _, names in os.walk(root)
        for f in names
    }


def warmup(base: str, model: str) -> dict[str, Any]:
    start = time.monotonic()
    with urllib.request.urlopen(
        completion_request(base, {"model": model, **WARMUP_BODY}), timeout=120
    ) as response:
        usage = json.loads(response.read())["usage"]
    return {"seconds": round(time.monotonic() - start, 3), "tokens": usage["completion_tokens"]}


def seed_run(svc: VLLMService, rep: int, out: Path) -> dict[str, Any]:
    inv = seed_engine_invocation(svc)
    assert inv.cache_mount_path
    cache = Path(inv.cache_mount_path)
    dropped = prepare(inv.cache_mount_path, restore_seed=False)
    log_path = out / "logs" / f"r{rep}-stoker-seed.log"

    def snapshot_then_warm_up(base: str, result: dict[str, Any], _: object) -> None:
        for snap in SNAPSHOTS.values():
            shutil.rmtree(snap, ignore_errors=True)
        shutil.copytree(cache, SNAPSHOTS["plain"], symlinks=True)
        try:
            result["warmupCompletion"] = warmup(base, inv.served_model_name)
            result["secondCompletion"] = first_completion(base, inv.served_model_name)
        except Exception as error:
            result["warmupCompletion"] = {"error": repr(error)}

    result = run_server(log_path, inv, snapshot_then_warm_up)
    ready = result["readySeconds"]
    if ready is not None:
        shutil.copytree(cache, SNAPSHOTS["warm"], symlinks=True)
        before, after = files_under(SNAPSHOTS["plain"]), files_under(SNAPSHOTS["warm"])
        result["addedByWarmup"] = {k: v for k, v in after.items() if before.get(k) != v}
        result["removedByWarmup"] = sorted(set(before) - set(after))
    record = {
        "profile": "stoker-seed",
        "repetition": rep,
        "role": "seed",
        **result,
        "pageCacheDropped": dropped,
    }
    record.update(argv=inv.argv, env=inv.env, warmupBody=WARMUP_BODY)
    return record


def serve_run(svc: VLLMService, rep: int, snapshot: str, out: Path) -> dict[str, Any]:
    inv = serve_invocation(svc, "stoker")
    assert inv.cache_mount_path
    dropped = prepare(inv.cache_mount_path, restore_seed=True, snapshot=SNAPSHOTS[snapshot])
    name = PROFILE_OF[snapshot]
    log_path = out / "logs" / f"r{rep}-{name}.log"
    result = start_and_measure(log_path, inv, measure=True)
    # One more completion would have shown warm latency, but start_and_measure stops the server; the
    # decode probe's firstTokenSeconds is the warm time to first token of the same prompt.
    jit = sum("Triton kernel JIT compilation during inference" in line for line in log_path.open())
    record = {"profile": name, "repetition": rep, "role": "serve", "seedCache": snapshot, **result}
    record.update(pageCacheDropped=dropped, jitWarnings=jit, argv=inv.argv, env=inv.env)
    record["cacheBytesAfter"] = tree_bytes(inv.cache_mount_path)
    return record


def emit(out: Path, record: dict[str, Any]) -> None:
    with (out / "runs.jsonl").open("a") as runs:
        runs.write(json.dumps(record) + "\n")
    keys = ("profile", "repetition", "readySeconds", "exitCode", "jitWarnings", "wallSeconds")
    summary = {key: record.get(key) for key in keys if key in record}
    summary["first"] = record.get("firstCompletion", record.get("warmupCompletion", {})).get("seconds")
    summary["tps"] = record.get("decode", {}).get("tokensPerSecond")
    print(json.dumps(summary), flush=True)


def seed_warmup(svc: VLLMService, out: Path, repetitions: int, stop_after_s: float) -> None:
    """No repetition starts that would end after `stop_after_s`."""
    budget = Budget(stop_after_s, {"repetition": 170.0})
    for rep in range(1, repetitions + 1):
        if not budget.fits(budget.estimate("repetition")):
            print(json.dumps({"repetition": rep, "skipped": "time budget"}), flush=True)
            break
        began = time.monotonic()
        seed = seed_run(svc, rep, out)
        emit(out, seed)
        if seed["readySeconds"] is None:
            continue
        order = ["plain", "warm"] if rep % 2 else ["warm", "plain"]
        for snapshot in order:
            emit(out, serve_run(svc, rep, snapshot, out))
        budget.record("repetition", time.monotonic() - began)
