"""How the operator reads the engines on a shared GPU from their pods (controller.standby)."""

from __future__ import annotations

from typing import Any

from stoker.api import VLLMService
from stoker.controller.standby import claims_of, gated, gpu_share, shared_engine
from stoker.render import build_deployment
from stoker.render.names import ASLEEP_ANNOTATION, ROLE_LABEL, ROLE_STANDBY


def shared_service(utilization: float | None = 0.3) -> VLLMService:
    runtime: dict[str, Any] = {"replicas": 1}
    if utilization is not None:
        runtime["gpuMemoryUtilization"] = utilization
    return VLLMService.model_validate(
        {
            "apiVersion": "stoker.dev/v1alpha1",
            "kind": "VLLMService",
            "metadata": {"name": "alpha", "namespace": "team-a"},
            "spec": {
                "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                "runtime": runtime,
                "coldStart": {"standby": {"replicas": 2, "sharedGpu": {"resourceClaimName": "shared-h100"}}},
            },
        }
    )


def pod_of(svc: VLLMService, ready: bool = True, **annotations: str) -> dict[str, Any]:
    """A pod as the Deployment's template makes it, once scheduled and (maybe) Ready."""
    template = build_deployment(svc)["spec"]["template"]
    metadata = {**template["metadata"], "name": "alpha-1", "creationTimestamp": "2026-11-26T10:00:00Z"}
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}], "podIP": "10.0.0.9"}
    return {"metadata": metadata, "spec": template["spec"], "status": status}


def test_a_new_pod_is_gated_and_names_the_claim() -> None:
    pod = pod_of(shared_service(), ready=False)
    assert gated(pod)
    assert claims_of(pod) == {"shared-h100"}
    pod["spec"].pop("schedulingGates")
    assert not gated(pod)


def as_served(svc: VLLMService) -> dict[str, Any]:
    return svc.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_the_share_is_the_specs_gpu_memory_utilization_or_vllms_default() -> None:
    assert gpu_share(as_served(shared_service(0.3))) == 0.3
    assert gpu_share(as_served(shared_service(None))) == 0.92  # vLLM's CacheConfig default


def test_an_engine_holds_its_share_until_the_operator_saw_it_asleep() -> None:
    svc = shared_service()
    starting = shared_engine(pod_of(svc, ready=False), gpu_share(as_served(svc)))
    assert starting.holds_memory and starting.wanted and starting.share == 0.3
    asleep = pod_of(svc, **{ASLEEP_ANNOTATION: "2026-11-26T10:01:00Z"})
    asleep["metadata"]["labels"][ROLE_LABEL] = ROLE_STANDBY
    engine = shared_engine(asleep, gpu_share(as_served(svc)))
    assert not engine.holds_memory and not engine.wanted
