"""An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) over a VLLMService's
serving pods, for a gateway whose endpoint picker (EPP) routes requests to them.

It selects the same pods as the Service: every serving pod of the VLLMService and, when the service keeps
standby replicas, only the active ones. A standby pod is asleep; the EPP lists the pods that match the
pool's selector and are Ready (docs/gateway.md), so a sleeping pod must not match the selector at all.
Relabelling a pod stoker.dev/role=active (waking it) is what adds it to the pool.
"""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.engine import PORT
from stoker.render.names import (
    COMPONENT_SERVER,
    Json,
    common_labels,
    object_meta,
    serving_selector_labels,
)

INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND = "InferencePool"
INFERENCE_POOL_PLURAL = "inferencepools"
# What the gateway does when the EPP cannot be reached: refuse the request rather than route around the
# picker (which knows which pods are asleep).
EPP_FAILURE_MODE = "FailClose"


def inference_pool_name(name: str) -> str:
    return name


def build_inference_pool(svc: VLLMService, endpoint_picker_name: str, endpoint_picker_port: int) -> Json:
    """The InferencePool of `svc`; its endpoint picker is the Service `endpoint_picker_name` (same
    namespace) whose `endpoint_picker_port` serves ext_proc gRPC."""
    if not endpoint_picker_name:
        raise ValueError("endpoint_picker_name must not be empty")
    if not 1 <= endpoint_picker_port <= 65535:
        raise ValueError(f"endpoint_picker_port {endpoint_picker_port} is not a port number")
    labels = common_labels(svc.name, COMPONENT_SERVER)
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": object_meta(svc, inference_pool_name(svc.name), labels),
        "spec": {
            "selector": {"matchLabels": serving_selector_labels(svc)},
            "targetPorts": [{"number": PORT}],
            # The CRD's defaults written out, so that what the API server stores equals what is rendered.
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": endpoint_picker_name,
                "port": {"number": endpoint_picker_port},
                "failureMode": EPP_FAILURE_MODE,
            },
        },
    }
