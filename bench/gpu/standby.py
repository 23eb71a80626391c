"""Standby replicas on a GPU host: a cold start of stoker's rendered serving pod, then sleep and wake cycles
driven by the operator's own code (stoker.standby.EngineControl, the calls the operator makes).

In order: the seed Job's invocation (wrapped, with --enable-sleep-mode, the guard middleware and a control
token, exactly as rendered for a VLLMService with coldStart.standby); the serving invocation on the volume
the seed left, with the page cache dropped (coldReadySeconds: first 200 from /health since process start),
SERVERS times, each a new pod. On each running server: a check that the guard refuses /sleep without the
token, then WAKES cycles of EngineControl.sleep (level and mode as the operator sends them), a pause, and
EngineControl.wake (POST /wake_up, GET /health, one completion: wakeToServedSeconds). GPU memory is read
awake and asleep.

Writes OUT/runs.jsonl, OUT/logs/*.log, OUT/host.json and OUT/standby.json (the results document).

A mode of the one driver: `coldstart.py MANIFEST OUT --standby [--servers 3] [--wakes 2]`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness import (
    SEED_SNAPSHOT,
    gpu_memory_used_mib,
    prepare,
    run_server,
    start_and_measure,
)
from profiles import Invocation, seed_invocation, serve_invocation

from stoker.api import VLLMService
from stoker.guard import CONTROL_TOKEN_ENV
from stoker.standby import EngineControl, EngineControlError


def with_token(inv: Invocation, token: str) -> Invocation:
    """The pod's environment also has the control token (from the Secret); the guard is with the
    programs (harness.host_env)."""
    return dataclasses.replace(inv, env={**inv.env, CONTROL_TOKEN_ENV: token})


def refused_without_token(base: str) -> int:
    """The status /sleep answers without the control token: the guard must say 403."""
    request = urllib.request.Request(f"{base}/sleep?level=1", method="POST", data=b"")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def cycles(base: str, token: str, model: str, level: int, wakes: int, asleep_s: float) -> dict[str, Any]:
    engine = EngineControl(base, token)
    result: dict[str, Any] = {
        "sleepWithoutTokenStatus": refused_without_token(base),
        "gpuMemoryAwakeMiB": gpu_memory_used_mib(),
        "cycles": [],
    }
    for index in range(1, wakes + 1):
        cycle: dict[str, Any] = {"wake": index}
        try:
            cycle["sleepSeconds"] = round(engine.sleep(level, timeout=300), 3)
            cycle["gpuMemoryAsleepMiB"] = gpu_memory_used_mib()
            cycle["isSleeping"] = engine.is_sleeping(timeout=10)
            time.sleep(asleep_s)
            timing = engine.wake(model, timeout=60)
            cycle.update(
                wakeSeconds=round(timing.wake_seconds, 3),
                healthSeconds=round(timing.health_seconds, 3),
                wakeToServedSeconds=round(timing.served_seconds, 3),
                gpuMemoryWokenMiB=gpu_memory_used_mib(),
            )
        except EngineControlError as error:
            cycle["error"] = str(error)
        result["cycles"].append(cycle)
        print(json.dumps(cycle), flush=True)
    return result


def standby(svc: VLLMService, manifest: str, out: Path, servers: int, wakes: int, asleep_s: float) -> None:
    """`servers` cold serving starts on the seeded volume, each with `wakes` sleep and wake cycles."""
    spec = svc.spec.cold_start.standby
    assert spec is not None, "the manifest must set spec.coldStart.standby"
    token = secrets.token_urlsafe(32)
    runs = (out / "runs.jsonl").open("a")

    seed = with_token(seed_invocation(svc), token)
    prepare(seed.cache_mount_path, restore_seed=False)
    seeded = start_and_measure(out / "logs" / "seed.log", seed, measure=False)
    runs.write(json.dumps({"profile": "stoker-seed", **seeded, "argv": seed.argv}) + "\n")
    print(json.dumps({"seed": seeded}), flush=True)
    assert seed.cache_mount_path
    shutil.rmtree(SEED_SNAPSHOT, ignore_errors=True)
    shutil.copytree(seed.cache_mount_path, SEED_SNAPSHOT, symlinks=True)

    serve = with_token(serve_invocation(svc, "stoker"), token)
    runs_of_all: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    started: list[dict[str, Any]] = []
    for server in range(1, servers + 1):
        # A new pod on a new node: the seeded volume, no container-local caches, cold page cache.
        dropped = prepare(serve.cache_mount_path, restore_seed=True)

        def measure(base: str, result: dict[str, Any], _: subprocess.Popen[str]) -> None:
            result.update(cycles(base, token, serve.served_model_name, spec.level, wakes, asleep_s))

        served = run_server(out / "logs" / f"serve-standby-{server}.log", serve, measure)
        record = {"profile": "stoker-standby", "server": server, **served, "pageCacheDropped": dropped}
        runs.write(json.dumps({**record, "argv": serve.argv}) + "\n")
        started.append(
            {k: served.get(k) for k in ("readySeconds", "sleepWithoutTokenStatus", "gpuMemoryAwakeMiB")}
        )
        for cycle in served.get("cycles", []):
            if "wakeToServedSeconds" in cycle:
                cold = {"server": server, "coldReadySeconds": served.get("readySeconds")}
                runs_of_all.append({"wakeToServedSeconds": cycle["wakeToServedSeconds"], **cold, **cycle})
            else:
                failed.append({"server": server, **cycle})
    runs.close()

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    document = {
        "benchmark": "standby wake (bench/gpu/coldstart.py --standby)",
        "manifest": manifest,
        "host": json.loads((out / "host.json").read_text()),
        "argv": serve.argv,
        "seedReadySeconds": seeded.get("readySeconds"),
        "servers": started,
        "runs": runs_of_all,
        "failedWakes": failed,
        "medianColdReadySeconds": median([s["readySeconds"] for s in started if s["readySeconds"]]),
        "medianWakeToServedSeconds": median([r["wakeToServedSeconds"] for r in runs_of_all]),
        # What a standby pod does under the operator: its first sleep and its first wake.
        "medianFirstWakeToServedSeconds": median(
            [r["wakeToServedSeconds"] for r in runs_of_all if r["wake"] == 1]
        ),
    }
    (out / "standby.json").write_text(json.dumps(document, indent=1) + "\n")
    summary = ("medianColdReadySeconds", "medianWakeToServedSeconds", "medianFirstWakeToServedSeconds")
    print(json.dumps({key: document[key] for key in summary}), flush=True)
