"""What every GPU benchmark mode of coldstart.py shares: the host's environment, a new pod's cold state
(`prepare`), starting a server and timing it to `/health` with its log timestamped (`run_server`), and the
probes run on a ready server (completion, decode rate, sleep and wake).

Every output line of a server is logged as `[seconds since start] line`, the format `stoker.phases` reads.
Standard library only, plus the Invocation of profiles.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiles import Invocation

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
# A pod's programs volume (render.pods): what `stoker programs` writes (coldstart.py, at its start), first on
# the servers' PYTHONPATH as in the pods, with stoker.inpod's wrappers and stoker.guard.
PROGRAMS = HOME / "stoker-programs"
SEED_EXIT_TIMEOUT_S = 600  # the seed wrapper's warm-up completion and shutdown
READY_LIMIT_S = 330
DECODE_TOKENS = 256


def host_env() -> dict[str, str]:
    """The image's environment: no stray vLLM/JIT settings, vLLM on the path, nothing fetched from a hub,
    and the pod's programs on PYTHONPATH before it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_", "TORCHINDUCTOR_"))}
    env.update(
        PATH=f"{HOME}/bin:" + env.get("PATH", "/usr/bin:/bin"),
        PYTHONPATH=f"{PROGRAMS}:{HOME}/site",
        HOME=str(HOME),
        PYTHONUNBUFFERED="1",
        # Air-gapped host: the hub is unreachable, for every profile alike.
        HF_HUB_OFFLINE="1",
        # The bundle leaves flashinfer out: vLLM's PyTorch sampler instead, for every profile alike.
        VLLM_USE_FLASHINFER_SAMPLER="0",
        # Multi-GPU hosts here are shared: NVLink multicast stays off (a no-op on one GPU), and with it
        # vLLM's symmetric-memory all-reduce, which needs multicast.
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        VLLM_ALLREDUCE_USE_SYMM_MEM="0",
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
    """Its seconds, and the greedy answer: text and token IDs (a synthetic checkpoint's text can be empty)."""
    body = {
        "model": model,
        "prompt": "def main():",
        "max_tokens": 16,
        "temperature": 0,
        "return_token_ids": True,
    }
    start = time.monotonic()
    with urllib.request.urlopen(completion_request(base, body), timeout=120) as response:
        answer = json.loads(response.read())
    choice = answer["choices"][0]
    return {
        "seconds": round(time.monotonic() - start, 3),
        "tokens": answer["usage"]["completion_tokens"],
        "text": choice["text"],
        "tokenIds": choice.get("token_ids"),
    }


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


def wait_ready(process: subprocess.Popen[str] | None, base: str, t0: float) -> float | None:
    """Seconds from `t0` to the first 200 from /health; None if `process` (None: a tree this driver did not
    start, such as a restored one) exits first or READY_LIMIT_S passes."""
    while time.monotonic() - t0 < READY_LIMIT_S and (process is None or process.poll() is None):
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


@dataclass
class Server:
    """A started `inv`, its log pumped line by line with each line's arrival time."""

    process: subprocess.Popen[str]
    base: str
    ready_seconds: float | None
    pumper: threading.Thread

    def stop(self) -> None:
        stop(self.process)
        self.pumper.join(5)


# Where the sampled starts' sitecustomize registers faulthandler on SIGUSR1.
STACKS_SITE = Path(__file__).resolve().parent / "stacks"
ENGINE_PID = re.compile(r"\(EngineCore pid=(\d+)\)")


class StackSampler:
    """Between two log lines (vLLM's own), sends SIGUSR1 to the engine process every `period` seconds, so
    that its threads' stacks land in the log: what a stretch no log line explains spends its time on."""

    def __init__(self, after: str, until: str, period: float = 0.5, longest: float = 40.0) -> None:
        self.after, self.until, self.period, self.longest = after, until, period, longest
        self.engine_pid: int | None = None
        self.done = threading.Event()

    def see(self, line: str) -> None:
        found = ENGINE_PID.search(line)
        if found and self.engine_pid is None:
            self.engine_pid = int(found.group(1))
        if self.after in line and self.engine_pid is not None:
            threading.Thread(target=self._sample, args=(self.engine_pid,), daemon=True).start()
        elif self.until in line:
            self.done.set()

    def _sample(self, pid: int) -> None:
        deadline = time.monotonic() + self.longest
        while not self.done.wait(self.period) and time.monotonic() < deadline:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                return


def start_server(log_path: Path, inv: Invocation) -> Server:
    """Start `inv` and wait for /health (ready_seconds None if it never answered)."""
    base = f"http://127.0.0.1:{inv.port}"
    log = log_path.open("w")
    env = {**host_env(), **inv.env}
    sampler = None
    if inv.stack_samples:
        env["PYTHONPATH"] = ":".join(filter(None, [str(STACKS_SITE), env.get("PYTHONPATH")]))
        sampler = StackSampler(after="Graph capturing finished", until="Kernel JIT monitor activated")
    t0 = time.monotonic()
    process = subprocess.Popen(
        inv.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        start_new_session=True,
        bufsize=1,
        cwd=HOME,
    )

    def pump() -> None:
        assert process.stdout is not None
        with log:
            for line in process.stdout:
                log.write(f"[{time.monotonic() - t0:9.3f}] {line}")
                log.flush()
                if sampler is not None:
                    sampler.see(line)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    return Server(process, base, wait_ready(process, base, t0), pumper)


def run_server(
    log_path: Path,
    inv: Invocation,
    while_ready: Callable[[str, dict[str, Any], subprocess.Popen[str]], None],
) -> dict[str, Any]:
    """Start `inv`, log each line with its arrival time, wait for /health, call
    `while_ready(base, result, process)` (skipped if the server never became ready), stop the server."""
    t0 = time.monotonic()
    server = start_server(log_path, inv)
    ready = server.ready_seconds
    result: dict[str, Any] = {"readySeconds": round(ready, 3) if ready is not None else None}
    if ready is not None:
        while_ready(server.base, result, server.process)
    server.stop()
    result["exitCode"] = server.process.returncode
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


def warm_node(checkpoint: str, listing: str) -> int:
    """What the node warmer keeps resident after `prepare` dropped it: one round of the agent
    (stoker.inpod.node_warmer) over the checkpoint's files and the seed's import-pages listing, with the
    whole of this host's memory as its budget. Returns the bytes resident after it. (Runs up to 2026-11-27
    read the same ranges with the read-ahead's reader directly.)"""
    from stoker.inpod.node_warmer import Warmer

    warmer = Warmer("bench/warm-node", listing, [checkpoint], budget=1 << 50, reserve=0, skipped=print)
    warmer.round()
    return warmer.resident


class Budget:
    """Which runs still end before the stop time, from the longest of each kind seen so far (plus a margin),
    or a first `estimates` of it."""

    def __init__(self, stop_after_s: float, estimates: dict[str, float]) -> None:
        self.start = time.monotonic()
        self.stop_after_s = stop_after_s
        self.longest: dict[str, float] = dict(estimates)

    def estimate(self, name: str, like: str | None = None) -> float:
        """The longest `name` seen, else the longest `like` seen (the same profile on another shape)."""
        return self.longest.get(name, self.longest.get(like or name, 90.0))

    def fits(self, seconds: float) -> bool:
        return time.monotonic() - self.start + seconds < self.stop_after_s

    def record(self, name: str, seconds: float) -> None:
        self.longest[name] = max(self.longest.get(name, 0.0), seconds + 10)


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
        # The disk the models and caches are on, and how its requests are queued (the read-ahead shares it).
        "disk": sh("sh", "-c", "df --output=source /models | tail -1; grep . /sys/block/*/queue/scheduler"),
    }
    (out / "host.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps(facts), flush=True)
