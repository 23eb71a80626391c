"""The serving Deployment."""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.cachekey import SHORT_KEY_LENGTH, cache_key
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    COMPONENT_SERVER,
    ROLE_ACTIVE,
    ROLE_LABEL,
    Json,
    common_labels,
    deployment_name,
    object_meta,
    server_selector_labels,
)
from stoker.render.peers import PEER_LABEL, peers_enabled
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE, pod_metadata, pod_spec
from stoker.render.prefetch import serving_invocation
from stoker.render.snapshot import Snapshots, not_snapshotted, with_snapshots

# The Deployment controller flags a rollout as stalled after this long; a cold compile can take most of it.
PROGRESS_DEADLINE_SECONDS = 3600


def pod_count(svc: VLLMService) -> int:
    """Serving pods the spec asks for: the active replicas plus the standby ones; with a shared GPU, the
    standby replicas alone (every engine on the GPU, runtime.replicas of them awake)."""
    standby = svc.spec.cold_start.standby
    if standby is None:
        return svc.spec.runtime.replicas
    if standby.shared_gpu is not None:
        return standby.replicas
    return svc.spec.runtime.replicas + standby.replicas


def build_deployment(
    svc: VLLMService,
    *,
    replicas: int | None = None,
    programs_image: str = DEFAULT_PROGRAMS_IMAGE,
    snapshots: Snapshots | None = None,
) -> Json:
    """`replicas` defaults to the serving pods the spec asks for (pod_count); the pods' programs are copied
    from `programs_image`; with `snapshots` (the admin's), pods made for snapshot and restore where the
    service allows (render.snapshot)."""
    key = cache_key(svc)
    labels = common_labels(svc.name, COMPONENT_SERVER, key[:SHORT_KEY_LENGTH])
    annotations = {CACHE_KEY_ANNOTATION: key}
    pod_labels = dict(labels)
    if peers_enabled(svc):
        pod_labels[PEER_LABEL] = "true"
    if svc.spec.cold_start.standby is not None:
        # Every pod starts active, so it serves even if the operator is down; the operator puts the
        # surplus to sleep. The label is not in the selector: relabelling keeps a pod in its ReplicaSet.
        pod_labels[ROLE_LABEL] = ROLE_ACTIVE
    template = {
        "metadata": pod_metadata(svc, pod_labels, annotations),
        "spec": pod_spec(svc, "serve", serving_invocation(svc), programs_image),
    }
    if snapshots is not None and not_snapshotted(svc) is None:
        with_snapshots(svc, template, snapshots)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(svc, deployment_name(svc.name), labels, annotations),
        "spec": {
            "replicas": pod_count(svc) if replicas is None else replicas,
            "selector": {"matchLabels": server_selector_labels(svc.name)},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": template,
        },
    }
