"""decide: from a snapshot of a VLLMService and its children to the writes, conditions and Events. Pure:
the live objects here are the rendered ones as the API server would return them (uids, defaults)."""

from __future__ import annotations

import copy
import dataclasses

import kopf
import pytest

from stoker.api import VLLMService
from stoker.controller.decide import (
    Outcome,
    Snapshot,
    blocked_status,
    decide_children,
    decide_status,
    first_reaction,
    trusted_body,
)
from stoker.controller.diagnose import UNSCHEDULABLE_GRACE_SECONDS
from stoker.controller.objects import facts_json
from stoker.controller.ownership import SeededClaim, claim_signature, owner_signature, seeded_annotations
from stoker.render import cache_key, render_children, seed_job_name, short_cache_key
from stoker.render.snapshot import Snapshots

KEY = "operator-signing-key-0123456789"
PROGRAMS_IMAGE = "registry.example/stoker:0.1.0"
NOW = "2026-11-26T10:00:00Z"
# What a seed of Qwen2.5-0.5B-Instruct prints (status.startup.model).
QWEN_FACTS = {
    "checkpointBytes": 988097824,
    "layers": 24,
    "hiddenSize": 896,
    "intermediateSize": 4864,
    "attentionHeads": 14,
    "kvHeads": 2,
    "vocabSize": 151936,
    "tokenizerBytes": 7031645,
    "moe": False,
    "experts": 0,
    "dtype": "bfloat16",
}


SNAPSHOTS = Snapshots("operator-control-key-0123456789", 10, 120, 300)


def body(**status: object) -> dict:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "llm", "namespace": "t1", "uid": "svc-uid", "generation": 1},
        "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "runtime": {"replicas": 1}},
        "status": dict(status),
    }


def as_live(child: dict, owner: dict, uid: str) -> dict:
    """A rendered child as the API server returns it: owned, with a uid and a defaulted field."""
    live = copy.deepcopy(child)
    kopf.append_owner_reference(live, owner=kopf.Body(owner))
    live["metadata"]["uid"] = uid
    live["metadata"]["managedFields"] = [{"manager": "stoker", "operation": "Apply", "fieldsV1": {}}]
    live.setdefault("status", {})
    if child["kind"] == "Deployment":
        live["spec"]["revisionHistoryLimit"] = 10
    return live


def snapshot(obj: dict, children: dict | None = None, seed_jobs: list | None = None) -> Snapshot:
    svc = VLLMService.model_validate(obj)
    rendered = {
        (c["kind"], c["metadata"]["name"]): None for c in render_children(svc, programs_image=PROGRAMS_IMAGE)
    }
    rendered.pop(("Job", seed_job_name("llm", short_cache_key(svc))), None)
    rendered.update(children or {})
    return Snapshot(
        body=obj,
        svc=svc,
        rendered=render_children(svc, programs_image=PROGRAMS_IMAGE),
        children=rendered,
        seed_jobs=seed_jobs or [],
        pods=[],
        seed_pods=[],
        claim_events={},
        job_events=[],
        control_token=None,
        signing_key=KEY,
        field_manager="stoker",
        programs_image=PROGRAMS_IMAGE,
        now=NOW,
    )


def converged(obj: dict) -> dict:
    """Every child as rendered and applied, the claim signed and released."""
    svc = VLLMService.model_validate(obj)
    children = {}
    for child in render_children(svc, programs_image=PROGRAMS_IMAGE):
        if child["kind"] == "Job":
            continue
        live = as_live(child, obj, f"{child['kind']}-uid")
        if child["kind"] == "PersistentVolumeClaim":
            live["metadata"].pop("ownerReferences")
            annotations = live["metadata"].setdefault("annotations", {})
            annotations["stoker.dev/claim-signature"] = claim_signature(KEY, live)
            annotations["stoker.dev/compile-cache-owner"] = obj["metadata"]["uid"]
            signature = owner_signature(KEY, live, obj["metadata"]["uid"])
            annotations["stoker.dev/compile-cache-owner-signature"] = signature
        children[(child["kind"], child["metadata"]["name"])] = live
    return children


def test_a_new_service_creates_every_child_with_an_owner_reference():
    plan = decide_children(snapshot(body()))
    kinds = [write.desired["kind"] for write in plan.writes]
    assert kinds == ["PersistentVolumeClaim", "Job", "Deployment", "Service"]
    assert all(write.current is None for write in plan.writes)
    assert all(w.desired["metadata"]["ownerReferences"][0]["uid"] == "svc-uid" for w in plan.writes)
    assert plan.gate_closed and plan.recheck_after == 0.0  # the new claim is signed at once
    deployment = next(w.desired for w in plan.writes if w.desired["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 0
    # Rendered again for the gate, with the operator's programs image still.
    (programs,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert programs["image"] == PROGRAMS_IMAGE


def test_in_a_burst_a_new_services_first_pass_creates_only_its_deployment():
    plan = first_reaction(decide_children(snapshot(body())))
    assert plan is not None
    assert [w.desired["kind"] for w in plan.writes] == ["Deployment"]
    assert plan.writes[0].desired["spec"]["replicas"] == 0  # the seed gate holds: nothing runs yet
    assert plan.recheck_after == 0.0  # the rest in the next pass
    # Not a new service's plan: nothing to cut.
    obj = body(cache={"seededKey": None})
    assert first_reaction(decide_children(snapshot(obj, converged(obj)))) is None
    seeded = body()
    seeded["spec"]["coldStart"] = {"seed": {"enabled": False}}  # no gate: the claim must come first
    assert first_reaction(decide_children(snapshot(seeded))) is None


def test_an_unchanged_service_writes_nothing():
    obj = body(cache={"seededKey": None})
    plan = decide_children(snapshot(obj, converged(obj)))
    # Only the seed Job is left to create (nothing seeded yet); nothing is applied again.
    assert [w.desired["kind"] for w in plan.writes] == ["Job"]


def test_a_created_claim_is_let_go_under_retain_and_keeps_its_signature():
    obj = body()
    children = converged(obj)
    claim_id = next(k for k in children if k[0] == "PersistentVolumeClaim")
    claim = children[claim_id]
    kopf.append_owner_reference(claim, owner=kopf.Body(obj))  # as created, signed by act
    plan = decide_children(snapshot(obj, children))
    write = next(w for w in plan.writes if w.desired["kind"] == "PersistentVolumeClaim")
    assert write.release_owner
    assert write.desired["metadata"]["annotations"]["stoker.dev/claim-signature"] == (
        claim_signature(KEY, claim)
    )
    assert "ownerReferences" not in write.desired["metadata"]


def test_a_claim_with_a_forged_owner_reference_is_a_conflict_and_never_signed():
    # Anyone who may create claims may write this service's owner reference on one.
    obj = body()
    children = converged(obj)
    claim_id = next(k for k in children if k[0] == "PersistentVolumeClaim")
    forged = children[claim_id]
    kopf.append_owner_reference(forged, owner=kopf.Body(obj))
    del forged["metadata"]["annotations"]["stoker.dev/claim-signature"]
    plan = decide_children(snapshot(obj, children))
    assert plan.blocked is not None and "PersistentVolumeClaim t1/llm-cache" in plan.blocked
    assert plan.writes == [] and plan.deletions == []


def test_a_planted_cache_claim_with_copied_annotations_is_a_conflict():
    obj = body()
    children = converged(obj)
    claim_id = next(k for k in children if k[0] == "PersistentVolumeClaim")
    planted = children[claim_id]
    svc = VLLMService.model_validate(obj)
    planted["metadata"]["uid"] = "planted-uid"  # the signature was made for another claim's uid
    planted["metadata"]["annotations"]["stoker.dev/seeded-key"] = cache_key(svc)
    plan = decide_children(snapshot(obj, children))
    assert plan.blocked is not None and "PersistentVolumeClaim t1/llm-cache" in plan.blocked
    assert plan.writes == [] and plan.deletions == []
    assert plan.cache.get("seededKey") is None


def seeded_claim(obj: dict, children: dict, facts: str | None = None, owner: str = "svc-uid") -> dict:
    """The cache claim in `children`, signed as seeded for the service's current key."""
    svc = VLLMService.model_validate(obj)
    claim = children[next(k for k in children if k[0] == "PersistentVolumeClaim")]
    seeded = SeededClaim(cache_key(svc), "2026-11-26T09:00:00Z", facts)
    claim["metadata"]["annotations"].update(seeded_annotations(KEY, claim, owner, seeded))
    return claim


def test_a_proven_seed_on_a_kept_claim_skips_the_seed_job():
    obj = body()
    svc = VLLMService.model_validate(obj)
    children = converged(obj)
    claim = seeded_claim(obj, children)
    plan = decide_children(snapshot(obj, children))
    assert plan.seeded and not plan.gate_closed
    assert plan.cache == {
        "seededKey": cache_key(svc),
        "seededAt": "2026-11-26T09:00:00Z",
        "claimUid": claim["metadata"]["uid"],
    }
    assert [e.reason for e in plan.events] == ["CacheReused"]
    assert all(w.desired["kind"] != "Job" for w in plan.writes)


def test_a_kept_claims_facts_are_in_the_body_the_replicas_are_rendered_from():
    # The memory request counts the checkpoint: replicas started before the facts would roll again.
    obj = body()
    svc = VLLMService.model_validate(obj)
    children = converged(obj)
    claim = seeded_claim(obj, children, facts_json(QWEN_FACTS))
    known = trusted_body(obj, svc, claim, KEY, None)
    assert known["status"]["startup"]["model"]["checkpointBytes"] == 988097824
    assert known["status"]["startup"]["modelCacheKey"] == short_cache_key(svc)
    plan = decide_children(snapshot(known, children))
    assert plan.seeded and not plan.gate_closed


def test_replicas_wait_for_the_seeds_record_a_bounded_time():
    obj = body()
    svc = VLLMService.model_validate(obj)
    seed = as_live(
        next(c for c in render_children(svc, programs_image=PROGRAMS_IMAGE) if c["kind"] == "Job"),
        obj,
        "seed-uid",
    )

    def finished(at: str) -> dict:
        done = copy.deepcopy(seed)
        done["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "completionTime": at}
        return done

    plan = decide_children(snapshot(obj, converged(obj), [finished("2026-11-26T09:59:57Z")]))
    assert plan.seeded and plan.gate_closed and plan.recheck_after == pytest.approx(7.0)
    plan = decide_children(snapshot(obj, converged(obj), [finished("2026-11-26T09:59:40Z")]))
    assert plan.seeded and not plan.gate_closed  # its log could not be read in time: start anyway
    recorded = body(startup={"seed": {"cacheKey": short_cache_key(svc)}})
    plan = decide_children(snapshot(recorded, converged(recorded), [finished("2026-11-26T09:59:59Z")]))
    assert plan.seeded and not plan.gate_closed


def test_a_claim_recreated_under_a_seeded_service_is_seeded_again():
    obj = body()
    svc = VLLMService.model_validate(obj)
    obj["status"]["cache"] = {"seededKey": cache_key(svc), "claimUid": "the-old-claim"}
    children = converged(obj)
    old_seed = as_live(
        next(c for c in render_children(svc, programs_image=PROGRAMS_IMAGE) if c["kind"] == "Job"),
        obj,
        "old-seed-uid",
    )
    old_seed["metadata"]["annotations"]["stoker.dev/seed-claim-uid"] = "the-old-claim"
    old_seed["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    plan = decide_children(snapshot(obj, children, [old_seed]))
    assert "seededKey" not in plan.cache and not plan.seeded and plan.gate_closed
    assert [e.reason for e in plan.events] == ["CacheClaimReplaced"]
    assert plan.deletions == [old_seed]  # the Job that filled the old claim goes; its successor follows
    assert plan.recheck_after is not None
    assert all(w.desired["kind"] != "Job" for w in plan.writes)


def test_while_a_reseed_runs_the_old_replicas_keep_the_service_ready_and_available():
    obj = body()
    children = converged(obj)
    deployment_id = next(k for k in children if k[0] == "Deployment")
    deployment = children[deployment_id]
    deployment["metadata"]["generation"] = 3
    deployment["status"] = {
        "observedGeneration": 3,
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
    }
    snap = snapshot(obj, children)
    plan = decide_children(snap)
    assert plan.gate_closed
    assert all(w.desired["kind"] != "Deployment" for w in plan.writes)  # what serves stays as it is
    status = decide_status(snap, plan, Outcome(children, []), None).status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Available"]["status"] == "True"
    assert conditions["Progressing"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "WaitingForSeed"


def test_a_refused_startup_record_is_a_condition_of_its_service():
    obj = body(startup={"recording": {"refused": "phase weights 36000 s is out of range"}})
    snap = snapshot(obj, converged(obj))
    plan = decide_children(snap)
    status = decide_status(snap, plan, Outcome(snap.children, []), None).status
    recorded = next(c for c in status["conditions"] if c["type"] == "StartupRecorded")
    assert recorded["status"] == "False" and "out of range" in recorded["message"]


def test_a_block_posts_its_event_once():
    obj = body()
    first = blocked_status(obj, "ChildConflict", "Deployment t1/llm exists", NOW)
    assert [e.reason for e in first.events] == ["ChildConflict"]
    again = blocked_status(body(**first.status), "ChildConflict", "Deployment t1/llm exists", NOW)
    assert again.events == [] and again.status == first.status


def test_a_seed_pod_the_scheduler_cannot_place_stops_progress_and_degrades_after_the_grace():
    obj = body()
    children = converged(obj)
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": '0/2 nodes are available: persistentvolumeclaim "models" not found.',
        "lastTransitionTime": "2026-11-26T09:59:40Z",  # 20 s before NOW
    }
    pod = {"metadata": {"name": "llm-seed-x-abc", "namespace": "t1"}, "status": {"conditions": [scheduled]}}
    snap = dataclasses.replace(snapshot(obj, children), seed_pods=[pod])
    plan = decide_children(snap)
    assert plan.gate_closed
    decided = decide_status(snap, plan, Outcome(children, []), None)
    conditions = {c["type"]: c for c in decided.status["conditions"]}
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == (
        "False",
        "Unschedulable",
    )
    assert (
        (conditions["Progressing"]["message"])
        == 'Pod t1/llm-seed-x-abc: 0/2 nodes are available: persistentvolumeclaim "models" not found.'
    )
    assert conditions["Degraded"]["status"] == "False"
    assert decided.recheck_after == UNSCHEDULABLE_GRACE_SECONDS - 20  # when it counts as Degraded
    assert decided.status["ready"] == "0/1"
    later = dataclasses.replace(snap, now="2026-11-26T10:01:00Z")
    conditions = {
        c["type"]: c for c in decide_status(later, plan, Outcome(children, []), None).status["conditions"]
    }
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "Unschedulable")


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (
            {"runtime": {"replicas": 1, "extraArgs": ["--enable-sleep-mode"]}},
            ("True", "Asleep", "dumped asleep"),
        ),
        ({"runtime": {"replicas": 1}}, ("True", "Awake", "add --enable-sleep-mode")),
        ({"runtime": {"replicas": 1, "gpus": 2}}, ("False", "NotEligible", "several GPUs")),
    ],
    ids=["asleep", "awake", "tensor-parallel"],
)
def test_where_snapshots_are_on_a_condition_says_whether_and_how_this_service_gets_them(
    spec: dict, want: tuple[str, str, str]
) -> None:
    obj = body()
    obj["spec"].update(spec)
    snap = dataclasses.replace(snapshot(obj, converged(obj)), snapshots=SNAPSHOTS)
    status = decide_status(snap, decide_children(snap), Outcome(snap.children, []), None).status
    found = next(c for c in status["conditions"] if c["type"] == "Snapshots")
    assert (found["status"], found["reason"]) == want[:2] and want[2] in found["message"], found
    # Off in the cluster: no such condition.
    plain = snapshot(obj, converged(obj))
    status = decide_status(plain, decide_children(plain), Outcome(plain.children, []), None).status
    assert "Snapshots" not in [c["type"] for c in status["conditions"]]
