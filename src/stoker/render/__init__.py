"""Pure builders: from a VLLMService to the objects that serve it. No I/O, no cluster, no yaml at import."""

from stoker.render.cachekey import cache_key, cache_key_factors, short_cache_key
from stoker.render.children import render_children, seed_wanted
from stoker.render.deployment import build_deployment, pod_count
from stoker.render.engine import (
    CACHE_MOUNT_PATH,
    PORT,
    EngineInvocation,
    Role,
    engine_invocation,
    key_relevant_args,
    model_string,
)
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    CACHE_KEY_LABEL,
    COMPONENT_LABEL,
    COMPONENT_SEED,
    COMPONENT_SERVER,
    INSTANCE_LABEL,
    MODEL_FACTS_ANNOTATION,
    RETAINED_CACHE_ANNOTATION,
    SEEDED_KEY_ANNOTATION,
    cache_pvc_name,
    common_labels,
    deployment_name,
    model_pvc_name,
    seed_job_name,
    server_selector,
    server_selector_labels,
    service_name,
    serving_selector,
    serving_selector_labels,
)
from stoker.render.pvc import build_cache_pvc, build_model_pvc
from stoker.render.seed import build_seed_job, seed_invocation
from stoker.render.service import build_service

__all__ = [
    "CACHE_KEY_ANNOTATION",
    "CACHE_KEY_LABEL",
    "CACHE_MOUNT_PATH",
    "COMPONENT_LABEL",
    "COMPONENT_SEED",
    "COMPONENT_SERVER",
    "INSTANCE_LABEL",
    "MODEL_FACTS_ANNOTATION",
    "PORT",
    "RETAINED_CACHE_ANNOTATION",
    "SEEDED_KEY_ANNOTATION",
    "EngineInvocation",
    "Role",
    "build_cache_pvc",
    "build_deployment",
    "build_model_pvc",
    "build_seed_job",
    "build_service",
    "cache_key",
    "cache_key_factors",
    "cache_pvc_name",
    "common_labels",
    "deployment_name",
    "engine_invocation",
    "key_relevant_args",
    "model_pvc_name",
    "model_string",
    "pod_count",
    "render_children",
    "seed_invocation",
    "seed_job_name",
    "seed_wanted",
    "server_selector",
    "server_selector_labels",
    "service_name",
    "serving_selector",
    "serving_selector_labels",
    "short_cache_key",
]
