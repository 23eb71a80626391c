"""Make a fake kwok pod "print" a recorded vLLM startup log, for the demo and the e2e tests.

kwok serves a container's log from the file a Logs object (named after the pod) points at, in the CRI
log format. Recordings carry `[seconds since process start]` prefixes (as in
tests/unit/data/phases/vllm-0.22.1-h100/); they are restamped from the container's own start, so every
startup phase the operator reads is exactly what the recording shows.

    python hack/kwoklogs.py NAMESPACE SELECTOR RECORDING WORKDIR    (kubectl on PATH, KUBECONFIG set)
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECONDS_PREFIX = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?")
ENGINE_CONTAINER = "vllm"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def cri_log(recording: Path, started: dt.datetime, target: Path) -> Path:
    """The recording's `[seconds] line` lines as CRI log lines stamped `started + seconds`."""
    lines = []
    for raw in recording.read_text().splitlines():
        match = SECONDS_PREFIX.match(raw)
        if match:
            stamp = started + dt.timedelta(seconds=float(match.group(1)))
            lines.append(f"{stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z stdout F {raw[match.end() :]}")
    target.write_text("\n".join(lines) + "\n")
    return target


def started_at(pod: dict[str, Any]) -> dt.datetime:
    state = pod["status"]["containerStatuses"][0]["state"]
    value = (state.get("running") or state.get("terminated"))["startedAt"]
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def print_recording(
    kubectl: Kubectl, namespace: str, selector: str, recording: Path, workdir: Path, timeout: float = 120
) -> str:
    """Wait for a started pod that `selector` finds, then make kwok serve `recording` as its log."""
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json").stdout)
        pods = [p for p in found["items"] if p["status"].get("containerStatuses")]
        if pods:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no started pod for {selector} in {namespace} within {timeout} s")
        time.sleep(0.5)
    pod = pods[0]
    name = str(pod["metadata"]["name"])
    serve_log(kubectl, namespace, name, recording, started_at(pod), workdir)
    return name


def serve_log(
    kubectl: Kubectl, namespace: str, pod: str, recording: Path, started: dt.datetime, workdir: Path
) -> None:
    """Make kwok serve `recording`, stamped from `started`, as the pod's engine log (replacing any other)."""
    log_file = cri_log(recording, started, workdir / f"{pod}-{started.timestamp():.0f}.log")
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": [{"containers": [ENGINE_CONTAINER], "logsFile": str(log_file.resolve())}]},
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(logs))


def _kubectl(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, check=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    namespace, selector, recording, workdir = sys.argv[1:]
    print(print_recording(_kubectl, namespace, selector, Path(recording), Path(workdir)))
