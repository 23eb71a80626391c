"""coldStart.peerWeights: serving replicas load their weights from a Ready replica of the same VLLMService
through vLLM's `modelexpress` loader (ModelExpress's k8s-service backend, NIXL over UCX).

Every serving pod is a target first and a source once it has loaded: ModelExpress dials the Service named
by MX_K8S_SERVICE_PATTERN for its own rank, fetches the tensor manifest from whichever pod answers, then
reads the weights from that pod directly on its NIXL listener and UCX ports. ModelExpress creates nothing
in the cluster; stoker keeps, per tensor-parallel rank, a Service without a selector whose EndpointSlice it
writes itself (only Ready serving pods of this VLLMService with the current cache key and image: a pod a
tenant labels cannot become a source), and a NetworkPolicy admitting the peer ports from this service's
serving pods only. Nothing on the peer path authenticates (ModelExpress 0.7.0 has plaintext gRPC and no
token on the worker channel): the policy is the only control (docs/concepts/peer-weights.md).

When no peer answers, ModelExpress loads from storage with its own strategies; `fallback_env` maps
coldStart.loader's choice onto them so that such a replica loads as it does without peers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stoker.api import VLLMService
from stoker.render.cachekey import cache_key
from stoker.render.engine import INSTANTTENSOR, PORT, STREAMER, load_format, model_string
from stoker.render.names import (
    Json,
    common_labels,
    object_meta,
    peer_policy_name,
    peer_service_name,
    server_selector_labels,
    serving_policy_name,
)

COMPONENT_PEERS = "peers"
# ModelExpress's defaults (envs.py), set explicitly so that the container ports, the Services and the
# NetworkPolicy list the same numbers: rank R binds MANIFEST_PORT + R (gRPC manifest server) and
# NIXL_PORT + R (NIXL metadata listener).
MANIFEST_PORT = 6555
NIXL_PORT = 5555
# UCX's TCP data connections: a fixed range (UCX_TCP_PORT_RANGE) so that the NetworkPolicy can name it;
# UCX otherwise lets the OS pick any port.
UCX_PORTS = (20000, 20099)
# A peer with another identity (FAILED_PRECONDITION) is tried once, not 5 times: the EndpointSlice lists
# only pods of the current key, so a mismatch is a rollout's moment, and storage is the answer.
SOURCE_RETRIES = 1
# Set on every serving pod of a service with peer weights: the operator follows these pods' readiness
# both ways (its EndpointSlices list the Ready ones), not only their turning Ready.
PEER_LABEL = "stoker.dev/peer-weights"
ENDPOINT_SLICE_MANAGER = "stoker.dev"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_SLICE_LABEL = "endpointslice.kubernetes.io/managed-by"
PEER_KINDS = ("NetworkPolicy", "Service", "EndpointSlice")


def peers_enabled(svc: VLLMService) -> bool:
    return svc.spec.cold_start.peer_weights.enabled


def ranks(svc: VLLMService) -> range:
    """The tensor-parallel ranks of a replica, each with its own Service (peer weights need one pod per
    replica and no pipeline or data parallel: the API refuses the rest)."""
    return range(svc.spec.runtime.effective_tensor_parallel_size)


def service_pattern(svc: VLLMService) -> str:
    """MX_K8S_SERVICE_PATTERN: fully qualified (no search-path lookups), with the port explicit, so that
    ModelExpress dials `<name>-peers-r<rank>` on MANIFEST_PORT and uses it verbatim. Without a namespace
    (`stoker render` of a manifest that names none) the pods' own is `default`, as kubectl's is."""
    return f"{peer_service_name(svc.name, '{rank}')}.{svc.namespace or 'default'}.svc:{MANIFEST_PORT}"


def fallback_env(svc: VLLMService) -> dict[str, str]:
    """ModelExpress's switches for loading from storage as coldStart.loader does today: instanttensor is
    its InstantTensor strategy; the streamer its model_streamer strategy on the model's URI (an s3 URI or
    the directory on the volume); safetensors and auto vLLM's DefaultModelLoader. A hub model without a
    volume is loaded by the DefaultModelLoader too (ModelExpress streams no hub id). fastsafetensors has
    no counterpart: the API refuses it with peer weights."""
    chosen = load_format(svc)
    if chosen == INSTANTTENSOR:
        return {"MX_INSTANT_TENSOR": "1"}
    env = {"MX_INSTANT_TENSOR": "0"}
    uri = model_string(svc)
    if chosen == STREAMER and (uri.startswith("s3://") or uri.startswith("/")):
        env["MX_MODEL_URI"] = uri
    return env


def storage_loader(env: Mapping[str, str]) -> str:
    """The load format ModelExpress falls back to under `env` (what `fallback_env` set): the loader that
    reads storage when no peer serves the weights."""
    if env.get("MX_INSTANT_TENSOR") == "1":
        return INSTANTTENSOR
    if "MX_MODEL_URI" in env:
        return STREAMER
    return "auto"


def peer_env(svc: VLLMService) -> list[Json]:
    """The serving container's ModelExpress environment (the seed loads dummy weights and has none)."""
    plain = {
        "MX_METADATA_BACKEND": "k8s-service",
        "MX_K8S_SERVICE_PATTERN": service_pattern(svc),
        "MX_WORKER_GRPC_PORT": str(MANIFEST_PORT),
        "MX_METADATA_PORT": str(NIXL_PORT),
        # Part of ModelExpress's source identity: a peer of another key is refused by the peer itself.
        "MX_MODEL_REVISION": cache_key(svc),
        "MX_TRANSFER_TIMEOUT": str(svc.spec.cold_start.peer_weights.transfer_timeout_seconds),
        "MX_K8S_SOURCE_RETRIES": str(SOURCE_RETRIES),
        "MX_METRICS_ENABLED": "0",
        "UCX_TCP_PORT_RANGE": f"{UCX_PORTS[0]}-{UCX_PORTS[1]}",
        **fallback_env(svc),
    }
    # The address it advertises to peers; unset, ModelExpress guesses it from a route to 8.8.8.8.
    host = {"name": "MX_WORKER_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    return [*({"name": name, "value": value} for name, value in plain.items()), host]


def peer_container_ports(svc: VLLMService) -> list[Json]:
    return [
        {"name": f"{prefix}-{rank}", "containerPort": base + rank, "protocol": "TCP"}
        for rank in ranks(svc)
        for prefix, base in (("mx-grpc", MANIFEST_PORT), ("nixl", NIXL_PORT))
    ]


def peer_labels(name: str) -> dict[str, str]:
    """On every peer child: the controller deletes those it no longer renders (peer weights turned off,
    fewer ranks)."""
    return common_labels(name, COMPONENT_PEERS)


def _labels(svc: VLLMService) -> dict[str, str]:
    return peer_labels(svc.name)


def build_peer_services(svc: VLLMService) -> list[Json]:
    """One Service per rank, without a selector: its endpoints are what build_endpoint_slices lists."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(svc, peer_service_name(svc.name, rank), _labels(svc)),
            "spec": {
                "type": "ClusterIP",
                "ports": [
                    {
                        "name": "mx-grpc",
                        "port": MANIFEST_PORT,
                        "targetPort": MANIFEST_PORT + rank,
                        "protocol": "TCP",
                    }
                ],
            },
        }
        for rank in ranks(svc)
    ]


@dataclass(frozen=True)
class Peer:
    """A serving pod that may serve its weights (the controller picks them: controller/peers.py)."""

    pod: str
    uid: str
    ip: str
    node: str | None


def _endpoint(svc: VLLMService, peer: Peer) -> Json:
    endpoint: Json = {
        "addresses": [peer.ip],
        "conditions": {"ready": True},
        "targetRef": {"kind": "Pod", "namespace": svc.namespace, "name": peer.pod, "uid": peer.uid},
    }
    if peer.node:
        endpoint["nodeName"] = peer.node
    return endpoint


def build_endpoint_slices(svc: VLLMService, sources: list[Peer]) -> list[Json]:
    """Each rank Service's EndpointSlice: `sources`, on that rank's manifest port. One address family, the
    pods' primary one (status.podIP): IPv6 if any source's is."""
    family = "IPv6" if any(":" in peer.ip for peer in sources) else "IPv4"
    slices = []
    for rank in ranks(svc):
        service = peer_service_name(svc.name, rank)
        labels = {**_labels(svc), SERVICE_NAME_LABEL: service, MANAGED_BY_SLICE_LABEL: ENDPOINT_SLICE_MANAGER}
        slices.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": object_meta(svc, service, labels),
                "addressType": family,
                "ports": [{"name": "mx-grpc", "port": MANIFEST_PORT + rank, "protocol": "TCP"}],
                "endpoints": [
                    _endpoint(svc, peer) for peer in sources if (":" in peer.ip) == (family == "IPv6")
                ],
            }
        )
    return slices


def _port_range(first: int, last: int) -> Json:
    port: Json = {"protocol": "TCP", "port": first}
    if last > first:
        port["endPort"] = last
    return port


def build_network_policies(svc: VLLMService) -> list[Json]:
    """The peer policy: this service's serving pods accept the ModelExpress ports (manifest, NIXL
    listener, UCX data) from this service's serving pods, in this namespace, and from nowhere else. A
    policy selecting a pod closes every port no policy opens, so a second one keeps the serving port
    (the API and /metrics) open from anywhere, as it was without peer weights."""
    tp = svc.spec.runtime.effective_tensor_parallel_size
    selector = {"matchLabels": server_selector_labels(svc.name)}
    peer_ports = [
        _port_range(MANIFEST_PORT, MANIFEST_PORT + tp - 1),
        _port_range(NIXL_PORT, NIXL_PORT + tp - 1),
        _port_range(*UCX_PORTS),
    ]
    labels = _labels(svc)
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": object_meta(svc, peer_policy_name(svc.name), labels),
            "spec": {
                "podSelector": selector,
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": selector}], "ports": peer_ports}],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": object_meta(svc, serving_policy_name(svc.name), labels),
            "spec": {
                "podSelector": selector,
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"protocol": "TCP", "port": PORT}]}],
            },
        },
    ]


def build_peer_children(svc: VLLMService, sources: list[Peer]) -> list[Json]:
    """The NetworkPolicies first (no peer port is reachable before they exist), the rank Services and
    their EndpointSlices listing `sources`; nothing without peer weights."""
    if not peers_enabled(svc):
        return []
    return [*build_network_policies(svc), *build_peer_services(svc), *build_endpoint_slices(svc, sources)]
