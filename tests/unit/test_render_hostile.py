"""Rendering hostile strings literally (the kubelet's `$(VAR)` expansion) and Pod Security `restricted`."""

from __future__ import annotations

from typing import Any

import pytest

from stoker.render import build_deployment, build_seed_job, engine_invocation
from stoker.render.pods import ENGINE_GID, ENGINE_UID
from tests.unit.test_dockerfile import parse
from tests.unit.test_render import engine_container, service

HOSTILE = "$(HF_TOKEN)-$$-$(STOKER_CONTROL_TOKEN)"


def pod_templates(**changes: Any) -> list[dict[str, Any]]:
    svc = service(**changes)
    return [build_seed_job(svc)["spec"]["template"], build_deployment(svc)["spec"]["template"]]


def kubelet_expansion(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of `text` (k8s.io/kubernetes/third_party/forked/golang/expansion): `$$` is
    `$`, `$(NAME)` of a defined variable is its value, anything else stays."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) > 0 and text[i + 2 : end] in env:
            out.append(env[text[i + 2 : end]])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@pytest.mark.parametrize(
    "changes",
    [
        {"runtime.extraArgs": ["--chat-template", HOSTILE]},
        {"model.servedModelName": HOSTILE},
        {
            "model.name": f"org/{HOSTILE}",
            "coldStart.modelCache": {"enabled": True},
            "model.revision": HOSTILE,
        },
        {"runtime.env": [{"name": "USER_VALUE", "value": HOSTILE}]},
    ],
)
def test_dollar_strings_reach_the_process_literally(changes: dict[str, Any]) -> None:
    svc = service(**changes)
    secrets = {"HF_TOKEN": "hf_secret", "STOKER_CONTROL_TOKEN": "control", "USER_VALUE": "x"}
    expected = engine_invocation(svc, "serve")
    for template in pod_templates(**changes):
        programs, *init_containers = template["spec"]["initContainers"]
        assert programs["command"] == ["stoker", "programs", "/opt/stoker/programs"]  # nothing of the spec
        for container in [*init_containers, *template["spec"]["containers"]]:
            strings = [*container["command"], *container.get("args", [])]
            strings += [var["value"] for var in container["env"] if "value" in var]
            expanded = [kubelet_expansion(text, secrets) for text in strings]
            assert "hf_secret" not in "".join(expanded) and "control" not in "".join(expanded)
            assert HOSTILE in "".join(expanded)
    serving = engine_container(build_deployment(svc)["spec"]["template"])
    assert [kubelet_expansion(a, secrets) for a in serving["args"]] == expected.args


@pytest.mark.parametrize("changes", [{}, {"coldStart.modelCache": {"enabled": True}}, {"runtime.gpus": 2}])
def test_seed_and_serving_pods_meet_pod_security_restricted(changes: dict[str, Any]) -> None:
    for template in pod_templates(**changes):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == ENGINE_UID != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert all("hostPath" not in volume for volume in pod["volumes"])
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert "ports" not in container or all("hostPort" not in p for p in container["ports"])


def test_pods_run_as_the_runtime_images_user() -> None:
    assert parse()["runtime"].last("USER") == f"{ENGINE_UID}:{ENGINE_GID}"
