"""All children of a VLLMService, in apply order."""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.deployment import build_deployment
from stoker.render.names import Json
from stoker.render.pvc import build_cache_pvc, build_model_pvc
from stoker.render.seed import build_seed_job
from stoker.render.service import build_service


def seed_wanted(svc: VLLMService) -> bool:
    cold_start = svc.spec.cold_start
    return cold_start.seed.enabled and cold_start.compile_cache.enabled


def render_children(svc: VLLMService, *, serving_replicas: int | None = None) -> list[Json]:
    """PVCs, seed Job, Deployment, Service. `serving_replicas` overrides spec.runtime.replicas (the
    controller passes 0 while a gated seed runs)."""
    children: list[Json] = []
    if svc.spec.cold_start.compile_cache.enabled:
        children.append(build_cache_pvc(svc))
    if svc.spec.cold_start.model_cache.enabled:
        children.append(build_model_pvc(svc))
    if seed_wanted(svc):
        children.append(build_seed_job(svc))
    children.append(build_deployment(svc, replicas=serving_replicas))
    children.append(build_service(svc))
    return children
