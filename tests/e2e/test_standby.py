"""Standby replicas on the real control plane, with a vLLM test double listening on each fake pod's IP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.fleet import ROLE, Fleet, settled, sleeps, standby_service
from tests.e2e.helpers import get_json, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def fleet(namespace: str, kubectl: Any, operator: Any, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    name, replicas, wake_timeout = request.param
    kubectl(
        "-n", namespace, "apply", "-f", "-", input=json.dumps(standby_service(name, replicas, wake_timeout))
    )
    with Fleet(kubectl, namespace, name) as running:
        yield running


def endpoint_ips(fleet: Fleet) -> set[str]:
    slices = get_json(
        fleet.kubectl,
        "-n",
        fleet.namespace,
        "endpointslices",
        "-l",
        f"kubernetes.io/service-name={fleet.name}",
    )
    return {
        address
        for item in (slices or {"items": []})["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def pod_ips(fleet: Fleet, names: list[str]) -> set[str]:
    return {pod["status"]["podIP"] for pod in fleet.pods() if pod["metadata"]["name"] in names}


def events(fleet: Fleet, reason: str) -> list[str]:
    found = get_json(
        fleet.kubectl, "-n", fleet.namespace, "events", "--field-selector", f"reason={reason}"
    ) or {"items": []}
    return [event["message"] for event in found["items"]]


@pytest.mark.parametrize("fleet", [("pool", 1, 10)], indirect=True)
def test_standby_sleeps_out_of_the_service_and_wakes_on_scale_up(fleet: Fleet) -> None:
    svc = wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby")
    roles = fleet.by_role()
    (sleeper,) = roles["standby"]
    (server,) = roles["active"]
    # Put to sleep through the guarded endpoint with the token, at the spec's level, after in-flight work.
    assert fleet.engine(sleeper).sleeping
    assert sleeps(fleet.engine(sleeper)) == [{"level": ["1"], "mode": ["wait"]}]
    assert not sleeps(fleet.engine(server))
    pods = {pod["metadata"]["name"]: pod for pod in fleet.pods()}
    annotations = pods[sleeper]["metadata"]["annotations"]
    assert annotations["controller.kubernetes.io/pod-deletion-cost"] == "-100"
    assert "stoker.dev/asleep-at" in annotations
    # Only the active pod is behind the Service; an HPA measures the active pods only.
    service = get_json(fleet.kubectl, "-n", fleet.namespace, "service", fleet.name)
    assert service and service["spec"]["selector"][ROLE] == "active"
    wait_for(lambda: endpoint_ips(fleet) == pod_ips(fleet, [server]), what="endpoints = the active pod")
    assert svc["status"]["selector"].endswith(",stoker.dev/role=active")
    assert {p["pod"]: p["role"] for p in svc["status"]["standby"]["pods"]} == {
        server: "active",
        sleeper: "standby",
    }
    deployment = get_json(fleet.kubectl, "-n", fleet.namespace, "deployment", fleet.name)
    assert deployment and deployment["spec"]["replicas"] == 2

    # Scale up through the scale subresource, as an HPA does: the sleeper wakes and serves at once.
    fleet.kubectl("-n", fleet.namespace, "scale", "vllmservice", fleet.name, "--replicas=2")
    wait_for(lambda: sleeper in fleet.by_role()["active"], what="the standby pod to become active")
    engine = fleet.engine(sleeper)
    assert not engine.sleeping
    assert engine.paths()[-3:] == [("POST", "/wake_up"), ("GET", "/health"), ("POST", "/v1/completions")]
    assert any(sleeper in message and "served a completion" in message for message in events(fleet, "Woke"))
    # The Deployment replaced the woken standby: a new pod comes up and goes to sleep in its turn.
    svc = wait_for(lambda: settled(fleet, active=2, standby=1), what="2 active and 1 asleep standby")
    assert svc["status"]["standby"]["lastWake"]["pod"] == sleeper
    assert svc["status"]["standby"]["lastWake"]["servedSeconds"] > 0
    wait_for(
        lambda: (
            endpoint_ips(fleet) == pod_ips(fleet, fleet.by_role()["active"]) and len(endpoint_ips(fleet)) == 2
        ),
        what="endpoints = the two active pods",
    )

    # Scale down: an active pod goes back to standby first, then the surplus standby is deleted.
    fleet.kubectl("-n", fleet.namespace, "scale", "vllmservice", fleet.name, "--replicas=1")
    wait_for(lambda: settled(fleet, active=1, standby=1), what="back to 1 active and 1 asleep standby")
    assert events(fleet, "Demoted")


@pytest.mark.parametrize("fleet", [("idle", 1, 10)], indirect=True)
def test_scale_to_zero_keeps_no_engine_awake_and_a_scale_from_zero_wakes_one(fleet: Fleet) -> None:
    wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby")
    (server,) = fleet.by_role()["active"]
    fleet.kubectl("-n", fleet.namespace, "scale", "vllmservice", fleet.name, "--replicas=0")
    # The awake engine leaves the Service and falls asleep (or is the one surplus pod deleted): none awake.
    wait_for(lambda: settled(fleet, active=0, standby=1), what="0 active and 1 asleep standby")
    (sleeper,) = fleet.by_role()["standby"]
    assert fleet.engine(sleeper).sleeping
    if sleeper == server:
        assert sleeps(fleet.engine(server)), "the formerly active engine was put to sleep, not deleted"
    assert endpoint_ips(fleet) == set()

    # From zero, as an autoscaler does through the scale subresource: the sleeper wakes and serves.
    fleet.kubectl("-n", fleet.namespace, "scale", "vllmservice", fleet.name, "--replicas=1")
    wait_for(lambda: sleeper in fleet.by_role()["active"], what="the sleeping pod to wake")
    assert not fleet.engine(sleeper).sleeping
    assert any(sleeper in message and "served a completion" in message for message in events(fleet, "Woke"))
    wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby again")


@pytest.mark.parametrize("fleet", [("stuck", 1, 1)], indirect=True)
def test_a_standby_that_does_not_wake_in_time_is_replaced_not_served(fleet: Fleet) -> None:
    wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby")
    (stuck,) = fleet.by_role()["standby"]
    fleet.engine(stuck).wake_delay = 3.0  # longer than wakeTimeoutSeconds: 1
    fleet.kubectl("-n", fleet.namespace, "scale", "vllmservice", fleet.name, "--replicas=2")
    wait_for(
        lambda: any(stuck in message for message in events(fleet, "WakeFailed")), what="a WakeFailed Event"
    )
    # Never served: deleted, and the Deployment's new pods fill both the active and the standby places.
    svc = wait_for(lambda: settled(fleet, active=2, standby=1), what="2 active and 1 asleep standby")
    assert stuck not in {pod["metadata"]["name"] for pod in fleet.pods()}
    assert svc["status"]["standby"]["lastWake"]["failed"] is True


@pytest.mark.parametrize("fleet", [("awake", 1, 10)], indirect=True)
def test_a_standby_found_awake_is_put_back_to_sleep(fleet: Fleet) -> None:
    """An operator that died after /wake_up but before relabelling leaves an awake standby; the next resync
    asks the engine and puts it back to sleep."""
    wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby")
    (sleeper,) = fleet.by_role()["standby"]
    engine = fleet.engine(sleeper)
    engine.sleeping = False
    wait_for(lambda: len(sleeps(engine)) == 2 and engine.sleeping, timeout=60, what="a second sleep")
    assert ("GET", "/is_sleeping") in engine.paths()
    assert fleet.by_role()["standby"] == [sleeper]
