"""Make a fake kwok pod "print" a recorded vLLM startup log, for the demo and the e2e tests.

kwok serves a container's log from the file a Logs object (named after the pod) points at, in the CRI
log format. Recordings carry `[seconds since process start]` prefixes (as in
tests/unit/data/phases/vllm-0.22.1-h100/); they are restamped from the container's own start, so every
startup phase the operator reads is exactly what the recording shows.

    python hack/kwoklogs.py NAMESPACE SELECTOR RECORDING WORKDIR    (kubectl on PATH, KUBECONFIG set)
    python hack/kwoklogs.py --follow RECORDINGS_DIR WORKDIR [NAMESPACE]

`--follow` runs until stopped (the demo runs it in the background): every started stoker seed, serving or
standby pod in any namespace (or NAMESPACE) prints RECORDINGS_DIR's seed.log or seeded-serving.log, so
every example applied to the demo cluster gets startup phases. It also does the one check of a kubelet's
that the demo needs and kwok lacks: a pod whose environment names a Secret that does not exist does not
run; its engine container waits with the kubelet's CreateContainerConfigError until the Secret exists (a
seed pod completes too soon for it).
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
SECRET_MISSING = "CreateContainerConfigError"  # the kubelet's waiting reason for a Secret it cannot read
# The recording each kind of stoker pod prints under --follow, by its app.kubernetes.io/component label.
FOLLOWED_RECORDINGS = {"seed": "seed.log", "server": "seeded-serving.log", "standby": "seeded-serving.log"}
COMPONENT_LABEL = "app.kubernetes.io/component"
FOLLOWED_PODS = f"app.kubernetes.io/managed-by=stoker,{COMPONENT_LABEL} in ({','.join(FOLLOWED_RECORDINGS)})"

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


def has_started(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or [{}]
    state = statuses[0].get("state") or {}
    return bool((state.get("running") or state.get("terminated") or {}).get("startedAt"))


def print_recording(
    kubectl: Kubectl, namespace: str, selector: str, recording: Path, workdir: Path, timeout: float = 120
) -> str:
    """Wait for a started pod that `selector` finds, then make kwok serve `recording` as its log."""
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json").stdout)
        pods = [p for p in found["items"] if has_started(p)]
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


def required_secrets(pod: dict[str, Any]) -> set[str]:
    """The Secrets a kubelet must read to start the pod's containers' environment."""
    names = set()
    for container in pod["spec"]["containers"]:
        refs = [(env.get("valueFrom") or {}).get("secretKeyRef") for env in container.get("env") or []]
        refs += [source.get("secretRef") for source in container.get("envFrom") or []]
        names |= {ref["name"] for ref in refs if ref and not ref.get("optional")}
    return names


def set_engine_state(kubectl: Kubectl, pod: dict[str, Any], state: dict[str, Any], ready: bool) -> None:
    """The pod's containers in `state` and its Ready conditions set to `ready`. The phase stays Running: at
    Pending, kwok would start the pod again."""
    meta = pod["metadata"]
    statuses = [
        {**status, "ready": ready, "started": ready, "state": state}
        for status in pod["status"]["containerStatuses"]
    ]
    conditions = [
        {**condition, "status": str(ready)}
        if condition["type"] in ("Ready", "ContainersReady")
        else condition
        for condition in pod["status"].get("conditions") or []
    ]
    patch = {"status": {"containerStatuses": statuses, "conditions": conditions}}
    kubectl("-n", meta["namespace"], "patch", "pod", meta["name"], "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))  # fmt: skip


def missing_secrets(kubectl: Kubectl, pod: dict[str, Any]) -> list[str]:
    existing = kubectl("-n", pod["metadata"]["namespace"], "get", "secrets", "-o", "name").stdout.split()
    return sorted(required_secrets(pod) - {name.removeprefix("secret/") for name in existing})


def waits_for_secret(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason") == SECRET_MISSING


def follow(
    kubectl: Kubectl, recordings: Path, workdir: Path, namespace: str | None = None, poll: float = 2
) -> None:
    """Until stopped: every stoker pod that starts, in any namespace, prints its component's recording,
    unless a Secret its environment needs is missing."""
    served: set[tuple[str, str, str]] = set()
    while True:
        try:
            where = ["-n", namespace] if namespace else ["-A"]
            found = json.loads(kubectl("get", "pods", *where, "-l", FOLLOWED_PODS, "-o", "json").stdout)
            # As a kubelet retries: a pod whose Secret now exists starts (and prints its recording below).
            for pod in filter(waits_for_secret, found["items"]):
                if not missing_secrets(kubectl, pod):
                    now = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
                    set_engine_state(kubectl, pod, {"running": {"startedAt": now}}, ready=True)
            for pod in filter(has_started, found["items"]):
                meta = pod["metadata"]
                started = started_at(pod)
                key = (meta["namespace"], meta["name"], started.isoformat())
                if key in served:
                    continue
                missing = missing_secrets(kubectl, pod)
                if missing and pod["status"].get("phase") == "Running":
                    waiting = {"reason": SECRET_MISSING, "message": f'secret "{missing[0]}" not found'}
                    set_engine_state(kubectl, pod, {"waiting": waiting}, ready=False)
                    served.add(key)
                    print(f"{meta['namespace']}/{meta['name']} waits for Secret {missing[0]}", flush=True)
                    continue
                recording = recordings / FOLLOWED_RECORDINGS[meta["labels"][COMPONENT_LABEL]]
                serve_log(kubectl, meta["namespace"], meta["name"], recording, started, workdir)
                served.add(key)
                print(f"{meta['namespace']}/{meta['name']} prints {recording.name}", flush=True)
        except subprocess.CalledProcessError as error:  # the API server restarting, a pod gone: try again
            print(f"kubectl failed, retrying: {error.stderr.strip()}", file=sys.stderr, flush=True)
        time.sleep(poll)


def _kubectl(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, check=True)


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--follow":
        follow(_kubectl, Path(sys.argv[2]), Path(sys.argv[3]), *sys.argv[4:])
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    namespace, selector, recording, workdir = sys.argv[1:]
    print(print_recording(_kubectl, namespace, selector, Path(recording), Path(workdir)))
