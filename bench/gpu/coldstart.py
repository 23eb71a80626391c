"""Cold-start benchmark on a GPU host: stock `vllm serve` against stoker's rendered seed and serving runs.

Per repetition, in this order: `stock` (plain `vllm serve`, empty caches), `stoker-seed` (the seed Job's
invocation, run until /health answers, then stopped), then each serving profile (`stoker` and the levers in
profiles.VARIANTS) on a fresh copy of the cache the seed left (the seed also gets the variables a lever
names as its seed_env). Before every start the page cache is dropped
and the container-local JIT caches are wiped, as for a new pod on a new node. Ready time is the first 200
from /health, counted from process start; then one completion (latency) and one streamed 256-token
completion (decode tokens/s), so no profile buys startup with serving speed unnoticed.

Writes OUT/logs/r<rep>-<profile>.log (every output line prefixed with `[seconds since start]`, the format
`stoker.phases` reads), OUT/runs.jsonl (one line per run) and OUT/host.json; bench/gpu/report.py turns them
into the results JSON, chart and table. Standard library only, plus stoker (and pydantic) for rendering.

With --shapes (the predictor's sweep, bench/predictor/shapes.py): the manifest serves each shape's synthetic
checkpoint (make_model.py --shapes, under /models/<shape>) in turn. Pass 1 runs stock, stoker-seed and stoker
for every shape; pass 2 runs stock and stoker again, held-out shapes first, so that a lease that ends early
still leaves every shape measured once. Each shape keeps its own seeded cache. Runs are logged as
OUT/logs/<shape>-r<rep>-<profile>.log; OUT/models.json holds each checkpoint's config, file sizes and (where
stoker.predict is importable) its model facts, as the seed Job would print them.

usage: coldstart.py MANIFEST OUT [--repetitions 3] [--profiles stoker,stoker-spawn] [--stop-after 1300]
       coldstart.py MANIFEST OUT --shapes NAME,NAME,... [--no-decode] [--stop-after 1300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.predictor.shapes import SHAPES, Shape
from profiles import (
    DEFAULT_PROFILE,
    Invocation,
    load_service,
    seed_invocation,
    serve_invocation,
    stock_invocation,
)

from stoker.api import VLLMService
from stoker.api.owned import MODEL_SOURCE_MOUNT_PATH

# The host's home: vLLM installed under site/, its `vllm` script under bin/ (see setup.sh).
HOME = Path(os.environ.get("BENCH_HOME", "/root"))
# What a new pod on a new node does not have: JIT caches outside the cache volume, and HOME's caches
# (stock vLLM's VLLM_CACHE_ROOT is ~/.cache/vllm).
CONTAINER_LOCAL = [
    HOME / ".triton",
    HOME / ".nv",
    HOME / ".cache",
    HOME / ".config/vllm",
    Path("/tmp/torchinductor_root"),
]
SEED_SNAPSHOT = HOME / "seeded-cache"
# The sweep keeps one seeded cache per shape (the model path is part of vLLM's compile-cache key).
SHAPE_SNAPSHOTS = HOME / "seeded-caches"
SEED_EXIT_TIMEOUT_S = 600  # the seed wrapper's warm-up completion and shutdown
# A later device call may write this to change the remaining plan without restarting the driver.
PLAN_OVERRIDE = HOME / "bench-plan.json"
READY_LIMIT_S = 330
DECODE_TOKENS = 256
# Rough durations for the time budget, replaced by the longest one seen (plus a margin).
DEFAULT_ESTIMATE_S = {"stock": 110.0, "stoker-seed": 130.0}


def host_env() -> dict[str, str]:
    """The image's environment: no stray vLLM/JIT settings, vLLM on the path, nothing fetched from a hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_", "TORCHINDUCTOR_"))}
    env.update(
        PATH=f"{HOME}/bin:" + env.get("PATH", "/usr/bin:/bin"),
        PYTHONPATH=f"{HOME}/site",
        HOME=str(HOME),
        PYTHONUNBUFFERED="1",
        # Air-gapped host: the hub is unreachable, for every profile alike.
        HF_HUB_OFFLINE="1",
        # The bundle leaves flashinfer out: vLLM's PyTorch sampler instead, for every profile alike.
        VLLM_USE_FLASHINFER_SAMPLER="0",
        # Multi-GPU hosts here are shared: NVLink multicast stays off (a no-op on one GPU).
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    return env


def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except FileNotFoundError:
        return ""


def drop_page_cache() -> bool:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def gpu_memory_used_mib() -> int:
    out = sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    return int(out.split()[0]) if out else -1


def wait_gpu_free(limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while gpu_memory_used_mib() > 2000 and time.monotonic() < deadline:
        time.sleep(0.5)


def tree_bytes(path: str | Path) -> int:
    files = (os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    return sum(os.path.getsize(f) for f in files if not os.path.islink(f))


def completion_request(base: str, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(
        f"{base}/v1/completions",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(body).encode(),
    )


def first_completion(base: str, model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": "def main():", "max_tokens": 16, "temperature": 0}
    start = time.monotonic()
    with urllib.request.urlopen(completion_request(base, body), timeout=120) as response:
        usage = json.loads(response.read())["usage"]
    return {"seconds": round(time.monotonic() - start, 3), "tokens": usage["completion_tokens"]}


def decode_rate(base: str, model: str) -> dict[str, Any]:
    """Tokens per second between the first and the last streamed token of one long completion."""
    body = {
        "model": model,
        "prompt": "def main():",
        "max_tokens": DECODE_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    first = last = None
    tokens = 0
    with urllib.request.urlopen(completion_request(base, body), timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("choices"):
                last = time.monotonic()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None or last is None or tokens < 2 or last <= first:
        return {"error": f"no decode interval (tokens={tokens})"}
    return {
        "tokensPerSecond": round((tokens - 1) / (last - first), 2),
        "tokens": tokens,
        "firstTokenSeconds": round(first - sent, 3),
    }


def sleep_wake(base: str, model: str) -> dict[str, Any]:
    """Sleep (level 1), wake up, then time one completion: the standby path of a forked engine."""
    timings: dict[str, Any] = {}
    for step, path in (("sleepSeconds", "/sleep?level=1"), ("wakeSeconds", "/wake_up")):
        start = time.monotonic()
        request = urllib.request.Request(f"{base}{path}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=120):
            timings[step] = round(time.monotonic() - start, 3)
    timings["completionAfterWake"] = first_completion(base, model)
    return timings


def wait_ready(process: subprocess.Popen[str], base: str, t0: float) -> float | None:
    while time.monotonic() - t0 < READY_LIMIT_S and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as response:
                if response.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.1)
    return None


def stop(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(30)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def run_server(
    log_path: Path,
    inv: Invocation,
    while_ready: Callable[[str, dict[str, Any], subprocess.Popen[str]], None],
) -> dict[str, Any]:
    """Start `inv`, log each line with its arrival time, wait for /health, call
    `while_ready(base, result, process)` (skipped if the server never became ready), stop the server."""
    base = f"http://127.0.0.1:{inv.port}"
    with log_path.open("w") as log:
        t0 = time.monotonic()
        process = subprocess.Popen(
            inv.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**host_env(), **inv.env},
            text=True,
            start_new_session=True,
            bufsize=1,
            cwd=HOME,
        )

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(f"[{time.monotonic() - t0:9.3f}] {line}")
                log.flush()

        pumper = threading.Thread(target=pump, daemon=True)
        pumper.start()
        ready = wait_ready(process, base, t0)
        result: dict[str, Any] = {"readySeconds": round(ready, 3) if ready is not None else None}
        if ready is not None:
            while_ready(base, result, process)
        stop(process)
        pumper.join(5)
    result["exitCode"] = process.returncode
    result["wallSeconds"] = round(time.monotonic() - t0, 1)
    return result


def start_and_measure(log_path: Path, inv: Invocation, measure: bool, decode: bool = True) -> dict[str, Any]:
    def probe(base: str, result: dict[str, Any], process: subprocess.Popen[str]) -> None:
        result["gpuMemoryUsedMiB"] = gpu_memory_used_mib()
        if inv.exits_by_itself:
            process.wait(timeout=SEED_EXIT_TIMEOUT_S)
            return
        if measure:
            probes: list[tuple[str, Callable[[str, str], dict[str, Any]]]] = [
                ("firstCompletion", first_completion)
            ]
            if decode:
                probes.append(("decode", decode_rate))
            if inv.sleep_check:
                probes.append(("sleepWake", sleep_wake))
            for key, run_probe in probes:
                try:
                    result[key] = run_probe(base, inv.served_model_name)
                except Exception as error:  # a failed probe is a result to record, not a reason to stop
                    result[key] = {"error": repr(error)}

    return run_server(log_path, inv, probe)


def prepare(cache_dir: str | None, restore_seed: bool, snapshot: Path = SEED_SNAPSHOT) -> bool:
    """A new pod on a new node: no container-local caches, the cache volume as the seed left it
    (`snapshot`), cold disk."""
    for path in CONTAINER_LOCAL:
        shutil.rmtree(path, ignore_errors=True)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
        if restore_seed:
            shutil.copytree(snapshot, cache_dir, symlinks=True)
        else:
            os.makedirs(cache_dir)
    wait_gpu_free()
    return drop_page_cache()


class Budget:
    def __init__(self, stop_after_s: float) -> None:
        self.start = time.monotonic()
        self.stop_after_s = stop_after_s
        self.longest: dict[str, float] = dict(DEFAULT_ESTIMATE_S)

    def allows(self, name: str, reserve: list[str]) -> bool:
        """Whether `name` ends before the stop time and still leaves room for the runs in `reserve`."""
        return self.fits(sum(self.estimate(later) for later in [name, *reserve]))

    def estimate(self, name: str, like: str | None = None) -> float:
        """The longest `name` seen, else the longest `like` seen (the same profile on another shape)."""
        return self.longest.get(name, self.longest.get(like or name, 90.0))

    def fits(self, seconds: float) -> bool:
        return time.monotonic() - self.start + seconds < self.stop_after_s

    def record(self, name: str, seconds: float) -> None:
        self.longest[name] = max(self.longest.get(name, 0.0), seconds + 10)


def run(
    name: str,
    rep: int,
    inv: Invocation,
    out: Path,
    budget: Budget,
    role: str,
    reserve: list[str],
    shape: str | None = None,
    decode: bool = True,
) -> dict[str, Any] | None:
    """One start of `inv` as profile `name`; with `shape`, the sweep's start of that shape's checkpoint."""
    key = f"{shape}/{name}" if shape else name
    if not (budget.fits(budget.estimate(key, like=name)) and budget.allows(name, reserve)):
        skipped = {"shape": shape, "profile": name, "repetition": rep, "skipped": "time budget"}
        print(json.dumps(skipped), flush=True)
        return None
    snapshot = SHAPE_SNAPSHOTS / shape if shape else SEED_SNAPSHOT
    dropped = prepare(inv.cache_mount_path, restore_seed=role == "serve", snapshot=snapshot)
    log = Path("logs") / (f"{shape}-r{rep}-{name}.log" if shape else f"r{rep}-{name}.log")
    started = time.monotonic()
    result = start_and_measure(out / log, inv, measure=role != "seed", decode=decode)
    budget.record(name, time.monotonic() - started)
    budget.record(key, time.monotonic() - started)
    record = {"profile": name, "repetition": rep, "role": role, **result, "pageCacheDropped": dropped}
    if shape:
        record.update(shape=shape, log=str(log))
    record.update(argv=inv.argv, env=inv.env)
    if inv.cache_mount_path:
        record["cacheBytesAfter"] = tree_bytes(inv.cache_mount_path)
    with (out / "runs.jsonl").open("a") as runs:
        runs.write(json.dumps(record) + "\n")
    summary = {key: record.get(key) for key in ("shape", "profile", "repetition", "readySeconds", "exitCode")}
    summary["first"] = result.get("firstCompletion", {}).get("seconds")
    summary["tps"] = result.get("decode", {}).get("tokensPerSecond")
    print(json.dumps(summary), flush=True)
    return record


def host_facts(out: Path) -> None:
    probe = (
        "import importlib.metadata as m, torch; "
        "print(m.version('vllm'), torch.__version__, torch.version.cuda)"
    )
    versions = sh(sys.executable, "-c", probe).split() or ["unknown"] * 3
    facts = {
        "gpu": sh("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"),
        "vllm": versions[0],
        "torch": versions[1],
        "cuda": versions[2],
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
    }
    (out / "host.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts), flush=True)


def shape_service(manifest: str, shape: Shape) -> VLLMService:
    """The manifest, serving the checkpoint of `shape` (written by make_model.py to /models/NAME)."""
    svc = load_service(manifest)
    assert svc.spec.model.source.pvc is not None, "the sweep's manifest takes its model from a PVC"
    svc.spec.model.source.pvc.path = f"/{shape.name}"
    return svc


def model_record(model_dir: str) -> dict[str, Any]:
    """What the predictor needs of a checkpoint: its config and file sizes, and the model facts the seed Job
    prints (stoker.predict.facts, the same function), where this checkout has it."""
    files = {name: os.path.getsize(os.path.join(model_dir, name)) for name in sorted(os.listdir(model_dir))}
    config = json.loads(Path(model_dir, "config.json").read_text())
    record: dict[str, Any] = {"config": config, "files": files}
    try:
        from stoker.predict.facts import read_model_facts
    except ImportError:
        return record
    record["facts"] = read_model_facts(model_dir)
    return record


def sweep_plan(shapes: list[Shape]) -> list[tuple[Shape, int, str]]:
    """(shape, repetition, profile), most useful first. Pass 1: every shape once (stock, seed, stoker), the
    held-out shapes before the last fitted one, so that a cut-off still leaves shapes to fit and to judge.
    Pass 2: stock and stoker again, held-out shapes first (pass 1's seed serves pass 2)."""
    fitted = [shape for shape in shapes if not shape.held_out]
    held_out = [shape for shape in shapes if shape.held_out]
    once = [*fitted[:-1], *held_out, *fitted[-1:]]
    first = [(shape, 1, name) for shape in once for name in ("stock", "stoker-seed", DEFAULT_PROFILE)]
    again = [*held_out, *fitted]
    return first + [(shape, 2, name) for shape in again for name in ("stock", DEFAULT_PROFILE)]


def sweep(manifest: str, shapes: list[Shape], out: Path, budget: Budget, decode: bool) -> None:
    models = {shape.name: model_record(f"{MODEL_SOURCE_MOUNT_PATH}/{shape.name}") for shape in shapes}
    (out / "models.json").write_text(json.dumps(models, indent=1))
    for shape, rep, name in sweep_plan(shapes):
        svc = shape_service(manifest, shape)
        if name == "stock":
            run(name, rep, stock_invocation(svc), out, budget, "stock", [], shape.name, decode)
        elif name == "stoker-seed":
            seeded = run(name, rep, seed_invocation(svc), out, budget, "seed", [], shape.name, decode)
            seed_cache = seed_invocation(svc).cache_mount_path
            if seeded and seeded["readySeconds"] is not None and seed_cache:
                shutil.rmtree(SHAPE_SNAPSHOTS / shape.name, ignore_errors=True)
                shutil.copytree(seed_cache, SHAPE_SNAPSHOTS / shape.name, symlinks=True)
        elif (SHAPE_SNAPSHOTS / shape.name).exists():
            run(name, rep, serve_invocation(svc, name), out, budget, "serve", [], shape.name, decode)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("out")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--profiles", default="stoker,stoker-spawn,stoker-nocompile")
    parser.add_argument("--first-repetition", type=int, default=1, help="to go on after an interruption")
    parser.add_argument("--skip-stock", action="store_true", help="only stoker's runs (safety checks)")
    parser.add_argument(
        "--stop-after", type=float, default=1300, help="seconds; no run starts that would end later"
    )
    parser.add_argument("--shapes", help="the predictor's sweep over these bench/predictor/shapes.py shapes")
    parser.add_argument("--no-decode", action="store_true", help="one completion per start, no decode probe")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = f"{HOME}/site"
    host_facts(out)
    if args.shapes:
        shapes = [SHAPES[name] for name in args.shapes.split(",")]
        sweep(args.manifest, shapes, out, Budget(args.stop_after), decode=not args.no_decode)
        print("done", flush=True)
        return
    svc = load_service(args.manifest)
    profiles, repetitions = args.profiles.split(","), args.repetitions
    # One seed for the whole run: a plan override that drops a lever later leaves the seed as it was.
    seed = seed_invocation(svc, tuple(profiles))
    budget = Budget(args.stop_after)
    # The runs every repetition needs; a lever runs only if the later repetitions' required runs still fit.
    required = ([] if args.skip_stock else ["stock"]) + ["stoker-seed", DEFAULT_PROFILE]
    rep = args.first_repetition
    while rep <= repetitions:
        if PLAN_OVERRIDE.exists():
            plan = json.loads(PLAN_OVERRIDE.read_text())
            profiles, repetitions = plan.get("profiles", profiles), plan.get("repetitions", repetitions)
        if not args.skip_stock:
            run("stock", rep, stock_invocation(svc), out, budget, "stock", reserve=[])
        seeded = run("stoker-seed", rep, seed, out, budget, "seed", reserve=[])
        if seeded and seeded["readySeconds"] is not None and seed.cache_mount_path:
            shutil.rmtree(SEED_SNAPSHOT, ignore_errors=True)
            shutil.copytree(seed.cache_mount_path, SEED_SNAPSHOT, symlinks=True)
            for name in profiles:
                reserve = [] if name == DEFAULT_PROFILE else required * (repetitions - rep)
                run(name, rep, serve_invocation(svc, name), out, budget, "serve", reserve)
        rep += 1
    print("done", flush=True)


if __name__ == "__main__":
    main()
