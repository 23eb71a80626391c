"""PersistentVolumeClaims: the compile cache (VLLM_CACHE_ROOT) and the optional model cache (HF_HOME)."""

from __future__ import annotations

from stoker.api import CompileCacheSpec, ModelCacheSpec, VLLMService
from stoker.render.names import (
    COMPONENT_CACHE,
    RETAINED_CACHE_ANNOTATION,
    Json,
    cache_pvc_name,
    common_labels,
    model_pvc_name,
    object_meta,
)


def _claim(
    svc: VLLMService,
    name: str,
    component: str,
    wanted: CompileCacheSpec | ModelCacheSpec,
    annotations: dict[str, str] | None = None,
) -> Json:
    spec: Json = {"accessModes": [wanted.access_mode], "resources": {"requests": {"storage": wanted.size}}}
    if wanted.storage_class_name:
        spec["storageClassName"] = wanted.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(svc, name, common_labels(svc.name, component), annotations),
        "spec": spec,
    }


def build_cache_pvc(svc: VLLMService) -> Json:
    """Owner references are the controller's: it adds one only under retentionPolicy Delete."""
    return _claim(
        svc,
        cache_pvc_name(svc.name),
        COMPONENT_CACHE,
        svc.spec.cold_start.compile_cache,
        {RETAINED_CACHE_ANNOTATION: svc.name},
    )


def build_model_pvc(svc: VLLMService) -> Json:
    return _claim(svc, model_pvc_name(svc.name), "model-cache", svc.spec.cold_start.model_cache)
