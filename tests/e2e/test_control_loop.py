"""The control loop's promises on the real control plane: a resync of unchanged services writes nothing,
the whole pod template is compared, a cache claim is taken only when the operator signed it, a claim
re-created under a running service is seeded again, and a reseed keeps the service Available."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.helpers import apply, condition, get_json, vllm_service, wait_for, wait_ready

pytestmark = pytest.mark.e2e

DRIFT_SECONDS = 5  # the e2e operator's STOKER_DRIFT_INTERVAL_SECONDS


def children_versions(kubectl, namespace: str, name: str) -> dict[str, str]:
    found = get_json(
        kubectl, "-n", namespace, "deployment,service,pvc,job", "-l", f"app.kubernetes.io/instance={name}"
    )
    return {
        f"{item['kind']}/{item['metadata']['name']}": item["metadata"]["resourceVersion"]
        for item in (found or {}).get("items", [])
    }


def settled(kubectl, namespace: str, name: str) -> dict:
    """Ready, seeded, and its children unchanged for a moment (the last writes of the rollout done)."""
    wait_ready(kubectl, namespace, name)
    previous: dict[str, str] = {}

    def quiet() -> dict[str, str] | None:
        nonlocal previous
        now = children_versions(kubectl, namespace, name)
        same = now == previous
        previous = now
        return now if same else None

    return wait_for(lambda: (time.sleep(2), quiet())[1], 90, what="children settled")


def test_a_resync_of_an_unchanged_service_writes_nothing(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("quiet"))
    before = settled(kubectl, namespace, "quiet")
    svc_before = get_json(kubectl, "-n", namespace, "vllmservice", "quiet")
    time.sleep(3 * DRIFT_SECONDS)  # three drift resyncs
    assert children_versions(kubectl, namespace, "quiet") == before
    svc_after = get_json(kubectl, "-n", namespace, "vllmservice", "quiet")
    assert svc_after["metadata"]["resourceVersion"] == svc_before["metadata"]["resourceVersion"]


def test_fields_set_by_hand_on_the_pod_template_are_removed(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("handset"))
    settled(kubectl, namespace, "handset")
    kubectl("-n", namespace, "create", "serviceaccount", "powerful")
    patch = {"spec": {"template": {"spec": {"hostNetwork": True, "serviceAccountName": "powerful"}}}}
    kubectl("-n", namespace, "patch", "deployment", "handset", "--type=merge", "-p", json.dumps(patch))

    def restored() -> dict | None:
        pod = get_json(kubectl, "-n", namespace, "deployment", "handset")["spec"]["template"]["spec"]
        hand_set = pod.get("hostNetwork") or pod.get("serviceAccountName") == "powerful"
        return pod if not hand_set else None

    pod = wait_for(restored, 3 * DRIFT_SECONDS + 10, what="hand-set template fields removed")
    assert pod.get("serviceAccountName", "default") == "default"
    wait_ready(kubectl, namespace, "handset")


def wait_conflict_over_claim(kubectl, namespace: str, name: str) -> dict:
    """The VLLMService `name` once Degraded/ChildConflict names its cache claim."""

    def conflict() -> dict | None:
        found = get_json(kubectl, "-n", namespace, "vllmservice", name)
        return found if condition(found, "Degraded").get("reason") == "ChildConflict" else None

    found = wait_for(conflict, 60, what="ChildConflict")
    assert f"PersistentVolumeClaim {namespace}/{name}-cache" in condition(found, "Degraded")["message"]
    return found


def test_a_planted_cache_claim_with_stokers_annotations_is_a_conflict(namespace, kubectl, operator):
    # What stoker would write, copied by a tenant onto a claim of their own before the service exists.
    svc = vllm_service("planted")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "planted-cache",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "stoker", "app.kubernetes.io/instance": "planted"},
            "annotations": {
                "stoker.dev/compile-cache-of": "planted",
                "stoker.dev/claim-signature": "0" * 64,
                "stoker.dev/seeded-key": "0" * 64,
                "stoker.dev/seeded-signature": "0" * 64,
                "stoker.dev/model-facts": json.dumps({"numLayers": 9223372036854775807}),
            },
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(claim))
    apply(kubectl, namespace, svc)

    found = wait_conflict_over_claim(kubectl, namespace, "planted")
    assert not (found["status"].get("cache") or {}).get("seededKey")
    assert "model" not in (found["status"].get("startup") or {})
    assert get_json(kubectl, "-n", namespace, "deployment", "planted") is None


def test_a_claim_with_a_forged_owner_reference_is_a_conflict(namespace, kubectl, operator):
    # A tenant who may create claims writes the service's owner reference on one while the service has no
    # cache claim, then the cache is turned on: the reference is not stoker's signature.
    svc = vllm_service("forged")
    svc["spec"]["coldStart"] = {"compileCache": {"enabled": False}, "seed": {"enabled": False}}
    apply(kubectl, namespace, svc)
    live = wait_ready(kubectl, namespace, "forged")
    owner = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "name": "forged",
        "uid": live["metadata"]["uid"],
        "controller": True,
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "forged-cache", "namespace": namespace, "ownerReferences": [owner]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(claim))
    svc["spec"]["coldStart"] = {}
    apply(kubectl, namespace, svc)

    wait_conflict_over_claim(kubectl, namespace, "forged")
    deployment = get_json(kubectl, "-n", namespace, "deployment", "forged")
    volumes = json.dumps(deployment["spec"]["template"]["spec"].get("volumes") or [])
    assert "forged-cache" not in volumes
    planted = get_json(kubectl, "-n", namespace, "pvc", "forged-cache")
    assert "stoker.dev/claim-signature" not in (planted["metadata"].get("annotations") or {})
    assert get_json(kubectl, "-n", namespace, "job", "-l", "app.kubernetes.io/instance=forged")["items"] == []


def test_a_cache_claim_recreated_under_a_running_service_is_seeded_again(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("regrow"))
    first = wait_ready(kubectl, namespace, "regrow")
    key = first["status"]["cache"]["key"]
    wait_for(
        lambda: get_json(kubectl, "-n", namespace, "vllmservice", "regrow")["status"]["cache"].get("claimUid")
    )
    old_uid = get_json(kubectl, "-n", namespace, "pvc", "regrow-cache")["metadata"]["uid"]
    # Deleted under running pods, the claim waits on its protection finalizer; lifting it lets the claim
    # go as a volume that failed would, and stoker creates an empty one in its place.
    kubectl("-n", namespace, "delete", "pvc", "regrow-cache", "--wait=false")
    kubectl(
        "-n",
        namespace,
        "patch",
        "pvc",
        "regrow-cache",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )

    def reseeded() -> dict | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "regrow")
        claim = get_json(kubectl, "-n", namespace, "pvc", "regrow-cache")
        cache = (svc or {}).get("status", {}).get("cache") or {}
        if not claim or claim["metadata"]["uid"] == old_uid:
            return None
        fresh = claim["metadata"]["uid"]
        return svc if cache.get("seededKey") == key and cache.get("claimUid") == fresh else None

    svc = wait_for(reseeded, 120, what="the new claim seeded")
    assert condition(svc, "CacheSeeded")["status"] == "True"
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.name=regrow")
    reasons = [e["reason"] for e in events["items"]]
    assert "CacheClaimReplaced" in reasons
    # The same Event twice is one Event counted twice, as the kubelet aggregates them.
    assert sum(e.get("count", 1) for e in events["items"] if e["reason"] == "SeedStarted") == 2


def test_a_reseed_keeps_the_old_replicas_available(namespace, kubectl, operator):
    manifest = vllm_service("steady")
    apply(kubectl, namespace, manifest)
    settled(kubectl, namespace, "steady")
    # A compile-relevant edit: a new key, a new seed; the old replicas keep serving meanwhile.
    manifest["spec"]["runtime"]["maxModelLen"] = 2048
    apply(kubectl, namespace, manifest)

    def seeding() -> dict | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "steady")
        return svc if condition(svc, "Progressing").get("reason") == "WaitingForSeed" else None

    svc = wait_for(seeding, 60, what="Progressing=WaitingForSeed")
    assert condition(svc, "Available")["status"] == "True"
    assert condition(svc, "Ready")["status"] == "True"
    kubectl(
        "-n", namespace, "wait", "vllmservice/steady", "--for=condition=Progressing=False", "--timeout=120s",
        timeout=130,
    )  # fmt: skip
    done = get_json(kubectl, "-n", namespace, "vllmservice", "steady")
    assert condition(done, "Available")["status"] == "True"
    assert condition(done, "CacheSeeded")["status"] == "True"
