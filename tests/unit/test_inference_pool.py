"""spec.inferencePool: the API, the InferencePool as a child (rendered, decided, missing CRD, pruned), and
the watch of the services that scale from zero (the loop: test_scale_from_zero.py)."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.controller.decide import Outcome, decide_children, decide_status
from stoker.controller.kube import missing_object
from stoker.controller.scalefromzero import Watched
from stoker.render import render_children
from tests.unit.test_decide import PROGRAMS_IMAGE, as_live, body, converged, snapshot

POOL = {"endpointPicker": {"name": "llm-epp"}}


def pool_body(pool: dict | None = None, replicas: int = 1) -> dict:
    obj = body(cache={"seededKey": None})
    obj["spec"]["inferencePool"] = pool if pool is not None else POOL
    obj["spec"]["runtime"]["replicas"] = replicas
    return obj


# ---------------------------------------------------------------------------------------------- API


def test_api_defaults_and_bounds() -> None:
    spec = VLLMService.model_validate(pool_body()).spec.inference_pool
    assert spec is not None
    assert (spec.endpoint_picker.name, spec.endpoint_picker.port, spec.scale_from_zero) == (
        "llm-epp",
        9002,
        None,
    )
    spec = VLLMService.model_validate(pool_body({**POOL, "scaleFromZero": {}})).spec.inference_pool
    assert spec is not None and spec.scale_from_zero is not None and spec.scale_from_zero.metrics_port == 9090
    assert VLLMService.model_validate(pool_body()).spec.inference_pool is not None
    assert VLLMService.model_validate(body()).spec.inference_pool is None


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"endpointPicker": {"name": "Not_A_Name"}}, "name"),
        ({"endpointPicker": {"name": "epp", "port": 0}}, "port"),
        ({"endpointPicker": {"name": "epp"}, "scaleFromZero": {"metricsPort": 70000}}, "metricsPort"),
        ({"endpointPicker": {"name": "epp"}, "extra": 1}, "extra"),
        ({}, "endpointPicker"),
    ],
)
def test_api_refuses(pool: dict, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        VLLMService.model_validate(pool_body(pool))
    assert field in str(refused.value)


# ------------------------------------------------------------------------------------------- child


def test_the_pool_is_rendered_last_and_only_when_set() -> None:
    children = render_children(VLLMService.model_validate(pool_body()), programs_image=PROGRAMS_IMAGE)
    pool = children[-1]
    assert (pool["kind"], pool["metadata"]["name"]) == ("InferencePool", "llm")
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-epp"
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
    plain = render_children(VLLMService.model_validate(body()), programs_image=PROGRAMS_IMAGE)
    assert all(child["kind"] != "InferencePool" for child in plain)


def test_the_pool_is_created_owned_then_left_alone_and_named_in_status() -> None:
    obj = pool_body()
    plan = decide_children(snapshot(obj, {("InferencePool", "llm"): None}))
    (write,) = [w for w in plan.writes if w.desired["kind"] == "InferencePool"]
    assert write.current is None
    assert write.desired["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    live = converged(obj)
    snap = snapshot(obj, live)
    plan = decide_children(snap)
    assert all(w.desired["kind"] != "InferencePool" for w in plan.writes)
    status = decide_status(snap, plan, Outcome(live, []), None).status
    assert status["inferencePool"] == "llm"


def test_a_foreign_pool_of_that_name_is_a_conflict() -> None:
    obj = pool_body()
    foreign = as_live(render_children(VLLMService.model_validate(obj))[-1], obj, "pool-uid")
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    plan = decide_children(snapshot(obj, {**converged(obj), ("InferencePool", "llm"): foreign}))
    assert plan.blocked is not None and "InferencePool t1/llm" in plan.blocked


def test_a_missing_crd_writes_no_pool_and_says_how_to_install_it() -> None:
    """The e2e cluster installs the InferencePool CRD for every test, so the absence is tested here: the
    observer's GET tells a missing resource (Kube.get_custom raises ResourceMissing) from a missing pool."""
    obj = pool_body()
    live = converged(obj)
    live.pop(("InferencePool", "llm"))
    snap = dataclasses.replace(
        snapshot(obj, live), inference_pool_crd_missing="inferencepools.inference.networking.k8s.io/v1"
    )
    snap.children.pop(("InferencePool", "llm"), None)
    plan = decide_children(snap)
    assert all(w.desired["kind"] != "InferencePool" for w in plan.writes)
    assert plan.blocked is None and plan.recheck_after is None  # no busy loop: the drift resync looks again
    result = decide_status(snap, plan, Outcome(live, []), None)
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InferencePoolCRDMissing"
    assert "inferencepools.inference.networking.k8s.io/v1" in degraded["message"]
    assert "kubectl apply" in degraded["message"]
    assert [e.reason for e in result.events] == ["InferencePoolCRDMissing"]
    assert "inferencePool" not in result.status
    # The next pass, with that condition in status, posts no second Event.
    again = dataclasses.replace(snap, body={**obj, "status": result.status})
    assert decide_status(again, decide_children(again), Outcome(live, []), None).events == []


def test_an_unset_pool_is_deleted_if_stokers() -> None:
    obj = pool_body()
    pool = converged(obj)[("InferencePool", "llm")]
    plain = body(cache={"seededKey": None}, inferencePool="llm")
    snap = dataclasses.replace(snapshot(plain, converged(plain)), stale_inference_pool=pool)
    plan = decide_children(snap)
    assert pool in plan.deletions
    status = decide_status(snap, plan, Outcome(converged(plain), []), None).status
    assert "inferencePool" not in status
    pool["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert pool not in decide_children(dataclasses.replace(snap, stale_inference_pool=pool)).deletions


class Refusal(Exception):
    def __init__(self, text: str) -> None:
        self.body = text


def test_a_404_tells_a_missing_pool_from_a_missing_resource() -> None:
    pool_absent = (
        '{"kind":"Status","status":"Failure","reason":"NotFound","code":404,'
        '"details":{"name":"llm","group":"inference.networking.k8s.io","kind":"inferencepools"}}'
    )
    assert missing_object(Refusal(pool_absent), "inferencepools", "llm")  # type: ignore[arg-type]
    assert not missing_object(Refusal("404 page not found"), "inferencepools", "llm")  # type: ignore[arg-type]
    resource_absent = '{"kind":"Status","reason":"NotFound","details":{}}'
    assert not missing_object(Refusal(resource_absent), "inferencepools", "llm")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------- scale from zero
# The loop itself: tests/unit/test_scale_from_zero.py.


def test_watched_keeps_only_services_that_set_scale_from_zero() -> None:
    store = {("t1", "llm"): pool_body({**POOL, "scaleFromZero": {}}, replicas=0)}
    watched = Watched(lambda namespace, name: store.get((namespace, name)))
    watched.observe(store[("t1", "llm")], deleted=False)
    watched.observe(pool_body(POOL) | {"metadata": {"namespace": "t1", "name": "plain"}}, deleted=False)
    assert [b["metadata"]["name"] for b in watched.services()] == ["llm"]
    watched.observe(store[("t1", "llm")], deleted=True)
    assert watched.services() == []
