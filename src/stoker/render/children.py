"""All children of a VLLMService, in apply order."""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.control import build_control_secret
from stoker.render.deployment import build_deployment
from stoker.render.group import LWS_KIND, build_leader_worker_set, build_seed_group_service, multi_node
from stoker.render.inferencepool import build_inference_pool
from stoker.render.names import Json
from stoker.render.nodewarmer import Warming, build_node_warmer
from stoker.render.peers import Peer, build_peer_children
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE
from stoker.render.pvc import build_cache_pvc, build_model_pvc
from stoker.render.seed import build_seed_job
from stoker.render.service import build_service
from stoker.render.snapshot import Snapshots, snapshotted_asleep


def seed_wanted(svc: VLLMService) -> bool:
    cold_start = svc.spec.cold_start
    return cold_start.seed.enabled and cold_start.compile_cache.enabled


def build_serving(
    svc: VLLMService,
    *,
    replicas: int | None = None,
    programs_image: str = DEFAULT_PROGRAMS_IMAGE,
    snapshots: Snapshots | None = None,
) -> Json:
    """What runs the replicas: a Deployment (its pods made for `snapshots` where the service allows), or
    with runtime.nodesPerReplica above 1 a LeaderWorkerSet of that many pods per replica (render.group)."""
    if multi_node(svc):
        return build_leader_worker_set(svc, replicas=replicas, programs_image=programs_image)
    return build_deployment(svc, replicas=replicas, programs_image=programs_image, snapshots=snapshots)


SERVING_KINDS = ("Deployment", LWS_KIND)


def serving_kind(svc: VLLMService) -> str:
    return LWS_KIND if multi_node(svc) else "Deployment"


def render_children(
    svc: VLLMService,
    *,
    serving_replicas: int | None = None,
    control_token: str | None = None,
    programs_image: str = DEFAULT_PROGRAMS_IMAGE,
    warming: Warming | None = None,
    peer_sources: list[Peer] | None = None,
    snapshots: Snapshots | None = None,
) -> list[Json]:
    """Control Secret, PVCs, seed Job (for a multi-node service with its headless Service), Deployment or
    LeaderWorkerSet (build_serving), Service, with `warming` (the operator's decision for
    coldStart.nodeWarming, controller/warming.py) the node warmer DaemonSet, with coldStart.peerWeights the
    peer NetworkPolicies, Services and EndpointSlices (listing `peer_sources`, the controller's pick of
    the serving pods, controller/peers.py; none in `stoker render`), and with spec.inferencePool
    the InferencePool (last: its CRD may be missing, and nothing else waits for it). `serving_replicas`
    overrides the Deployment's or LeaderWorkerSet's replicas (the controller passes 0 while a gated seed
    runs); `control_token` is the operator's (see render.control): without it, as in `stoker render`, the
    Secret of a standby service, or of one snapshotted asleep, is left out. The pods copy their programs
    from `programs_image` (the operator's own image, by default of this version); with `snapshots` (the
    admin turned snapshot and restore on) the serving pods are made for them (render.snapshot)."""
    children: list[Json] = []
    guarded = svc.spec.cold_start.standby is not None or snapshotted_asleep(svc, snapshots)
    if guarded and control_token is not None:
        children.append(build_control_secret(svc, control_token))
    if svc.spec.cold_start.compile_cache.enabled:
        children.append(build_cache_pvc(svc))
    if svc.spec.cold_start.model_cache.enabled:
        children.append(build_model_pvc(svc))
    if seed_wanted(svc):
        if multi_node(svc):
            children.append(build_seed_group_service(svc))
        children.append(build_seed_job(svc, programs_image=programs_image))
    children.append(
        build_serving(svc, replicas=serving_replicas, programs_image=programs_image, snapshots=snapshots)
    )
    children.append(build_service(svc))
    children += build_peer_children(svc, peer_sources or [])
    if warming is not None:
        children.append(build_node_warmer(svc, warming, programs_image=programs_image))
    pool = svc.spec.inference_pool
    if pool is not None:
        children.append(build_inference_pool(svc, pool.endpoint_picker.name, pool.endpoint_picker.port))
    return children
