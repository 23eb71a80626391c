"""Standby engines of two VLLMServices sharing one GPU through DRA (coldStart.standby.sharedGpu), on the real
control plane: hack/cluster's fake nodes publish their GPUs as ResourceSlices of class gpu.nvidia.com, the
scheduler allocates the namespace's ResourceClaim to one device, and every engine of both services runs on
that device's node, with a vLLM test double on each fake pod's IP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from stoker.render import GPU_SHARE_CLAIM, GPU_SHARE_GATE
from tests.e2e.fleet import Fleet, settled, standby_service
from tests.e2e.helpers import get_json, wait_for

pytestmark = pytest.mark.e2e

CLAIM = "shared-h100"
DEVICE_CLASS = "gpu.nvidia.com"  # hack/cluster's, the NVIDIA DRA driver's name
SERVICES = ("alpha", "beta")
ENGINES = 2  # standby.replicas: the engines of each service on the shared GPU, awake or asleep


def shared_service(name: str) -> dict[str, Any]:
    manifest = standby_service(name, replicas=1)
    manifest["spec"]["runtime"]["gpuMemoryUtilization"] = 0.3
    manifest["spec"]["coldStart"]["standby"].update(replicas=ENGINES, sharedGpu={"resourceClaimName": CLAIM})
    return manifest


def resource_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1}}]
            }
        },
    }


@pytest.fixture
def fleets(namespace: str, kubectl: Any, operator: Any) -> Iterator[dict[str, Fleet]]:
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(resource_claim()))
    for name in SERVICES:
        kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(shared_service(name)))
    with ExitStack() as stack:
        yield {name: stack.enter_context(Fleet(kubectl, namespace, name)) for name in SERVICES}


def all_pods(fleets: dict[str, Fleet]) -> list[dict[str, Any]]:
    return [pod for fleet in fleets.values() for pod in fleet.pods()]


def gated(pod: dict[str, Any]) -> bool:
    return any(gate["name"] == GPU_SHARE_GATE for gate in pod["spec"].get("schedulingGates") or [])


def events(fleet: Fleet, reason: str) -> list[str]:
    found = get_json(
        fleet.kubectl,
        "-n",
        fleet.namespace,
        "events",
        "--field-selector",
        f"reason={reason},involvedObject.name={fleet.name}",
    ) or {"items": []}
    return [event["message"] for event in found["items"]]


def test_engines_of_two_services_share_the_claims_one_device(
    fleets: dict[str, Fleet], namespace: str, kubectl: Any
) -> None:
    # Each Deployment runs standby.replicas pods (not replicas + standby), created behind the gate, with the
    # claim instead of a GPU of their own.
    for name in SERVICES:
        deployment = wait_for(
            lambda name=name: get_json(kubectl, "-n", namespace, "deployment", name),
            what=f"{name} Deployment",
        )
        assert deployment["spec"]["replicas"] == ENGINES
        assert deployment["spec"]["template"]["spec"]["schedulingGates"] == [{"name": GPU_SHARE_GATE}]
    pods = wait_for(
        lambda: (found := all_pods(fleets)) and len(found) == ENGINES * len(SERVICES) and found,
        what="every engine's pod",
    )
    for pod in pods:
        assert pod["spec"]["resourceClaims"] == [{"name": GPU_SHARE_CLAIM, "resourceClaimName": CLAIM}]
        (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        assert engine["resources"]["claims"] == [{"name": GPU_SHARE_CLAIM}]
        assert "nvidia.com/gpu" not in (engine["resources"].get("limits") or {})

    # The operator lifts the gates one engine at a time, each once its share fits beside the awake ones
    # (0.3 each: three fit awake, so the fourth starts only after a surplus engine fell asleep). Each service
    # then keeps one engine awake (runtime.replicas) and the other asleep.
    for fleet in fleets.values():
        wait_for(
            lambda fleet=fleet: settled(fleet, active=1, standby=1), what=f"{fleet.name}: 1 awake, 1 asleep"
        )
    # Every engine started through the gate, once. A kwok pod is Ready before its test double listens, so a
    # standby the operator could not put to sleep may be replaced (SleepFailed): its successor starts too.
    started = [message for fleet in fleets.values() for message in events(fleet, "StartingOnSharedGpu")]
    replaced = [message for fleet in fleets.values() for message in events(fleet, "SleepFailed")]
    engines = [pod["metadata"]["name"] for pod in all_pods(fleets)]
    assert len(engines) == ENGINES * len(SERVICES)
    assert len(started) == len(engines) + len(replaced), (started, replaced)
    assert all(any(f"Pod {pod} may start" in message for message in started) for pod in engines), started

    # The claim is allocated once, to one device, and reserved for every engine of both services.
    claim = get_json(kubectl, "-n", namespace, "resourceclaim", CLAIM)
    assert claim
    allocation = claim["status"]["allocation"]
    (device,) = allocation["devices"]["results"]
    assert device["driver"] == DEVICE_CLASS and device["device"].startswith("gpu-")
    (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
    (node,) = term["matchFields"][0]["values"]
    assert device["pool"] == node  # hack/cluster: one pool per node, named after it
    running = {pod["metadata"]["uid"]: pod for pod in all_pods(fleets)}
    assert len(running) == ENGINES * len(SERVICES)
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == set(running)
    for pod in running.values():
        assert pod["spec"]["nodeName"] == node
        assert not gated(pod)

    # Both services see every engine on the device in their status.
    alpha, beta = fleets["alpha"], fleets["beta"]

    def shared_status() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", beta.name)
        shared = ((svc or {}).get("status") or {}).get("standby", {}).get("sharedGpu") or {}
        engines = shared.get("engines") or []
        return shared if len(engines) == 4 and sum(e["awake"] for e in engines) == 2 else None

    shared = wait_for(shared_status, what="beta's status: 4 engines on the device, 2 awake")
    assert shared["resourceClaimName"] == CLAIM
    assert {engine["service"] for engine in shared["engines"]} == set(SERVICES)

    # alpha wants both its engines awake: the third fits. beta then wants its second too: four do not fit,
    # and every awake engine serves, so beta waits and says why.
    kubectl("-n", namespace, "scale", "vllmservice", alpha.name, "--replicas=2")
    wait_for(lambda: settled(alpha, active=2, standby=0), what="alpha: 2 awake")
    kubectl("-n", namespace, "scale", "vllmservice", beta.name, "--replicas=2")
    wait_for(lambda: events(beta, "WaitingForGPU"), what="beta waiting for the GPU")
    awake_alpha = alpha.by_role()["active"]
    svc = get_json(kubectl, "-n", namespace, "vllmservice", beta.name)
    assert all(pod in svc["status"]["standby"]["sharedGpu"]["waiting"] for pod in awake_alpha)
    assert not any(alpha.engine(pod).sleeping for pod in awake_alpha)

    # alpha scales to zero: its engine, no longer wanted, falls asleep (its own drain, or put to sleep at
    # once to make room), and beta's second engine wakes: the engines stay on the GPU, none is deleted.
    kubectl("-n", namespace, "scale", "vllmservice", alpha.name, "--replicas=0")
    wait_for(lambda: settled(alpha, active=0, standby=ENGINES), what="alpha: 0 awake, 2 asleep")
    wait_for(lambda: settled(beta, active=2, standby=0), what="beta: 2 awake")
    assert all(alpha.engine(pod).sleeping for pod in awake_alpha)
    deployment = get_json(kubectl, "-n", namespace, "deployment", alpha.name)
    assert deployment and deployment["spec"]["replicas"] == ENGINES
    claim = get_json(kubectl, "-n", namespace, "resourceclaim", CLAIM)
    assert claim and {r["uid"] for r in claim["status"]["reservedFor"]} == set(running)
