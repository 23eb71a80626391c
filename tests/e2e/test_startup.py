"""Startup phases end to end: fake pods "print" recorded H100 vLLM logs through kwok (hack/kwoklogs.py),
the operator reads them into status, Events and metrics."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from hack.kwoklogs import print_recording, serve_log

from stoker.phases import parse_log
from tests.e2e.helpers import RECORDED, apply, condition, get_json, wait_for

pytestmark = pytest.mark.e2e


def apply_llama(kubectl, namespace: str, name: str) -> None:
    svc = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
    }
    apply(kubectl, namespace, svc)


@pytest.mark.parametrize(
    ("recording", "cache", "degraded"),
    [("seeded-serving.log", "hit", "AsExpected"), ("streamer-cold-cache.log", "miss", "CompileCacheMiss")],
)
def test_recorded_startups_reach_status_events_and_metrics(
    recording, cache, degraded, namespace, kubectl, operator, tmp_path
):
    apply_llama(kubectl, namespace, "timed")
    instance = "app.kubernetes.io/instance=timed"
    seed_pod = print_recording(
        kubectl, namespace, f"{instance},app.kubernetes.io/component=seed", RECORDED / "seed.log", tmp_path
    )
    pod_name = print_recording(
        kubectl, namespace, f"{instance},app.kubernetes.io/component=server", RECORDED / recording, tmp_path
    )

    def recorded():
        status = (get_json(kubectl, "-n", namespace, "vllmservice", "timed") or {}).get("status") or {}
        startup = status.get("startup") or {}
        done = (startup.get("last") or {}).get("pod") == pod_name and (startup.get("seed") or {}).get("pod")
        # The reconcile follows the recorder's write with what it reads from it.
        return status if done and "lastHit" in (status.get("cache") or {}) else None

    status = wait_for(recorded, what="startup phases in status")
    with open(RECORDED / recording, newline="") as recorded_log:  # keep progress bars' carriage returns
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
    service = f'name="timed",namespace="{namespace}"'
    assert re.search(
        rf'stoker_compile_cache_total\{{{service},result="{cache}",role="serve"\}} [1-9]', metrics
    )
    assert re.search(rf'stoker_startup_total_seconds_count\{{{service},role="seed"\}} [1-9]', metrics)


def test_a_restarted_container_is_parsed_again_from_its_new_start(namespace, kubectl, operator, tmp_path):
    svc = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "restarts"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "coldStart": {"seed": {"enabled": False}},
        },
    }
    apply(kubectl, namespace, svc)
    selector = "app.kubernetes.io/instance=restarts,app.kubernetes.io/component=server"
    pod = print_recording(kubectl, namespace, selector, RECORDED / "seeded-serving.log", tmp_path)

    def samples(count: int):
        status = (get_json(kubectl, "-n", namespace, "vllmservice", "restarts") or {}).get("status") or {}
        startup = status.get("startup") or {}
        return startup if (startup.get("recent") or {}).get("samples") == count else None

    wait_for(lambda: samples(1), what="the first start parsed")
    # The container restarts (kwok has no runtime to do it): a new start time, restartCount 1, a new log.
    restarted = dt.datetime.now(dt.UTC).replace(microsecond=0)
    running = {"running": {"startedAt": restarted.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    status = {"containerStatuses": [{"name": "vllm", "restartCount": 1, "state": running}]}
    serve_log(kubectl, namespace, pod, RECORDED / "baseline.log", restarted, tmp_path)
    kubectl(
        "-n", namespace, "patch", "pod", pod, "--subresource=status", "-p", json.dumps({"status": status})
    )

    startup = wait_for(lambda: samples(2), what="the restarted container parsed")
    with open(RECORDED / "baseline.log", newline="") as recorded_log:
        expected = parse_log(recorded_log)
    assert [s["restarts"] for s in startup["history"]] == [0, 1]
    assert startup["last"]["pod"] == pod and startup["last"]["compileCache"] == "miss"
    assert startup["last"]["totalSeconds"] == pytest.approx(expected.total_seconds, abs=0.01)
    assert startup["last"]["phases"]["bootstrap"] == pytest.approx(expected.phases["bootstrap"], abs=0.01)


def test_after_an_edit_status_no_longer_shows_the_replaced_pod(namespace, kubectl, operator, tmp_path):
    apply_llama(kubectl, namespace, "edited")
    server = "app.kubernetes.io/instance=edited,app.kubernetes.io/component=server"
    old_pod = print_recording(kubectl, namespace, server, RECORDED / "seeded-serving.log", tmp_path)

    def last_pod():
        status = (get_json(kubectl, "-n", namespace, "vllmservice", "edited") or {}).get("status") or {}
        return ((status.get("startup") or {}).get("last") or {}).get("pod")

    wait_for(lambda: last_pod() == old_pod, what="the first pod's start in status")
    # A change outside the cache key: a new ReplicaSet, no new seed.
    patch = {"spec": {"runtime": {"env": [{"name": "APP_MODE", "value": "edited"}]}}}
    kubectl("-n", namespace, "patch", "vsvc", "edited", "--type=merge", "-p", json.dumps(patch))
    wait_for(
        lambda: get_json(kubectl, "-n", namespace, "pod", old_pod) is None, timeout=180, what="old pod gone"
    )

    def current():
        obj = get_json(kubectl, "-n", namespace, "vllmservice", "edited") or {}
        status = obj.get("status") or {}
        last = (status.get("startup") or {}).get("last")
        fresh = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if fresh and (last is None or last["pod"] != old_pod) else None

    obj = wait_for(current, what="status without the replaced pod as last")
    status = obj["status"]
    last = status["startup"].get("last")
    if last is not None:  # the new pod's own start, if already parsed
        assert get_json(kubectl, "-n", namespace, "pod", last["pod"]) is not None
        assert last["podTemplateHash"] != old_pod.split("-")[-2]
    assert old_pod in [sample["pod"] for sample in status["startup"]["history"]]  # history is kept
    for kind in ("Ready", "CacheSeeded", "Progressing", "Degraded"):
        assert condition(obj, kind).get("message"), kind
