"""Rendering with spec.coldStart.standby.sharedGpu: serving pods share one DRA ResourceClaim's device instead
of a GPU each, start behind the gpu-share scheduling gate, and the Deployment runs standby.replicas pods."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.render import (
    GPU_SHARE_CLAIM,
    GPU_SHARE_GATE,
    build_deployment,
    build_seed_job,
    cache_key,
    pod_count,
    render_children,
)
from stoker.render.memory import BASE_BYTES, PER_GPU_BYTES, gib_quantity
from tests.unit.test_render import engine_container
from tests.unit.test_render_memory import CHECKPOINT, HUB, with_facts, with_spec
from tests.unit.test_render_standby import service

CLAIM = "shared-h100"
SHARED = {"replicas": 3, "sharedGpu": {"resourceClaimName": CLAIM}}


def shared(replicas: int = 1, **standby: Any) -> VLLMService:
    """test_render's BASE with a shared GPU of 3 engines, `replicas` of them awake."""
    return service({**SHARED, **standby}, replicas=replicas)


def serving_pod(svc: VLLMService) -> dict[str, Any]:
    spec: dict[str, Any] = build_deployment(svc)["spec"]["template"]["spec"]
    return spec


def seed_pod(svc: VLLMService) -> dict[str, Any]:
    spec: dict[str, Any] = build_seed_job(svc)["spec"]["template"]["spec"]
    return spec


def test_gate_name() -> None:
    assert GPU_SHARE_GATE == "stoker.dev/gpu-share"


@pytest.mark.parametrize(("active", "engines"), [(0, 3), (1, 3), (3, 3), (0, 0)])
def test_deployment_runs_the_engines_on_the_gpu_not_active_plus_standby(active: int, engines: int) -> None:
    svc = service({"replicas": engines, "sharedGpu": {"resourceClaimName": CLAIM}}, replicas=active)
    assert pod_count(svc) == engines
    assert build_deployment(svc)["spec"]["replicas"] == engines
    # Without sharing, standby pods are beside the active ones.
    assert pod_count(service({"replicas": engines}, replicas=active)) == active + engines


def test_serving_pods_reference_the_claim_instead_of_a_gpu() -> None:
    pod = serving_pod(shared())
    assert pod["resourceClaims"] == [{"name": GPU_SHARE_CLAIM, "resourceClaimName": CLAIM}]
    resources = engine_container({"spec": pod})["resources"]
    assert resources["claims"] == [{"name": GPU_SHARE_CLAIM}]
    assert "nvidia.com/gpu" not in resources.get("limits", {})
    assert "nvidia.com/gpu" not in resources["requests"]
    # Only the engine container holds the claim: the init containers get no device.
    for container in pod["initContainers"]:
        assert "claims" not in container.get("resources", {})


def test_serving_pods_start_behind_the_gpu_share_gate() -> None:
    assert serving_pod(shared())["schedulingGates"] == [{"name": GPU_SHARE_GATE}]
    assert "schedulingGates" not in serving_pod(service({"replicas": 3}))
    assert "schedulingGates" not in serving_pod(service())


def test_without_sharing_each_pod_has_its_own_gpus() -> None:
    for svc in (service({"replicas": 1}), service()):
        pod = serving_pod(svc)
        assert "resourceClaims" not in pod
        resources = engine_container({"spec": pod})["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        assert "claims" not in resources


def test_the_seed_keeps_a_gpu_of_its_own() -> None:
    pod = seed_pod(shared())
    assert "resourceClaims" not in pod
    assert "schedulingGates" not in pod
    resources = engine_container({"spec": pod})["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "1"}
    assert "claims" not in resources


def test_a_users_memory_limit_stays_without_the_gpu_limit() -> None:
    svc = service({**SHARED}, replicas=1, resources={"cpu": "4", "memory": "48Gi"})
    resources = engine_container({"spec": serving_pod(svc)})["resources"]
    assert resources == {
        "requests": {"cpu": "4", "memory": "48Gi"},
        "limits": {"memory": "48Gi"},
        "claims": [{"name": GPU_SHARE_CLAIM}],
    }


def test_level_1_standby_still_requests_the_weights_in_host_memory() -> None:
    svc = with_facts(with_spec(HUB, coldStart={"standby": SHARED}))
    resources = engine_container({"spec": serving_pod(svc)})["resources"]
    assert resources["requests"]["memory"] == gib_quantity(BASE_BYTES + PER_GPU_BYTES + CHECKPOINT) == "23Gi"
    assert "limits" not in resources
    assert engine_container({"spec": seed_pod(svc)})["resources"]["requests"]["memory"] == "8Gi"


def test_sharing_a_gpu_does_not_change_the_cache_key() -> None:
    # The engines run the same invocation on the same GPU model: their compile cache is the standby one's.
    assert cache_key(shared()) == cache_key(service({"replicas": 3}))
    assert cache_key(shared()) == cache_key(service({"replicas": 3, "sharedGpu": {"resourceClaimName": "x"}}))


def test_children_are_the_same_kinds_with_sharing() -> None:
    kinds = [child["kind"] for child in render_children(shared())]
    assert kinds == [child["kind"] for child in render_children(service({"replicas": 3}))]
    assert "ResourceClaim" not in kinds  # the claim is its owner's, not stoker's


# ----------------------------------------------------------------------------------------- validation


def test_scale_to_zero_keeps_the_engines() -> None:
    svc = shared(replicas=0)
    assert svc.spec.runtime.replicas == 0 and pod_count(svc) == 3


def test_no_more_awake_than_engines() -> None:
    with pytest.raises(ValidationError, match=r"runtime\.replicas must not exceed coldStart\.standby"):
        shared(replicas=4)
    assert shared(replicas=3).spec.runtime.replicas == 3
    # Without sharing the standby pods are extra, so any active count goes.
    assert service({"replicas": 1}, replicas=4).spec.runtime.replicas == 4


def test_one_gpu_per_engine() -> None:
    with pytest.raises(ValidationError, match=r"runtime\.gpus must be 1 when coldStart\.standby\.sharedGpu"):
        service({**SHARED}, replicas=1, gpus=2)
    assert service({"replicas": 3}, replicas=1, gpus=2).spec.runtime.gpus == 2


@pytest.mark.parametrize("name", ["", "Shared", "shared_gpu", "-shared", "a" * 254])
def test_the_claim_name_is_a_dns_name(name: str) -> None:
    with pytest.raises(ValidationError, match="resourceClaimName"):
        service({"replicas": 1, "sharedGpu": {"resourceClaimName": name}})


def test_the_claim_name_is_required_and_nothing_else_is_accepted() -> None:
    with pytest.raises(ValidationError, match="resourceClaimName"):
        service({"replicas": 1, "sharedGpu": {}})
    with pytest.raises(ValidationError):
        service({"replicas": 1, "sharedGpu": {"resourceClaimName": CLAIM, "deviceClassName": "gpu"}})


def test_shared_gpu_round_trips_in_camel_case() -> None:
    svc = shared()
    dumped = svc.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["spec"]["coldStart"]["standby"]["sharedGpu"] == {"resourceClaimName": CLAIM}
    assert VLLMService.model_validate(dumped) == svc
