"""Polling, lookup, manifest and fixture helpers shared by the e2e tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data"
# Recorded vLLM 0.22.1 starts on an H100, shared with the unit tests of the phase parser.
RECORDED = Path(__file__).resolve().parents[1] / "unit" / "data" / "phases" / "vllm-0.22.1-h100"
CHART = Path(__file__).resolve().parents[2] / "charts" / "stoker"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# The operator's startup coefficients outside the chart (tests/conftest.py runs `stoker run` without
# them set).
CONFIGMAP = ("configmap", "stoker-startup-coefficients")
CONFIGMAP_NAMESPACE = "default"
WARM_NODE = "kwok-gpu-0"  # hack/cluster's first fake GPU node
WARM_NODE_LABEL = "stoker.dev/e2e-node-warming"


def wait_for(
    predicate: Callable[[], Any], timeout: float = 120, what: str = "condition", every: float = 0.5
) -> Any:
    """Poll every `every` seconds until predicate returns something truthy, and return it."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(every)
    return value


def create_namespace(kubectl: Callable[..., Any]) -> str:
    """A new namespace, once pods may be made in it (the service-account controller has made "default")."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    wait_for(
        lambda: kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
        timeout=30,
        what=f"the default service account of {name}",
        every=0.2,
    )
    return name


@pytest.fixture
def other_namespace(kubectl: Callable[..., Any]) -> Iterator[str]:
    """A second tenant's namespace, beside the `namespace` fixture's."""
    name = create_namespace(kubectl)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def vllm_service(
    name: str, *, model: str = QWEN, cold_start: dict[str, Any] | None = None, **runtime: Any
) -> dict[str, Any]:
    """A VLLMService of `model` with one replica unless `runtime` says otherwise, and `cold_start` as its
    spec.coldStart when given."""
    spec: dict[str, Any] = {"model": {"name": model}, "runtime": {"replicas": 1, **runtime}}
    if cold_start is not None:
        spec["coldStart"] = cold_start
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": name},
        "spec": spec,
    }


def qwen(name: str, seed: bool = False, **runtime: Any) -> dict[str, Any]:
    """A Qwen VLLMService whose cache seed is off unless `seed`."""
    return vllm_service(name, cold_start={"seed": {"enabled": seed}}, **runtime)


def llama(name: str, **runtime: Any) -> dict[str, Any]:
    """Llama-3.1-8B on vLLM 0.22.1, the version of the recorded logs (so observations and predictions
    share a hardware class)."""
    return vllm_service(name, model=LLAMA, engineVersion="0.22.1", **runtime)


def apply(kubectl: Callable[..., Any], namespace: str, manifest: dict[str, Any] | str) -> None:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    kubectl("-n", namespace, "apply", "-f", "-", input=text)


def owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(ref["uid"] == owner["metadata"]["uid"] and ref.get("controller") for ref in refs)


def get_json(kubectl: Callable[..., Any], *args: str) -> dict[str, Any] | None:
    """`kubectl get ARGS -o json`, or None when the object does not exist."""
    result = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def seeded_service(kubectl: Callable[..., Any], namespace: str, name: str) -> dict[str, Any] | None:
    """The VLLMService once its seed has filled the cache for its current key, else None."""
    svc = get_json(kubectl, "-n", namespace, "vllmservice", name) or {}
    cache_status = (svc.get("status") or {}).get("cache") or {}
    key = cache_status.get("key")
    return svc if key and cache_status.get("seededKey") == key else None


def wait_ready(
    kubectl: Callable[..., Any], namespace: str, name: str, timeout: float = 120
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", name)
        return svc if condition(svc, "Ready").get("status") == "True" else None

    return wait_for(ready, timeout, what=f"{namespace}/{name} Ready=True")


def wait_condition(
    kubectl: Callable[..., Any],
    namespace: str,
    name: str,
    kind: str,
    status: str,
    reason: str,
    timeout: float = 60,
    says: str = "",
) -> dict[str, Any]:
    """The VLLMService once its `kind` condition has `status` and `reason`, and a message with `says`."""

    def found() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", name)
        held = condition(svc, kind)
        matches = (held.get("status"), held.get("reason")) == (status, reason)
        return svc if matches and says in held.get("message", "") else None

    what = f"{namespace}/{name} {kind}={status} reason {reason} saying {says!r}"
    return wait_for(found, timeout, what=what)


def get_service(kubectl: Callable[..., Any], namespace: str, name: str) -> dict[str, Any]:
    """The VLLMService as stored, or {} while there is none."""
    return get_json(kubectl, "-n", namespace, "vllmservice", name) or {}


def seed_jobs(kubectl: Callable[..., Any], namespace: str, name: str) -> list[str]:
    jobs = get_json(kubectl, "-n", namespace, "jobs", "-l", f"app.kubernetes.io/instance={name}") or {}
    return [
        j["metadata"]["name"] for j in jobs.get("items", []) if not j["metadata"].get("deletionTimestamp")
    ]


def delete_and_wait_for_garbage_collection(kubectl: Callable[..., Any], namespace: str, name: str) -> None:
    kubectl("-n", namespace, "delete", "vsvc", name)
    wait_for(
        lambda: (
            not kubectl(
                "-n",
                namespace,
                "get",
                "deployment,job",
                "-l",
                f"app.kubernetes.io/instance={name}",
                "-o",
                "name",
            ).stdout.strip()
        ),
        what="deployment and seed job garbage-collected",
    )


def fleet(kubectl: Callable[..., Any]) -> dict[str, str]:
    """The data of the operator's startup-coefficients ConfigMap: every namespace's observed starts."""
    configmap = get_json(kubectl, "-n", CONFIGMAP_NAMESPACE, *CONFIGMAP) or {}
    return dict(configmap.get("data") or {})


@pytest.fixture
def warm_node(namespace: str, kubectl: Callable[..., Any]) -> Iterator[dict[str, str]]:
    """One fake node labelled for this test only: the services' nodeSelector picks it alone."""
    kubectl("label", "node", WARM_NODE, f"{WARM_NODE_LABEL}={namespace}", "--overwrite")
    yield {WARM_NODE_LABEL: namespace}
    kubectl("label", "node", WARM_NODE, f"{WARM_NODE_LABEL}-", check=False)


def warming_service(name: str, node_selector: dict[str, str]) -> dict[str, Any]:
    """Llama-3.1-8B from a model-cache volume (weights that are files), vLLM 0.22.1 as the recorded seed
    log, no serving replicas: warming concerns the nodes, not the replicas."""
    return vllm_service(
        name,
        model=LLAMA,
        cold_start={"modelCache": {"enabled": True}, "nodeWarming": {"enabled": True}},
        engineVersion="0.22.1",
        replicas=0,
        nodeSelector=node_selector,
    )


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
