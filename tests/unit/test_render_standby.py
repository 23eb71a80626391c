"""Rendering with spec.coldStart.standby: sleep mode, the control guard and token, roles and replicas."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.render import (
    build_deployment,
    build_seed_job,
    build_service,
    cache_key,
    engine_invocation,
    key_relevant_args,
    render_children,
    server_selector,
    serving_selector,
)
from stoker.render.control import build_control_secret, control_token
from tests.unit.test_render import engine_container
from tests.unit.test_render import service as base_service

ROLE_LABEL = "stoker.dev/role"
GUARD_ARGS = ["--middleware", "stoker.guard.ControlGuard"]
TOKEN_REF = {"name": "llama-control", "key": "token"}
TOKEN_ENV = {"name": "STOKER_CONTROL_TOKEN", "valueFrom": {"secretKeyRef": TOKEN_REF}}


def service(standby: dict[str, Any] | None = None, **runtime: Any) -> VLLMService:
    """test_render's BASE, `standby` as spec.coldStart.standby (if given), `runtime` in spec.runtime."""
    changes = {f"runtime.{field}": value for field, value in runtime.items()}
    if standby is not None:
        changes["coldStart.standby"] = standby
        # BASE's VLLM_API_KEY is refused with standby (the operator's wake check sends no key).
        changes.setdefault("runtime.env", [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}])
    return base_service(**changes)


def seed_and_serving_containers(svc: VLLMService) -> list[dict[str, Any]]:
    return [
        engine_container(build_seed_job(svc)["spec"]["template"]),
        engine_container(build_deployment(svc)["spec"]["template"]),
    ]


def contains(args: list[str], part: list[str]) -> bool:
    return any(args[i : i + len(part)] == part for i in range(len(args) - len(part) + 1))


# ---------------------------------------------------------------------------------------- engine args


def test_seed_and_serving_pods_run_in_sleep_mode_behind_the_guard() -> None:
    for container in seed_and_serving_containers(service({})):
        assert "--enable-sleep-mode" in container["args"]
        assert contains(container["args"], GUARD_ARGS)
    for container in seed_and_serving_containers(service()):
        assert "--enable-sleep-mode" not in container["args"]
        assert "--middleware" not in container["args"]


def test_seed_and_serving_key_relevant_args_are_equal_with_standby() -> None:
    svc = service({"replicas": 2})
    seed, serve = engine_invocation(svc, "seed"), engine_invocation(svc, "serve")
    assert key_relevant_args(seed.args, svc.spec.runtime.engine_profile) == key_relevant_args(
        serve.args, svc.spec.runtime.engine_profile
    )
    assert "--enable-sleep-mode" in key_relevant_args(serve.args, svc.spec.runtime.engine_profile)
    assert "--middleware" not in key_relevant_args(serve.args, svc.spec.runtime.engine_profile)
    seed_container, serve_container = seed_and_serving_containers(svc)
    # The seed's args: the import-pages listing, the volume it empties, then the serving pods' vLLM argv
    # (their command is "vllm serve" here: standby pods load with the streamer and are not read ahead).
    engine_args = seed_container["args"][seed_container["args"].index("--") + 1 :]
    assert key_relevant_args(engine_args, svc.spec.runtime.engine_profile) == serve_container[
        "command"
    ] + key_relevant_args(serve_container["args"], svc.spec.runtime.engine_profile)


def test_cache_key_changes_with_standby_but_not_with_its_replicas() -> None:
    assert cache_key(service({})) != cache_key(service())
    # Even zero standby replicas turn sleep mode on, so the key is that of standby.
    assert cache_key(service({"replicas": 0})) == cache_key(service({"replicas": 3}))
    assert cache_key(service({"replicas": 0})) == cache_key(service({}))
    assert cache_key(service({"wakeTimeoutSeconds": 90})) == cache_key(service({}))


# ------------------------------------------------------------------------------------------------ env


def test_dev_mode_on_seed_and_serving_pods_and_the_control_token_on_serving_pods_only() -> None:
    seed, serving = seed_and_serving_containers(service({}))
    for container in (seed, serving):
        env = {var["name"]: var for var in container["env"]}
        assert env["VLLM_SERVER_DEV_MODE"] == {"name": "VLLM_SERVER_DEV_MODE", "value": "1"}
    serving_env = {var["name"]: var for var in serving["env"]}
    assert serving_env["STOKER_CONTROL_TOKEN"] == TOKEN_ENV
    assert "value" not in serving_env["STOKER_CONTROL_TOKEN"]  # never the token itself in the pod spec
    assert "STOKER_CONTROL_TOKEN" not in {var["name"] for var in seed["env"]}
    for container in seed_and_serving_containers(service()):
        names = {var["name"] for var in container["env"]}
        assert "VLLM_SERVER_DEV_MODE" not in names
        assert "STOKER_CONTROL_TOKEN" not in names


def test_seed_and_serving_env_differ_only_by_the_control_token_with_standby() -> None:
    seed, serve = seed_and_serving_containers(service({}))
    assert seed["env"] == [var for var in serve["env"] if var != TOKEN_ENV]


# ------------------------------------------------------------------------------- replicas and labels


@pytest.mark.parametrize(("active", "standby"), [(2, 1), (2, 0), (0, 3), (5, 100)])
def test_deployment_runs_active_plus_standby_replicas(active: int, standby: int) -> None:
    svc = service({"replicas": standby}, replicas=active)
    assert build_deployment(svc)["spec"]["replicas"] == active + standby
    assert build_deployment(svc, replicas=0)["spec"]["replicas"] == 0  # a closed seed gate still wins


def test_deployment_without_standby_runs_the_active_replicas() -> None:
    assert build_deployment(service(replicas=3))["spec"]["replicas"] == 3


def test_pods_start_active_and_the_deployment_selects_every_role() -> None:
    deployment = build_deployment(service({}))
    assert deployment["spec"]["template"]["metadata"]["labels"][ROLE_LABEL] == "active"
    # Relabelling a pod standby must keep it in its ReplicaSet.
    assert ROLE_LABEL not in deployment["spec"]["selector"]["matchLabels"]
    assert (
        deployment["spec"]["selector"]["matchLabels"]
        == build_deployment(service())["spec"]["selector"]["matchLabels"]
    )
    assert ROLE_LABEL not in deployment["metadata"]["labels"]
    assert ROLE_LABEL not in build_deployment(service())["spec"]["template"]["metadata"]["labels"]


def test_service_selects_active_pods_only_with_standby() -> None:
    selector = build_service(service({}))["spec"]["selector"]
    assert selector[ROLE_LABEL] == "active"
    assert ROLE_LABEL not in build_service(service())["spec"]["selector"]
    # Every label the Service selects on is on the pod template.
    pod_labels = build_deployment(service({}))["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


def test_serving_selector_has_the_role_only_with_standby() -> None:
    base = "app.kubernetes.io/instance=llama,app.kubernetes.io/component=server"
    assert serving_selector(service({})) == base + ",stoker.dev/role=active"
    assert serving_selector(service()) == base
    # What the operator lists (and the Deployment owns) stays every serving pod.
    assert server_selector("llama") == base


def test_seed_job_has_no_role_label() -> None:
    labels = build_seed_job(service({}))["spec"]["template"]["metadata"]["labels"]
    assert ROLE_LABEL not in labels


def test_children_with_standby_are_the_same_kinds() -> None:
    kinds = [child["kind"] for child in render_children(service({}))]
    assert kinds == ["PersistentVolumeClaim", "Job", "Deployment", "Service"]


# ------------------------------------------------------------------------------------- control secret


def test_control_secret() -> None:
    secret = build_control_secret(service({}), "tok-123")
    assert secret["apiVersion"] == "v1"
    assert secret["kind"] == "Secret"
    assert secret["type"] == "Opaque"
    assert secret["metadata"]["name"] == "llama-control"
    assert secret["metadata"]["namespace"] == "ml"
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama"
    assert secret["data"] == {"token": base64.b64encode(b"tok-123").decode()}
    assert "stringData" not in secret


def test_control_secret_is_what_the_pods_read() -> None:
    secret = build_control_secret(service({}), "tok")
    assert {"name": secret["metadata"]["name"], "key": next(iter(secret["data"]))} == TOKEN_REF


def test_control_tokens_are_derived_per_object_and_key() -> None:
    """The operator never reads the Secret back: the same key and uid always give the same token."""
    tokens = {control_token("key", f"uid-{n}") for n in range(20)}
    assert len(tokens) == 20 and all(len(token) >= 32 for token in tokens)
    assert control_token("key", "uid-1") == control_token("key", "uid-1") != control_token("other", "uid-1")


def test_the_control_secret_is_a_child_only_with_standby_and_a_token() -> None:
    kinds = [child["kind"] for child in render_children(service({}), control_token="tok")]
    assert kinds[0] == "Secret"
    assert "Secret" not in [child["kind"] for child in render_children(service({}))]
    assert "Secret" not in [child["kind"] for child in render_children(service(), control_token="tok")]


# ----------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", ["VLLM_SERVER_DEV_MODE", "STOKER_CONTROL_TOKEN"])
def test_runtime_env_must_not_set_standby_variables(name: str) -> None:
    with pytest.raises(ValidationError, match="env must not set variables stoker owns"):
        service({}, env=[{"name": name, "value": "1"}])
    with pytest.raises(ValidationError, match="env must not set variables stoker owns"):
        service(env=[{"name": name, "valueFrom": {"secretKeyRef": {"name": "x", "key": "y"}}}])


@pytest.mark.parametrize("level", [0, 2, 3])
def test_only_sleep_level_1_is_accepted(level: int) -> None:
    with pytest.raises(ValidationError, match="level"):
        service({"level": level})
    assert service({"level": 1}).spec.cold_start.standby is not None


@pytest.mark.parametrize(("replicas", "valid"), [(-1, False), (0, True), (100, True), (101, False)])
def test_standby_replicas_bounds(replicas: int, valid: bool) -> None:
    if valid:
        standby = service({"replicas": replicas}).spec.cold_start.standby
        assert standby is not None and standby.replicas == replicas
    else:
        with pytest.raises(ValidationError, match="replicas"):
            service({"replicas": replicas})


def test_standby_defaults() -> None:
    standby = service({}).spec.cold_start.standby
    assert standby is not None
    assert (standby.replicas, standby.level, standby.wake_timeout_seconds) == (1, 1, 30)
    assert service().spec.cold_start.standby is None


def test_unknown_standby_fields_are_rejected() -> None:
    with pytest.raises(ValidationError):
        service({"sleepLevel": 1})
