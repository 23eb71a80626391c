"""The compile-cache PVC on delete (spec.coldStart.compileCache.retentionPolicy), on the real control plane:
a kept cache is taken back by the next VLLMService of its name that asks for it (reuseRetained), seeded
again for its new owner; a user's PVC of that name never is (tests/e2e/test_hostile_cache_claim.py: one
that does not ask)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import (
    apply,
    condition,
    delete_and_wait_for_garbage_collection,
    get_json,
    owned_by,
    seed_jobs,
    vllm_service,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.e2e

RETAINED = "stoker.dev/compile-cache-of"
SEEDED_KEY = "stoker.dev/seeded-key"
OWNER = "stoker.dev/compile-cache-owner"


def reusing(manifest: dict) -> dict:
    manifest["spec"]["coldStart"] = {"compileCache": {"reuseRetained": True}}
    return manifest


def annotation_is(kubectl, namespace: str, claim: str, key: str):
    def recorded():
        pvc = get_json(kubectl, "-n", namespace, "pvc", claim) or {}
        return pvc if (pvc.get("metadata", {}).get("annotations") or {}).get(SEEDED_KEY) == key else None

    return wait_for(recorded, what=f"{claim} records seeded key {key[:10]}")


def test_a_kept_cache_is_taken_back_on_request_and_reseeded_for_its_new_owner(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("keep"))
    first = wait_ready(kubectl, namespace, "keep")
    key = first["status"]["cache"]["key"]
    claim = annotation_is(kubectl, namespace, "keep-cache", key)
    assert not claim["metadata"].get("ownerReferences")  # Retain is the default: GC keeps it
    assert claim["metadata"]["annotations"][RETAINED] == "keep"

    delete_and_wait_for_garbage_collection(kubectl, namespace, "keep")
    kept = get_json(kubectl, "-n", namespace, "pvc", "keep-cache")
    assert kept and kept["metadata"]["uid"] == claim["metadata"]["uid"]

    # Same spec, same key, asking for the kept claim: the claim is taken back, and seeded again for its new
    # owner (what the previous one's pods wrote is not this one's to trust).
    apply(kubectl, namespace, reusing(vllm_service("keep")))
    again = wait_ready(kubectl, namespace, "keep")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert condition(again, "CacheSeeded")["status"] == "True"
    assert again["status"]["cache"]["seededKey"] == key
    assert seed_jobs(kubectl, namespace, "keep") == [f"keep-seed-{key[:10]}"]
    reclaimed = annotation_is(kubectl, namespace, "keep-cache", key)
    assert reclaimed["metadata"]["uid"] == claim["metadata"]["uid"]
    assert reclaimed["metadata"]["annotations"][OWNER] == again["metadata"]["uid"]

    # Another key (a compile-relevant change): the kept volume is taken back and seeded again.
    delete_and_wait_for_garbage_collection(kubectl, namespace, "keep")
    apply(kubectl, namespace, reusing(vllm_service("keep", maxModelLen=2048)))
    rekeyed = wait_ready(kubectl, namespace, "keep")
    new_key = rekeyed["status"]["cache"]["key"]
    assert new_key != key
    wait_for(
        lambda: seed_jobs(kubectl, namespace, "keep") == [f"keep-seed-{new_key[:10]}"], what="a seed job"
    )
    assert condition(rekeyed, "CacheSeeded")["status"] == "True"
    claim = annotation_is(kubectl, namespace, "keep-cache", new_key)
    assert claim["metadata"]["uid"] == kept["metadata"]["uid"]


def test_an_edited_service_keeps_its_retained_claim(namespace, kubectl, operator):
    """Retained for this very VLLMService (its uid): an edit to another key reseeds the same claim."""
    apply(kubectl, namespace, vllm_service("edited"))
    first = wait_ready(kubectl, namespace, "edited")
    claim = annotation_is(kubectl, namespace, "edited-cache", first["status"]["cache"]["key"])
    assert claim["metadata"]["annotations"][OWNER] == first["metadata"]["uid"]
    apply(kubectl, namespace, vllm_service("edited", maxModelLen=2048))
    wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "vllmservice", "edited") or {})
            .get("status", {})
            .get("cache", {})
            .get("seededKey")
            not in (None, first["status"]["cache"]["key"])
        ),
        what="seeded for the edited key",
    )
    assert (
        get_json(kubectl, "-n", namespace, "pvc", "edited-cache")["metadata"]["uid"]
        == claim["metadata"]["uid"]
    )


@pytest.mark.parametrize("annotation", [None, "someone-else"], ids=["plain", "kept-for-another"])
def test_a_claim_not_kept_for_this_name_is_still_refused(annotation, namespace, kubectl, operator):
    meta: dict = {"name": "taken-cache", "namespace": namespace}
    if annotation:
        meta["annotations"] = {RETAINED: annotation}
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(claim))
    apply(kubectl, namespace, vllm_service("taken"))

    def conflict():
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "taken")
        return svc if condition(svc, "Degraded").get("reason") == "ChildConflict" else None

    svc = wait_for(conflict, what="ChildConflict")
    assert f"PersistentVolumeClaim {namespace}/taken-cache" in condition(svc, "Degraded")["message"]
    pvc = get_json(kubectl, "-n", namespace, "pvc", "taken-cache")
    assert not pvc["metadata"].get("ownerReferences")
    assert (pvc["metadata"].get("annotations") or {}).get(RETAINED) == annotation
    assert seed_jobs(kubectl, namespace, "taken") == []


def test_delete_policy_hands_the_claim_to_garbage_collection(namespace, kubectl, operator):
    manifest = vllm_service("drop")
    manifest["spec"]["coldStart"] = {"compileCache": {"retentionPolicy": "Delete"}}
    apply(kubectl, namespace, manifest)
    svc = wait_ready(kubectl, namespace, "drop")
    assert owned_by(get_json(kubectl, "-n", namespace, "pvc", "drop-cache"), svc)

    # Retain on a live object: stoker removes its owner reference, so deleting keeps the claim.
    manifest["spec"]["coldStart"]["compileCache"]["retentionPolicy"] = "Retain"
    apply(kubectl, namespace, manifest)
    wait_for(
        lambda: (
            not get_json(kubectl, "-n", namespace, "pvc", "drop-cache")["metadata"].get("ownerReferences")
        ),
        what="owner reference removed",
    )
    manifest["spec"]["coldStart"]["compileCache"]["retentionPolicy"] = "Delete"
    apply(kubectl, namespace, manifest)
    wait_for(
        lambda: owned_by(get_json(kubectl, "-n", namespace, "pvc", "drop-cache"), svc), what="owned again"
    )
    kubectl("-n", namespace, "delete", "vsvc", "drop")

    def collected():
        pvc = get_json(kubectl, "-n", namespace, "pvc", "drop-cache")
        return pvc is None or pvc["metadata"].get("deletionTimestamp")

    wait_for(collected, what="claim garbage-collected")
