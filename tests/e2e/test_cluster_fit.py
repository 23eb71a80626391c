"""Fitting a real cluster: `kubectl explain` shows every field's description, and spec.pod reaches the seed
Job's and the serving pods, which the real admission plugins accept and the scheduler places on kwok nodes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stoker.api.crd import resource_schema
from tests.e2e.helpers import condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster-fit.yaml"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

EXPLAINED = [
    "spec",
    "spec.model",
    "spec.runtime.maxModelLen",
    "spec.coldStart.compileCache",
    "spec.coldStart.standby.wakeTimeoutSeconds",
    "spec.pod.volumeMounts.mountPath",
    "spec.pod.affinity.nodeAffinity",
    "status.startup.last.totalSeconds",
]


def described(path: str) -> str:
    """The description the generated schema gives `path` (list items are walked through)."""
    node = resource_schema()
    for part in path.split("."):
        node = node.get("items", node)["properties"][part]
    return " ".join(node["description"].split())


@pytest.mark.parametrize("path", EXPLAINED)
def test_kubectl_explain_shows_the_generated_description(path: str, crd: None, kubectl: Kubectl) -> None:
    def explained() -> str | None:
        # The API server publishes a new CRD's OpenAPI a moment after it is Established.
        result = kubectl("explain", f"vllmservices.{path}", check=False)
        text = " ".join(result.stdout.split())
        return text if result.returncode == 0 and "<no description>" not in text else None

    text = wait_for(explained, timeout=60, what=f"kubectl explain {path}")
    assert described(path) in text


@pytest.fixture
def cluster_scoped_classes(namespace: str, kubectl: Kubectl) -> Iterator[dict[str, str]]:
    """A PriorityClass and a RuntimeClass for this test only (both are cluster-scoped)."""
    names = {"priorityClassName": f"{namespace}-inference", "runtimeClassName": f"{namespace}-nvidia"}
    objects = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names["priorityClassName"]},
            "value": 4242,
        },
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": names["runtimeClassName"]},
            "handler": "nvidia",
        },
    ]
    text = "\n---\n".join(json.dumps(obj) for obj in objects)
    kubectl("apply", "-f", "-", input=text)
    yield names
    kubectl("delete", "-f", "-", "--wait=false", input=text, check=False)


def pod_templates(kubectl: Kubectl, namespace: str, svc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    name = svc["metadata"]["name"]
    job = get_json(kubectl, "-n", namespace, "job", f"{name}-seed-{svc['status']['cache']['key'][:10]}")
    deployment = get_json(kubectl, "-n", namespace, "deployment", name)
    assert job and deployment
    return {"seed": job["spec"]["template"], "serve": deployment["spec"]["template"]}


def test_pod_settings_reach_seed_and_serving_pods_on_the_real_api_server(
    namespace: str, kubectl: Kubectl, operator: Any, cluster_scoped_classes: dict[str, str]
) -> None:
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    (manifest,) = [d for d in documents if d["kind"] == "VLLMService"]
    manifest["spec"]["pod"].update(cluster_scoped_classes)
    # A hard constraint, so that the placement below proves the default selector counts these pods.
    manifest["spec"]["pod"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "DoNotSchedule"
    text = "\n---\n".join(json.dumps(d) for d in documents if d["kind"] != "VLLMService")
    kubectl("-n", namespace, "apply", "-f", "-", input=text + "\n---\n" + json.dumps(manifest))
    svc = wait_ready(kubectl, namespace, "qwen-fit")
    pod = manifest["spec"]["pod"]

    for role, template in pod_templates(kubectl, namespace, svc).items():
        spec, metadata = template["spec"], template["metadata"]
        assert spec["serviceAccountName"] == "qwen-fit", role
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}], role
        assert spec["affinity"] == pod["affinity"], role
        assert spec["priorityClassName"] == cluster_scoped_classes["priorityClassName"], role
        assert spec["runtimeClassName"] == cluster_scoped_classes["runtimeClassName"], role
        assert {"name": "corporate-ca", "configMap": {"name": "corporate-ca", "defaultMode": 420}} in spec[
            "volumes"
        ], role
        (engine,) = [c for c in spec["containers"] if c["name"] == "vllm"]
        assert pod["volumeMounts"][0] in engine["volumeMounts"], role
        assert {"team": "search", "cost-center": "ml-42"}.items() <= metadata["labels"].items(), role
        assert metadata["labels"]["app.kubernetes.io/instance"] == "qwen-fit", role
        assert metadata["annotations"]["sidecar.istio.io/inject"] == "false", role
        assert ("topologySpreadConstraints" in spec) == (role == "serve"), role

    # The pods themselves: admitted (the Priority plugin resolved the class to its value) and scheduled.
    pods = get_json(kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/instance=qwen-fit")
    assert pods
    components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods["items"]}
    assert components == {"seed", "server"}
    for item in pods["items"]:
        assert item["spec"]["priority"] == 4242
        assert item["spec"]["serviceAccountName"] == "qwen-fit"
        assert item["spec"]["nodeName"].startswith("kwok-gpu-")
    serving = [p for p in pods["items"] if p["metadata"]["labels"]["app.kubernetes.io/component"] == "server"]
    assert sum(p["status"]["phase"] == "Running" for p in serving) == 2
    # The spread constraint's default selector counts exactly this service's serving pods: one per node.
    assert len({p["spec"]["nodeName"] for p in serving}) == 2


def test_cluster_fit_settings_stay_out_of_the_cache_key(
    namespace: str, kubectl: Kubectl, operator: Any
) -> None:
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    (manifest,) = [d for d in documents if d["kind"] == "VLLMService"]
    plain = json.loads(json.dumps(manifest))
    del plain["spec"]["pod"]
    plain["metadata"]["name"] = "qwen-plain"
    kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(plain))
    fitted = wait_ready(kubectl, namespace, "qwen-fit")["status"]["cache"]["key"]
    assert wait_ready(kubectl, namespace, "qwen-plain")["status"]["cache"]["key"] == fitted


def test_editing_pod_settings_rolls_the_deployment_without_reseeding(
    namespace: str, kubectl: Kubectl, operator: Any
) -> None:
    kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))
    key = wait_ready(kubectl, namespace, "qwen-fit")["status"]["cache"]["key"]
    patch = {"spec": {"pod": {"labels": {"team": "ranking", "cost-center": None}}}}
    kubectl("-n", namespace, "patch", "vsvc", "qwen-fit", "--type=merge", "-p", json.dumps(patch))

    def relabelled() -> dict[str, str] | None:
        deployment = get_json(kubectl, "-n", namespace, "deployment", "qwen-fit") or {}
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        return labels if labels.get("team") == "ranking" else None

    labels = wait_for(relabelled, what="the new pod label on the Deployment")
    assert "cost-center" not in labels
    jobs = get_json(kubectl, "-n", namespace, "jobs", "-l", "app.kubernetes.io/instance=qwen-fit")
    assert jobs and [job["metadata"]["name"] for job in jobs["items"]] == [f"qwen-fit-seed-{key[:10]}"]


def test_affinity_the_api_server_refuses_is_reported_with_its_message(
    namespace: str, kubectl: Kubectl, operator: Any
) -> None:
    # Free-form in the CRD, so the API server's core/v1 validation meets it when stoker applies the pods.
    manifest = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "bad-affinity"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))

    def degraded() -> dict[str, Any] | None:
        found = condition(get_json(kubectl, "-n", namespace, "vsvc", "bad-affinity"), "Degraded")
        return found if found.get("reason") == "ApplyFailed" else None

    found = wait_for(degraded, what="Degraded=ApplyFailed")
    assert found["status"] == "True"
    assert "nodeSelectorTerms" in found["message"], found["message"]
