"""The Service in front of the serving pods."""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.engine import PORT
from stoker.render.names import (
    COMPONENT_SERVER,
    Json,
    common_labels,
    object_meta,
    service_name,
    serving_selector_labels,
)


def build_service(svc: VLLMService) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(svc, service_name(svc.name), common_labels(svc.name, COMPONENT_SERVER)),
        "spec": {
            "type": "ClusterIP",
            "selector": serving_selector_labels(svc),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
