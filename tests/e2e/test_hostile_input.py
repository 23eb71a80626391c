"""Hostile input on the real control plane: owned flags in every spelling and flag-like names are refused by
the API server with a message naming the field; `$(VAR)` strings reach the Deployment escaped; a Pod
Security `restricted` namespace admits the seed and serving pods; the seed gets no control token."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.helpers import get_json, wait_for, wait_ready

pytestmark = pytest.mark.e2e

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
OWNED = "extraArgs must not set flags stoker owns"
STANDBY = {"standby": {"replicas": 1}}


def manifest(name: str, model: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": name},
        "spec": {"model": model or {"name": MODEL}, **spec},
    }


def extra_args(*args: str, **spec: Any) -> dict[str, Any]:
    return manifest("hostile", runtime={"extraArgs": list(args)}, **spec)


# (manifest, field the API server names, message)
REFUSED = {
    "port-abbreviated": (extra_args("--por=9000"), "spec.runtime.extraArgs", OWNED),
    "load-format-abbreviated": (extra_args("--load-form=dummy"), "spec.runtime.extraArgs", OWNED),
    "served-name-abbreviated": (extra_args("--served-model=x"), "spec.runtime.extraArgs", OWNED),
    "tp-underscore-prefix": (extra_args("--tensor_parallel", "2"), "spec.runtime.extraArgs", OWNED),
    "tp-short-prefix": (extra_args("-t", "2"), "spec.runtime.extraArgs", OWNED),
    "tp-short-equals": (extra_args("-tp=2"), "spec.runtime.extraArgs", OWNED),
    "compilation-config-json": (
        extra_args("--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}'),
        "spec.runtime.extraArgs",
        OWNED,
    ),
    "cc-json-equals": (extra_args('-cc={"cudagraph_mode": "NONE"}'), "spec.runtime.extraArgs", OWNED),
    "cc-dotted-mode": (extra_args("-cc.cudagraph_mode=NONE"), "spec.runtime.extraArgs", OWNED),
    "compilation-config-dotted-underscore": (
        extra_args("--compilation_config.max_cudagraph_capture_size", "8"),
        "spec.runtime.extraArgs",
        OWNED,
    ),
    "cc-dotted-list-append": (
        extra_args("-cc.cudagraph_capture_sizes+=8,16"),
        "spec.runtime.extraArgs",
        OWNED,
    ),
    "compilation-config-abbreviated-dotted": (
        extra_args("--compil.cudagraph_capture_sizes=[8]"),
        "spec.runtime.extraArgs",
        OWNED,
    ),
    "config-file": (extra_args("--config", "/etc/vllm.yaml"), "spec.runtime.extraArgs", OWNED),
    "config-file-abbreviated": (extra_args("--conf=/etc/vllm.yaml"), "spec.runtime.extraArgs", OWNED),
    "newline-in-value": (extra_args("--max-num-seqs", "4", "--port=9000\n"), "spec.runtime.extraArgs", OWNED),
    "sleep-mode-off": (extra_args("--no-enable-sleep-mode"), "spec.runtime.extraArgs", OWNED),
    "sleep-mode-disabled": (extra_args("--disable_sleep_mode"), "spec.runtime.extraArgs", OWNED),
    "end-of-options": (extra_args("--max-num-seqs", "4", "--"), "spec.runtime.extraArgs", OWNED),
    "bare-value-extends-capture-sizes": (
        extra_args("128"),
        "spec.runtime.extraArgs",
        "extraArgs must start with a flag",
    ),
    "model-name-is-a-flag": (
        manifest("hostile", {"name": "--port=9000"}),
        "spec.model.name",
        "model.name must not start with '-'",
    ),
    "served-name-is-a-flag": (
        manifest("hostile", {"name": MODEL, "servedModelName": "-tp"}),
        "spec.model.servedModelName",
        "model.servedModelName must not start with '-'",
    ),
    "api-key-with-standby": (
        extra_args("--api-key", "k", coldStart=STANDBY),
        "spec.runtime.extraArgs",
        "coldStart.standby does not work with an API key",
    ),
    "api-key-abbreviated-with-standby": (
        extra_args("--api_k=k", coldStart=STANDBY),
        "spec.runtime.extraArgs",
        "coldStart.standby does not work with an API key",
    ),
    "api-key-env-with-standby": (
        manifest(
            "hostile",
            runtime={
                "env": [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "a", "key": "k"}}}]
            },
            coldStart=STANDBY,
        ),
        "spec.runtime.env",
        "remove VLLM_API_KEY from runtime.env",
    ),
}

ACCEPTED = {
    "user-flags": extra_args("--max_num_seqs=64", "--enable-prefix-caching", "-O3", "-q", "fp8"),
    "cc-dotted-other-key": extra_args("-cc.pass_config.fuse_norm_quant=true", "-cc.mode", "3"),
    "api-key-without-standby": extra_args("--api-key", "k"),
    "dollar-strings": manifest("hostile", {"name": MODEL, "servedModelName": "$(HF_TOKEN)"}),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_hostile_spec_is_refused_naming_the_field(
    case: str, crd: None, namespace: str, kubectl: Kubectl
) -> None:
    body, field, message = REFUSED[case]
    result = kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0, f"{case} was accepted"
    assert field in result.stderr and message in result.stderr, result.stderr
    assert get_json(kubectl, "-n", namespace, "vllmservice", "hostile") is None


@pytest.mark.parametrize("case", ACCEPTED, ids=list(ACCEPTED))
def test_user_spellings_are_accepted(case: str, crd: None, namespace: str, kubectl: Kubectl) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(ACCEPTED[case]))
    stored = get_json(kubectl, "-n", namespace, "vllmservice", "hostile")
    assert stored is not None
    sent = ACCEPTED[case]["spec"]
    assert stored["spec"]["model"]["name"] == sent["model"]["name"]
    assert stored["spec"]["runtime"].get("extraArgs") == sent.get("runtime", {}).get("extraArgs")


def engine(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return container


def test_dollar_strings_reach_the_deployment_escaped(namespace: str, kubectl: Kubectl, operator) -> None:
    body = manifest(
        "dollars",
        {
            "name": MODEL,
            "servedModelName": "chat-$(HF_TOKEN)",
            "source": {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "token"}}},
        },
        runtime={
            "extraArgs": ["--override-generation-config", '{"stop": ["$(HF_TOKEN)", "$$"]}'],
            "env": [{"name": "GREETING", "value": "cost: $(STOKER_CONTROL_TOKEN) $5"}],
        },
        coldStart={"seed": {"enabled": False}},
    )
    kubectl("-n", namespace, "create", "secret", "generic", "hf", "--from-literal=token=hf_secret")
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body))
    deployment = wait_for(
        lambda: get_json(kubectl, "-n", namespace, "deployment", "dollars"), what="the Deployment"
    )
    container = engine(deployment["spec"]["template"])
    args, env = container["args"], {e["name"]: e.get("value") for e in container["env"]}
    # `$$` is the kubelet's escape for `$`: vLLM gets `chat-$(HF_TOKEN)`, not the token.
    assert args[args.index("--served-model-name") + 1] == "chat-$$(HF_TOKEN)"
    assert args[-1] == '{"stop": ["$$(HF_TOKEN)", "$$$$"]}'
    assert env["GREETING"] == "cost: $$(STOKER_CONTROL_TOKEN) $$5"
    assert not any("hf_secret" in arg for arg in args)


def test_restricted_namespace_admits_seed_and_serving_pods(
    namespace: str, kubectl: Kubectl, operator
) -> None:
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    # The API server enforces it: a pod without the restricted settings is refused.
    refused = kubectl("-n", namespace, "run", "plain", "--image=busybox", "--restart=Never", check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr
    body = manifest(
        "restricted",
        runtime={"replicas": 2, "gpus": 2},  # tensor parallel 2: the /dev/shm emptyDir too
        coldStart={"modelCache": {"enabled": True, "size": "1Gi"}},  # the download init container too
    )
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body))
    svc = wait_ready(kubectl, namespace, "restricted", timeout=240)
    assert svc["status"]["readyReplicas"] == 2
    pods = json.loads(kubectl("-n", namespace, "get", "pods", "-o", "json").stdout)["items"]
    seed_pods = [p for p in pods if "job-name" in p["metadata"]["labels"]]
    serving_pods = [p for p in pods if "pod-template-hash" in p["metadata"]["labels"]]
    assert seed_pods and len(serving_pods) == 2
    for pod in seed_pods + serving_pods:
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["initContainers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    events = kubectl("-n", namespace, "get", "events", "-o", "json").stdout
    assert "FailedCreate" not in events


def test_seed_job_gets_no_control_token(namespace: str, kubectl: Kubectl, operator) -> None:
    body = manifest("tokens", runtime={"replicas": 1}, coldStart={"standby": {"replicas": 1}})
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(body))

    def seed_job() -> dict[str, Any] | None:
        jobs = json.loads(kubectl("-n", namespace, "get", "jobs", "-o", "json").stdout)["items"]
        return jobs[0] if jobs else None

    job = wait_for(seed_job, what="the seed Job")
    deployment = wait_for(
        lambda: get_json(kubectl, "-n", namespace, "deployment", "tokens"), what="Deployment"
    )
    seed_env = {e["name"] for e in engine(job["spec"]["template"])["env"]}
    serving_env = {e["name"] for e in engine(deployment["spec"]["template"])["env"]}
    assert "VLLM_SERVER_DEV_MODE" in seed_env  # same engine settings as the serving pods...
    assert "STOKER_CONTROL_TOKEN" not in seed_env  # ...but not the token
    assert "STOKER_CONTROL_TOKEN" in serving_env
