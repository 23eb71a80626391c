"""The CRD on a real API server: invalid objects are rejected with a message naming the field; examples apply,
get the same defaults as the pydantic models, and render children the API server accepts."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stoker.api import VLLMService
from stoker.render import render_children, server_selector
from tests.e2e.helpers import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
INVALID = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def expectations(path: Path) -> tuple[str, str]:
    """The `# expect-field:` and `# expect-message:` header lines of an invalid manifest."""
    header = dict(
        line[2:].split(": ", 1) for line in path.read_text().splitlines() if line.startswith("# expect-")
    )
    return header["expect-field"], header["expect-message"]


def test_enough_invalid_manifests() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_manifest_is_rejected(path: Path, crd: None, namespace: str, kubectl: Kubectl) -> None:
    field, message = expectations(path)
    result = kubectl("-n", namespace, "create", "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was accepted"
    assert field in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_applies_with_the_models_defaults(
    path: Path, crd: None, namespace: str, kubectl: Kubectl
) -> None:
    kubectl("-n", namespace, "create", "-f", str(path))
    (name,) = [
        d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "VLLMService"
    ]
    stored = json.loads(kubectl("-n", namespace, "get", "vllmservice", name, "-o", "json").stdout)
    # The API server's defaults (from the CRD) and pydantic's agree: validating and dumping the stored
    # object changes nothing the server would keep.
    svc = VLLMService.model_validate(stored)
    dumped = svc.model_dump(mode="json", by_alias=True, exclude_none=True)["spec"]
    assert _without_empty(dumped) == _without_empty(_ints_as_strings(stored["spec"]))
    # Every child it renders passes the API server's own validation.
    children = "\n---\n".join(json.dumps(child) for child in render_children(svc))
    kubectl("-n", namespace, "apply", "--dry-run=server", "-f", "-", input=children)


def test_scale_subresource_and_status(crd: None, namespace: str, kubectl: Kubectl, operator) -> None:
    kubectl("-n", namespace, "create", "-f", str(REPO / "examples" / "minimal.yaml"))
    kubectl("-n", namespace, "scale", "vllmservice", "qwen-small", "--replicas=3")
    spec = json.loads(kubectl("-n", namespace, "get", "vsvc", "qwen-small", "-o", "json").stdout)["spec"]
    assert spec["runtime"]["replicas"] == 3

    def scaled() -> dict | None:
        scale = json.loads(kubectl("get", "--raw", _scale_path(namespace, "qwen-small")).stdout)
        return scale if scale["status"].get("replicas") == 3 else None

    # The operator's status feeds the scale subresource, which is what an HPA reads.
    scale = wait_for(scaled, what="status.replicas 3 through the scale subresource")
    assert scale["status"] == {"replicas": 3, "selector": server_selector("qwen-small")}
    table = kubectl("-n", namespace, "get", "vsvc", "qwen-small").stdout
    assert "Qwen/Qwen2.5-0.5B-Instruct" in table


def _scale_path(namespace: str, name: str) -> str:
    return f"/apis/stoker.dev/v1alpha1/namespaces/{namespace}/vllmservices/{name}/scale"


def _without_empty(value: Any) -> Any:
    """Drop empty maps and lists: the CRD leaves them out where pydantic writes them."""
    if isinstance(value, dict):
        pruned = {k: _without_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def _ints_as_strings(spec: dict[str, Any]) -> dict[str, Any]:
    """Quantities may be written as integers; the models keep them as strings."""
    resources = spec.get("runtime", {}).get("resources", {})
    for key, value in resources.items():
        resources[key] = str(value)
    return spec
