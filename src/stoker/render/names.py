"""Deterministic child names and the labels stoker puts on them."""

from __future__ import annotations

from typing import Any

from stoker.api import VLLMService

Json = dict[str, Any]

INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
CACHE_KEY_LABEL = "stoker.dev/cache-key"
CACHE_KEY_ANNOTATION = "stoker.dev/cache-key"

COMPONENT_SERVER = "server"
COMPONENT_SEED = "seed"
COMPONENT_CACHE = "cache"


def cache_pvc_name(name: str) -> str:
    return f"{name}-cache"


def model_pvc_name(name: str) -> str:
    return f"{name}-model"


def seed_job_name(name: str, short_key: str) -> str:
    return f"{name}-seed-{short_key}"


def deployment_name(name: str) -> str:
    return name


def service_name(name: str) -> str:
    return name


def common_labels(name: str, component: str | None = None, short_key: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "vllm",
        INSTANCE_LABEL: name,
        "app.kubernetes.io/managed-by": "stoker",
    }
    if component:
        labels[COMPONENT_LABEL] = component
    if short_key:
        labels[CACHE_KEY_LABEL] = short_key
    return labels


def server_selector_labels(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name, COMPONENT_LABEL: COMPONENT_SERVER}


def server_selector(name: str) -> str:
    """The label selector string for status.selector (the scale subresource's labelSelectorPath)."""
    return ",".join(f"{key}={value}" for key, value in server_selector_labels(name).items())


def object_meta(
    svc: VLLMService, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> Json:
    """Metadata of a child: same namespace as the VLLMService; the controller adds owner references."""
    metadata: Json = {"name": name, "labels": labels}
    if svc.namespace:
        metadata["namespace"] = svc.namespace
    if annotations:
        metadata["annotations"] = annotations
    return metadata
