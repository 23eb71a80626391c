"""The tenant boundary on the real API server (charts/stoker/templates/admission-policy.yaml).

A user whose role allows VLLMServices but not pods (the chart's editor ClusterRole, bound in a namespace) is
refused, at `kubectl apply`, every ServiceAccount, Secret, ConfigMap, PVC, PriorityClass, ResourceClaim,
volume type and pod label the pods would use that the user may not use directly, with a message naming the
field; the user is accepted once granted the direct verb on exactly that object, and a user who may create
pods is accepted outright. The policy and the roles are rendered by `helm template` from the chart, as both
install paths do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import Helm
from tests.e2e.admission import (
    EDITOR,
    HOST_PATH,
    MODEL,
    NAME,
    POLICY,
    TENANT,
    apply_as,
    apply_chart,
    bind,
    chart_objects,
    dry_run,
    manifest,
    may,
    policy_alone,
    policy_refuses,
    probe_namespace,
    refusal,
    tenant_namespace,
)
from tests.e2e.helpers import CHART, apply, get_json, wait_for

pytestmark = pytest.mark.e2e
__all__ = ["probe_namespace", "tenant_namespace"]  # the fixtures, used by name

DEPLOYER = "bob"

# The CSI driver of the nodePublishSecretRef case, allowed so that the grant of its Secret is what decides
# (test_hostile_admission.py proves a driver not allowed is refused).
BASE_VALUES = ("--set", "admission.allowedCsiDrivers={secrets-store.csi.k8s.io}")


def install(kubectl, helm: Helm, *values: str) -> None:
    apply_chart(kubectl, helm, *BASE_VALUES, *values)


NFS = {"pod": {"volumes": [{"name": "share", "nfs": {"server": "nfs.local", "path": "/models"}}]}}


@pytest.fixture(scope="module")
def policy(kubectl, helm: Helm, crd: None, probe_namespace: str) -> Iterator[None]:
    """The chart's policy with its default values (and the CSI driver above)."""
    with policy_alone(kubectl, helm, probe_namespace, *BASE_VALUES):
        yield


# ------------------------------------------------------------------------------------------- the chart


def test_chart_ships_the_policy_by_default_and_refuses_old_clusters(helm: Helm) -> None:
    kinds = [doc["kind"] for doc in yaml.safe_load_all(chart_objects(helm))]
    assert kinds.count("ValidatingAdmissionPolicy") == kinds.count("ValidatingAdmissionPolicyBinding") == 1
    off = yaml.safe_load_all(
        chart_objects(helm, "--set", "admission.enabled=false", "--set", "rbac.userRoles=false")
    )
    assert [doc for doc in off if doc] == []
    old = helm("template", "stoker", str(CHART), "--kube-version", "1.33.0", check=False)
    assert old.returncode != 0 and "admission.enabled needs Kubernetes 1.34" in old.stderr, old.stderr


def test_policy_type_checks_without_warnings(kubectl, policy: None) -> None:
    def checked() -> dict[str, Any] | None:
        stored = get_json(kubectl, "validatingadmissionpolicy", POLICY) or {}
        status = stored.get("status", {})
        return status if status.get("observedGeneration") == stored["metadata"]["generation"] else None

    status = wait_for(checked, timeout=30, what="the policy type-checked")
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


# ---------------------------------------------------------------------------- one refusal per field

# (spec, field named, kind, object)
Case = tuple[dict[str, Any], str, str, str]

# What lets a user use one object of each kind without create on pods: (API group, resource, verb).
GRANTS = {
    "ServiceAccount": ("", "serviceaccounts/token", "create"),
    "Secret": ("", "secrets", "get"),
    "ConfigMap": ("", "configmaps", "get"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims", "use"),
    "PriorityClass": ("scheduling.k8s.io", "priorityclasses", "use"),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims", "use"),
    "Service": ("", "services", "get"),
    # An ephemeral volume's claim that clones or binds existing data: what creating it directly needs.
    "PersistentVolumeClaim made from existing data": ("", "persistentvolumeclaims", "create"),
}


def volume(source: dict[str, Any]) -> dict[str, Any]:
    return {"pod": {"volumes": [{"name": "extra", **source}]}}


def env_from(source: dict[str, Any]) -> dict[str, Any]:
    return {"runtime": {"env": [{"name": "FROM_REF", "valueFrom": source}]}}


CASES: dict[str, Case] = {
    "service-account": (
        {"pod": {"serviceAccountName": "admin-sa"}},
        "spec.pod.serviceAccountName",
        "ServiceAccount",
        "admin-sa",
    ),
    "projected-token-of-the-default-account": (
        volume({"projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "path": "token"}}]}}),
        "spec.pod.volumes[0].projected.sources[0].serviceAccountToken",
        "ServiceAccount",
        "default",
    ),
    "secret-volume": (
        volume({"secret": {"secretName": "db-creds"}}),
        "spec.pod.volumes[0].secret.secretName",
        "Secret",
        "db-creds",
    ),
    "projected-secret": (
        volume(
            {"projected": {"sources": [{"downwardAPI": {"items": []}}, {"secret": {"name": "db-creds"}}]}}
        ),
        "spec.pod.volumes[0].projected.sources[1].secret.name",
        "Secret",
        "db-creds",
    ),
    "csi-publish-secret": (
        volume(
            {"csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": "vault-creds"}}}
        ),
        "spec.pod.volumes[0].csi.nodePublishSecretRef.name",
        "Secret",
        "vault-creds",
    ),
    "config-map-volume": (
        volume({"configMap": {"name": "other-team-config"}}),
        "spec.pod.volumes[0].configMap.name",
        "ConfigMap",
        "other-team-config",
    ),
    "projected-config-map": (
        volume({"projected": {"sources": [{"configMap": {"name": "other-team-config"}}]}}),
        "spec.pod.volumes[0].projected.sources[0].configMap.name",
        "ConfigMap",
        "other-team-config",
    ),
    "env-secret-key-ref": (
        env_from({"secretKeyRef": {"name": "db-creds", "key": "password"}}),
        "spec.runtime.env[0].valueFrom.secretKeyRef.name",
        "Secret",
        "db-creds",
    ),
    "env-config-map-key-ref": (
        env_from({"configMapKeyRef": {"name": "other-team-config", "key": "url"}}),
        "spec.runtime.env[0].valueFrom.configMapKeyRef.name",
        "ConfigMap",
        "other-team-config",
    ),
    "s3-credentials-env-from": (
        {
            "model": {
                "name": MODEL,
                "source": {"s3": {"uri": "s3://models/qwen", "credentialsSecretRef": {"name": "s3-creds"}}},
            }
        },
        "spec.model.source.s3.credentialsSecretRef.name",
        "Secret",
        "s3-creds",
    ),
    "hugging-face-token": (
        {"model": {"name": MODEL, "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}}}}},
        "spec.model.source.huggingFace.tokenSecretRef.name",
        "Secret",
        "hf-token",
    ),
    "image-pull-secret": (
        {"pod": {"imagePullSecrets": [{"name": "registry"}]}},
        "spec.pod.imagePullSecrets[0].name",
        "Secret",
        "registry",
    ),
    "pvc-volume": (
        volume({"persistentVolumeClaim": {"claimName": "other-team-data"}}),
        "spec.pod.volumes[0].persistentVolumeClaim.claimName",
        "PersistentVolumeClaim",
        "other-team-data",
    ),
    "model-source-pvc": (
        {"model": {"name": MODEL, "source": {"pvc": {"claimName": "other-team-weights"}}}},
        "spec.model.source.pvc.claimName",
        "PersistentVolumeClaim",
        "other-team-weights",
    ),
    "ephemeral-claim-cloning-a-pvc": (
        volume(
            {
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                            "dataSource": {"kind": "PersistentVolumeClaim", "name": "other-team-data"},
                        }
                    }
                }
            }
        ),
        "spec.pod.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSource",
        "PersistentVolumeClaim made from existing data",
        "",
    ),
    "ephemeral-claim-binding-a-volume": (
        volume({"ephemeral": {"volumeClaimTemplate": {"spec": {"volumeName": "pv-of-another-team"}}}}),
        "spec.pod.volumes[0].ephemeral.volumeClaimTemplate.spec.volumeName",
        "PersistentVolumeClaim made from existing data",
        "",
    ),
    "priority-class": (
        {"pod": {"priorityClassName": "system-node-critical"}},
        "spec.pod.priorityClassName",
        "PriorityClass",
        "system-node-critical",
    ),
    # Every serving pod references the claim and so shares its device (another team's GPU).
    "shared-gpu-claim": (
        {"coldStart": {"standby": {"replicas": 2, "sharedGpu": {"resourceClaimName": "other-team-gpu"}}}},
        "spec.coldStart.standby.sharedGpu.resourceClaimName",
        "ResourceClaim",
        "other-team-gpu",
    ),
    # The operator reads the /metrics of the pods behind it (scale from zero): one the author may get.
    "scale-from-zero-endpoint-picker": (
        {"inferencePool": {"endpointPicker": {"name": "other-team-epp"}, "scaleFromZero": {}}},
        "spec.inferencePool.endpointPicker.name",
        "Service",
        "other-team-epp",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_field_is_refused_until_the_tenant_may_use_that_object(
    case: Case, kubectl, policy: None, tenant_namespace: str
) -> None:
    spec, field, kind, name = case
    namespace = tenant_namespace
    assert not may(kubectl, namespace, TENANT, "create", "pods")
    message = refusal(apply_as(kubectl, TENANT, namespace, manifest(spec)))
    named = f"{kind} {name}" if name else kind  # a claim yet to be made has no name to grant
    assert message.startswith(f"{field}: {TENANT} may not use {named} in namespace {namespace} "), message
    assert get_json(kubectl, "-n", namespace, "vllmservice", NAME) is None

    group, resource, verb = GRANTS[kind]
    rule = {
        "apiGroups": [group],
        "resources": [resource],
        "resourceNames": [name] if name else [],
        "verbs": [verb],
    }
    bind(kubectl, namespace, TENANT, rule, "exactly-that-object")
    accepted = apply_as(kubectl, TENANT, namespace, manifest(spec))
    assert accepted.returncode == 0, accepted.stderr
    assert get_json(kubectl, "-n", namespace, "vllmservice", NAME)


def test_a_name_no_message_can_show_is_still_refused(kubectl, policy: None, tenant_namespace: str) -> None:
    """The API server drops a message with a newline; the validation's fixed one stands in."""
    spec = env_from({"secretKeyRef": {"name": "db\ncreds", "key": "password"}})
    message = refusal(apply_as(kubectl, TENANT, tenant_namespace, manifest(spec)))
    assert (
        message
        == "spec names an object its author may not use (needs create on pods, or the direct verb on it)"
    )


# The core/v1 volume types outside Pod Security's `restricted` set (a minimal body each: the policy reads
# the type, and the CRD keeps a volume's source as written).
DISALLOWED_VOLUME_TYPES = [
    "hostPath",
    "nfs",
    "iscsi",
    "rbd",
    "cephfs",
    "glusterfs",
    "flexVolume",
    "fc",
    "gitRepo",
    "image",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "cinder",
    "vsphereVolume",
    "portworxVolume",
    "flocker",
    "quobyte",
    "scaleIO",
    "storageos",
    "photonPersistentDisk",
]


@pytest.mark.parametrize("volume_type", DISALLOWED_VOLUME_TYPES)
def test_volume_type_outside_the_restricted_set_is_refused(
    volume_type: str, kubectl, policy: None, tenant_namespace: str
) -> None:
    message = refusal(
        apply_as(kubectl, TENANT, tenant_namespace, manifest(volume({volume_type: {"path": "/"}})))
    )
    field = f"spec.pod.volumes[0].{volume_type}"
    assert message.startswith(f"{field}: {TENANT} may not use this volume type in namespace "), message


def test_pod_labels_are_refused_since_they_join_the_namespaces_selectors(
    kubectl, policy: None, tenant_namespace: str
) -> None:
    """A pod labelled like another team's Service would receive its traffic."""
    hijack = {"pod": {"labels": {"app": "payments"}}}
    message = refusal(apply_as(kubectl, TENANT, tenant_namespace, manifest(hijack)))
    assert message.startswith(f"spec.pod.labels['app']: {TENANT} may not label pods in namespace "), message


def test_pod_annotations_are_refused_since_webhooks_act_on_them(
    kubectl, policy: None, tenant_namespace: str
) -> None:
    """An annotation can ask an identity webhook (Vault's injector, kube2iam) for another role."""
    identity = {"pod": {"annotations": {"vault.hashicorp.com/role": "payments-admin"}}}
    message = refusal(apply_as(kubectl, TENANT, tenant_namespace, manifest(identity)))
    assert message.startswith(
        f"spec.pod.annotations['vault.hashicorp.com/role']: {TENANT} may not annotate pods in namespace "
    ), message


def refused_until_granted(
    kubectl, namespace: str, spec: dict[str, Any], said: str, rule: dict[str, Any], grant: str
) -> None:
    """`spec` is refused for TENANT with a message starting with `said`, and accepted once a Role grants
    `rule` in `namespace`."""
    message = refusal(apply_as(kubectl, TENANT, namespace, manifest(spec)))
    assert message.startswith(said), message
    bind(kubectl, namespace, TENANT, rule, grant)
    result = apply_as(kubectl, TENANT, namespace, manifest(spec))
    assert result.returncode == 0, result.stderr


def test_node_warming_needs_what_a_daemonset_needs(kubectl, policy: None, tenant_namespace: str) -> None:
    """A warmer pod of the serving image lands on every node the replicas can land on, needing no GPU."""
    refused_until_granted(
        kubectl,
        tenant_namespace,
        {"coldStart": {"nodeWarming": {"enabled": True}}},
        f"spec.coldStart.nodeWarming.enabled: {TENANT} may not run a pod on every node",
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["create"]},
        "daemonsets",
    )


def test_peer_weights_need_what_writing_network_policies_needs(
    kubectl, policy: None, tenant_namespace: str
) -> None:
    """stoker writes the peer ports' NetworkPolicies, one of which opens the serving port to every pod."""
    refused_until_granted(
        kubectl,
        tenant_namespace,
        {"coldStart": {"peerWeights": {"enabled": True}}},
        f"spec.coldStart.peerWeights.enabled: {TENANT} may not have stoker write NetworkPolicies",
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
        "networkpolicies",
    )


# ------------------------------------------------------------------------------------- what is allowed


# One object of each kind in one spec, and a hostPath.
EVERYTHING: dict[str, Any] = {
    "model": CASES["s3-credentials-env-from"][0]["model"],
    "coldStart": CASES["shared-gpu-claim"][0]["coldStart"],
    "runtime": {
        "env": [
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "password"}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "other-team-config", "key": "url"}}},
        ]
    },
    "pod": {
        "labels": {"app": "payments"},
        "annotations": {"vault.hashicorp.com/role": "payments-admin"},
        "serviceAccountName": "admin-sa",
        "priorityClassName": "system-node-critical",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "secret", "secret": {"secretName": "db-creds"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "other-team-data"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            {"name": "host", "hostPath": {"path": "/"}},
        ],
    },
}


def test_a_spec_naming_nothing_is_accepted(kubectl, policy: None, tenant_namespace: str) -> None:
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "info", "downwardAPI": {"items": []}},
        {"name": "fresh", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}},  # empty, as stoker's cache
    ]
    harmless = {"pod": {"volumes": volumes}}
    result = apply_as(kubectl, TENANT, tenant_namespace, manifest(harmless))
    assert result.returncode == 0, result.stderr


def test_a_user_who_may_create_pods_may_name_anything(kubectl, policy: None, tenant_namespace: str) -> None:
    namespace = tenant_namespace
    kubectl(
        "-n", namespace, "create", "rolebinding", "deployer", f"--clusterrole={EDITOR}", f"--user={DEPLOYER}"
    )
    assert refusal(apply_as(kubectl, TENANT, namespace, manifest(EVERYTHING)))
    bind(
        kubectl, namespace, DEPLOYER, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}, "pods"
    )
    result = apply_as(kubectl, DEPLOYER, namespace, manifest(EVERYTHING))
    assert result.returncode == 0, result.stderr


def test_sixteen_granted_objects_fit_the_budget_and_a_seventeenth_needs_create_pods(
    kubectl, policy: None, tenant_namespace: str
) -> None:
    """Each object is one authorization check; 16 of them, each named in several fields, are checked."""
    namespace = tenant_namespace
    names = [f"s{i}" for i in range(17)]
    rule = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": names, "verbs": ["get"]}
    bind(kubectl, namespace, TENANT, rule, "secrets")

    def spec(count: int) -> dict[str, Any]:
        env = [
            {"name": f"E{i}", "valueFrom": {"secretKeyRef": {"name": names[i % count], "key": "k"}}}
            for i in range(64)
        ]
        volumes = [{"name": f"v{i}", "secret": {"secretName": names[i]}} for i in range(count)]
        return {"runtime": {"env": env}, "pod": {"volumes": volumes}}

    result = apply_as(kubectl, TENANT, namespace, manifest(spec(16)))
    assert result.returncode == 0, result.stderr
    message = refusal(apply_as(kubectl, TENANT, namespace, manifest(spec(17))))
    assert message.startswith(
        f"spec: without create on pods in namespace {namespace}, {TENANT} may name at most 16"
    ), message


def test_spec_updates_are_checked_whole_as_their_author(kubectl, policy: None, tenant_namespace: str) -> None:
    """An admin's VLLMService runs as a privileged ServiceAccount: the tenant may scale it and label it, but
    a spec change of theirs would run their image as that account."""
    namespace = tenant_namespace
    apply(kubectl, namespace, manifest({"pod": {"serviceAccountName": "admin-sa"}}))
    patch = json.dumps({"spec": {"runtime": {"image": "attacker/vllm:latest"}}})
    changed = kubectl(
        "--as",
        TENANT,
        "-n",
        namespace,
        "patch",
        "vllmservice",
        NAME,
        "--type",
        "merge",
        "-p",
        patch,
        check=False,
    )
    assert refusal(changed).startswith(
        f"spec.pod.serviceAccountName: {TENANT} may not use ServiceAccount admin-sa"
    )
    labelled = kubectl(
        "--as", TENANT, "-n", namespace, "label", "vllmservice", NAME, "team=search", check=False
    )
    assert labelled.returncode == 0, labelled.stderr
    scaled = kubectl(
        "--as", TENANT, "-n", namespace, "scale", "vllmservice", NAME, "--replicas=3", check=False
    )
    assert scaled.returncode == 0, scaled.stderr
    stored = get_json(kubectl, "-n", namespace, "vllmservice", NAME)
    assert stored and stored["spec"]["runtime"]["replicas"] == 3
    assert stored["spec"]["runtime"]["image"] != "attacker/vllm:latest"


def test_admins_allow_more_in_values(kubectl, helm: Helm, policy: None, tenant_namespace: str) -> None:
    """admission.allowedVolumeTypes, allowedPodLabelKeys and allowedPodAnnotationKeys admit a type, label
    and annotation keys for everyone,
    admission.exemptNamespaces a namespace, and validationActions [Warn, Audit] only warns."""
    namespace = tenant_namespace
    labelled = {
        "pod": {
            **NFS["pod"],
            "labels": {"team": "search", "cost-center": "ml-42"},
            "annotations": {"prometheus.io/scrape": "true"},
        }
    }
    try:
        install(
            kubectl,
            helm,
            "--set",
            "admission.allowedVolumeTypes={nfs}",
            "--set",
            "admission.allowedPodLabelKeys={team,cost-center}",
            "--set",
            "admission.allowedPodAnnotationKeys={prometheus.io/scrape}",
        )
        wait_for(
            lambda: not policy_refuses(kubectl, namespace, labelled), timeout=60, what="nfs, labels allowed"
        )
        result = apply_as(kubectl, TENANT, namespace, manifest(labelled))
        assert result.returncode == 0, result.stderr
        assert refusal(apply_as(kubectl, TENANT, namespace, manifest(HOST_PATH))).startswith(
            "spec.pod.volumes[0].hostPath:"
        )
        hijack = {"pod": {"labels": {"team": "search", "app": "payments"}}}
        assert refusal(apply_as(kubectl, TENANT, namespace, manifest(hijack))).startswith(
            "spec.pod.labels['app']:"
        )
        install(kubectl, helm, "--set", f"admission.exemptNamespaces={{{namespace}}}")
        wait_for(
            lambda: not policy_refuses(kubectl, namespace, HOST_PATH), timeout=60, what="namespace exempt"
        )
        result = apply_as(kubectl, TENANT, namespace, manifest(HOST_PATH))
        assert result.returncode == 0, result.stderr
        # A rollout's first step (docs/security.md): refusals become warnings.
        install(kubectl, helm, "--set", "admission.validationActions={Warn,Audit}")
        warning = f"Warning: Validation failed for ValidatingAdmissionPolicy '{POLICY}'"
        wait_for(
            lambda: warning in dry_run(kubectl, namespace, HOST_PATH).stderr, timeout=60, what="warnings"
        )
        kubectl("-n", namespace, "delete", "vllmservice", NAME)
        result = apply_as(kubectl, TENANT, namespace, manifest(HOST_PATH))
        assert result.returncode == 0, result.stderr
        assert warning in result.stderr
        assert f"spec.pod.volumes[0].hostPath: {TENANT} may not use this volume type" in result.stderr
    finally:
        install(kubectl, helm)
        wait_for(lambda: policy_refuses(kubectl, namespace, HOST_PATH), timeout=60, what="the defaults back")
    assert policy_refuses(kubectl, namespace, NFS)
