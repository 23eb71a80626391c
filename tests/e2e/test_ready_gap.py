"""The ready gap end to end: `status.startup.last.readyGapSeconds` is the time from the engine's
`Starting vLLM server on` line to the pod's Ready condition.

A simulated engine start on kwok: the serving pod is held back before its container starts (hack/kwok's
KWOK_SIMULATE_WAITING), then the test plays the kubelet. It starts the container, lets the pod "print" a
recorded vLLM start through kwok (hack/kwoklogs.py) and, a few seconds after the log's ready line, marks
the pod Ready as a probe would. kwok's own Ready timing is simulated, so the figure is checked against the
two timestamps read back from the API: the ready line's in the pod's log and the Ready condition's.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from hack.kwoklogs import serve_log

from stoker.phases import parse_log
from tests.e2e.helpers import get_json, wait_for

pytestmark = pytest.mark.e2e

RECORDED = Path(__file__).resolve().parents[1] / "unit" / "data" / "phases" / "vllm-0.22.1-h100"
RECORDING = RECORDED / "seeded-serving.log"
READY_LINE = "Starting vLLM server on"
KWOK_WAITING = "KWOK_SIMULATE_WAITING"  # hack/kwok/stages.yaml: the pod's containers wait with this reason
# How long the simulated engine process had run when the test marks the pod Ready.
RAN_SECONDS = 70


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def patch_status(kubectl, namespace: str, pod: str, status: dict) -> None:
    """What the kubelet would write (a strategic merge: conditions by type, containers by name)."""
    patch = json.dumps({"status": status})
    kubectl("-n", namespace, "patch", "pod", pod, "--subresource=status", "-p", patch)


def test_ready_gap_is_the_ready_line_to_the_ready_condition(namespace, kubectl, operator, tmp_path):
    svc = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "gap"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "runtime": {"env": [{"name": KWOK_WAITING, "value": "ContainerCreating"}]},
            "coldStart": {"seed": {"enabled": False}},
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(svc))
    selector = "app.kubernetes.io/instance=gap,app.kubernetes.io/component=server"

    def waiting_pod():
        pods = (get_json(kubectl, "-n", namespace, "pods", "-l", selector) or {}).get("items", [])
        waiting = [
            p
            for p in pods
            if any("waiting" in (s.get("state") or {}) for s in p["status"].get("containerStatuses") or [])
        ]
        return waiting[0]["metadata"]["name"] if waiting else None

    pod = wait_for(waiting_pod, what="a serving pod held before its start")

    # The container started RAN_SECONDS ago (as the kubelet would say), and its log is the recording's
    # start from then: its ready line is a few seconds in the past.
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    started = now - dt.timedelta(seconds=RAN_SECONDS)
    running = {
        "name": "vllm",
        "ready": False,
        "started": True,
        "restartCount": 0,
        "state": {"waiting": None, "running": {"startedAt": stamp(started)}},
    }
    status = {"phase": "Running", "containerStatuses": [running]}
    patch_status(kubectl, namespace, pod, status)
    serve_log(kubectl, namespace, pod, RECORDING, started, tmp_path)
    wait_for(
        lambda: READY_LINE in kubectl("-n", namespace, "logs", pod, "-c", "vllm", check=False).stdout,
        what="kwok serving the engine's log",
    )

    # The probe succeeds now: the pod turns Ready, which is what the operator's recorder waits for.
    ready = {"lastTransitionTime": stamp(now), "status": "True"}
    ready_conditions = [{"type": "Ready", **ready}, {"type": "ContainersReady", **ready}]
    running = {**running, "ready": True, "state": {"running": {"startedAt": stamp(started)}}}
    patch_status(kubectl, namespace, pod, {"conditions": ready_conditions, "containerStatuses": [running]})

    def last_start():
        obj = get_json(kubectl, "-n", namespace, "vllmservice", "gap") or {}
        last = ((obj.get("status") or {}).get("startup") or {}).get("last") or {}
        return obj["status"]["startup"] if last.get("pod") == pod else None

    startup = wait_for(last_start, what="the start in status")

    # The two timestamps as the API serves them: the log line's (kubelet clock) and the condition's.
    logged = kubectl("-n", namespace, "logs", pod, "-c", "vllm", "--timestamps").stdout
    (line,) = [line for line in logged.splitlines() if READY_LINE in line]
    ready_line_at = dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d*Z", r"\1+00:00", line.split(" ", 1)[0]))
    pod_obj = get_json(kubectl, "-n", namespace, "pod", pod) or {}
    condition = next(c for c in pod_obj["status"]["conditions"] if c["type"] == "Ready")
    became_ready = dt.datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
    gap = (became_ready - ready_line_at).total_seconds()
    assert 1 < gap < RAN_SECONDS  # the ready line came before the condition, as the test staged it

    last = startup["last"]
    assert last["readyGapSeconds"] == pytest.approx(gap, abs=0.02)  # both times are the API's own
    assert last["phases"]["podReady"] == pytest.approx(gap, abs=0.02)  # the probes' delay as a phase
    assert startup["history"][-1]["readyGapSeconds"] == last["readyGapSeconds"]
    # The engine's own start is untouched by the gap: process start to the ready line.
    with open(RECORDING, newline="") as recording:
        assert last["totalSeconds"] == pytest.approx(parse_log(recording).total_seconds, abs=0.01)

    metrics = operator.metrics()
    assert re.search(
        rf'stoker_startup_ready_gap_seconds_count\{{name="gap",namespace="{namespace}"\}} [1-9]', metrics
    )
    assert re.search(r'stoker_startup_phase_seconds_count\{phase="podReady",role="serve"\} [1-9]', metrics)
