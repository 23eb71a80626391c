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

usage (repository root): python3 bench/snapshot/cpu.py OUT_JSON [--repetitions 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VENV", Path.home() / ".cache/stoker/vllm/0.26.0"))
WORK = Path(os.environ.get("WORK", "/tmp/stoker-snapshot"))
SHM = Path("/dev/shm")
PORT = 18123
PROMPT = {"prompt": "The operator renders one", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
READY_LIMIT_S = 600
# Right after a dump the dead tree's PIDs can stay taken for a moment ("Can't fork for PID: File exists").
RESTORE_ATTEMPTS = 20


@functools.cache
def criu() -> str:
    """The path of `hack/criu build`'s binary."""
    return subprocess.run(
        [REPO / "hack/criu", "bin"], check=True, capture_output=True, text=True
    ).stdout.strip()


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


def stop_group(pid: int) -> None:
    """TERM the server's process group, KILL it after 30 s, and wait until none of it is left."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pid):
                return
            time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and (entry / "stat").read_text().split()[2] != "Z":
                    return True
            except (OSError, IndexError):
                continue
    return False


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
    shutil.rmtree(image, ignore_errors=True)
    image.mkdir(parents=True)
    shm_before = set(os.listdir(SHM))
    log = WORK / "snapshotted.log"
    began = time.monotonic()
    server = start(wrapper, model, cache, log)
    first = served(began, model, server)
    dumped = time.monotonic()
    dump = subprocess.run(
        [
            criu(),
            "dump",
            "-t",
            str(server.pid),
            "-D",
            str(image),
            "--tcp-established",
            "--link-remap",
            "-o",
            "dump.log",
        ],
        capture_output=True,
        text=True,
    )
    dump_seconds = time.monotonic() - dumped
    if dump.returncode != 0:
        stop_group(server.pid)
        raise RuntimeError(f"criu dump failed: {(image / 'dump.log').read_text()[-2000:]}")
    server.wait()
    (image / "shm").mkdir()
    for name in set(os.listdir(SHM)) - shm_before:
        subprocess.run(
            ["cp", "-a", "--sparse=always", str(SHM / name), str(image / "shm" / name)], check=True
        )
    shutil.copy2(log, image / "log.at-dump")
    pages = sum(path.stat().st_size for path in image.glob("pages-*.img"))
    return {"served": first, "dumpSeconds": round(dump_seconds, 3), "imageBytes": pages, "log": str(log)}


def run_restore(rep: int, image: Path, model: Path, log: Path, expected: str) -> dict[str, object]:
    for entry in (image / "shm").iterdir():
        subprocess.run(["cp", "-a", "--sparse=always", str(entry), str(SHM / entry.name)], check=True)
    shutil.copy2(image / "log.at-dump", log)
    pidfile = image / "restored.pid"
    pidfile.unlink(missing_ok=True)
    drop_page_cache()
    began = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        restore = subprocess.run(
            [
                criu(),
                "restore",
                "-d",
                "-D",
                str(image),
                "--tcp-established",
                "--pidfile",
                str(pidfile),
                "-o",
                f"restore-r{rep}.log",
            ],
            capture_output=True,
            text=True,
        )
        if restore.returncode == 0 or attempts == RESTORE_ATTEMPTS:
            break
        time.sleep(0.5)
    if restore.returncode != 0:
        raise RuntimeError(f"criu restore failed: {(image / f'restore-r{rep}.log').read_text()[-2000:]}")
    restored = int(pidfile.read_text())
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
    criu_version = subprocess.run([criu(), "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    host = {"cpus": os.cpu_count(), "kernel": platform.release(), "criu": criu_version, "vllm": VENV.name}
    result = {"host": host, "snapshot": taken, "summary": summary, "runs": runs}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
