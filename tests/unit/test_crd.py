"""The generated CRD: committed copies are current, the schema is structural, CEL iterates bounded lists."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from stoker.api.crd import CRD_PATHS, build_crd, crd_yaml

REPO = Path(__file__).resolve().parents[2]


def openapi_schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for name, child in node.get("properties", {}).items():
            yield from walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


def node_at(path: str) -> dict[str, Any]:
    node = openapi_schema()
    for part in path.split("."):
        node = node["properties"][part]
    return node


def test_committed_crds_match_a_regeneration() -> None:
    expected = crd_yaml()
    for relative in CRD_PATHS:
        committed = (REPO / relative).read_text(encoding="utf-8")
        assert committed == expected, f"{relative} is stale: run `python -m stoker.api.crd`"


def test_crd_yaml_parses_to_build_crd() -> None:
    assert yaml.safe_load(crd_yaml()) == build_crd()


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "nullable", "const"}
    for path, node in walk(openapi_schema()):
        assert not forbidden & node.keys(), (path, forbidden & node.keys())
        assert node.get("additionalProperties") is not False, path
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
        if "properties" in node:
            assert node["type"] == "object", path


def test_names_subresources_and_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "vllmservices.stoker.dev"
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["vsvc"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.runtime.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns == {
        "Ready": ".status.ready",
        "Model": ".spec.model.name",
        "Replicas": ".status.replicas",
        "Standby": ".status.standbyReplicas",
        "Startup(s)": ".status.startup.last.totalSeconds",
        "Expected(s)": ".status.startup.expected.totalSeconds",
        "Age": ".metadata.creationTimestamp",
    }


def test_defaults() -> None:
    assert node_at("spec.coldStart.cudaGraphs")["default"] == {"captureSizes": [1, 2, 4, 8, 16, 32, 64]}
    assert node_at("spec.model.source")["default"] == {"huggingFace": {}}
    assert node_at("spec.runtime")["default"] == {}
    assert node_at("spec.runtime.image")["default"] == "ghcr.io/stoker-dev/stoker-vllm:0.26.0"
    assert node_at("spec.runtime.replicas")["default"] == 1
    assert node_at("spec.runtime.gpus")["default"] == 1
    # Unset, the renderer picks the loader from the source and the image (render.engine.load_format).
    assert "default" not in node_at("spec.coldStart.loader.format")
    assert node_at("spec.coldStart.startupPlan")["default"] is True
    assert node_at("spec.coldStart.compileCache.enabled")["default"] is True
    assert node_at("spec.coldStart.seed.enabled")["default"] is True
    # The capture settings are alternatives: a default inside cudaGraphs would collide with the user's.
    assert all(
        "default" not in child for child in node_at("spec.coldStart.cudaGraphs")["properties"].values()
    )
    assert all("default" not in node for _, node in walk(node_at("status")))


def test_cel_rules_have_messages_and_iterate_bounded_lists() -> None:
    rules = [
        (path, rule)
        for path, node in walk(openapi_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 10
    for path, rule in rules:
        assert rule["message"], path
        # A regex's backslash is written `\\` in a CEL string; a lone one (`\d`) is no CEL escape.
        assert "\\" not in rule["rule"].replace("\\\\", ""), (path, rule["rule"])
    for path in ("spec.runtime.extraArgs", "spec.runtime.env", "spec.coldStart.cudaGraphs.captureSizes"):
        assert node_at(path)["maxItems"] <= 64, path
    assert node_at("spec.runtime.extraArgs")["items"]["maxLength"] <= 1024


def test_api_and_render_import_without_yaml_kopf_or_kubernetes() -> None:
    code = (
        "import sys\n"
        "for name in ('yaml', 'kopf', 'kubernetes'): sys.modules[name] = None\n"
        "import stoker.api, stoker.api.crd, stoker.render, stoker.render.cli\n"
        "print(stoker.api.crd.build_crd()['kind'])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "CustomResourceDefinition"


def test_every_property_has_a_description_for_kubectl_explain() -> None:
    # Object-typed fields included: their text comes from the field or, failing that, from the class.
    # Not metadata: the API server refuses anything but its type there and explains ObjectMeta itself.
    missing = [
        f"{path}.{name}"
        for path, node in walk(openapi_schema())
        for name, child in node.get("properties", {}).items()
        if not child.get("description", "").strip() and f"{path}.{name}" != ".metadata"
    ]
    assert missing == []


def test_startup_column_says_what_total_seconds_measures() -> None:
    columns = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    (startup,) = [column for column in columns if column["name"] == "Startup(s)"]
    assert startup["jsonPath"] == ".status.startup.last.totalSeconds"
    assert "process start" in startup["description"] and "Starting vLLM server on" in startup["description"]
    description = node_at("status.startup.last.totalSeconds")["description"]
    assert "process start" in description and "Starting vLLM server on" in description
