"""What the tenant boundary lets through is an explicit list (charts/stoker/templates/admission-policy.yaml).

Tolerations, pinning to a node by name, the size and StorageClass of the claims a VLLMService makes, CSI
drivers and RuntimeClasses have no RBAC rule short of create on pods. A user with only the chart's editor
role is refused each one with the field named, unless an admin allows it in values; a user who may create
pods is refused none. On the real API server, with the policy `helm template` renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Helm
from tests.e2e.admission import (
    EDITOR,
    TENANT,
    apply_as,
    apply_chart,
    bind,
    dry_run,
    manifest,
    may,
    policy_alone,
    policy_refuses,
    probe_namespace,
    refusal,
    tenant_namespace,
)
from tests.e2e.helpers import wait_for

pytestmark = pytest.mark.e2e
__all__ = ["probe_namespace", "tenant_namespace"]  # the fixtures, used by name

HOSTNAME = "kubernetes.io/hostname"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def pinned(term: dict[str, Any]) -> dict[str, Any]:
    return {"pod": {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term]}}}}}


def ephemeral(claim: dict[str, Any]) -> dict[str, Any]:
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **claim}
    return {"pod": {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}]}}


EPHEMERAL = "spec.pod.volumes[0].ephemeral.volumeClaimTemplate.spec"
# (spec, the field the refusal names first, what it says the user may not do)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "toleration-of-every-taint": (
        {"runtime": {"tolerations": [{"operator": "Exists"}]}},
        "spec.runtime.tolerations[0]",
        "tolerate this taint",
    ),
    "toleration-of-the-control-plane": (
        {
            "runtime": {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists"},
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
                ]
            }
        },
        "spec.runtime.tolerations[1]",
        "tolerate this taint",
    ),
    "node-selector-on-a-hostname": (
        {"runtime": {"nodeSelector": {HOSTNAME: "node-of-another-team"}}},
        f"spec.runtime.nodeSelector['{HOSTNAME}']",
        "pin pods to a node by name",
    ),
    "required-affinity-on-a-hostname": (
        pinned({"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": ["node-a"]}]}),
        f"spec.pod.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0]",
        "pin pods to a node by name",
    ),
    "required-affinity-on-a-node-name": (
        pinned({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}),
        f"spec.pod.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[0].matchFields[0]",
        "pin pods to a node by name",
    ),
    "a-pebibyte-ephemeral-volume": (
        ephemeral({"resources": {"requests": {"storage": "1Pi"}}}),
        f"{EPHEMERAL}.resources.requests.storage",
        "ask for a volume over 200Gi",
    ),
    "an-ephemeral-volume-of-any-class": (
        ephemeral({"storageClassName": "premium-ssd"}),
        f"{EPHEMERAL}.storageClassName",
        "use this StorageClass",
    ),
    "a-pebibyte-compile-cache": (
        {"coldStart": {"compileCache": {"size": "1Pi"}}},
        "spec.coldStart.compileCache.size",
        "ask for a volume over 200Gi",
    ),
    "a-model-cache-of-any-class": (
        {"coldStart": {"modelCache": {"enabled": True, "storageClassName": "premium-ssd"}}},
        "spec.coldStart.modelCache.storageClassName",
        "use this StorageClass",
    ),
    "another-tenants-secret-provider-class": (
        {
            "pod": {
                "volumes": [
                    {
                        "name": "vault",
                        "csi": {
                            "driver": "secrets-store.csi.k8s.io",
                            "readOnly": True,
                            "volumeAttributes": {"secretProviderClass": "payments-db"},
                        },
                    }
                ]
            }
        },
        "spec.pod.volumes[0].csi.driver",
        "use this CSI driver",
    ),
    "any-runtime-class": (
        {"pod": {"runtimeClassName": "unsandboxed"}},
        "spec.pod.runtimeClassName",
        "use this RuntimeClass",
    ),
}

# What an admin allows for each case above.
ALLOWANCES = (
    "--set-json",
    'admission.allowedTolerations=[{"key":"nvidia.com/gpu"},{"operator":"Exists"}]',
    "--set",
    "admission.allowNodePinning=true",
    "--set",
    "admission.maxVolumeSize=2Pi",
    "--set",
    "admission.allowedStorageClasses={premium-ssd}",
    "--set",
    "admission.allowedCsiDrivers={secrets-store.csi.k8s.io}",
    "--set",
    "admission.allowedRuntimeClasses={unsandboxed}",
)


@pytest.fixture(scope="module")
def policy(kubectl, helm: Helm, crd: None, probe_namespace: str) -> Iterator[None]:
    """The chart's policy with its default values, alone in force."""
    with policy_alone(kubectl, helm, probe_namespace):
        yield


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_refused_with_the_field_named(case, kubectl, policy: None, tenant_namespace: str) -> None:
    spec, field, what = case
    assert not may(kubectl, tenant_namespace, TENANT, "create", "pods")
    message = refusal(apply_as(kubectl, TENANT, tenant_namespace, manifest(spec)))
    assert message.startswith(f"{field}: {TENANT} may not {what} in namespace {tenant_namespace} "), message


def test_the_defaults_allow_gpu_nodes_and_small_claims_of_the_default_class(
    kubectl,
    policy: None,
    tenant_namespace: str,
) -> None:
    spec = {
        "runtime": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        },
        "coldStart": {"compileCache": {"size": "200Gi"}},
        **ephemeral({"resources": {"requests": {"storage": "10Gi"}}}),
    }
    result = dry_run(kubectl, tenant_namespace, spec)
    assert result.returncode == 0, result.stderr


def test_each_is_allowed_once_an_admin_lists_it(
    kubectl,
    helm: Helm,
    policy: None,
    tenant_namespace: str,
) -> None:
    try:
        apply_chart(kubectl, helm, *ALLOWANCES)
        first = next(iter(CASES.values()))[0]
        wait_for(
            lambda: not policy_refuses(kubectl, tenant_namespace, first), timeout=60, what="the allowances"
        )
        for name, (spec, _, _) in CASES.items():
            result = dry_run(kubectl, tenant_namespace, spec)
            assert result.returncode == 0, f"{name}: {result.stderr}"
        # Allowing one class allows that class only.
        other = ephemeral({"storageClassName": "another-class"})
        assert refusal(apply_as(kubectl, TENANT, tenant_namespace, manifest(other))).startswith(
            f"{EPHEMERAL}.storageClassName:"
        )
    finally:
        apply_chart(kubectl, helm)
        wait_for(
            lambda: policy_refuses(kubectl, tenant_namespace, CASES["any-runtime-class"][0]),
            timeout=60,
            what="the defaults back",
        )


def test_a_user_who_may_create_pods_is_refused_none(
    kubectl,
    policy: None,
    tenant_namespace: str,
) -> None:
    deployer = "carol"
    kubectl(
        "-n",
        tenant_namespace,
        "create",
        "rolebinding",
        "deployer",
        f"--clusterrole={EDITOR}",
        f"--user={deployer}",
    )
    bind(
        kubectl,
        tenant_namespace,
        deployer,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
        "pods",
    )
    for name, (spec, _, _) in CASES.items():
        result = apply_as(kubectl, deployer, tenant_namespace, manifest(spec))
        assert result.returncode == 0, f"{name}: {result.stderr}"
