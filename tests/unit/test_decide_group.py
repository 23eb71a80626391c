"""A multi-node service's LeaderWorkerSet in the decide step: created, held at zero by the seed gate,
compared whole as the Deployment is, and ready only as LeaderWorkerSet counts its groups (all pods ready)."""

from __future__ import annotations

import dataclasses

from stoker.controller.decide import Outcome, decide_children, decide_status
from stoker.render.group import LWS_KIND
from tests.unit.test_decide import body, converged, snapshot


def group_body(**status: object) -> dict:
    obj = body(**status)
    obj["spec"]["runtime"].update(gpus=8, nodesPerReplica=2)
    return obj


def test_a_new_group_service_creates_its_leader_worker_set_behind_the_seed_gate():
    plan = decide_children(snapshot(group_body()))
    kinds = [write.desired["kind"] for write in plan.writes]
    assert kinds == ["PersistentVolumeClaim", "Service", "Job", LWS_KIND, "Service"]
    group = next(w.desired for w in plan.writes if w.desired["kind"] == LWS_KIND)
    assert group["spec"]["replicas"] == 0  # the seed gate holds
    assert group["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"


def test_an_unchanged_group_writes_nothing_and_a_hand_edit_is_applied_back():
    obj = group_body()
    obj["spec"]["coldStart"] = {"seed": {"enabled": False}}
    children = converged(obj)
    assert decide_children(snapshot(obj, children)).writes == []
    key = next(k for k in children if k[0] == LWS_KIND)
    children[key]["spec"]["leaderWorkerTemplate"]["size"] = 3
    assert LWS_KIND in [w.desired["kind"] for w in decide_children(snapshot(obj, children)).writes]


def conditions_with(group_status: dict) -> dict:
    obj = group_body()
    obj["spec"]["coldStart"] = {"seed": {"enabled": False}}
    children = converged(obj)
    key = next(k for k in children if k[0] == LWS_KIND)
    children[key]["status"] = group_status
    snap = snapshot(obj, children)
    plan = decide_children(snap)
    decided = decide_status(snap, plan, Outcome(children, []), None)
    return {"recheck": decided.recheck_after, "status": decided.status} | {
        c["type"]: c for c in decided.status["conditions"]
    }


def test_the_service_is_ready_only_when_leader_worker_set_counts_a_group_ready():
    # A group whose pods are not all ready: LWS does not count it, and neither does stoker.
    starting = conditions_with({"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1})
    assert starting["Ready"]["status"] == "False"
    assert starting["status"]["readyReplicas"] == 0 and starting["status"]["ready"] == "0/1"
    assert "LeaderWorkerSet llm" in starting["Progressing"]["message"]
    assert starting["recheck"] is not None  # not watched: looked at again while it rolls out
    ready = conditions_with({"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1})
    assert ready["Ready"]["status"] == "True" and ready["status"]["readyReplicas"] == 1
    assert ready["Progressing"]["reason"] == "Converged" and ready["recheck"] is None
    rolling = {"type": "UpdateInProgress", "status": "True"}
    updating = conditions_with(
        {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "conditions": [rolling]}
    )
    assert updating["Progressing"]["reason"] != "Converged"


def test_without_the_leader_worker_set_crd_nothing_runs_and_the_service_says_so():
    obj = group_body()
    snap = dataclasses.replace(
        snapshot(obj), group_crd_missing="leaderworkersets.leaderworkerset.x-k8s.io/v1"
    )
    plan = decide_children(snap)
    assert LWS_KIND not in [w.desired["kind"] for w in plan.writes]
    conditions = {c["type"]: c for c in decide_status(snap, plan, Outcome({}, []), None).status["conditions"]}
    assert conditions["Degraded"]["reason"] == "LeaderWorkerSetCRDMissing"
    assert "leaderworkersets.leaderworkerset.x-k8s.io/v1" in conditions["Degraded"]["message"]
