"""build_inference_pool: the Gateway API Inference Extension v1 InferencePool over a VLLMService's pods."""

from __future__ import annotations

import pytest

from stoker.render import PORT, build_deployment, build_service
from stoker.render.inferencepool import build_inference_pool
from tests.unit.test_render import service as base_service
from tests.unit.test_render_standby import service as standby_service


def test_pool_selects_only_active_serving_pods_of_the_service_with_standby() -> None:
    svc = standby_service({})
    pool = build_inference_pool(svc, "llama-epp", 9002)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "llama"
    assert pool["metadata"]["namespace"] == "ml"
    assert pool["spec"]["selector"] == {
        "matchLabels": {
            "app.kubernetes.io/instance": "llama",
            "app.kubernetes.io/component": "server",
            "stoker.dev/role": "active",
        }
    }
    # The same pods as the Service in front of them.
    assert pool["spec"]["selector"]["matchLabels"] == build_service(svc)["spec"]["selector"]


def test_pool_matches_an_active_pod_and_never_a_standby_one() -> None:
    svc = standby_service({})
    selector = build_inference_pool(svc, "llama-epp", 9002)["spec"]["selector"]["matchLabels"]
    pod_labels = build_deployment(svc)["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()  # every pod starts active
    standby = {**pod_labels, "stoker.dev/role": "standby"}
    assert not selector.items() <= standby.items()


def test_pool_without_standby_selects_every_serving_pod() -> None:
    svc = base_service()
    selector = build_inference_pool(svc, "llama-epp", 9002)["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/instance": "llama", "app.kubernetes.io/component": "server"}
    pod_labels = build_deployment(svc)["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


def test_pool_ports_and_endpoint_picker_ref() -> None:
    spec = build_inference_pool(standby_service({}), "llama-epp", 9002)["spec"]
    assert spec["targetPorts"] == [{"number": PORT}] == [{"number": 8000}]
    assert spec["appProtocol"] == "http"
    assert spec["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


@pytest.mark.parametrize(("name", "port"), [("", 9002), ("epp", 0), ("epp", 65536)])
def test_pool_refuses_a_bad_endpoint_picker(name: str, port: int) -> None:
    with pytest.raises(ValueError):
        build_inference_pool(standby_service({}), name, port)
