"""spec.pod: validated like the rest of the spec, rendered onto the seed and serving pods, outside the key."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.render import build_deployment, build_seed_job, cache_key, server_selector_labels

POD: dict[str, Any] = {
    "serviceAccountName": "vllm-s3-reader",
    "imagePullSecrets": [{"name": "registry"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "priorityClassName": "inference",
    "runtimeClassName": "nvidia",
    "labels": {"team": "search", "cost-center": "ml-42"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "volumes": [{"name": "ca-bundle", "configMap": {"name": "corporate-ca"}}],
    "volumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
}


def service(pod: dict[str, Any] | None = None) -> VLLMService:
    spec: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}
    if pod is not None:
        spec["pod"] = pod
    return VLLMService.model_validate({"metadata": {"name": "qwen"}, "spec": spec})


def pod_templates(svc: VLLMService) -> dict[str, dict[str, Any]]:
    return {
        "seed": build_seed_job(svc)["spec"]["template"],
        "serve": build_deployment(svc)["spec"]["template"],
    }


def engine_mounts(template: dict[str, Any]) -> list[dict[str, Any]]:
    (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return list(engine["volumeMounts"])


@pytest.mark.parametrize("role", ["seed", "serve"])
def test_settings_reach_seed_and_serving_pods_alike(role: str) -> None:
    template = pod_templates(service(POD))[role]
    spec = template["spec"]
    assert spec["serviceAccountName"] == "vllm-s3-reader"
    assert "automountServiceAccountToken" not in spec  # the named one's own setting applies
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["affinity"] == POD["affinity"]
    assert spec["priorityClassName"] == "inference"
    assert spec["runtimeClassName"] == "nvidia"
    assert {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}} in spec["volumes"]
    assert POD["volumeMounts"][0] in engine_mounts(template)
    labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
    assert labels["team"] == "search" and labels["app.kubernetes.io/instance"] == "qwen"
    assert annotations["sidecar.istio.io/inject"] == "false" and "stoker.dev/cache-key" in annotations


def test_topology_spread_applies_to_serving_pods_with_their_selector_by_default() -> None:
    templates = pod_templates(service(POD))
    assert "topologySpreadConstraints" not in templates["seed"]["spec"]
    (constraint,) = templates["serve"]["spec"]["topologySpreadConstraints"]
    assert constraint["labelSelector"] == {"matchLabels": server_selector_labels("qwen")}
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    own = {"matchLabels": {"team": "search"}}
    pod = {
        **POD,
        "topologySpreadConstraints": [{**POD["topologySpreadConstraints"][0], "labelSelector": own}],
    }
    (constraint,) = pod_templates(service(pod))["serve"]["spec"]["topologySpreadConstraints"]
    assert constraint["labelSelector"] == own


def test_no_settings_render_nothing_extra() -> None:
    for template in pod_templates(service()).values():
        for field in ("serviceAccountName", "imagePullSecrets", "affinity", "priorityClassName"):
            assert field not in template["spec"]
        assert "team" not in template["metadata"]["labels"]
        # No token of the namespace's default ServiceAccount in the author's image.
        assert template["spec"]["automountServiceAccountToken"] is False


def test_pod_settings_are_not_in_the_cache_key() -> None:
    assert cache_key(service(POD)) == cache_key(service())


def mounted_at(path: str) -> dict[str, Any]:
    return {"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": path}]}


REFUSED = {
    "instance label": ({"labels": {"app.kubernetes.io/instance": "other"}}, "app.kubernetes.io/instance"),
    "managed-by label": ({"labels": {"app.kubernetes.io/managed-by": "me"}}, "app.kubernetes.io/managed-by"),
    "role label": ({"labels": {"stoker.dev/role": "active"}}, "stoker.dev/role"),
    "cache-key label": ({"labels": {"stoker.dev/cache-key": "x"}}, "stoker.dev/cache-key"),
    "cache-key annotation": ({"annotations": {"stoker.dev/cache-key": "x"}}, "stoker.dev/cache-key"),
    "deletion cost": (
        {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"}},
        "controller.kubernetes.io/pod-deletion-cost",
    ),
    "volume named cache": ({"volumes": [{"name": "cache", "emptyDir": {}}]}, "found: cache"),
    "volume named shm": ({"volumes": [{"name": "shm", "emptyDir": {}}]}, "found: shm"),
    "duplicate volumes": (
        {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
        "unique",
    ),
    "mount without volume": ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "found: nope"),
    "mount on the cache": (
        mounted_at("/var/cache/vllm"),
        "found: /var/cache/vllm",
    ),
    "mount inside the cache": (
        mounted_at("/var/cache/vllm/triton"),
        "found: /var/cache/vllm/triton",
    ),
    "mount above the cache": (
        mounted_at("/var"),
        "found: /var",
    ),
    "mount over /dev/shm": (
        mounted_at("/dev/shm"),
        "found: /dev/shm",
    ),
    "relative mount path": (
        mounted_at("etc/x"),
        "mountPath",
    ),
    "dot-dot in mount path": (
        mounted_at("/x/../var"),
        "mountPath",
    ),
    "bad service account": ({"serviceAccountName": "Not_A_Name"}, "serviceAccountName"),
    "bad topology policy": (
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "Maybe"}]},
        "whenUnsatisfiable",
    ),
    "unknown affinity kind": ({"affinity": {"gpuAffinity": {}}}, "gpuAffinity"),
    "bad label value": ({"labels": {"team": "not a value"}}, "labels.team"),
    "label key with a space": ({"labels": {"my team": "a"}}, "found: my team"),
    "annotation key with two slashes": ({"annotations": {"a/b/c": "x"}}, "found: a/b/c"),
    "label name too long": ({"labels": {"x" * 64: "a"}}, "qualified names"),
    "label key ending in a newline": ({"labels": {"team\n": "a"}}, "qualified names"),
}


@pytest.mark.parametrize(("pod", "named"), REFUSED.values(), ids=REFUSED.keys())
def test_pod_settings_that_would_break_stokers_pods_are_refused(pod: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        service(pod)
    assert named in str(caught.value)


def test_similar_but_free_keys_and_paths_pass() -> None:
    service(
        {
            "labels": {"app.kubernetes.io/part-of": "search", "example.com/stoker.dev": "x", "Team_1.a": "b"},
            "annotations": {"prometheus.io/scrape": "true"},
            "volumes": [{"name": "cache2", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache2", "mountPath": "/var/cache/vllm2"}],
        }
    )
