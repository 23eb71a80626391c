"""Why a replica or seed does not start, on the VLLMService, on the real control plane (issue 37).

The scheduler is the real one, on kwok nodes: a pod it cannot place carries its own Unschedulable condition
and message. kwok runs no containers, so what a kubelet would report of them (an OOM kill, a failed seed's
log tail in its termination message) comes from kwok stages asked for through the pod's env
(hack/kwok/stages.yaml: KWOK_SIMULATE_FAILURE, KWOK_SIMULATE_FAILURE_REASON, KWOK_SIMULATE_FAILURE_LOG).

The scheduler's first message for a pod may name a claim not yet bound; the condition follows its later
messages, so every test here waits for the message it expects rather than reading the first one.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from stoker.controller.diagnose import UNSCHEDULABLE_GRACE_SECONDS
from stoker.inpod.seed import MODEL_PATH_MISSING_LINE
from tests.e2e.helpers import apply, condition, qwen, wait_condition

pytestmark = pytest.mark.e2e


UNSCHEDULABLE = {
    # case -> (seed, runtime, what the scheduler says)
    "no-node-matches": (False, {"nodeSelector": {"pool": "none-such"}}, "didn't match Pod's node affinity"),
    "insufficient-memory": (False, {"resources": {"memory": "4Ti"}}, "Insufficient memory"),
}


@pytest.mark.parametrize("case", UNSCHEDULABLE)
def test_a_pod_the_scheduler_cannot_place_stops_progress_with_the_schedulers_message(
    case, namespace, kubectl, operator
):
    seed, runtime, said = UNSCHEDULABLE[case]
    apply(kubectl, namespace, qwen("unplaced", seed, **runtime))
    svc = wait_condition(kubectl, namespace, "unplaced", "Progressing", "False", "Unschedulable", says=said)
    message = condition(svc, "Progressing")["message"]
    assert message.startswith(f"Pod {namespace}/unplaced-"), message
    assert condition(svc, "Available")["status"] == "False"
    assert svc["status"]["ready"] == "0/1"


@pytest.fixture
def tainted_node(kubectl: Any) -> Any:
    """A kwok node of its own label, tainted: the only one a pod selecting that label may land on."""
    name = f"kwok-tainted-{uuid.uuid4().hex[:6]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "pool": name},
        },
        "spec": {"taints": [{"key": "stoker.dev/broken-gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}},
    }
    kubectl("apply", "-f", "-", input=json.dumps(node))
    yield name
    kubectl("delete", "node", name, "--wait=false")


def test_a_taint_the_pods_do_not_tolerate_is_named(namespace, kubectl, operator, tainted_node):
    apply(kubectl, namespace, qwen("tainted", False, nodeSelector={"pool": tainted_node}))
    taint = "untolerated taint"
    wait_condition(kubectl, namespace, "tainted", "Progressing", "False", "Unschedulable", says=taint)


def test_an_unschedulable_pod_degrades_after_the_documented_grace(namespace, kubectl, operator):
    apply(kubectl, namespace, qwen("waits", False, nodeSelector={"pool": "none-such"}))
    affinity = "didn't match Pod's node affinity"
    svc = wait_condition(kubectl, namespace, "waits", "Progressing", "False", "Unschedulable", says=affinity)
    assert condition(svc, "Degraded")["status"] == "False"  # a cluster autoscaler may add the node
    began = time.monotonic()
    grace = UNSCHEDULABLE_GRACE_SECONDS + 30
    wait_condition(kubectl, namespace, "waits", "Degraded", "True", "Unschedulable", grace, says=affinity)
    assert time.monotonic() - began <= grace


def test_a_missing_model_claim_is_named_while_the_seed_waits(namespace, kubectl, operator):
    manifest = qwen("noclaim", True)
    manifest["spec"]["model"]["source"] = {"pvc": {"claimName": "models", "path": "/llama"}}
    apply(kubectl, namespace, manifest)
    missing = 'persistentvolumeclaim "models" not found'
    svc = wait_condition(kubectl, namespace, "noclaim", "Progressing", "False", "Unschedulable", says=missing)
    assert f"Pod {namespace}/noclaim-seed-" in condition(svc, "Progressing")["message"]


def failing_seed(name: str, **failure: str) -> dict[str, Any]:
    env = [{"name": "KWOK_SIMULATE_FAILURE", "value": "true"}]
    env += [
        {"name": f"KWOK_SIMULATE_FAILURE_{key.upper()}", "value": value} for key, value in failure.items()
    ]
    return qwen(name, True, env=env)


def test_a_failed_seed_says_why_with_the_last_lines_of_its_log(namespace, kubectl, operator):
    log = "INFO loading\nTraceback (most recent call last):\nerror: unrecognized arguments: --max-batch-size"
    apply(kubectl, namespace, failing_seed("badflag", log=log))
    svc = wait_condition(kubectl, namespace, "badflag", "Degraded", "True", "SeedFailed")
    message = condition(svc, "Degraded")["message"]
    assert message.startswith(f"Pod {namespace}/badflag-seed-"), message
    assert "container vllm exited with code 1; its log ends:" in message
    assert "unrecognized arguments: --max-batch-size" in message


def test_a_seed_killed_for_memory_is_an_oom_kill(namespace, kubectl, operator):
    apply(kubectl, namespace, failing_seed("oom", reason="OOMKilled"))
    svc = wait_condition(kubectl, namespace, "oom", "Degraded", "True", "OOMKilled")
    assert "killed for using more memory than its limit" in condition(svc, "Degraded")["message"]


def test_a_model_path_that_does_not_exist_names_the_path_and_the_claim(namespace, kubectl, operator):
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    apply(kubectl, namespace, claim)
    # The seed's own check prints this before vLLM starts (stoker.inpod.seed); kwok plays its exit.
    manifest = failing_seed("nopath", log=f"{MODEL_PATH_MISSING_LINE} /models/llama-8b")
    manifest["spec"]["model"]["source"] = {"pvc": {"claimName": "weights", "path": "/llama-8b"}}
    apply(kubectl, namespace, manifest)
    svc = wait_condition(kubectl, namespace, "nopath", "Degraded", "True", "ModelPathMissing", 90)
    message = condition(svc, "Degraded")["message"]
    assert "the model path /models/llama-8b does not exist" in message
    assert "PersistentVolumeClaim weights" in message and "/llama-8b (spec.model.source.pvc.path)" in message
