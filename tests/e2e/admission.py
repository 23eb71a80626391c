"""The chart's tenant boundary (charts/stoker/templates/admission-policy.yaml and its ClusterRoles for people)
as the e2e tests apply it and ask it, as a tenant, for a verdict."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from tests.conftest import Helm
from tests.e2e.helpers import CHART, QWEN, apply, wait_for

# The policy's and the roles' names carry the release namespace; nothing is installed in it.
RELEASE_NAMESPACE = "admission-e2e"
POLICY = f"{RELEASE_NAMESPACE}-stoker-tenant-boundary"
EDITOR = f"{RELEASE_NAMESPACE}-stoker-vllmservice-editor"
TENANT = "alice"
NAME = "svc"
MODEL = QWEN


def manifest(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": NAME},
        "spec": {"model": {"name": MODEL}, **copy.deepcopy(spec or {})},
    }


def chart_objects(helm: Helm, *values: str) -> str:
    """The chart's tenant boundary and its ClusterRoles for people, as `helm template` renders them."""
    rendered = helm("template", "stoker", str(CHART), "--namespace", RELEASE_NAMESPACE, *values).stdout
    docs = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc
        and (
            doc["kind"].startswith("ValidatingAdmissionPolicy") or "-vllmservice-" in doc["metadata"]["name"]
        )
    ]
    return yaml.safe_dump_all(docs)


def apply_as(kubectl, user: str, namespace: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl("--as", user, "-n", namespace, "apply", "-f", "-", input=json.dumps(obj), check=False)


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The policy's message of a refused apply."""
    assert result.returncode != 0, "accepted"
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in result.stderr and "forbidden" in result.stderr, (
        result.stderr
    )
    return result.stderr.split("denied request: ", 1)[1].strip()


def bind(kubectl, namespace: str, user: str, rule: dict[str, Any], name: str) -> None:
    """A Role of one rule for `user`, in force (`kubectl auth can-i` says yes) when this returns."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name},
        "rules": [rule],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    apply(kubectl, namespace, {"kind": "List", "apiVersion": "v1", "items": [role, binding]})
    resource, _, subresource = rule["resources"][0].partition("/")
    target = resource + (f".{rule['apiGroups'][0]}" if rule["apiGroups"][0] else "")
    target += "".join(f"/{name}" for name in rule.get("resourceNames", [])[:1])
    question = [rule["verbs"][0], target, *(["--subresource", subresource] if subresource else [])]
    wait_for(
        lambda: may(kubectl, namespace, user, *question), timeout=30, what=f"{user} may {' '.join(question)}"
    )


def may(kubectl, namespace: str, user: str, *question: str) -> bool:
    """`kubectl auth can-i` as `user`: the API server's own authorizer."""
    answer = kubectl("auth", "can-i", *question, "-n", namespace, "--as", user, check=False)
    return answer.stdout.strip() == "yes"


def grant_editor(kubectl, namespace: str) -> None:
    """TENANT holds the chart's VLLMService editor role in `namespace`."""
    kubectl("-n", namespace, "create", "rolebinding", "tenant", f"--clusterrole={EDITOR}", f"--user={TENANT}")


def editor_in_force(kubectl, namespace: str) -> str:
    """`namespace`, once TENANT holds the chart's VLLMService editor role there (the ClusterRole applied)."""
    grant_editor(kubectl, namespace)
    wait_for(
        lambda: may(kubectl, namespace, TENANT, "create", "vllmservices.stoker.dev"),
        timeout=30,
        what="binding",
    )
    return namespace


@pytest.fixture
def tenant_namespace(namespace: str, kubectl) -> str:
    """A namespace where TENANT holds the chart's VLLMService editor role and nothing else."""
    return editor_in_force(kubectl, namespace)


def dry_run(kubectl, namespace: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The tenant's create of `spec`, through admission but not stored."""
    obj = json.dumps(manifest(spec))
    return kubectl(
        "--as", TENANT, "-n", namespace, "create", "--dry-run=server", "-f", "-", input=obj, check=False
    )


def policy_refuses(kubectl, namespace: str, spec: dict[str, Any]) -> bool:
    result = dry_run(kubectl, namespace, spec)
    return result.returncode != 0 and POLICY in result.stderr


@pytest.fixture(scope="module")
def probe_namespace(cluster, kubectl, crd: None) -> Iterator[str]:
    name = f"admission-probe-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    grant_editor(kubectl, name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


HOST_PATH = {"pod": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}


def apply_chart(kubectl, helm: Helm, *values: str) -> None:
    kubectl("apply", "-f", "-", input=chart_objects(helm, *values))


@contextmanager
def policy_alone(kubectl, helm: Helm, probe_namespace: str, *values: str) -> Iterator[None]:
    """The chart's policy rendered with `values`, the only tenant boundary in force while the block runs (a
    release another test applied and left would refuse first)."""
    kubectl("delete", "validatingadmissionpolicybindings", "-l", "app.kubernetes.io/part-of=stoker")
    apply_chart(kubectl, helm, *values)
    wait_for(
        lambda: policy_refuses(kubectl, probe_namespace, HOST_PATH), timeout=60, what="the policy in force"
    )
    yield
    kubectl("delete", "-f", "-", "--wait=false", input=chart_objects(helm), check=False)
