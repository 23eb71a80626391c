"""Many sleeping engines on one GPU (issue 25), woken by the operator's own code.

Two models, the synthetic checkpoints of two bench/predictor/shapes.py shapes (make_model.py --shapes), each a
VLLMService with standby: the manifest's runtime and coldStart (its gpuMemoryUtilization is each engine's
share of the GPU), serving that shape's checkpoint. In order:
1. each service's seed Job invocation (with a control token), alone on the GPU; its cache is kept;
2. ENGINES serving pods per service, started one at a time on the one GPU, each on its service's seeded cache
   (the pod's cache path moved per service on this host, a port per engine); the first engine of each model
   also measures decode speed; each is then put to sleep (EngineControl.sleep, as the operator does);
   GPU memory (per process where nvidia-smi names them, and in all) and host memory are read asleep;
3. WAKES wakes, of the engines in turn, alternating models, each through
   stoker.standby.gpushare.wake_on_shared_gpu, the function the operator calls: the engine awake before (its
   service scaled to zero, so not wanted) is asked, put to sleep first when the two do not fit together, and
   the target wakes and serves a completion. `servedSeconds` counts from the call, the sleep included.
   Decode speed is measured again after the first wake of each model.

Writes OUT/runs.jsonl, OUT/logs/*.log and OUT/standby-pool.json (the results document).
A mode of the one driver: `coldstart.py MANIFEST OUT --pool SHAPE,SHAPE [--engines 2] [--wakes 24]`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import secrets
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from harness import (
    CONTAINER_LOCAL,
    HOME,
    Budget,
    Server,
    decode_rate,
    gpu_memory_used_mib,
    prepare,
    sh,
    start_and_measure,
    start_server,
)
from profiles import Invocation, seed_invocation, serve_invocation
from standby import with_token

from stoker.api import VLLMService
from stoker.api.owned import CACHE_MOUNT_PATH
from stoker.standby import EngineControl
from stoker.standby.gpushare import SharedEngine, wake_on_shared_gpu

POOL_CACHES = HOME / "pool-caches"
FIRST_PORT = 8100


def moved(inv: Invocation, cache: Path, port: int) -> Invocation:
    """`inv` as a pod of its own: its service's cache volume (the in-pod path, moved on this host) and its
    own port, the rest exactly as rendered."""

    def move(value: str) -> str:
        return value.replace(CACHE_MOUNT_PATH, str(cache))

    argv = [move(arg) for arg in inv.argv]
    argv[argv.index("--port") + 1] = str(port)
    env = {key: move(value) for key, value in inv.env.items()}
    return dataclasses.replace(inv, argv=argv, env=env, port=port, cache_mount_path=str(cache))


def device_mib() -> int:
    out = sh("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits")
    return int(out.split()[0])


def process_group(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def gpu_mib_by_group() -> dict[int, int]:
    """GPU memory per process group (each engine is one), where nvidia-smi can name the processes."""
    out = sh("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    used: dict[int, int] = {}
    for line in out.splitlines():
        try:
            pid, mib = (int(field) for field in line.split(","))
        except ValueError:
            continue
        group = process_group(pid)
        if group is not None:
            used[group] = used.get(group, 0) + mib
    return used


def host_mib_of_group(group: int) -> int:
    """Resident host memory of every process in the engine's group (pinned weight backups included)."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and process_group(int(entry.name)) == group:
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
    return total_kib // 1024


@dataclasses.dataclass
class Engine:
    name: str
    service: VLLMService
    model: str
    server: Server
    control: EngineControl
    since: dt.datetime

    def shared(self, wanted: bool) -> SharedEngine:
        share = self.service.spec.runtime.gpu_memory_utilization or 0.9
        return SharedEngine(self.name, share, True, wanted, self.since)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: with fewer than 100 values, p99 is the slowest."""
    ordered = sorted(values)
    return round(ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)], 3)


def pool(
    services: list[VLLMService], out: Path, engines_per_service: int, wakes: int, budget: Budget
) -> None:
    token = secrets.token_urlsafe(32)
    runs = (out / "runs.jsonl").open("a")
    level = 1
    device_gib = device_mib() / 1024

    # 1. Seeds, each alone on the GPU, each into its service's own cache.
    seeded: dict[str, Path] = {}
    for svc in services:
        cache = POOL_CACHES / svc.name
        seed = moved(with_token(seed_invocation(svc), token), cache, FIRST_PORT)
        prepare(seed.cache_mount_path, restore_seed=False)
        result = start_and_measure(out / "logs" / f"{svc.name}-seed.log", seed, measure=False)
        runs.write(
            json.dumps({"profile": "stoker-seed", "service": svc.name, **result, "argv": seed.argv}) + "\n"
        )
        print(json.dumps({"seed": svc.name, "readySeconds": result.get("readySeconds")}), flush=True)
        snapshot = POOL_CACHES / f"{svc.name}-seeded"
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(cache, snapshot, symlinks=True)
        seeded[svc.name] = snapshot

    # 2. Engines, one at a time on the one GPU, each asleep before the next starts.
    engines: list[Engine] = []
    started: list[dict[str, Any]] = []
    fresh_decode: dict[str, Any] = {}
    port = FIRST_PORT
    for index in range(engines_per_service):
        for svc in services:
            name = f"{svc.name}-{index}"
            cache = POOL_CACHES / name
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(seeded[svc.name], cache, symlinks=True)
            # A new pod: no container-local JIT caches (the node's page cache stays, as it would).
            for path in CONTAINER_LOCAL:
                shutil.rmtree(path, ignore_errors=True)
            serve = moved(with_token(serve_invocation(svc, "stoker"), token), cache, port)
            port += 1
            server = start_server(out / "logs" / f"{name}.log", serve)
            record: dict[str, Any] = {"engine": name, "model": svc.name, "readySeconds": server.ready_seconds}
            if server.ready_seconds is None:
                server.stop()
                record["error"] = "not ready"
                started.append(record)
                print(json.dumps(record), flush=True)
                continue
            engine = Engine(
                name,
                svc,
                serve.served_model_name,
                server,
                EngineControl(server.base, token),
                dt.datetime.now(dt.UTC),
            )
            record["gpuMiBAwakeTotal"] = gpu_memory_used_mib()
            if svc.name not in fresh_decode:
                fresh_decode[svc.name] = decode_rate(server.base, engine.model)
            record["sleepSeconds"] = round(engine.control.sleep(level, timeout=120), 3)
            record["gpuMiBAfterSleepTotal"] = gpu_memory_used_mib()
            engines.append(engine)
            started.append(record)
            runs.write(json.dumps({"profile": "stoker-standby", **record, "argv": serve.argv}) + "\n")
            print(json.dumps(record), flush=True)

    time.sleep(2)
    by_group = gpu_mib_by_group()
    asleep_memory = [
        {
            "engine": engine.name,
            "model": engine.service.name,
            "gpuMiB": by_group.get(engine.server.process.pid),
            "hostMiB": host_mib_of_group(engine.server.process.pid),
            # Results files keep sizes in bytes too (the README's figures are checked against them).
            "gpuBytes": by_group[engine.server.process.pid] * 2**20
            if engine.server.process.pid in by_group
            else None,
            "hostBytes": host_mib_of_group(engine.server.process.pid) * 2**20,
        }
        for engine in engines
    ]
    all_asleep_gpu_mib = gpu_memory_used_mib()
    print(json.dumps({"asleep": asleep_memory, "gpuMiBAllAsleep": all_asleep_gpu_mib}), flush=True)

    # 3. Wakes, alternating models, each through the operator's own wake on a shared GPU.
    order = sorted(
        engines, key=lambda engine: (int(engine.name.rsplit("-", 1)[1]), services.index(engine.service))
    )
    results: list[dict[str, Any]] = []
    after_wake_decode: dict[str, Any] = {}
    awake: Engine | None = None
    by_name = {engine.name: engine for engine in engines}
    for number in range(1, wakes + 1):
        if not order or not budget.fits(30):
            break
        target = order[(number - 1) % len(order)]
        # The autoscaler scaled the awake engine's service to zero and the target's to one.
        neighbours = [engine.shared(wanted=False) for engine in engines if engine is not target]
        wake: dict[str, Any] = {"wake": number, "engine": target.name, "model": target.service.name}
        try:
            shared = wake_on_shared_gpu(
                "bench-gpu",
                device_gib,
                target.shared(wanted=True),
                neighbours,
                lambda engine: by_name[engine.name].control,
                target.model,
                level,
                timeout=60,
            )
        except Exception as error:  # a failed wake is a result to record
            wake["error"] = repr(error)
            results.append(wake)
            print(json.dumps(wake), flush=True)
            continue
        assert shared.timing is not None and shared.served_seconds is not None, shared.plan
        target.since = dt.datetime.now(dt.UTC)
        wake.update(
            sleptFirst=[
                {"engine": name, "sleepSeconds": round(seconds, 3)} for name, seconds in shared.slept
            ],
            awakeBefore=awake.name if awake else None,
            wakeSeconds=round(shared.timing.wake_seconds, 3),
            healthSeconds=round(shared.timing.health_seconds, 3),
            servedSeconds=round(shared.served_seconds, 3),
            gpuMiBAwake=gpu_memory_used_mib(),
        )
        awake = target
        if target.service.name not in after_wake_decode:
            after_wake_decode[target.service.name] = decode_rate(target.server.base, target.model)
        results.append(wake)
        print(json.dumps(wake), flush=True)
        time.sleep(0.5)

    for engine in engines:
        engine.server.stop()
    runs.close()

    served = [wake["servedSeconds"] for wake in results if "servedSeconds" in wake]
    made_room = [wake["servedSeconds"] for wake in results if wake.get("sleptFirst")]
    document = {
        "benchmark": "shared standby pool (bench/gpu/coldstart.py --pool)",
        "host": json.loads((out / "host.json").read_text()),
        "deviceGiB": round(device_gib, 1),
        "enginesPerGpu": len(engines),
        "models": [
            {
                "name": svc.name,
                "checkpoint": svc.spec.model.source.pvc.path if svc.spec.model.source.pvc else None,
                "gpuMemoryUtilization": svc.spec.runtime.gpu_memory_utilization,
                "engines": sum(engine.service is svc for engine in engines),
            }
            for svc in services
        ],
        "engines": started,
        "asleep": asleep_memory,
        "gpuMiBAllAsleep": all_asleep_gpu_mib,
        "wakes": results,
        "failedWakes": sum("error" in wake for wake in results),
        "wakeServedP50Seconds": round(statistics.median(served), 3) if served else None,
        "wakeServedP99Seconds": percentile(served, 0.99) if served else None,
        "wakesWithSleepFirst": len(made_room),
        "wakeWithSleepFirstServedP50Seconds": round(statistics.median(made_room), 3) if made_room else None,
        "decode": {
            name: {"freshStart": fresh_decode.get(name), "afterWake": after_wake_decode.get(name)}
            for name in (svc.name for svc in services)
        },
        "argv": {engine.name: engine.server.process.args for engine in engines},
    }
    (out / "standby-pool.json").write_text(json.dumps(document, indent=1) + "\n")
    summary = (
        "enginesPerGpu",
        "failedWakes",
        "wakeServedP50Seconds",
        "wakeServedP99Seconds",
        "gpuMiBAllAsleep",
    )
    print(json.dumps({key: document[key] for key in summary}), flush=True)
    os.sync()
