"""The local control plane behaves like a real cluster in the ways the operator relies on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.helpers import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

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


def test_kubectl_logs_returns_the_file_kwok_is_told_to_serve(namespace, kubectl, tmp_path):
    kubectl("-n", namespace, "create", "deployment", "printer", "--image=fake.invalid/printer")
    kubectl("-n", namespace, "rollout", "status", "deployment/printer", "--timeout=90s")
    pod = kubectl(
        "-n", namespace, "get", "pods", "-l", "app=printer", "-o", "jsonpath={.items[0].metadata.name}"
    )
    log_file = tmp_path / "printer.log"
    log_file.write_text(
        "2026-11-22T05:00:00.000000000Z stdout F first line\n"
        "2026-11-22T05:00:01.500000000Z stdout F second line\n"
    )
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod.stdout, "namespace": namespace},
        "spec": {"logs": [{"containers": ["printer"], "logsFile": str(log_file)}]},
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(logs))

    def printed() -> str | None:
        result = kubectl("-n", namespace, "logs", "-l", "app=printer", check=False)
        return result.stdout if result.returncode == 0 else None

    assert wait_for(printed, timeout=30) == "first line\nsecond line\n"


def test_up_twice_is_harmless_and_down_stops_every_process_it_started(cluster, tmp_path):
    env = dict(
        cluster.env,
        STOKER_CLUSTER_DIR=str(tmp_path / "cluster"),
        STOKER_CLUSTER_PORT_BASE="27790",
        GPU_NODES="1",
    )
    up = [str(REPO / "hack" / "cluster"), "up"]
    subprocess.run(up, env=env, check=True, timeout=300)
    pids = [int(p.read_text()) for p in (tmp_path / "cluster" / "pids").glob("*.pid")]
    assert len(pids) == 5
    again = subprocess.run(up, env=env, check=True, timeout=300, capture_output=True, text=True)
    assert "already up" in again.stderr
    assert sorted(int(p.read_text()) for p in (tmp_path / "cluster" / "pids").glob("*.pid")) == sorted(pids)
    subprocess.run([str(REPO / "hack" / "cluster"), "down"], env=env, check=True, timeout=120)
    assert not (tmp_path / "cluster").exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} survived down"
