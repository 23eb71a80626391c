"""Run a command as a real process and record its output as `[seconds since start] line`, the recorder
format stoker's parser reads (and hack/kwoklogs.py restamps for kwok pods); talk to it over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

STOP_GRACE_SECONDS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RecordedProcess:
    """One process (in its own session, so stopping it stops its engine and workers too)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._recorder = threading.Thread(target=self._record, daemon=True)
        self._recorder.start()

    def _record(self) -> None:
        assert self.process.stdout is not None
        # newline="": progress bars' carriage returns stay in the line, as the parser expects them.
        with open(self.log_path, "w", encoding="utf-8", newline="") as log:
            for raw in self.process.stdout:
                seconds = time.monotonic() - self.started
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                log.write(f"[{seconds:9.3f}] {line}\n")
                log.flush()

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after `timeout` seconds."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._recorder.join(timeout=10)
        return code

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            if self.wait(STOP_GRACE_SECONDS) is None:
                os.killpg(self.process.pid, signal.SIGKILL)
        code = self.wait(STOP_GRACE_SECONDS)
        return -1 if code is None else code


def wait_healthy(process: RecordedProcess, port: int, timeout: float) -> bool:
    """Poll /health until it answers 200; False when the process exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def complete(port: int, model: str, timeout: float = 300) -> bool:
    """One greedy completion; True when the server answered it with a choice."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200 and bool(json.load(response).get("choices"))
    except OSError:
        return False
