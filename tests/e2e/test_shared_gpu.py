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
    manifest["spec"]["runtime"]["gpuMemoryUtilization"] = 0.4
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


def lift_gate(kubectl: Any, namespace: str, pod: str) -> None:
    # TODO(shared GPU planner): the operator lifts the gate, one pod at a time per shared GPU, when the
    # engine's gpuMemoryUtilization share is free; until then the test stands in for it. Removing a gate is
    # the only change the API server allows to spec.schedulingGates.
    patch = [{"op": "remove", "path": "/spec/schedulingGates"}]
    kubectl("-n", namespace, "patch", "pod", pod, "--type=json", "-p", json.dumps(patch))


def test_engines_of_two_services_share_the_claims_one_device(
    fleets: dict[str, Fleet], namespace: str, kubectl: Any
) -> None:
    # Each Deployment runs standby.replicas pods (not replicas + standby), all created behind the gate,
    # none scheduled, so the claim is not allocated yet.
    for name in SERVICES:
        deployment = wait_for(
            lambda name=name: get_json(kubectl, "-n", namespace, "deployment", name),
            what=f"{name} Deployment",
        )
        assert deployment["spec"]["replicas"] == ENGINES
    pods = wait_for(
        lambda: (found := all_pods(fleets)) and len(found) == ENGINES * len(SERVICES) and found,
        what="every engine's pod",
    )
    for pod in pods:
        assert gated(pod), pod["spec"].get("schedulingGates")
        assert not pod["spec"].get("nodeName")
        assert pod["spec"]["resourceClaims"] == [{"name": GPU_SHARE_CLAIM, "resourceClaimName": CLAIM}]
        (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        assert engine["resources"]["claims"] == [{"name": GPU_SHARE_CLAIM}]
        assert "nvidia.com/gpu" not in (engine["resources"].get("limits") or {})
    claim = get_json(kubectl, "-n", namespace, "resourceclaim", CLAIM)
    assert claim and not (claim.get("status") or {}).get("allocation")

    # One engine at a time: each starts only once the one before it runs (the planner will also wait for
    # its memory share to be free).
    for pod in sorted(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"])):
        name = pod["metadata"]["name"]
        lift_gate(kubectl, namespace, name)
        wait_for(
            lambda name=name: (
                (found := get_json(kubectl, "-n", namespace, "pod", name))
                and found["status"].get("phase") == "Running"
            ),
            what=f"{name} Running",
        )

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
    assert {r["resource"] for r in claim["status"]["reservedFor"]} == {"pods"}
    for pod in running.values():
        assert pod["spec"]["nodeName"] == node
        assert not gated(pod)

    # The standby pool of each service works on the shared GPU as on GPUs of their own: one engine each
    # serves (runtime.replicas), the other sleeps.
    for fleet in fleets.values():
        wait_for(
            lambda fleet=fleet: settled(fleet, active=1, standby=1), what=f"{fleet.name}: 1 awake, 1 asleep"
        )

    # Scale to zero keeps the engines, asleep, on the GPU: the Deployment still runs standby.replicas pods.
    alpha = fleets["alpha"]
    kubectl("-n", namespace, "scale", "vllmservice", alpha.name, "--replicas=0")
    wait_for(lambda: settled(alpha, active=0, standby=ENGINES), what="alpha: 0 awake, 2 asleep")
    deployment = get_json(kubectl, "-n", namespace, "deployment", alpha.name)
    assert deployment and deployment["spec"]["replicas"] == ENGINES
    claim = get_json(kubectl, "-n", namespace, "resourceclaim", CLAIM)
    assert claim and {r["uid"] for r in claim["status"]["reservedFor"]} == set(running)
