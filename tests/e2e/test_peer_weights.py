"""coldStart.peerWeights on the real control plane (kwok nodes): the per-rank Services without a selector,
their EndpointSlices following the serving pods' readiness and cache key, never listing a pod of another
service or namespace, the NetworkPolicies' shape, everything gone when peer weights are turned off, and the
API server's refusals naming the field.

The loader itself (ModelExpress over NIXL) needs GPUs and is not run here (issue 39)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.helpers import apply, get_json, get_service, other_namespace, owned_by, qwen, wait_for

pytestmark = pytest.mark.e2e
__all__ = ["other_namespace"]  # the fixture, used by name

NAME = "peer"
SERVER = {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/component": "server"}


def peer_service(replicas: int = 2, **cold_start: Any) -> dict[str, Any]:
    manifest = qwen(NAME, replicas=replicas)
    manifest["spec"]["coldStart"].update(peerWeights={"enabled": True}, **cold_start)
    return manifest


def serving_pods(kubectl: Any, namespace: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{key}={value}" for key, value in SERVER.items())
    pods = get_json(kubectl, "-n", namespace, "pods", "-l", selector) or {"items": []}
    return [pod for pod in pods["items"] if not pod["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def listed(kubectl: Any, namespace: str) -> set[str]:
    """The pods the rank-0 EndpointSlice lists."""
    found = get_json(kubectl, "-n", namespace, "endpointslice", f"{NAME}-peers-r0") or {}
    return {e["targetRef"]["name"] for e in found.get("endpoints") or []}


def impostor(namespace: str, name: str, like: dict[str, Any]) -> dict[str, Any]:
    """A plain pod carrying a serving pod's labels and annotations (its cache key), on a kwok node; not its
    pod-template-hash, which would have the ReplicaSet adopt it (as any pod the namespace's users create
    to match it)."""
    labels = {k: v for k, v in like["metadata"]["labels"].items() if k != "pod-template-hash"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": like["metadata"].get("annotations") or {},
        },
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "vllm", "image": like["spec"]["containers"][0]["image"]}],
        },
    }


def test_refusals_name_the_field(namespace: str, kubectl: Any, crd: None) -> None:
    for cold_start, field in (
        ({"loader": {"format": "fastsafetensors"}}, "spec.coldStart.loader.format"),
        ({"standby": {"replicas": 1}}, "spec.coldStart.standby"),
    ):
        text = json.dumps(peer_service(**cold_start))
        refused = kubectl("-n", namespace, "apply", "-f", "-", input=text, check=False)
        assert refused.returncode != 0
        assert field in refused.stderr and "coldStart.peerWeights" in refused.stderr, refused.stderr


def test_endpoint_slices_follow_readiness_and_key_and_never_list_another_s_pods(
    namespace: str, other_namespace: str, kubectl: Any, operator: Any
) -> None:
    apply(kubectl, namespace, peer_service())
    owner = get_service(kubectl, namespace, NAME)

    # The Service: no selector, one port to rank 0's manifest port, owned like the other children.
    service = wait_for(lambda: get_json(kubectl, "-n", namespace, "service", f"{NAME}-peers-r0"), what="r0")
    assert "selector" not in service["spec"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(6555, 6555)]
    assert owned_by(service, owner)
    assert get_json(kubectl, "-n", namespace, "service", f"{NAME}-peers-r1") is None

    # The NetworkPolicies: peer ports from this service's serving pods only; the serving port open.
    peers = wait_for(lambda: get_json(kubectl, "-n", namespace, "networkpolicy", f"{NAME}-peers"), what="np")
    assert owned_by(peers, owner)
    assert peers["spec"]["podSelector"] == {"matchLabels": SERVER}
    (rule,) = peers["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": SERVER}}]
    assert {(p["port"], p.get("endPort")) for p in rule["ports"]} == {
        (6555, None),
        (5555, None),
        (20000, 20099),
    }
    serving = get_json(kubectl, "-n", namespace, "networkpolicy", f"{NAME}-serving")
    assert serving is not None and serving["spec"]["ingress"] == [
        {"ports": [{"port": 8000, "protocol": "TCP"}]}
    ]

    # Both Ready serving pods, with their IPs, and nothing else.
    pods = wait_for(
        lambda: (
            (found := serving_pods(kubectl, namespace))
            and len(found) == 2
            and all(map(ready, found))
            and found
        ),
        what="two Ready serving pods",
    )
    names = {pod["metadata"]["name"] for pod in pods}
    wait_for(lambda: listed(kubectl, namespace) == names, what="the EndpointSlice lists both pods")
    endpoint_slice = get_json(kubectl, "-n", namespace, "endpointslice", f"{NAME}-peers-r0")
    assert endpoint_slice is not None and owned_by(endpoint_slice, owner)
    assert endpoint_slice["metadata"]["labels"]["kubernetes.io/service-name"] == f"{NAME}-peers-r0"
    addresses = {e["addresses"][0] for e in endpoint_slice["endpoints"]}
    assert addresses == {pod["status"]["podIP"] for pod in pods}
    assert endpoint_slice["ports"] == [{"name": "mx-grpc", "port": 6555, "protocol": "TCP"}]

    # Pods that look like serving pods, here and in another namespace, Ready: never listed.
    for where, name in ((namespace, "impostor"), (other_namespace, "elsewhere")):
        kubectl("apply", "-f", "-", input=json.dumps(impostor(where, name, pods[0])))
    wait_for(
        lambda: all(ready(get_json(kubectl, "-n", ns, "pod", n) or {}) for ns, n in
                    ((namespace, "impostor"), (other_namespace, "elsewhere"))),
        what="the look-alike pods Ready",
    )  # fmt: skip

    # A pod turning unready leaves the slice (and the look-alikes are still not in it).
    gone = sorted(names)[0]
    unready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    kubectl("-n", namespace, "patch", "pod", gone, "--subresource=status", "-p", json.dumps(unready))
    wait_for(lambda: listed(kubectl, namespace) == names - {gone}, what="the unready pod leaves the slice")

    # A new cache key: once its pods are Ready, only they are listed.
    old_key = get_service(kubectl, namespace, NAME)["status"]["cache"]["key"]
    edited = peer_service()
    edited["spec"]["runtime"]["maxModelLen"] = 2048
    apply(kubectl, namespace, edited)

    def only_new_key() -> bool:
        key = (get_service(kubectl, namespace, NAME).get("status") or {}).get("cache", {}).get("key")
        current = {
            pod["metadata"]["name"]
            for pod in serving_pods(kubectl, namespace)
            if ready(pod) and pod["metadata"]["annotations"].get("stoker.dev/cache-key") == key
        }
        return key != old_key and len(current) == 2 and listed(kubectl, namespace) == current

    wait_for(only_new_key, timeout=90, what="the slice lists the new key's Ready pods only")
    assert not listed(kubectl, namespace) & {"impostor", "elsewhere", *names}

    # Turned off: the peer Services, EndpointSlices and NetworkPolicies go.
    off = peer_service()
    off["spec"]["runtime"]["maxModelLen"] = 2048
    off["spec"]["coldStart"]["peerWeights"]["enabled"] = False
    apply(kubectl, namespace, off)
    wait_for(
        lambda: all(
            get_json(kubectl, "-n", namespace, kind, name) is None
            for kind, name in (
                ("service", f"{NAME}-peers-r0"),
                ("endpointslice", f"{NAME}-peers-r0"),
                ("networkpolicy", f"{NAME}-peers"),
                ("networkpolicy", f"{NAME}-serving"),
            )
        ),
        what="the peer children deleted",
    )
