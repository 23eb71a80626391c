"""Default memory requests: no seed or serving pod is BestEffort; the request follows the model's size
(from the seed's facts for the current key) and the settings that hold the weights in host memory."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from stoker.api import VLLMService
from stoker.render import render_children, short_cache_key
from stoker.render.memory import BASE_BYTES, GIB, PER_GPU_BYTES, gib_quantity
from stoker.render.pods import ENGINE_CONTAINER

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
CHECKPOINT = 16_060_522_496  # Llama-3.1-8B's safetensors: 14.96 GiB
FACTS: dict[str, Any] = {
    "checkpointBytes": CHECKPOINT,
    "layers": 32,
    "hiddenSize": 4096,
    "intermediateSize": 14336,
    "attentionHeads": 32,
    "kvHeads": 8,
    "vocabSize": 128256,
    "tokenizerBytes": 9_085_698,
    "moe": False,
    "experts": 0,
}
PVC_WEIGHTS: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {"model": {"name": "llama-8b", "source": {"pvc": {"claimName": "models", "path": "/llama-8b"}}}},
}
HUB: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
}


def example_services() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.stem}/{document['metadata']['name']}", document)
        for path in EXAMPLES
        for document in yaml.safe_load_all(path.read_text())
        if document and document.get("kind") == "VLLMService"
    ]


def with_spec(manifest: dict[str, Any], **spec: Any) -> dict[str, Any]:
    raw = copy.deepcopy(manifest)
    raw["spec"].update(spec)
    return raw


def with_facts(manifest: dict[str, Any], key: str | None = None, checkpoint: int = CHECKPOINT) -> VLLMService:
    """The manifest with the seed's facts in status, read by the seed of `key` (default: the current key)."""
    raw = copy.deepcopy(manifest)
    current = short_cache_key(VLLMService.model_validate(raw))
    facts = {**FACTS, "checkpointBytes": checkpoint}
    raw["status"] = {"startup": {"model": facts, "modelCacheKey": key or current}}
    return VLLMService.model_validate(raw)


def pod_templates(svc: VLLMService) -> dict[str, dict[str, Any]]:
    """The seed's and the serving pods' templates, by role."""
    children = {child["kind"]: child for child in render_children(svc)}
    templates = {"serve": children["Deployment"]["spec"]["template"]}
    if "Job" in children:
        templates["seed"] = children["Job"]["spec"]["template"]
    return templates


def engine_resources(svc: VLLMService, role: str) -> dict[str, Any]:
    containers = pod_templates(svc)[role]["spec"]["containers"]
    resources: dict[str, Any] = next(c for c in containers if c["name"] == ENGINE_CONTAINER)["resources"]
    return resources


def requested(svc: VLLMService, role: str) -> str:
    request: str = engine_resources(svc, role)["requests"]["memory"]
    return request


def qos_class(pod: dict[str, Any]) -> str:
    """The pod's QoS class as the kubelet computes it: only cpu and memory count, not extended resources."""
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    requests_or_limits, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            requests_or_limits |= name in requests or name in limits
            # A request defaults to its limit: Guaranteed needs a limit for both, equal to any request.
            guaranteed &= name in limits and requests.get(name, limits.get(name)) == limits.get(name)
    if not requests_or_limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def base(gpus: int = 1) -> int:
    return BASE_BYTES + PER_GPU_BYTES * gpus


@pytest.mark.parametrize("facts", [False, True], ids=["no status", "seed facts"])
@pytest.mark.parametrize(("name", "manifest"), example_services(), ids=[n for n, _ in example_services()])
def test_no_example_pod_is_best_effort(name: str, manifest: dict[str, Any], facts: bool) -> None:
    svc = with_facts(manifest) if facts else VLLMService.model_validate(manifest)
    for role, pod in pod_templates(svc).items():
        assert qos_class(pod) != "BestEffort", (name, role)
        engine = next(c for c in pod["spec"]["containers"] if c["name"] == ENGINE_CONTAINER)
        assert engine["resources"]["requests"]["memory"], (name, role)


def test_without_facts_every_pod_requests_the_host_side_only() -> None:
    svc = VLLMService.model_validate(PVC_WEIGHTS)
    assert requested(svc, "seed") == requested(svc, "serve") == gib_quantity(base()) == "8Gi"
    # A request, no limit: the page cache may grow past it and be reclaimed.
    assert "memory" not in engine_resources(svc, "serve")["limits"]
    assert engine_resources(svc, "serve")["limits"] == {"nvidia.com/gpu": "1"}


def test_the_host_side_grows_with_gpus() -> None:
    svc = VLLMService.model_validate(
        with_spec(PVC_WEIGHTS, runtime={"gpus": 4}, coldStart={"loader": {"readAhead": False}})
    )
    assert requested(svc, "serve") == gib_quantity(base(4)) == "14Gi"


def test_the_read_ahead_adds_the_checkpoint_of_the_current_key() -> None:
    svc = with_facts(PVC_WEIGHTS)
    assert requested(svc, "serve") == gib_quantity(base() + CHECKPOINT) == "23Gi"
    # The seed loads dummy weights and reads nothing ahead.
    assert requested(svc, "seed") == "8Gi"
    bigger = with_facts(PVC_WEIGHTS, checkpoint=140 * GIB)
    assert requested(bigger, "serve") == "148Gi"


def test_facts_of_another_key_are_ignored() -> None:
    # Another key may be another model (a changed name, revision or image): its size says nothing.
    svc = with_facts(PVC_WEIGHTS, key="0123456789")
    assert short_cache_key(svc) != "0123456789"
    assert requested(svc, "serve") == "8Gi"


def test_without_the_read_ahead_the_page_cache_is_not_requested() -> None:
    off = with_facts(with_spec(PVC_WEIGHTS, coldStart={"loader": {"readAhead": False}}))
    assert requested(off, "serve") == "8Gi"
    # A hub model is downloaded by vLLM itself, never read ahead.
    assert requested(with_facts(HUB), "serve") == "8Gi"


def test_a_level_1_standby_adds_the_weights() -> None:
    svc = with_facts(with_spec(HUB, coldStart={"standby": {"replicas": 1, "level": 1}}))
    assert requested(svc, "serve") == gib_quantity(base() + CHECKPOINT) == "23Gi"
    assert requested(svc, "seed") == "8Gi"
    # Every serving pod may be put to sleep, so the Deployment's one template counts them.
    tensor_parallel = with_facts(
        with_spec(HUB, runtime={"gpus": 2}, coldStart={"standby": {"replicas": 1, "level": 1}})
    )
    assert requested(tensor_parallel, "serve") == gib_quantity(base(2) + CHECKPOINT) == "25Gi"


def test_read_ahead_and_standby_count_the_weights_once() -> None:
    # The read-ahead's pages are clean and needed only while loading: the kernel reclaims them for the
    # sleeping pod's backup of the weights.
    svc = with_facts(with_spec(PVC_WEIGHTS, coldStart={"standby": {"replicas": 1}}))
    assert requested(svc, "serve") == "23Gi"


def test_a_users_memory_overrides_the_default() -> None:
    svc = with_facts(
        with_spec(
            PVC_WEIGHTS,
            runtime={"resources": {"cpu": "8", "memory": "64Gi"}},
            coldStart={"standby": {"replicas": 1}},
        )
    )
    for role in ("seed", "serve"):
        resources = engine_resources(svc, role)
        assert resources["requests"] == {"cpu": "8", "memory": "64Gi"}
        assert resources["limits"] == {"nvidia.com/gpu": "1", "memory": "64Gi"}


def test_a_users_cpu_keeps_the_default_memory() -> None:
    svc = VLLMService.model_validate(with_spec(HUB, runtime={"resources": {"cpu": "4"}}))
    assert engine_resources(svc, "serve")["requests"] == {"cpu": "4", "memory": "8Gi"}


@pytest.mark.parametrize(
    ("size", "quantity"), [(1, "1Gi"), (GIB, "1Gi"), (GIB + 1, "2Gi"), (base() + CHECKPOINT, "23Gi")]
)
def test_requests_round_up_to_whole_gib(size: int, quantity: str) -> None:
    assert gib_quantity(size) == quantity
