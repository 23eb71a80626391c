"""A vLLM CPU server restored from a CRIU snapshot, against the same server started (issue 40), on this host.

Profiles, interleaved per repetition, the page cache dropped before each start:
- `stock`: `vllm serve` with an empty compile cache (a new pod of stock vLLM);
- `cache`: the same with the compile cache a first start left (a seeded replica, as stoker starts one);
- `restore`: `criu restore` of the server snapshotted once, after that first start had served a completion.
Each is timed from its process start to /health and to a first greedy completion, which must equal the
snapshotted server's. Every server runs under bench/snapshot/no_io_uring.c (CRIU cannot dump io_uring; a pod's
default seccomp profile denies it the same way). The snapshot: `criu dump --tcp-established --link-remap` (the
engine's gloo connection, multiprocessing's semaphores), with the files vLLM keeps in /dev/shm beside the
image (CRIU keeps shared file mappings by path) and the server's log as it was (CRIU checks its size).

Needs root (the page cache, CRIU), hack/vllm-venv's vLLM 0.26.0 CPU venv and `hack/criu build`.

usage (repository root): python3 -m bench.snapshot.cpu OUT_JSON [--repetitions 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.snapshot.criu_tree import REPO, SHM, criu_binary, dump, put_back, restore, stop_group

VENV = Path(os.environ.get("VENV", Path.home() / ".cache/stoker/vllm/0.26.0"))
WORK = Path(os.environ.get("WORK", "/tmp/stoker-snapshot"))
PORT = 18123
PROMPT = {"prompt": "The operator renders one", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
READY_LIMIT_S = 600


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def completion(model: Path) -> str:
    body = json.dumps({"model": str(model), **PROMPT}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]["text"]


def healthy() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def served(began: float, model: Path, alive: subprocess.Popen[bytes] | None = None) -> dict[str, object]:
    """Seconds from `began` to /health and to a first completion, and its text."""
    while not healthy():
        if alive is not None and alive.poll() is not None:
            raise RuntimeError(f"the server exited with {alive.returncode} before /health")
        if time.monotonic() - began > READY_LIMIT_S:
            raise RuntimeError(f"no /health after {READY_LIMIT_S} s")
        time.sleep(0.05)
    health = time.monotonic() - began
    text = completion(model)
    return {
        "healthSeconds": round(health, 3),
        "firstCompletionSeconds": round(time.monotonic() - began, 3),
        "text": text,
    }


def start(wrapper: Path, model: Path, cache: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        "HOME": str(WORK),
        "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(cache),
    }
    argv = [str(wrapper), str(VENV / "bin/vllm"), "serve", str(model), "--port", str(PORT)]
    argv += ["--max-model-len", "256", "--dtype", "float32"]
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def run_start(name: str, rep: int, wrapper: Path, model: Path, cache: Path) -> dict[str, object]:
    drop_page_cache()
    began = time.monotonic()
    server = start(wrapper, model, cache, WORK / f"r{rep}-{name}.log")
    try:
        return {"profile": name, "repetition": rep, **served(began, model, server)}
    finally:
        stop_group(server.pid)


def snapshot(wrapper: Path, model: Path, cache: Path, image: Path) -> dict[str, object]:
    """Start the server on `cache`, serve once, dump it into `image` with what a restore needs beside it."""
    shm_before = set(os.listdir(SHM))
    log = WORK / "snapshotted.log"
    began = time.monotonic()
    server = start(wrapper, model, cache, log)
    first = served(began, model, server)
    try:
        taken = dump(server.pid, image, shm_before, log)
    except RuntimeError:
        stop_group(server.pid)
        raise
    server.wait()
    return {"served": first, **taken, "log": str(log)}


def run_restore(rep: int, image: Path, model: Path, log: Path, expected: str) -> dict[str, object]:
    put_back(image, log)
    drop_page_cache()
    began = time.monotonic()
    restored, attempts = restore(image, f"r{rep}")
    try:
        result = served(began, model)
    finally:
        stop_group(os.getpgid(restored))
    return {
        "profile": "restore",
        "repetition": rep,
        "restoreAttempts": attempts,
        **result,
        "greedyEqual": result["text"] == expected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    wrapper = WORK / "no_io_uring"
    subprocess.run(["cc", "-O2", "-o", str(wrapper), str(REPO / "bench/snapshot/no_io_uring.c")], check=True)
    model = WORK / "model"
    if not model.exists():
        subprocess.run(
            [str(VENV / "bin/python"), str(REPO / "bench/conformance/tiny_model.py"), str(model)],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
    seeded = WORK / "cache-seeded"
    shutil.rmtree(seeded, ignore_errors=True)
    runs = [run_start("stock", 0, wrapper, model, seeded)]  # the first start compiles into `seeded`: the seed
    print(json.dumps(runs[-1]), flush=True)
    image = WORK / "image"
    taken = snapshot(wrapper, model, seeded, image)
    print(json.dumps({"snapshot": taken}), flush=True)
    expected = taken["served"]["text"]
    for rep in range(1, args.repetitions + 1):
        empty = WORK / "cache-empty"
        shutil.rmtree(empty, ignore_errors=True)
        for result in (
            run_start("stock", rep, wrapper, model, empty),
            run_start("cache", rep, wrapper, model, seeded),
            run_restore(rep, image, model, Path(taken["log"]), expected),
        ):
            result.setdefault("greedyEqual", result["text"] == expected)
            runs.append(result)
            print(json.dumps(result), flush=True)
    measured = [run for run in runs if run["repetition"]]
    summary = {}
    for name in ("stock", "cache", "restore"):
        first = [run["firstCompletionSeconds"] for run in measured if run["profile"] == name]
        summary[name] = {"firstCompletionSeconds": first, "median": statistics.median(first)}
    summary["stockOverRestore"] = round(summary["stock"]["median"] / summary["restore"]["median"], 2)
    summary["cacheOverRestore"] = round(summary["cache"]["median"] / summary["restore"]["median"], 2)
    version = subprocess.run([criu_binary(), "--version"], capture_output=True, text=True)
    criu_version = version.stdout.split("\n")[0]
    host = {"cpus": os.cpu_count(), "kernel": platform.release(), "criu": criu_version, "vllm": VENV.name}
    result = {"host": host, "snapshot": taken, "summary": summary, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
