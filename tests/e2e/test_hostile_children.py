"""Hostile cluster state around a VLLMService's children, on the real control plane.

Objects a user already had are neither changed nor deleted (their resourceVersion does not move) and the
VLLMService names them; children that cannot be created or started say why in Degraded; every accepted
object can be deleted, with the operator running or stopped; drift correction removes what stoker did not
render and never shrinks a volume.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from stoker.api import VLLMService
from stoker.render import short_cache_key
from tests.e2e.fleet import Fleet, standby_service
from tests.e2e.helpers import (
    apply,
    apply_namespace_policy,
    condition,
    delete_policy,
    get_json,
    qwen,
    wait_condition,
    wait_for,
    wait_ready,
)
from tests.fakevllm import FakeEngine

pytestmark = pytest.mark.e2e

KWOK_WAITING = "KWOK_SIMULATE_WAITING"  # hack/kwok/stages.yaml: the pod's containers wait with this reason


def create(kubectl: Any, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))
    kind = manifest["kind"].lower()
    found = get_json(kubectl, "-n", namespace, kind, manifest["metadata"]["name"])
    assert found is not None
    return found


def wait_degraded(
    kubectl: Any, namespace: str, name: str, reason: str, timeout: float = 90
) -> dict[str, Any]:
    return wait_condition(kubectl, namespace, name, "Degraded", "True", reason, timeout)


def warnings(kubectl: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = get_json(kubectl, "-n", namespace, "events", "--field-selector", f"involvedObject.name={name}")
    return [e for e in (found or {}).get("items", []) if e["reason"] == reason and e["type"] == "Warning"]


def delete_and_wait_gone(kubectl: Any, namespace: str, name: str, timeout: int = 60) -> None:
    kubectl("-n", namespace, "delete", "vllmservice", name, f"--timeout={timeout}s", timeout=timeout + 10)
    assert get_json(kubectl, "-n", namespace, "vllmservice", name) is None


# ------------------------------------------------------------------ objects in the way


def user_pvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"team": "research"}, "annotations": {"data": "irreplaceable"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def user_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"team": "research"}},
        "spec": {
            "type": "NodePort",
            "selector": {"app": "mine"},
            "ports": [{"port": 80, "targetPort": 8080}],
        },
    }


def user_secret(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"team": "research"}},
        "stringData": {"password": "hunter2"},
    }


def user_deployment(name: str) -> dict[str, Any]:
    labels = {"app": "mine"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
            },
        },
    }


def user_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"team": "research"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "batch", "image": "registry.example/batch:1"}],
                }
            }
        },
    }


def seed_name(manifest: dict[str, Any], namespace: str) -> str:
    svc = VLLMService.model_validate(
        dict(manifest, metadata={**manifest["metadata"], "namespace": namespace})
    )
    return f"{manifest['metadata']['name']}-seed-{short_cache_key(svc)}"


def with_model_cache(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["coldStart"]["modelCache"] = {"enabled": True, "size": "2Gi"}
    return manifest


def with_standby(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["coldStart"]["standby"] = {"replicas": 1}
    return manifest


# case -> (the user's object for a VLLMService named n, the VLLMService)
IN_THE_WAY = {
    "cache-pvc": (lambda n, ns: user_pvc(f"{n}-cache"), lambda n: qwen(n)),
    "model-pvc": (lambda n, ns: user_pvc(f"{n}-model"), lambda n: with_model_cache(qwen(n))),
    "control-secret": (lambda n, ns: user_secret(f"{n}-control"), lambda n: with_standby(qwen(n))),
    "nodeport-service": (lambda n, ns: user_service(n), lambda n: qwen(n)),
    "deployment": (lambda n, ns: user_deployment(n), lambda n: qwen(n)),
    "seed-job": (
        lambda n, ns: user_job(seed_name(qwen(n, seed=True), ns)),
        lambda n: qwen(n, seed=True),
    ),
}


def unchanged(kubectl: Any, namespace: str, before: dict[str, Any]) -> bool:
    """The same object (uid), with the same metadata and contents, never written by stoker. Only its
    status moves (a Job's controller updates it; resourceVersion moves with it)."""
    now = get_json(kubectl, "-n", namespace, before["kind"].lower(), before["metadata"]["name"])
    if now is None:
        return False
    keys = ("uid", "labels", "annotations", "ownerReferences", "finalizers")
    same_meta = all(now["metadata"].get(key) == before["metadata"].get(key) for key in keys)
    same_contents = all(now.get(key) == before.get(key) for key in ("spec", "data", "type"))
    writers = {entry.get("manager") for entry in now["metadata"].get("managedFields") or []}
    return same_meta and same_contents and "stoker" not in writers


@pytest.mark.parametrize("case", IN_THE_WAY)
def test_an_object_in_the_way_is_never_taken_and_outlives_the_vllmservice(case, namespace, kubectl, operator):
    user_object, manifest = IN_THE_WAY[case]
    name = f"taken-{case}"[:40]
    mine = create(kubectl, namespace, user_object(name, namespace))
    kind = mine["kind"]
    apply(kubectl, namespace, manifest(name))

    svc = wait_degraded(kubectl, namespace, name, "ChildConflict")
    message = condition(svc, "Degraded")["message"]
    assert (
        f"{kind} {namespace}/{mine['metadata']['name']} exists and is not owned by this VLLMService"
        in message
    )
    assert (
        condition(svc, "Ready")["status"] == "False" and condition(svc, "Ready")["reason"] == "ChildConflict"
    )
    time.sleep(6)  # a drift resync (5 s) and its retries change nothing and post no second Event
    assert unchanged(kubectl, namespace, mine)
    assert len(warnings(kubectl, namespace, name, "ChildConflict")) == 1
    if kind != "Deployment":  # the rest waits: no serving pods without their volume
        assert get_json(kubectl, "-n", namespace, "deployment", name) is None

    delete_and_wait_gone(kubectl, namespace, name)
    time.sleep(2)  # the garbage collector had its chance
    assert unchanged(kubectl, namespace, mine)


def test_an_object_owned_by_something_else_is_not_taken(namespace, kubectl, operator):
    owner = create(
        kubectl, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    )
    claim = user_pvc("elsewhere-cache")
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    mine = create(kubectl, namespace, claim)
    apply(kubectl, namespace, qwen("elsewhere"))
    wait_degraded(kubectl, namespace, "elsewhere", "ChildConflict")
    assert unchanged(kubectl, namespace, mine)


def test_a_child_of_another_vllmservice_is_not_taken(namespace, kubectl, operator):
    # The first object's PVC, moved under a second object of the same name: a different uid. (With
    # retentionPolicy Retain it would have no owner and be taken back: tests/e2e/test_cache_retention.py.)
    twin = qwen("twin")
    twin["spec"]["coldStart"]["compileCache"] = {"retentionPolicy": "Delete"}
    apply(kubectl, namespace, twin)
    first = wait_ready(kubectl, namespace, "twin")
    hold = {"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "test.stoker.dev/hold"]}}
    kubectl("-n", namespace, "patch", "pvc", "twin-cache", "--type=merge", "-p", json.dumps(hold))
    kubectl("-n", namespace, "delete", "vllmservice", "twin", "--wait=false")
    wait_for(lambda: get_json(kubectl, "-n", namespace, "vllmservice", "twin") is None, what="twin deleted")
    apply(kubectl, namespace, twin)
    # The old PVC is still there (held by the finalizer, owned by the first object's uid).
    svc = wait_degraded(kubectl, namespace, "twin", "ChildConflict")
    assert svc["metadata"]["uid"] != first["metadata"]["uid"]
    kubectl(
        "-n",
        namespace,
        "patch",
        "pvc",
        "twin-cache",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )
    wait_ready(kubectl, namespace, "twin", timeout=60)


def test_the_vllmservice_converges_once_the_user_removes_the_object(namespace, kubectl, operator):
    create(kubectl, namespace, user_service("later"))
    apply(kubectl, namespace, qwen("later"))
    wait_degraded(kubectl, namespace, "later", "ChildConflict")
    kubectl("-n", namespace, "delete", "service", "later")
    svc = wait_ready(kubectl, namespace, "later", timeout=60)  # within a drift interval
    assert condition(svc, "Degraded")["status"] == "False"
    assert get_json(kubectl, "-n", namespace, "service", "later")["spec"]["type"] == "ClusterIP"


# ------------------------------------------------------------------ children that cannot start


def test_a_missing_storage_class_is_named(namespace, kubectl, operator):
    manifest = qwen("noclass")
    manifest["spec"]["coldStart"]["compileCache"] = {"storageClassName": "does-not-exist"}
    apply(kubectl, namespace, manifest)
    svc = wait_degraded(kubectl, namespace, "noclass", "VolumeProvisioningFailed")
    message = condition(svc, "Degraded")["message"]
    assert f"PersistentVolumeClaim {namespace}/noclass-cache" in message and "does-not-exist" in message
    assert warnings(kubectl, namespace, "noclass", "VolumeProvisioningFailed")


@pytest.mark.parametrize("seed", [False, True], ids=["deployment", "seed-job"])
def test_a_gpu_quota_is_named(seed, namespace, kubectl, operator):
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
    }
    create(kubectl, namespace, quota)
    apply(kubectl, namespace, qwen("quota", seed=seed))
    svc = wait_degraded(kubectl, namespace, "quota", "PodCreationFailed")
    message = condition(svc, "Degraded")["message"]
    owner = f"Job {namespace}/quota-seed-" if seed else f"Deployment {namespace}/quota"
    assert owner in message and "exceeded quota" in message
    assert warnings(kubectl, namespace, "quota", "PodCreationFailed")


def test_a_limit_range_is_named(namespace, kubectl, operator):
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "small"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gi"}}]},
    }
    create(kubectl, namespace, limits)
    apply(kubectl, namespace, qwen("limited", resources={"memory": "4Gi"}))
    svc = wait_degraded(kubectl, namespace, "limited", "PodCreationFailed")
    assert "maximum memory usage per Container is 1Gi" in condition(svc, "Degraded")["message"]


def test_a_restricted_namespace_either_admits_the_pods_or_is_named(namespace, kubectl, operator):
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    apply(kubectl, namespace, qwen("restricted", seed=True))

    def outcome() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "restricted")
        degraded = condition(svc, "Degraded")
        if degraded.get("reason") == "PodCreationFailed" or condition(svc, "Ready").get("status") == "True":
            return svc
        return None

    svc = wait_for(outcome, 90, what="Ready, or the refusal named")
    if condition(svc, "Ready").get("status") != "True":
        assert "violates PodSecurity" in condition(svc, "Degraded")["message"]


WAITING = {
    # reason -> what in the spec makes a kubelet report it
    # Tags that name no vLLM version: the engine version is given, else the spec is invalid before any pod.
    "InvalidImageName": {"image": "registry.example/vllm:a tag with spaces", "engineVersion": "0.26.0"},
    "ImagePullBackOff": {"image": "registry.example/does-not-exist:1", "engineVersion": "0.26.0"},
    "CreateContainerConfigError": {
        "env": [{"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "k"}}}]
    },
}


@pytest.mark.parametrize("reason", WAITING)
def test_a_container_that_cannot_start_is_named(reason, namespace, kubectl, operator):
    runtime = copy.deepcopy(WAITING[reason])
    # kwok runs no kubelet checks: the stage reports the reason a kubelet would for this spec.
    runtime["env"] = [*runtime.get("env", []), {"name": KWOK_WAITING, "value": reason}]
    apply(kubectl, namespace, qwen("stuck", **runtime))
    svc = wait_degraded(kubectl, namespace, "stuck", reason)
    message = condition(svc, "Degraded")["message"]
    assert message.startswith(f"Pod {namespace}/stuck-") and "container vllm" in message
    assert condition(svc, "Ready")["status"] == "False"
    assert (condition(svc, "Progressing")["status"], condition(svc, "Progressing")["reason"]) == (
        "False",
        reason,
    )
    assert len(warnings(kubectl, namespace, "stuck", reason)) == 1


def test_an_apply_the_api_server_refuses_is_reported_and_retried_with_backoff(namespace, kubectl, operator):
    bad = {"name": "POD_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "spec.noSuchField"}}}
    apply(kubectl, namespace, qwen("refused", env=[bad]))
    svc = wait_degraded(kubectl, namespace, "refused", "ApplyFailed")
    message = condition(svc, "Degraded")["message"]
    assert f"Deployment {namespace}/refused" in message and "noSuchField" in message
    time.sleep(8)
    failures = [line for line in operator.log().splitlines() if f"key={namespace}/refused" in line]
    assert 1 <= len(failures) <= 5, failures  # backoff: 1, 2, 5 s apart, not a busy loop
    assert not any("Traceback" in line for line in operator.log().splitlines()[-200:])
    assert len(warnings(kubectl, namespace, "refused", "ApplyFailed")) == 1
    # Fixing the spec converges.
    apply(kubectl, namespace, qwen("refused"))
    wait_ready(kubectl, namespace, "refused", timeout=90)


def refuse_status_of_labelled_services(kubectl: Any, namespace: str) -> str:
    """A ValidatingAdmissionPolicy that refuses every status write changing status.cache of a VLLMService
    labelled refuse-status in `namespace`, as a policy or an older CRD's schema would; returns its name."""
    name = f"refuse-status-{namespace}"
    apply_namespace_policy(
        kubectl,
        name,
        namespace,
        {
            "apiGroups": ["stoker.dev"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["vllmservices/status"],
        },
        {
            "expression": "!('refuse-status' in object.metadata.?labels.orValue({}))"
            " || object.?status.?cache == oldObject.?status.?cache",
            "message": "status.cache is not accepted here",
        },
    )
    return name


def test_a_status_the_api_server_refuses_is_a_condition_and_backs_off(namespace, kubectl, operator):
    policy = refuse_status_of_labelled_services(kubectl, namespace)
    try:
        manifest = qwen("mute")
        manifest["metadata"]["labels"] = {"refuse-status": "yes"}
        time.sleep(3)  # the API server loads a new policy within a second or so
        apply(kubectl, namespace, manifest)
        svc = wait_degraded(kubectl, namespace, "mute", "StatusRefused")
        message = condition(svc, "Degraded")["message"]
        assert "status.cache is not accepted here" in message, message
        assert len(warnings(kubectl, namespace, "mute", "StatusRefused")) == 1
        time.sleep(8)
        failures = [line for line in operator.log().splitlines() if f"key={namespace}/mute" in line]
        assert 1 <= len(failures) <= 5, failures  # backoff, not a busy loop
        kubectl("-n", namespace, "label", "vllmservice", "mute", "refuse-status-")
        wait_ready(kubectl, namespace, "mute", timeout=90)
    finally:
        delete_policy(kubectl, policy)


# ------------------------------------------------------------------ any accepted object renders and deletes


def test_an_emoji_served_name_renders(namespace, kubectl, operator):
    manifest = qwen("emoji")
    manifest["spec"]["model"]["servedModelName"] = "llama-🦙-ünïcode"
    apply(kubectl, namespace, manifest)
    wait_ready(kubectl, namespace, "emoji")
    deployment = get_json(kubectl, "-n", namespace, "deployment", "emoji")
    assert "llama-🦙-ünïcode" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    # An edit goes through server-side apply of the existing Deployment (its body is YAML to the server).
    patch = {"spec": {"model": {"servedModelName": "llama-🐪-2"}}}
    kubectl("-n", namespace, "patch", "vllmservice", "emoji", "--type=merge", "-p", json.dumps(patch))

    def renamed() -> bool:
        found = get_json(kubectl, "-n", namespace, "deployment", "emoji")
        return "llama-🐪-2" in found["spec"]["template"]["spec"]["containers"][0]["args"]

    wait_for(renamed, 30, what="the new served name applied")
    assert condition(wait_ready(kubectl, namespace, "emoji"), "Degraded")["status"] == "False"


def test_a_huge_valid_spec_converges_carries_no_operator_state_and_deletes(namespace, kubectl, operator):
    env = [{"name": f"HUGE_{i}", "value": "x" * 30000} for i in range(12)]  # beyond 256 KiB of annotations
    # create, not apply: kubectl's own last-applied annotation would not fit either.
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(qwen("huge", env=env)))
    svc = wait_ready(kubectl, namespace, "huge")
    assert not svc["metadata"].get("finalizers")
    assert not any(key.startswith("stoker.dev/") for key in svc["metadata"].get("annotations") or {})
    delete_and_wait_gone(kubectl, namespace, "huge")


def test_deletion_completes_with_the_operator_stopped(namespace, kubectl, operator):
    apply(kubectl, namespace, qwen("orphaned"))
    wait_ready(kubectl, namespace, "orphaned")
    operator.stop()
    try:
        delete_and_wait_gone(kubectl, namespace, "orphaned", timeout=20)
    finally:
        operator.start()
    wait_for(
        lambda: get_json(kubectl, "-n", namespace, "deployment", "orphaned") is None,
        60,
        what="children garbage-collected",
    )


def test_the_finalizer_and_annotations_of_an_earlier_version_are_removed(namespace, kubectl, operator):
    manifest = qwen("legacy")
    manifest["metadata"]["finalizers"] = ["stoker.dev/finalizer"]
    manifest["metadata"]["annotations"] = {"stoker.dev/last-handled-configuration": "{}", "keep": "me"}
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))

    def cleaned() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "legacy")
        meta = (svc or {}).get("metadata", {})
        annotations = meta.get("annotations") or {}
        return (
            svc
            if not meta.get("finalizers") and "stoker.dev/last-handled-configuration" not in annotations
            else None
        )

    svc = wait_for(cleaned, 60, what="the old finalizer and annotation removed")
    assert svc["metadata"]["annotations"] == {"keep": "me"}
    delete_and_wait_gone(kubectl, namespace, "legacy")


@pytest.fixture
def own_namespace(kubectl: Any) -> Iterator[str]:
    name = f"t-ns-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    wait_for(lambda: kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0, 30)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_namespace_deletion_completes(own_namespace, kubectl, operator):
    apply(kubectl, own_namespace, qwen("doomed", seed=True))
    wait_ready(kubectl, own_namespace, "doomed")
    kubectl("delete", "namespace", own_namespace, "--timeout=90s", timeout=100)
    assert get_json(kubectl, "namespace", own_namespace) is None


# ------------------------------------------------------------------ drift


def test_a_hand_added_sidecar_env_and_volume_are_removed(namespace, kubectl, operator):
    apply(kubectl, namespace, qwen("drifty"))
    wait_ready(kubectl, namespace, "drifty")
    base = "/spec/template/spec"
    patch = [
        {
            "op": "add",
            "path": f"{base}/containers/-",
            "value": {"name": "sidecar", "image": "registry.example/s:1"},
        },
        {"op": "add", "path": f"{base}/containers/0/env/-", "value": {"name": "HAND_ADDED", "value": "1"}},
        {"op": "add", "path": f"{base}/volumes/-", "value": {"name": "scratch", "emptyDir": {}}},
    ]
    kubectl("-n", namespace, "patch", "deployment", "drifty", "--type=json", "-p", json.dumps(patch))

    def restored() -> dict[str, Any] | None:
        pod = get_json(kubectl, "-n", namespace, "deployment", "drifty")["spec"]["template"]["spec"]
        names = [c["name"] for c in pod["containers"]]
        env = [e["name"] for e in pod["containers"][0].get("env", [])]
        volumes = [v["name"] for v in pod.get("volumes", [])]
        return pod if names == ["vllm"] and "HAND_ADDED" not in env and "scratch" not in volumes else None

    wait_for(restored, 20, what="the hand-added items removed within the drift interval")
    wait_ready(kubectl, namespace, "drifty")


def test_hand_edits_of_the_service_are_undone_within_a_drift_period(namespace, kubectl, operator):
    """The Service is compared whole, like the pod template: a selector key added by hand (which would
    select no pod), stoker's port changed (it keeps the name `http` of the port stoker puts back), an added
    port and a changed session affinity are undone; its cluster IP, allocated by the API server, stays."""
    apply(kubectl, namespace, qwen("edited"))
    wait_ready(kubectl, namespace, "edited")
    before = get_json(kubectl, "-n", namespace, "service", "edited")
    patch = [
        {"op": "add", "path": "/spec/selector/hand-added", "value": "nothing-has-this"},
        {"op": "replace", "path": "/spec/ports/0/port", "value": 9000},
        {"op": "add", "path": "/spec/ports/-", "value": {"name": "extra", "port": 7777, "targetPort": 7777}},
        {"op": "replace", "path": "/spec/sessionAffinity", "value": "ClientIP"},
    ]
    kubectl("-n", namespace, "patch", "service", "edited", "--type=json", "-p", json.dumps(patch))

    def restored() -> dict[str, Any] | None:
        spec = get_json(kubectl, "-n", namespace, "service", "edited")["spec"]
        as_rendered = (
            spec["selector"] == before["spec"]["selector"]
            and [p["port"] for p in spec["ports"]] == [p["port"] for p in before["spec"]["ports"]]
            and spec.get("sessionAffinity", "None") == "None"
        )
        return spec if as_rendered else None

    spec = wait_for(restored, 6, what="the hand edits undone within one drift period (5 s)")
    assert spec["clusterIP"] == before["spec"]["clusterIP"]
    svc = wait_ready(kubectl, namespace, "edited")
    assert condition(svc, "Degraded")["status"] == "False", condition(svc, "Degraded")


def test_hand_edits_of_the_deployment_spec_are_undone(namespace, kubectl, operator):
    """Not only the pod template: a paused rollout or a changed strategy is undone too."""
    apply(kubectl, namespace, qwen("paused"))
    wait_ready(kubectl, namespace, "paused")
    kubectl("-n", namespace, "rollout", "pause", "deployment/paused")
    kubectl("-n", namespace, "patch", "deployment", "paused", "--type=merge", "-p",
            '{"spec":{"minReadySeconds":600}}')  # fmt: skip

    def restored() -> dict[str, Any] | None:
        spec = get_json(kubectl, "-n", namespace, "deployment", "paused")["spec"]
        return spec if not spec.get("paused") and not spec.get("minReadySeconds") else None

    wait_for(restored, 6, what="the paused rollout and minReadySeconds undone within one drift period")
    wait_ready(kubectl, namespace, "paused")


def test_a_hand_expanded_cache_volume_is_kept_and_not_degraded(namespace, kubectl, operator):
    apply(kubectl, namespace, qwen("grown"))
    wait_ready(kubectl, namespace, "grown")
    kubectl("-n", namespace, "patch", "pvc", "grown-cache", "--type=merge", "-p",
            '{"spec":{"resources":{"requests":{"storage":"64Gi"}}}}')  # fmt: skip
    time.sleep(12)  # two drift resyncs
    svc = get_json(kubectl, "-n", namespace, "vllmservice", "grown")
    assert condition(svc, "Degraded")["status"] == "False", condition(svc, "Degraded")
    claim = get_json(kubectl, "-n", namespace, "pvc", "grown-cache")
    assert claim["spec"]["resources"]["requests"]["storage"] == "64Gi"


# ------------------------------------------------------------------ standby


class SleeplessFleet(Fleet):
    """Every engine refuses /sleep, as a misconfigured image would."""

    def new_engine(self) -> FakeEngine:
        return FakeEngine(self.token, answers={"/sleep": (500, {"error": "no sleep mode"})})


def test_standby_pods_that_cannot_sleep_are_replaced_with_backoff(namespace, kubectl, operator):
    apply(kubectl, namespace, standby_service("sleepless", replicas=1))
    seen: set[str] = set()
    with SleeplessFleet(kubectl, namespace, "sleepless") as fleet:
        svc = wait_degraded(kubectl, namespace, "sleepless", "StandbyBackoff", timeout=60)
        started = time.monotonic()
        while time.monotonic() - started < 30:
            seen.update(pod["metadata"]["name"] for pod in fleet.pods())
            time.sleep(0.5)
    assert "did not fall asleep" in condition(svc, "Degraded")["message"]
    # Without backoff a pod a second went; with it, 5, 10, 20 s apart: at most 4 new pods in 30 s.
    assert len(seen) <= 6, sorted(seen)
