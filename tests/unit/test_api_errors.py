"""Refusals in the user's terms (stoker.api.errors): each names the field as kubectl does and the rule in
words, with none of pydantic's internals, for every kind of rule a manifest can break."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from stoker.api import VLLMService, user_message
from stoker.api.crd import build_crd
from stoker.api.errors import field_path
from stoker.api.models import PATTERN_RULES
from stoker.predict.cli import main as predict_main
from stoker.render.cli import main as render_main
from tests.unit.test_predict_facts import LLAMA_CONFIG, write_model

MINIMAL: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "svc"},
    "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
}
INTERNALS = (
    "Value error",
    "Assertion failed",
    "[type=",
    "pydantic",
    "https://errors",
    "validation error for",
)


def with_spec(**spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(MINIMAL)
    manifest["spec"].update(spec)
    return manifest


# (manifest, the field the message names, words of the rule)
CASES: list[tuple[dict[str, Any], str, str]] = [
    ({**MINIMAL, "spec": {}}, "spec.model", "is required"),
    (with_spec(bogus=1), "spec.bogus", "is not a field of this object"),
    (with_spec(model={"name": "a\nb"}), "spec.model.name", "must not contain control characters"),
    (with_spec(model={"name": "m", "revision": "main\r"}), "spec.model.revision", "control characters"),
    (with_spec(model={"name": "--port=1"}), "spec.model.name", "must not start with '-'"),
    (with_spec(model={"name": ""}), "spec.model.name", "must have at least 1 characters"),
    (with_spec(model={"name": "m" * 300}), "spec.model.name", "must have at most 256 characters"),
    (
        with_spec(model={"name": "m", "source": {"s3": {"uri": "s3://bucket/m", "endpoint": "file:///etc"}}}),
        "spec.model.source.s3.endpoint",
        "must be an http:// or https:// URL with a host",
    ),
    (
        with_spec(model={"name": "m", "source": {"s3": {"uri": "https://bucket/m"}}}),
        "spec.model.source.s3.uri",
        "must be s3://bucket/prefix",
    ),
    (
        with_spec(model={"name": "m", "source": {"pvc": {"claimName": "c"}, "s3": {"uri": "s3://bucket/m"}}}),
        "spec.model.source",
        "exactly one of huggingFace, pvc or s3",
    ),
    (with_spec(runtime={"gpus": 0}), "spec.runtime.gpus", "must be at least 1"),
    (with_spec(runtime={"replicas": "many"}), "spec.runtime.replicas", "must be an integer"),
    (
        with_spec(runtime={"gpuMemoryUtilization": 2}),
        "spec.runtime.gpuMemoryUtilization",
        "must be at most 1",
    ),
    (
        with_spec(runtime={"gpus": 2, "tensorParallelSize": 3}),
        "spec.runtime.tensorParallelSize",
        "divide gpus",
    ),
    (
        with_spec(runtime={"extraArgs": ["-O", '{"cudagraph_capture_sizes": [8]}']}),
        "spec.runtime.extraArgs",
        "must not set flags stoker owns",
    ),
    (with_spec(runtime={"extraArgs": ["--seed", "1\x00"]}), "spec.runtime.extraArgs[1]", "NUL"),
    (with_spec(runtime={"extraArgs": "--seed 1"}), "spec.runtime.extraArgs", "must be a list"),
    (
        with_spec(runtime={"env": [{"name": "HF_HOME", "value": "/x"}]}),
        "spec.runtime.env",
        "must not set variables stoker owns",
    ),
    (
        with_spec(runtime={"env": [{"name": "A", "value": "x", "valueFrom": {}}]}),
        "spec.runtime.env[0]",
        "value and valueFrom are mutually exclusive",
    ),
    (
        with_spec(runtime={"env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "p"}}}]}),
        "spec.runtime.env",
        "PYTHONPATH must be a value, not valueFrom",
    ),
    (with_spec(runtime={"engineVersion": "0.1.0"}), "spec.runtime.engineVersion", "0.1.0"),
    (
        with_spec(coldStart={"loader": {"format": "pickle"}}),
        "spec.coldStart.loader.format",
        "must be 'runai_streamer', 'instanttensor'",
    ),
    (
        with_spec(coldStart={"cudaGraphs": {"captureSizes": [8, 4]}}),
        "spec.coldStart.cudaGraphs.captureSizes",
        "strictly increasing",
    ),
    (with_spec(coldStart={"standby": {"replicas": 1.5}}), "spec.coldStart.standby.replicas", "whole number"),
    (
        with_spec(coldStart={"standby": {}}, runtime={"extraArgs": ["--api-key", "k"]}),
        "spec.runtime.extraArgs",
        "coldStart.standby does not work with an API key",
    ),
    (
        with_spec(
            runtime={"replicas": 3},
            coldStart={"standby": {"replicas": 2, "sharedGpu": {"resourceClaimName": "g"}}},
        ),
        "spec.runtime.replicas",
        "runtime.replicas must not exceed coldStart.standby.replicas",
    ),
    (
        with_spec(runtime={"gpus": 2}, coldStart={"standby": {"sharedGpu": {"resourceClaimName": "g"}}}),
        "spec.runtime.gpus",
        "runtime.gpus must be 1 when coldStart.standby.sharedGpu is set",
    ),
    (
        with_spec(coldStart={"standby": {"sharedGpu": {"resourceClaimName": "G"}}}),
        "spec.coldStart.standby.sharedGpu.resourceClaimName",
        "must be a DNS name",
    ),
    (
        with_spec(
            coldStart={"modelCache": {"enabled": True}},
            model={"name": "m", "source": {"pvc": {"claimName": "c"}}},
        ),
        "spec.coldStart.modelCache.enabled",
        "applies only to model.source.huggingFace",
    ),
    (with_spec(pod={"labels": {"stoker.dev/x": "y"}}), "spec.pod.labels", "must not set keys stoker owns"),
    (
        with_spec(pod={"volumeMounts": [{"name": "v", "mountPath": "/data"}]}),
        "spec.pod.volumeMounts",
        "must each name a volume",
    ),
    ({**MINIMAL, "metadata": {"name": "Not_DNS"}}, "metadata.name", "DNS-1035 label"),
    (with_spec(coldStart={"compileCache": {"size": "lots"}}), "spec.coldStart.compileCache.size", "quantity"),
    (with_spec(runtime={"env": [{"name": "1X", "value": "v"}]}), "spec.runtime.env[0].name", "variable name"),
    (with_spec(runtime={"engineVersion": "latest"}), "spec.runtime.engineVersion", "version such as 0.26.0"),
    (with_spec(pod={"serviceAccountName": "Admin"}), "spec.pod.serviceAccountName", "must be a DNS name"),
    (
        with_spec(pod={"volumes": [{"name": "v"}], "volumeMounts": [{"name": "v", "mountPath": "/a/../b"}]}),
        "spec.pod.volumeMounts[0].mountPath",
        "must be an absolute path",
    ),
]


@pytest.mark.parametrize(("manifest", "field", "rule"), CASES, ids=[case[1] for case in CASES])
def test_a_refusal_names_the_field_and_the_rule_in_plain_words(
    manifest: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        VLLMService.model_validate(manifest)
    message = user_message(refused.value)
    assert not [word for word in INTERNALS if word in message], message
    lines = message.splitlines()
    assert any(line.startswith(f"{field}: ") and rule in line for line in lines), message
    assert all(line.startswith(("spec.", "metadata.")) for line in lines), message


def test_every_broken_rule_gets_its_own_line() -> None:
    manifest = with_spec(model={"name": "a\nb"}, runtime={"gpus": 0, "replicas": -1})
    with pytest.raises(ValidationError) as refused:
        VLLMService.model_validate(manifest)
    assert user_message(refused.value).splitlines() == [
        "spec.model.name: must not contain control characters (newline, tab, NUL, ...)",
        "spec.runtime.replicas: must be at least 0",
        "spec.runtime.gpus: must be at least 1",
    ]


def test_every_pattern_of_the_spec_has_its_rule_in_words() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    patterns = set()
    nodes = [schema]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            patterns.add(node.get("pattern"))
            nodes += node.values()
        elif isinstance(node, list):
            nodes += node
    assert len(patterns - {None}) >= 6
    assert patterns - {None} <= PATTERN_RULES.keys()


def test_field_paths_read_as_kubectl_writes_them() -> None:
    assert field_path(("spec", "runtime", "env", 0, "value")) == "spec.runtime.env[0].value"
    assert field_path(()) == ""


def test_the_clis_print_refusals_in_the_users_terms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = with_spec(model={"name": "m\n"}, runtime={"extraArgs": ["-O{}"], "gpus": "two"})
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(manifest))
    write_model(tmp_path / "model", LLAMA_CONFIG)
    for main in (render_main, lambda argv: predict_main([str(tmp_path / "model"), "-f", *argv])):
        assert main([str(path)]) == 1
        stderr = capsys.readouterr().err
        assert not [word for word in INTERNALS if word in stderr], stderr
        assert "spec.model.name: must not contain control characters" in stderr
        assert "spec.runtime.gpus: must be an integer" in stderr
