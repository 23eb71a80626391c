"""Serving pods made for snapshot and restore (render.snapshot) and the signature the node agent checks
(snapshot.trust): what the operator renders when an admin turned it on, which services it leaves alone, and
which pods the agent refuses to act on."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api.owned import CACHE_KEY_LABEL, INSTANCE_LABEL, SNAPSHOT_LABEL
from stoker.controller.settings import OperatorSettings
from stoker.guard import CONTROL_TOKEN_ENV
from stoker.inpod import engine_init
from stoker.render.children import render_children
from stoker.render.engine import CONTROL_GUARD
from stoker.render.pods import ENGINE_CONTAINER
from stoker.render.snapshot import GATE_PORT, Snapshots
from stoker.snapshot import agent, plan, trust
from tests.unit.test_render import by_kind, engine_container, service

KEY = "operator-control-key-0123456789"
SNAPSHOTS = Snapshots(KEY, restore_wait_seconds=10, restore_bound_seconds=120, offer_bound_seconds=300)


def deployment(snapshots: Snapshots | None = SNAPSHOTS, **changes: Any) -> dict[str, Any]:
    return by_kind(render_children(service(**changes), snapshots=snapshots))["Deployment"]


def as_pod(template: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    """The template as a pod of it reads back: the API server's defaults filled in, a token mounted."""
    pod = copy.deepcopy(template)
    pod["metadata"]["namespace"] = namespace
    for container in pod["spec"]["containers"]:
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container["volumeMounts"].append({"name": "kube-api-access-x", "mountPath": "/var/run/secrets"})
    pod["spec"].setdefault("restartPolicy", "Always")
    return pod


def signed(pod: dict[str, Any]) -> bool:
    labels = pod["metadata"]["labels"]
    return trust.signed(KEY, pod, labels[INSTANCE_LABEL], labels[CACHE_KEY_LABEL], ENGINE_CONTAINER)


def test_the_engine_runs_under_engine_init_gated_on_loopback_and_signed() -> None:
    plain = engine_container(deployment(None)["spec"]["template"])
    template = deployment()["spec"]["template"]
    engine = engine_container(template)
    command = engine["command"]
    separator = command.index("--")
    assert command[:3] == ["python3", "-m", engine_init.__name__]
    assert command[separator + 1 :] == plain["command"] + plain["args"] and "args" not in engine
    options = dict(zip(command[3:separator:2], command[4:separator:2], strict=True))
    assert options == {
        "--restore-wait": "10",
        "--restore-bound": "120",
        "--health-url": "http://127.0.0.1:8000/health",
        "--gate-port": str(GATE_PORT),
        "--offer-bound": "300",
    }
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert {name: env[name] for name in plan.LOOPBACK_ENVIRONMENT} == plan.LOOPBACK_ENVIRONMENT
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # a GPU engine: forked ones share device files
    assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "snapshot-gate"}
    assert engine["readinessProbe"]["periodSeconds"] == 1
    assert {"name": "snapshot-gate", "containerPort": GATE_PORT, "protocol": "TCP"} in engine["ports"]
    assert (
        engine["startupProbe"] == plain["startupProbe"] and engine["livenessProbe"] == plain["livenessProbe"]
    )
    (handshake,) = [m for m in engine["volumeMounts"] if m["mountPath"] == engine_init.HANDSHAKE_DIRECTORY]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == handshake["name"]]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    assert template["metadata"]["labels"][SNAPSHOT_LABEL] == "true"
    assert signed(as_pod(template))


def test_nothing_changes_when_the_admin_has_not_turned_it_on() -> None:
    template = deployment(None)["spec"]["template"]
    assert SNAPSHOT_LABEL not in template["metadata"]["labels"]
    assert trust.SIGNATURE_ANNOTATION not in template["metadata"]["annotations"]
    assert engine_container(template)["command"][:3] != ["python3", "-m", engine_init.__name__]


@pytest.mark.parametrize(
    "changes",
    [
        {"runtime.gpus": 2, "runtime.tensorParallelSize": 2},
        {"coldStart.standby": {"replicas": 1}, "runtime.env": []},
    ],
    ids=["tensor-parallel", "standby"],
)
def test_services_a_snapshot_cannot_cover_are_left_as_they_are(changes: dict[str, Any]) -> None:
    assert deployment(**changes) == deployment(None, **changes)


def test_an_engine_in_sleep_mode_is_snapshotted_asleep_behind_the_guard_with_its_control_token() -> None:
    sleeping = {"runtime.extraArgs": ["--enable-sleep-mode"]}
    children = by_kind(render_children(service(**sleeping), snapshots=SNAPSHOTS, control_token="t" * 32))
    template = children["Deployment"]["spec"]["template"]
    engine = engine_container(template)
    command = engine["command"]
    separator = command.index("--")
    assert "--sleep" in command[:separator]
    # The dev endpoints sleep mode needs, behind the guard, which only the pod's control token passes.
    assert command[-2:] == ["--middleware", CONTROL_GUARD] and "--enable-sleep-mode" in command[separator:]
    env = {e["name"]: e for e in engine["env"]}
    assert env["VLLM_SERVER_DEV_MODE"]["value"] == "1"
    secret = children["Secret"]
    assert env[CONTROL_TOKEN_ENV]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert signed(as_pod(template))
    # The seed runs in sleep mode too (part of the compile-cache key), without the guard or a token.
    seed = engine_container(children["Job"]["spec"]["template"])
    seed_text = json.dumps(seed)
    assert "--enable-sleep-mode" in seed_text and CONTROL_GUARD not in seed_text
    assert CONTROL_TOKEN_ENV not in seed_text
    # Without sleep mode, or with snapshots off, no Secret and no dev mode.
    assert "Secret" not in by_kind(render_children(service(), snapshots=SNAPSHOTS, control_token="t" * 32))
    assert "Secret" not in by_kind(render_children(service(**sleeping), control_token="t" * 32))
    plain = engine_container(deployment()["spec"]["template"])
    assert "--sleep" not in plain["command"] and "VLLM_SERVER_DEV_MODE" not in json.dumps(plain["env"])


def test_the_seed_is_never_made_for_snapshots() -> None:
    job = by_kind(render_children(service(), snapshots=SNAPSHOTS))["Job"]
    assert engine_container(job["spec"]["template"])["command"][:3] != ["python3", "-m", engine_init.__name__]


def test_the_signature_covers_namespace_service_key_and_what_runs() -> None:
    pod = as_pod(deployment()["spec"]["template"])
    labels = pod["metadata"]["labels"]
    assert signed(pod)
    changed: list[dict[str, Any]] = []
    for edit in (
        lambda p: p["metadata"].update(namespace="other"),
        lambda p: p["metadata"]["labels"].update({INSTANCE_LABEL: "other"}),
        lambda p: p["metadata"]["labels"].update({CACHE_KEY_LABEL: "0" * 16}),
        lambda p: p["spec"]["containers"][0].update(image="attacker/image:1"),
        lambda p: p["spec"]["containers"][0]["command"].append("--trust-remote-code"),
        lambda p: p["spec"]["containers"][0]["env"].append({"name": "LD_PRELOAD", "value": "/tmp/x.so"}),
        lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True),
        lambda p: p["spec"]["securityContext"].update(runAsUser=0),
        lambda p: p["spec"].update(hostPID=True),
        lambda p: p["metadata"]["annotations"].pop(trust.SIGNATURE_ANNOTATION),
        lambda p: p["metadata"]["annotations"].update({trust.SIGNATURE_ANNOTATION: "0" * 64}),
    ):
        copied = copy.deepcopy(pod)
        edit(copied)
        changed.append(copied)
    assert [signed(p) for p in changed] == [False] * len(changed)
    # Another key: not the operator's.
    assert not trust.signed(
        "another-key-0123456789", pod, labels[INSTANCE_LABEL], labels[CACHE_KEY_LABEL], "vllm"
    )


def test_a_field_reference_signs_alike_with_and_without_its_defaulted_api_version() -> None:
    spec = {
        "containers": [
            {"name": "vllm", "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}
        ]
    }
    defaulted = json.loads(json.dumps(spec))
    defaulted["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    assert trust.signature(KEY, "ns", "svc", "k", spec, "vllm") == trust.signature(
        KEY, "ns", "svc", "k", defaulted, "vllm"
    )


def test_the_agent_takes_no_handshake_from_an_unsigned_pod() -> None:
    """handshake_of returns before it looks at the node's processes: the inits map is empty on purpose."""
    pod = as_pod(deployment()["spec"]["template"])
    pod["metadata"]["annotations"].pop(trust.SIGNATURE_ANNOTATION)
    pod["metadata"]["name"] = "p"
    pod["status"] = {"containerStatuses": [{"name": "vllm", "containerID": "containerd://" + "a" * 64}]}
    assert agent.handshake_of(pod, {}, engine_init.HANDSHAKE_DIRECTORY, KEY) is None


def test_the_agent_refuses_to_serve_without_the_operators_key(tmp_path: Any, capsys: Any) -> None:
    short = tmp_path / "key"
    short.write_text("short")
    for argv in (
        ["serve", "--base", str(tmp_path), "--node", "n"],
        ["serve", "--base", str(tmp_path), "--node", "n", "--key-file", str(tmp_path / "missing")],
        ["serve", "--base", str(tmp_path), "--node", "n", "--key-file", str(short)],
    ):
        with pytest.raises(SystemExit) as exited:
            agent.main(argv)
        assert exited.value.code == 2
    assert "--key-file" in capsys.readouterr().err


def test_the_operator_refuses_snapshots_without_a_control_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_SNAPSHOT_ENABLED", "true")
    monkeypatch.delenv("STOKER_CONTROL_KEY", raising=False)
    monkeypatch.delenv("STOKER_CONTROL_KEY_SECRET", raising=False)
    with pytest.raises(ValidationError, match="STOKER_CONTROL_KEY_SECRET"):
        OperatorSettings()
    monkeypatch.setenv("STOKER_CONTROL_KEY_SECRET", "stoker-control-key")
    assert OperatorSettings().snapshot_enabled
