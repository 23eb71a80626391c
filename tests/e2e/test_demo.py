"""The demo's stand-in for the kubelet (hack/kwoklogs.py --follow, which hack/demo runs): every stoker pod
prints a recorded startup, and a serving pod whose Secret is missing waits as on a real node, so that a
VLLMService applied without its Secret says so instead of going Ready."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = REPO / "tests" / "unit" / "data" / "phases" / "vllm-0.22.1-h100"


@pytest.fixture
def demo_kubelet(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[None]:
    follower = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "hack" / "kwoklogs.py"),
            "--follow",
            str(RECORDINGS),
            str(tmp_path),
            namespace,
        ],
        env=cluster.env,
    )
    try:
        yield
    finally:
        follower.terminate()
        follower.wait(timeout=30)


def test_a_missing_secret_keeps_the_service_from_ready_until_it_exists(
    namespace: str, kubectl: Any, operator: Any, demo_kubelet: None
) -> None:
    service = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "gated"},
        "spec": {
            "model": {
                "name": "meta-llama/Llama-3.1-8B-Instruct",
                "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
            }
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(service))

    def degraded() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "gated")
        return svc if condition(svc, "Degraded").get("reason") == "CreateContainerConfigError" else None

    svc = wait_for(degraded, 90, what="Degraded=CreateContainerConfigError")
    assert condition(svc, "Degraded")["status"] == "True"
    assert 'container vllm: secret "hf-token" not found' in condition(svc, "Degraded")["message"]
    assert condition(svc, "Ready")["status"] == "False"

    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_test")
    wait_ready(kubectl, namespace, "gated", timeout=90)
    started = wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "vllmservice", "gated") or {})
            .get("status", {})
            .get("startup", {})
            .get("last")
        ),
        90,
        what="the recorded start read",
    )
    assert started["totalSeconds"] > 0
