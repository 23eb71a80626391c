"""The local control plane behaves like a real cluster in the ways the operator relies on."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import wait_for

pytestmark = pytest.mark.e2e

GPU_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: gpu-app}
spec:
  replicas: 2
  selector: {matchLabels: {app: gpu-app}}
  template:
    metadata: {labels: {app: gpu-app}}
    spec:
      nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
      containers:
      - name: main
        image: fake.invalid/vllm
        resources: {limits: {nvidia.com/gpu: "4"}}
"""

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.stoker.dev}
spec:
  group: e2e.stoker.dev
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: spec.min must not exceed spec.max
"""


def test_gpu_pods_of_a_deployment_run_on_fake_gpu_nodes(namespace, kubectl):
    kubectl("-n", namespace, "apply", "-f", "-", input=GPU_DEPLOYMENT)
    kubectl("-n", namespace, "rollout", "status", "deployment/gpu-app", "--timeout=90s")
    pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", "app=gpu-app", "-o", "json").stdout)
    assert len(pods["items"]) == 2
    for pod in pods["items"]:
        assert pod["status"]["phase"] == "Running"
        node = json.loads(kubectl("get", "node", pod["spec"]["nodeName"], "-o", "json").stdout)
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_a_job_completes(namespace, kubectl):
    kubectl("-n", namespace, "create", "job", "once", "--image=fake.invalid/job")
    kubectl("-n", namespace, "wait", "--for=condition=complete", "job/once", "--timeout=90s")


def test_a_cel_rule_rejects_a_bad_object_with_its_message(kubectl, namespace):
    kubectl("apply", "-f", "-", input=WIDGET_CRD)
    kubectl("wait", "--for=condition=Established", "crd/widgets.e2e.stoker.dev", "--timeout=60s")
    bad = "apiVersion: e2e.stoker.dev/v1\nkind: Widget\nmetadata: {name: w}\nspec: {min: 3, max: 1}\n"
    # A new CRD takes a moment to be served; retry until the answer is the validation error.
    result = None

    def rejected() -> bool:
        nonlocal result
        result = kubectl("-n", namespace, "apply", "-f", "-", input=bad, check=False)
        return "spec.min must not exceed spec.max" in result.stderr

    wait_for(rejected, timeout=30)
    assert result is not None and result.returncode != 0


def test_garbage_collection_deletes_an_owned_object_when_its_owner_goes(namespace, kubectl):
    kubectl("-n", namespace, "create", "configmap", "owner")
    owner_uid = kubectl("-n", namespace, "get", "configmap", "owner", "-o", "jsonpath={.metadata.uid}").stdout
    owned = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "owned",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(owned))
    kubectl("-n", namespace, "delete", "configmap", "owner")
    wait_for(lambda: kubectl("-n", namespace, "get", "configmap", "owned", check=False).returncode != 0)
