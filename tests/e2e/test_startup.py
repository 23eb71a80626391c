"""Startup phases end to end: fake pods "print" recorded vLLM logs through kwok, the operator reads them.

kwok serves a container's log from a file named by a Logs object (one pod, by name) or a ClusterLogs
object (every pod of a namespace). The files are recorded H100 logs rewritten into the CRI log format
with timestamps counted from the container's own start, so every phase is exactly what the recording
shows.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from stoker.phases import parse_log
from tests.e2e.helpers import condition, get_json, wait_for

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "data" / "phases" / "vllm-0.22.1-h100"
SECONDS_PREFIX = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?")
ENGINE_CONTAINER = "vllm"


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


def started_at(pod: dict) -> dt.datetime:
    state = pod["status"]["containerStatuses"][0]["state"]
    value = (state.get("running") or state.get("terminated"))["startedAt"]
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def print_recording(kubectl, namespace: str, selector: str, recording: Path, tmp_path: Path) -> str:
    """Wait for the pod the selector finds, then make kwok serve the recording as its log."""

    def started_pod():
        pods = get_json(kubectl, "-n", namespace, "pods", "-l", selector)["items"]
        return pods[0] if pods and pods[0]["status"].get("containerStatuses") else None

    pod = wait_for(started_pod, what=f"a pod for {selector}")
    name = pod["metadata"]["name"]
    log_file = cri_log(recording, started_at(pod), tmp_path / f"{name}.log")
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"logs": [{"containers": [ENGINE_CONTAINER], "logsFile": str(log_file)}]},
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(logs))
    return str(name)


@pytest.mark.parametrize(
    ("recording", "cache", "degraded"),
    [("seeded-serving.log", "hit", "AsExpected"), ("streamer-cold-cache.log", "miss", "CompileCacheMiss")],
)
def test_recorded_startups_reach_status_events_and_metrics(
    recording, cache, degraded, namespace, kubectl, operator, tmp_path
):
    svc = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "timed"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(svc))
    instance = "app.kubernetes.io/instance=timed"
    seed_pod = print_recording(
        kubectl, namespace, f"{instance},app.kubernetes.io/component=seed", FIXTURES / "seed.log", tmp_path
    )
    pod_name = print_recording(
        kubectl, namespace, f"{instance},app.kubernetes.io/component=server", FIXTURES / recording, tmp_path
    )

    def recorded():
        status = (get_json(kubectl, "-n", namespace, "vllmservice", "timed") or {}).get("status") or {}
        startup = status.get("startup") or {}
        done = (startup.get("last") or {}).get("pod") == pod_name and (startup.get("seed") or {}).get("pod")
        return status if done else None

    status = wait_for(recorded, what="startup phases in status")
    with open(FIXTURES / recording, newline="") as recorded_log:  # keep progress bars' carriage returns
        expected = parse_log(recorded_log)
    last = status["startup"]["last"]
    assert last["compileCache"] == cache == expected.compile_cache
    assert last["totalSeconds"] == pytest.approx(expected.total_seconds, abs=0.01)
    for phase, seconds in expected.phases.items():
        assert last["phases"][phase] == pytest.approx(seconds, abs=0.01), phase
    assert {"scheduling", "containerStart"} <= set(last["phases"])
    assert status["startup"]["seed"]["pod"] == seed_pod
    assert status["startup"]["seed"]["compileCache"] == "miss"
    assert status["startup"]["recent"]["samples"] == 1
    assert status["cache"]["lastHit"] is (cache == "hit")
    table = kubectl("-n", namespace, "get", "vsvc", "timed").stdout  # the Startup(s) printer column
    assert f"{expected.total_seconds:.2f}".rstrip("0").rstrip(".") in table, table

    def degraded_reason():
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "timed")
        return condition(svc, "Degraded").get("reason") == degraded

    wait_for(degraded_reason, what=f"Degraded reason {degraded}")
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.name=timed")
    messages = [e["message"] for e in events["items"] if e["reason"] == "Started"]
    assert any(f"Started in {expected.total_seconds:.1f} s" in m and f"cache {cache}" in m for m in messages)

    metrics = operator.metrics()
    assert re.search(r'stoker_startup_phase_seconds_count\{phase="weightLoad",role="serve"\} [1-9]', metrics)
    assert re.search(rf'stoker_compile_cache_total\{{result="{cache}",role="serve"\}} [1-9]', metrics)
    assert re.search(r'stoker_startup_total_seconds_count\{role="seed"\} [1-9]', metrics)
