"""Why a pod does not start, on the VLLMService, when the kubelet and the container runtime say it: the cases
tests/e2e/test_diagnosis.py and test_hostile_children.py play on kwok, here on the real node with real
images and real vLLM (CPU build), each proven by the condition the VLLMService ends in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench.conformance.versions import default_version
from bench.realnode import SERVICE, advertise_gpus, model_and_cache_volumes, placement, vllm_service

from tests.conftest import Cluster, Kubectl, RealNode
from tests.e2e.helpers import apply, condition, get_json, get_service, wait_for

pytestmark = pytest.mark.e2e


def without_seed(svc: dict[str, Any]) -> dict[str, Any]:
    svc["spec"]["coldStart"]["seed"] = {"enabled": False}
    return svc


def absent_image(svc: dict[str, Any]) -> dict[str, Any]:
    # The machine reaches no registry: the pull fails as it does for a mistyped image.
    svc["spec"]["runtime"]["image"] = f"ghcr.io/stoker-dev/no-such-image:{default_version()}"
    return without_seed(svc)


def little_memory(svc: dict[str, Any]) -> dict[str, Any]:
    # A limit vLLM's imports exceed: the cgroup's OOM killer, then the kubelet's restarts.
    svc["spec"]["runtime"]["resources"] = {"memory": "96Mi"}
    return without_seed(svc)


def read_the_images_imports(kubectl: Kubectl, namespace: str) -> None:
    """Run the API server's imports once in the vLLM image, as a node that has served it has: its files in
    the page cache, charged to that pod. Under a tight limit, a cold page cache charges every page the
    imports read to the container and reclaims it again, and the imports crawl for minutes before their
    own memory reaches the limit (cgroup v1: 40 MiB, no OOM kill in 300 s; after this, 96 MiB in 2 s)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "read-imports"},
        "spec": {
            "restartPolicy": "Never",
            **placement(),
            "containers": [
                {
                    "name": "imports",
                    "image": vllm_service(1)["spec"]["runtime"]["image"],
                    "command": ["python3", "-c", "import vllm.entrypoints.openai.api_server"],
                }
            ],
        },
    }
    apply(kubectl, namespace, pod)

    def finished() -> str | None:
        phase = ((get_json(kubectl, "-n", namespace, "pod", "read-imports") or {}).get("status") or {}).get(
            "phase"
        )
        return phase if phase in ("Succeeded", "Failed") else None

    assert wait_for(finished, 180, "the imports to run") == "Succeeded"
    kubectl("-n", namespace, "delete", "pod", "read-imports", "--wait=true", timeout=120)


def absent_model_path(svc: dict[str, Any]) -> dict[str, Any]:
    svc["spec"]["model"]["source"]["pvc"]["path"] = "/no-such-model"
    return svc


def too_long_context(svc: dict[str, Any]) -> dict[str, Any]:
    # Valid to the API server; vLLM refuses it once it reads the checkpoint's config, and exits 1.
    svc["spec"]["runtime"]["maxModelLen"] = 1 << 20
    return svc


CASES = {
    # case -> (spec change, Degraded reasons the kubelet's report may give, words the message carries, what
    # the node has done before)
    "image-pull": (
        absent_image,
        ("ErrImagePull", "ImagePullBackOff"),
        ["container vllm", "no-such-image"],
        None,
    ),
    "oom-kill": (
        little_memory,
        ("OOMKilled",),
        ["killed for using more memory than its limit"],
        read_the_images_imports,
    ),
    "model-path": (
        absent_model_path,
        ("ModelPathMissing",),
        ["/no-such-model (spec.model.source.pvc.path)", "PersistentVolumeClaim models"],
        None,
    ),
    "seed-exit": (
        too_long_context,
        ("SeedFailed",),
        ["exited with code 1; its log ends:", "max_model_len"],
        None,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_kubelets_reason_a_pod_does_not_start_is_a_condition(
    case: str,
    real_node: RealNode,
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    operator: Any,
    engine_venv: Path,
) -> None:
    change, reasons, words, before = CASES[case]
    python = engine_venv / "bin" / "python"
    if before is not None:
        before(kubectl, namespace)
    model_and_cache_volumes(kubectl, namespace, cluster.work_dir / "volumes" / namespace, python)
    advertise_gpus(kubectl, 4)
    apply(kubectl, namespace, change(vllm_service(1)))

    def degraded() -> dict[str, Any] | None:
        svc = get_service(kubectl, namespace, SERVICE)
        held = condition(svc, "Degraded")
        return svc if held.get("status") == "True" and held.get("reason") in reasons else None

    svc = wait_for(degraded, 300, f"Degraded=True for one of {reasons}")
    message = condition(svc, "Degraded")["message"]
    assert message.startswith(f"Pod {namespace}/{SERVICE}-"), message
    assert all(word in message for word in words), message
    assert condition(svc, "Ready")["status"] == "False"
