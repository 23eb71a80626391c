"""Polling and lookup helpers shared by the e2e tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def wait_for(predicate: Callable[[], Any], timeout: float = 120, what: str = "condition") -> Any:
    """Poll until predicate returns something truthy, and return it."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(0.5)
    return value


def get_json(kubectl: Callable[..., Any], *args: str) -> dict[str, Any] | None:
    """`kubectl get ARGS -o json`, or None when the object does not exist."""
    result = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def wait_ready(
    kubectl: Callable[..., Any], namespace: str, name: str, timeout: float = 120
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", name)
        return svc if condition(svc, "Ready").get("status") == "True" else None

    return wait_for(ready, timeout, what=f"{namespace}/{name} Ready=True")


def apply_namespace_policy(
    kubectl: Callable[..., Any], name: str, namespace: str, rule: dict[str, Any], validation: dict[str, Any]
) -> None:
    """A ValidatingAdmissionPolicy named `name` that denies, in `namespace` only, the requests `rule` matches
    (one resourceRules entry) unless `validation` holds; its binding has the same name."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "validations": [validation],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    items = {"apiVersion": "v1", "kind": "List", "items": [policy, binding]}
    kubectl("apply", "-f", "-", input=json.dumps(items))


def delete_policy(kubectl: Callable[..., Any], name: str) -> None:
    kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name, check=False)


def build_or_skip(script: Path, env: dict[str, str], wanted: list[Path]) -> None:
    """`script build` (a hack/ script building Go binaries into hack/cluster's bin dir) if go is here; a
    failed build fails the test in CI and skips it elsewhere, as does no go with `wanted` missing."""
    name = f"hack/{script.name}"
    if shutil.which("go"):
        build = subprocess.run([str(script), "build"], env=env, capture_output=True, text=True, timeout=1800)
        if build.returncode != 0:
            message = f"{name} build failed:\n{build.stderr[-3000:]}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    elif not all(path.exists() for path in wanted):
        pytest.skip(f"{', '.join(p.name for p in wanted)} missing and no go to build them ({name} build)")
