"""The serving Deployment."""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.cachekey import SHORT_KEY_LENGTH, cache_key
from stoker.render.engine import engine_invocation
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    COMPONENT_SERVER,
    Json,
    common_labels,
    deployment_name,
    object_meta,
    server_selector_labels,
)
from stoker.render.pods import pod_spec

# The Deployment controller flags a rollout as stalled after this long; a cold compile can take most of it.
PROGRESS_DEADLINE_SECONDS = 3600


def build_deployment(svc: VLLMService, *, replicas: int | None = None) -> Json:
    key = cache_key(svc)
    labels = common_labels(svc.name, COMPONENT_SERVER, key[:SHORT_KEY_LENGTH])
    annotations = {CACHE_KEY_ANNOTATION: key}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(svc, deployment_name(svc.name), labels, annotations),
        "spec": {
            "replicas": svc.spec.runtime.replicas if replicas is None else replicas,
            "selector": {"matchLabels": server_selector_labels(svc.name)},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
                "spec": pod_spec(svc, "serve", engine_invocation(svc, "serve")),
            },
        },
    }
