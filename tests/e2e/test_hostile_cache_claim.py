"""Hostile tenants and the compile cache, on the real control plane (issue 35, findings 2 and 6).

A retained compile-cache claim goes only to its owner: a tenant who deletes another's VLLMService and
creates one of the same name with their own image gets a conflict, not the claim, and is refused
`reuseRetained` at admission; the owner takes the claim back with `reuseRetained`, seeded again into an
emptied volume. Status is output: a forged `seededKey` never skips a seed, and forged `seededAt` and
`startup.model` are written over.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from stoker.api import VLLMService
from stoker.render import cache_key, short_cache_key
from tests.conftest import Helm
from tests.e2e.admission import (
    TENANT,
    apply_as,
    apply_chart,
    editor_in_force,
    refusal,
)
from tests.e2e.helpers import (
    apply,
    condition,
    delete_and_wait_for_garbage_collection,
    get_json,
    seed_jobs,
    vllm_service,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.e2e

OWNER = "stoker.dev/compile-cache-owner"
SEEDED_KEY = "stoker.dev/seeded-key"
SEEDED_AT = "stoker.dev/seeded-at"
EDITORS_IMAGE = "registry.example/editor/vllm:0.26.0"


@pytest.fixture
def policy(kubectl, helm: Helm, namespace: str) -> str:
    """The chart's tenant boundary in force, and TENANT holding only its VLLMService editor role in
    `namespace`."""
    apply_chart(kubectl, helm)
    return editor_in_force(kubectl, namespace)


def claim_of(kubectl, namespace: str, name: str) -> dict[str, Any]:
    claim = get_json(kubectl, "-n", namespace, "pvc", f"{name}-cache")
    assert claim is not None
    return claim


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("annotations") or {}


def owned_and_seeded(kubectl, namespace: str, name: str, owner_uid: str, key: str) -> dict[str, Any]:
    def recorded() -> dict[str, Any] | None:
        claim = claim_of(kubectl, namespace, name)
        found = annotations(claim)
        return claim if found.get(OWNER) == owner_uid and found.get(SEEDED_KEY) == key else None

    return wait_for(recorded, what=f"{name}-cache owned by {owner_uid} and seeded for {key[:10]}")


def test_a_service_recreated_by_name_does_not_get_the_retained_cache(namespace, kubectl, operator, policy):
    apply(kubectl, namespace, vllm_service("shared"))
    admins = wait_ready(kubectl, namespace, "shared")
    key = admins["status"]["cache"]["key"]
    kept = owned_and_seeded(kubectl, namespace, "shared", admins["metadata"]["uid"], key)

    # The editor deletes the admin's service and makes one of the same name, with their own image.
    kubectl("--as", TENANT, "-n", namespace, "delete", "vsvc", "shared")
    wait_for(
        lambda: (
            get_json(kubectl, "-n", namespace, "deployment", "shared") is None
            and not seed_jobs(kubectl, namespace, "shared")
        ),
        what="the admin's deployment and seed job collected",
    )
    editors = vllm_service("shared")
    editors["spec"]["runtime"].update(image=EDITORS_IMAGE, engineVersion="0.26.0")
    # Asking for the retained claim needs `use` on it, which the editor role does not give.
    asked = json.loads(json.dumps(editors))
    asked["spec"]["coldStart"] = {"compileCache": {"reuseRetained": True}}
    message = refusal(apply_as(kubectl, TENANT, namespace, asked))
    assert (
        "spec.coldStart.compileCache.reuseRetained" in message and "use on persistentvolumeclaims" in message
    )
    result = apply_as(kubectl, TENANT, namespace, editors)
    assert result.returncode == 0, result.stderr

    def conflict() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "shared")
        return svc if condition(svc, "Degraded").get("reason") == "ChildConflict" else None

    blocked = wait_for(conflict, what="the editor's service names the retained claim")
    message = condition(blocked, "Degraded")["message"]
    assert f"PersistentVolumeClaim {namespace}/shared-cache" in message and "reuseRetained" in message
    time.sleep(3)  # a few passes: nothing of the editor's is made, the claim is not touched
    assert seed_jobs(kubectl, namespace, "shared") == []
    assert get_json(kubectl, "-n", namespace, "deployment", "shared") is None
    untouched = claim_of(kubectl, namespace, "shared")
    assert untouched["metadata"]["uid"] == kept["metadata"]["uid"]
    assert untouched["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    assert not untouched["metadata"].get("ownerReferences")

    # The admin re-creates theirs, asking for the claim: it is theirs again, seeded into an emptied volume.
    kubectl("-n", namespace, "delete", "vsvc", "shared")
    reclaimed = vllm_service("shared")
    reclaimed["spec"]["coldStart"] = {"compileCache": {"reuseRetained": True}}
    apply(kubectl, namespace, reclaimed)
    again = wait_ready(kubectl, namespace, "shared")
    claim = owned_and_seeded(kubectl, namespace, "shared", again["metadata"]["uid"], key)
    assert claim["metadata"]["uid"] == kept["metadata"]["uid"]
    (job,) = seed_jobs(kubectl, namespace, "shared")
    seed = get_json(kubectl, "-n", namespace, "job", job)
    args = seed["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--empty") + 1] == "/var/cache/vllm"
    # Nothing the seed wrote before belongs to the new owner's record: it was seeded after the takeover.
    assert annotations(claim)[SEEDED_AT] >= again["metadata"]["creationTimestamp"]


def test_a_cache_another_owner_wrote_is_emptied_before_its_new_owner_uses_it(namespace, kubectl, operator):
    """The editor's own service (their image) seeds its claim and is deleted; the admin's service of that
    name takes the claim over: it is seeded again, emptied first, before any replica of the admin's
    starts."""
    editors = vllm_service("handed")
    editors["spec"]["runtime"].update(image=EDITORS_IMAGE, engineVersion="0.26.0")
    apply(kubectl, namespace, editors)
    first = wait_ready(kubectl, namespace, "handed")
    owned_and_seeded(kubectl, namespace, "handed", first["metadata"]["uid"], first["status"]["cache"]["key"])
    delete_and_wait_for_garbage_collection(kubectl, namespace, "handed")

    admins = vllm_service("handed")
    admins["spec"]["coldStart"] = {"compileCache": {"reuseRetained": True}}
    apply(kubectl, namespace, admins)
    again = wait_ready(kubectl, namespace, "handed")
    owned_and_seeded(kubectl, namespace, "handed", again["metadata"]["uid"], again["status"]["cache"]["key"])
    (job,) = seed_jobs(kubectl, namespace, "handed")
    seed = get_json(kubectl, "-n", namespace, "job", job)
    assert "--empty" in seed["spec"]["template"]["spec"]["containers"][0]["args"]
    # The admin's replicas started after that seed finished (the gate), never on what the editor's wrote.
    pods = get_json(kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/instance=handed")["items"]
    serving = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "server"]
    finished = seed["status"]["completionTime"]
    assert serving and all(p["metadata"]["creationTimestamp"] >= finished for p in serving)


def forge(kubectl, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What a user with patch on vllmservices/status can write."""
    kubectl(
        "-n", namespace, "patch", "vsvc", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


FORGED_MODEL = {
    "checkpointBytes": 1 << 45,
    "layers": 4096,
    "hiddenSize": 1 << 20,
    "intermediateSize": 0,
    "attentionHeads": 1,
    "kvHeads": 1,
    "vocabSize": 1,
    "tokenizerBytes": 0,
    "moe": False,
    "experts": 0,
}


def test_a_forged_seeded_key_never_skips_the_seed(namespace, kubectl, operator):
    # The seed pod can never be scheduled: the cache stays unseeded, the serving replicas gated.
    manifest = vllm_service("forged")
    manifest["spec"]["runtime"]["nodeSelector"] = {"stoker.test/no-such-node": "true"}
    apply(kubectl, namespace, manifest)
    wait_for(lambda: seed_jobs(kubectl, namespace, "forged"), what="a seed job")
    svc = VLLMService.model_validate(get_json(kubectl, "-n", namespace, "vllmservice", "forged"))
    key, short_key = cache_key(svc), short_cache_key(svc)
    forge(
        kubectl,
        namespace,
        "forged",
        {
            "cache": {"key": key, "seededKey": key, "seededAt": "2026-01-01T00:00:00Z"},
            "startup": {"seed": {"cacheKey": short_key}, "model": FORGED_MODEL, "modelCacheKey": short_key},
        },
    )

    def restored() -> dict[str, Any] | None:
        now = get_json(kubectl, "-n", namespace, "vllmservice", "forged") or {}
        status = now.get("status") or {}
        forged_left = "seededKey" in status.get("cache", {}) or "model" in status.get("startup", {})
        return None if forged_left else now

    after = wait_for(restored, timeout=30, what="the forged status written over")
    assert condition(after, "CacheSeeded")["status"] == "False"
    time.sleep(3)  # passes after the forgery decide from the claim, not from status
    assert seed_jobs(kubectl, namespace, "forged") == [f"forged-seed-{short_key}"]
    deployment = get_json(kubectl, "-n", namespace, "deployment", "forged")
    assert deployment["spec"]["replicas"] == 0  # the gate stays closed
    assert SEEDED_KEY not in annotations(claim_of(kubectl, namespace, "forged"))
    assert (
        condition(get_json(kubectl, "-n", namespace, "vllmservice", "forged"), "Ready")["status"] == "False"
    )


def test_forged_seeded_at_and_model_are_restored(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("restored"))
    ready = wait_ready(kubectl, namespace, "restored")
    key = ready["status"]["cache"]["key"]
    claim = owned_and_seeded(kubectl, namespace, "restored", ready["metadata"]["uid"], key)
    signed_at = annotations(claim)[SEEDED_AT]
    model_before = (ready["status"].get("startup") or {}).get("model")
    forge(
        kubectl,
        namespace,
        "restored",
        {
            "cache": {"seededAt": "2000-01-01T00:00:00Z"},
            "startup": {
                "model": FORGED_MODEL,
                "modelCacheKey": short_cache_key(VLLMService.model_validate(ready)),
            },
        },
    )

    def restored() -> dict[str, Any] | None:
        now = get_json(kubectl, "-n", namespace, "vllmservice", "restored") or {}
        status = now.get("status") or {}
        same = (
            status.get("cache", {}).get("seededAt") == signed_at
            and (status.get("startup") or {}).get("model") == model_before
        )
        return now if same else None

    after = wait_for(restored, timeout=30, what="seededAt and startup.model restored")
    assert condition(after, "Ready")["status"] == "True"
    assert after["status"]["cache"]["seededKey"] == key
