"""The Helm chart on the real control plane, and GitOps behaviour.

The chart's operator pod cannot run under kwok (fake pods run nothing), so `helm install` proves that the
chart's objects are valid and install; the operator itself then runs as a local process that signs in
with a token of the chart's ServiceAccount. An example reaching Ready=True under that identity shows the
chart's RBAC is enough; `kubectl auth can-i` shows it is not more than needed.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Helm, Operator
from tests.e2e.fleet import Fleet, settled, standby_service
from tests.e2e.helpers import CHART, apply, condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "minimal.yaml"
ARTIFACTS = REPO / ".artifacts" / "e2e"
RELEASE = "stoker"
# Ports of their own: the session's operator fixture uses 28080/28081.
METRICS_PORT = 28180  # and liveness on 28181
SNAPSHOT = ("--set", "snapshot.enabled=true")
# The chart's value sets: defaults, namespaced with a ServiceMonitor, the snapshot agent.
VALUE_SETS = [
    [],
    ["--set", "watchNamespaces={a,b}", "--set", "serviceMonitor.enabled=true"],
    [*SNAPSHOT, "--set", "watchNamespaces={a,b}"],
]


def example_name() -> str:
    return str(yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"])


def rendered(helm: Helm, *args: str) -> list[dict[str, Any]]:
    out = helm("template", RELEASE, str(CHART), "--namespace", "ops", *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


# ------------------------------------------------------------------------------------- lint, template


@pytest.mark.parametrize("values", VALUE_SETS)
def test_chart_lints_strictly(helm: Helm, values: list[str]) -> None:
    helm("lint", "--strict", str(CHART), *values)


@pytest.mark.parametrize(
    "bad",
    [
        "image.tag=latest",
        "unknownKey=1",
        "metrics.port=0",
        "operator.logLevel=TRACE",
        "watchNamespaces={Bad_NS}",
        "metrics.bindAddress=everywhere",
        "liveness.bindAddress=300.1.1.1",
        "admission.validationActions={Deny,Warn}",
        "admission.allowedVolumeTypes={host_path}",
        "admission.maxVolumeSize=lots",
        "admission.allowNodePinning=maybe",
        "snapshot.enabled=maybe",
        "snapshot.unknownKey=1",
        "snapshot.reserveGiB=-1",
        "snapshot.restoreWaitSeconds=-1",
        "snapshot.restoreBoundSeconds=0",
        "snapshot.offerBoundSeconds=0",
        "snapshot.restoreBoundSeconds=1801",
        "snapshot.hostPath=var/lib/stoker",
        "snapshot.hostPath=/",
        "snapshot.hostPath=/var/lib/../../etc",
        "snapshot.image.tag=latest",
        "snapshot.image.digest=sha256:abc",
    ],
)
def test_values_schema_rejects_bad_values(helm: Helm, bad: str) -> None:
    result = helm("template", RELEASE, str(CHART), "--set", bad, check=False)
    assert result.returncode != 0 and "values don't meet the specifications" in result.stderr, result.stderr


def test_chart_versions_and_crd_copy_match_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == "0.1.0" and chart["appVersion"] == version
    crd = "stoker.dev_vllmservices.yaml"
    assert (CHART / "crds" / crd).read_text() == (REPO / "crds" / crd).read_text()


def test_operator_deployment_is_hardened(helm: Helm) -> None:
    (deployment,) = of_kind(rendered(helm), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2  # one leads (a Lease), the other waits to take over
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == "ghcr.io/stoker-dev/stoker:0.1.0"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": 8080, "liveness": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["STOKER_METRICS_PORT"] == "8080" and env["STOKER_LIVENESS_PORT"] == "8081"
    assert env["STOKER_NAMESPACES"] == "[]"
    assert (
        env["STOKER_LEADER_ELECTION"] == "true"
        and env["STOKER_LEADER_ELECTION_LEASE_NAME"] == "stoker-leader"
    )
    assert env["STOKER_CONTROL_KEY_SECRET"] == "stoker-control-key" and "STOKER_CONTROL_KEY" not in env
    (budget,) = of_kind(rendered(helm), "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert not of_kind(rendered(helm, "--set", "replicas=1"), "PodDisruptionBudget")


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_namespaced_object_names_the_release_namespace(helm: Helm, values: list[str]) -> None:
    """`helm template | kubectl apply` puts an object without a namespace in kubectl's (often `default`)."""
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in rendered(helm, *values):
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace"), doc["kind"] + "/" + doc["metadata"]["name"]
    # Nothing in the chart generates the control key: re-rendering it cannot rotate the key.
    assert not of_kind(rendered(helm), "Secret")


def bind_addresses(helm: Helm, *values: str) -> dict[str, Any]:
    """Each STOKER_*_BIND_ADDRESS of the operator container: a literal value or the downward-API field."""
    (deployment,) = of_kind(rendered(helm, *values), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {
        item["name"]: item.get("value") or item["valueFrom"]["fieldRef"]["fieldPath"]
        for item in container["env"]
        if item["name"].endswith("_BIND_ADDRESS")
    }


@pytest.mark.parametrize(
    ("values", "metrics", "liveness"),
    [
        # The kubelet probes liveness at the pod IP; Prometheus scrapes metrics there through the Service.
        ([], "status.podIP", "status.podIP"),
        # Nothing scrapes: metrics stay on loopback (kubectl port-forward still reaches them).
        (["--set", "metrics.service.enabled=false"], "127.0.0.1", "status.podIP"),
        (["--set", "serviceMonitor.enabled=true"], "status.podIP", "status.podIP"),
        (["--set", "metrics.bindAddress=0.0.0.0", "--set", "liveness.bindAddress=::"], "0.0.0.0", "::"),
        (["--set", "metrics.bindAddress=127.0.0.1"], "127.0.0.1", "status.podIP"),
    ],
)
def test_operator_endpoints_bind_where_they_are_needed(
    helm: Helm, values: list[str], metrics: str, liveness: str
) -> None:
    assert bind_addresses(helm, *values) == {
        "STOKER_METRICS_BIND_ADDRESS": metrics,
        "STOKER_LIVENESS_BIND_ADDRESS": liveness,
    }


def is_agents(obj: dict[str, Any]) -> bool:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"] == "snapshot-agent"


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's rules (not those of the ClusterRoles for people, aggregated into admin, edit, view,
    nor the snapshot agent's)."""
    return [
        rule
        for role in of_kind(docs, kind)
        if not is_agents(role)
        and not any(
            label.startswith("rbac.authorization.k8s.io/aggregate-to-")
            for label in role["metadata"]["labels"]
        )
        for rule in role["rules"]
    ]


def workload_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Roles for watched namespaces, without the one for the operator's own state."""
    return [role for role in of_kind(docs, "Role") if not role["metadata"]["name"].endswith("-state")]


def test_operator_state_rights_are_named_and_in_its_namespace(helm: Helm) -> None:
    (state,) = [
        role for role in of_kind(rendered(helm), "Role") if role["metadata"]["name"] == "stoker-state"
    ]
    assert state["metadata"]["namespace"] == "ops"
    assert state["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["stoker-leader"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["stoker-control-key"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["stoker-startup-coefficients"],
            "verbs": ["get", "patch"],
        },
    ]


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_rbac_is_explicit_and_least_privilege(helm: Helm, mode: str) -> None:
    watch = ["--set", "watchNamespaces={ml,research}"] if mode == "namespaced" else []
    docs = rendered(helm, *SNAPSHOT, *watch)
    rules = rules_of(docs, "ClusterRole") + [rule for role in workload_roles(docs) for rule in role["rules"]]
    agent = [rule for role in of_kind(docs, "ClusterRole") if is_agents(role) for rule in role["rules"]]
    # The snapshot agent reads its node's pods, of every namespace in one list (a Role cannot grant that).
    assert agent == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert not [role for role in of_kind(docs, "Role") if is_agents(role)]
    for rule in rules + agent:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
    verbs = {
        (group, resource): set(rule["verbs"])
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert verbs[("", "pods/log")] == {"get"}
    # Shared GPUs (coldStart.standby.sharedGpu): the operator reads the claims; their owners make them.
    assert verbs[("resource.k8s.io", "resourceclaims")] == {"get", "list", "watch"}
    assert verbs[("stoker.dev", "vllmservices/status")] == {"get", "patch"}
    assert verbs[("stoker.dev", "vllmservices/finalizers")] == {"update"}
    # spec.inferencePool: the pool (read per pass, never watched: its CRD may be missing), and scale from
    # zero (the EPP Service's EndpointSlices, each address checked against its pod with a get, the scale
    # subresource as an autoscaler uses it).
    assert verbs[("inference.networking.k8s.io", "inferencepools")] == {"get", "create", "patch", "delete"}
    assert verbs[("discovery.k8s.io", "endpointslices")] == {"list"}
    assert verbs[("", "pods")] == {"get", "list", "watch", "patch", "delete"}
    assert verbs[("stoker.dev", "vllmservices/scale")] == {"get", "update"}
    # coldStart.nodeWarming: the warmer DaemonSets, deleted again when warming is skipped or turned off.
    assert verbs[("apps", "daemonsets")] == {"get", "list", "watch", "create", "patch", "delete"}
    # runtime.nodesPerReplica: the LeaderWorkerSet, read per pass (its CRD may be missing), never deleted.
    assert verbs[("leaderworkerset.x-k8s.io", "leaderworkersets")] == {"get", "create", "patch"}
    for rule in rules:  # status and finalizers have rules of their own
        if any("/" in resource for resource in rule["resources"]):
            assert len(rule["resources"]) == 1, rule
    # Standby control tokens are derived, never read back: Secrets are written, not read.
    assert verbs[("", "secrets")] == {"create", "patch"}
    assert ("", "configmaps") not in verbs  # only the operator's own, in its namespace (above)
    assert not any("escalate" in v or "bind" in v or "impersonate" in v for v in verbs.values())
    if mode == "namespaced":
        assert sorted(role["metadata"]["namespace"] for role in workload_roles(docs)) == ["ml", "research"]
        # Cluster-wide, only what kopf observes: CRDs, Nodes (where node warmers can land, and their
        # memory), and the namespaces it filters.
        assert rules_of(docs, "ClusterRole") == [
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        ]
    (deployment,) = of_kind(docs, "Deployment")
    env = {
        item["name"]: item.get("value")
        for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["STOKER_NAMESPACES"]) == (["ml", "research"] if mode == "namespaced" else [])


def test_service_monitor_is_optional(helm: Helm) -> None:
    assert not of_kind(rendered(helm), "ServiceMonitor")
    (monitor,) = of_kind(rendered(helm, "--set", "serviceMonitor.enabled=true"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (service,) = of_kind(rendered(helm), "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = of_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value") for item in container["env"]}


def snapshot_seconds(docs: list[dict[str, Any]]) -> list[str]:
    """The operator's restore wait, restore bound and offer bound."""
    env = operator_env(docs)
    return [
        env[f"STOKER_SNAPSHOT_{name}_SECONDS"] for name in ("RESTORE_WAIT", "RESTORE_BOUND", "OFFER_BOUND")
    ]


def test_snapshot_agent_is_opt_in(helm: Helm) -> None:
    docs = rendered(helm)
    assert not [doc for doc in docs if is_agents(doc)] and not of_kind(docs, "DaemonSet")
    assert operator_env(docs)["STOKER_SNAPSHOT_ENABLED"] == "false"
    assert snapshot_seconds(docs) == ["10", "120", "300"]


def test_snapshot_agent_has_exactly_its_privileges(helm: Helm) -> None:
    """A privileged root container in the host's PID namespace (CRIU dumps and restores other containers'
    processes), the host paths it reaches them by, the operator's key read-only, and a list of pods."""
    docs = rendered(helm, *SNAPSHOT)
    (daemonset,) = of_kind(docs, "DaemonSet")
    assert (
        daemonset["metadata"]["namespace"] == "ops"
        and daemonset["metadata"]["name"] == "stoker-snapshot-agent"
    )
    pod = daemonset["spec"]["template"]["spec"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "snapshot-agent"
    # Neither the operator's Deployment, PDB nor metrics Service selects the agent's pods.
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    (deployment,) = of_kind(docs, "Deployment")
    operator_selector = deployment["spec"]["selector"]["matchLabels"]
    assert not operator_selector.items() <= labels.items() and selector.items() <= labels.items()
    (service,) = of_kind(docs, "Service")
    assert not service["spec"]["selector"].items() <= labels.items()
    assert (
        pod["serviceAccountName"] == "stoker-snapshot-agent" and pod["automountServiceAccountToken"] is True
    )
    assert pod["hostPID"] is True
    assert not {"hostNetwork", "hostIPC", "securityContext"} & pod.keys()
    (container,) = pod["containers"]
    assert container["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert container["image"] == "ghcr.io/stoker-dev/stoker:0.1.0-snapshot-agent"  # unless set
    # The operator's image has no CRIU: its agents stay un-Ready, and the rollout says so.
    assert container["readinessProbe"]["exec"]["command"] == ["criu", "--version"]
    assert container["command"] == [
        *("python3", "-m", "stoker.snapshot.agent", "serve", "--node", "$(NODE_NAME)"),
        *("--base", "/var/lib/stoker/snapshots", "--reserve-bytes", str(20 << 30)),
        *("--key-file", "/etc/stoker/control-key/key"),
    ]
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # The driver's libraries, for the CUDA checkpoint API, from the NVIDIA container runtime.
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
    ]
    assert "runtimeClassName" not in pod
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    host_paths = {name: volume["hostPath"] for name, volume in volumes.items() if "hostPath" in volume}
    assert host_paths == {
        "snapshots": {"path": "/var/lib/stoker/snapshots", "type": "DirectoryOrCreate"},
        "containerd": {"path": "/run/containerd", "type": "Directory"},
        "containerd-root": {"path": "/var/lib/containerd", "type": "Directory"},
        "kubelet-pods": {"path": "/var/lib/kubelet/pods", "type": "Directory"},
        "host-root": {"path": "/", "type": "Directory"},
        "cgroup": {"path": "/sys/fs/cgroup", "type": "Directory"},
    }
    assert volumes["control-key"] == {
        "name": "control-key",
        "secret": {"secretName": "stoker-control-key", "defaultMode": 0o400},
    }
    assert volumes.keys() == {*host_paths, "control-key"}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts.keys() == volumes.keys()
    for name, host_path in host_paths.items():  # at the host's own paths, as CRIU finds them
        where = "/host" if name == "host-root" else host_path["path"]
        assert mounts[name]["mountPath"] == where and not mounts[name].get("readOnly")
    # The containers' roots and volumes, mounted after the agent started.
    assert {name: mount.get("mountPropagation") for name, mount in mounts.items()} == {
        "snapshots": None,
        "containerd": "HostToContainer",
        "containerd-root": "HostToContainer",
        "kubelet-pods": "HostToContainer",
        "host-root": None,
        "cgroup": None,
        "control-key": None,
    }
    assert mounts["control-key"] == {
        "name": "control-key",
        "mountPath": "/etc/stoker/control-key",
        "readOnly": True,
    }
    (account,) = [doc for doc in of_kind(docs, "ServiceAccount") if is_agents(doc)]
    assert (account["metadata"]["name"], account["metadata"]["namespace"]) == ("stoker-snapshot-agent", "ops")
    (role,) = [doc for doc in of_kind(docs, "ClusterRole") if is_agents(doc)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    (binding,) = [doc for doc in of_kind(docs, "ClusterRoleBinding") if is_agents(doc)]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "ops-stoker-snapshot-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "stoker-snapshot-agent", "namespace": "ops"}
    ]
    assert operator_env(docs)["STOKER_SNAPSHOT_ENABLED"] == "true"


def test_snapshot_values_reach_the_agent_and_the_operator(helm: Helm) -> None:
    docs = rendered(
        helm,
        *SNAPSHOT,
        *("--set", "snapshot.hostPath=/data/snapshots", "--set-json", "snapshot.reserveGiB=0.5"),
        *("--set", "snapshot.restoreWaitSeconds=3", "--set", "snapshot.restoreBoundSeconds=60"),
        *("--set", "snapshot.offerBoundSeconds=30", "--set", "snapshot.image.tag=0.1.0-snapshot-agent"),
        *("--set", "snapshot.nodeSelector.gpu=yes", "--set", "snapshot.priorityClassName=critical"),
        *("--set", "snapshot.runtimeClassName=nvidia", "--set", "rbac.create=false"),
        *("--set", "snapshot.hostPaths.containerdRoot=/var/lib/rancher/k3s/agent/containerd"),
    )
    (daemonset,) = of_kind(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[command.index("--base") + 1] == "/data/snapshots"
    assert command[command.index("--reserve-bytes") + 1] == str(1 << 29)
    (snapshots,) = [volume for volume in pod["volumes"] if volume["name"] == "snapshots"]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == "snapshots"]
    assert snapshots["hostPath"]["path"] == mount["mountPath"] == "/data/snapshots"
    assert container["image"] == "ghcr.io/stoker-dev/stoker:0.1.0-snapshot-agent"
    assert pod["nodeSelector"] == {"gpu": "yes"} and pod["priorityClassName"] == "critical"
    assert pod["runtimeClassName"] == "nvidia"
    (root,) = [volume for volume in pod["volumes"] if volume["name"] == "containerd-root"]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == "containerd-root"]
    assert root["hostPath"]["path"] == mount["mountPath"] == "/var/lib/rancher/k3s/agent/containerd"
    # rbac.create=false: the admin binds the agent's ServiceAccount.
    assert not [doc for doc in docs if doc["kind"].endswith(("Role", "RoleBinding")) and is_agents(doc)]
    assert snapshot_seconds(docs) == ["3", "60", "30"]
    digest = "sha256:" + "a" * 64
    (daemonset,) = of_kind(rendered(helm, *SNAPSHOT, "--set", f"snapshot.image.digest={digest}"), "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/stoker-dev/stoker@{digest}"
    # Nothing set: the operator's repository at its version's snapshot-agent tag.
    (daemonset,) = of_kind(rendered(helm, *SNAPSHOT, "--set", "image.tag=9.9.9"), "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/stoker-dev/stoker:9.9.9-snapshot-agent"


def test_snapshot_agent_objects_pass_the_api_servers_validation(namespace: str, kubectl, helm: Helm) -> None:
    """A server-side dry run: the DaemonSet's fields (mount propagation, host path types, the Secret's mode)
    as the API server reads them."""
    manifest = helm(
        *("template", RELEASE, str(CHART), "--namespace", namespace, *SNAPSHOT),
        *("--show-only", "templates/snapshot-agent.yaml"),
    ).stdout
    applied = kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout.splitlines()
    assert len(applied) == 4 and all(line.endswith("(server dry run)") for line in applied), applied


# ------------------------------------------------------------------------------ install, run, uninstall


def chart_settings(kubectl, namespace: str) -> dict[str, str]:
    """The chart Deployment's literal STOKER_* values for the operator's own state (key, Lease), and the
    namespace the downward API would give it."""
    deployment = get_json(kubectl, "-n", namespace, "deployment", RELEASE)
    assert deployment is not None
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    settings = {
        item["name"]: item["value"]
        for item in env
        if "value" in item
        and item["name"].startswith(("STOKER_CONTROL_KEY", "STOKER_LEADER_ELECTION", "STOKER_COEFFICIENTS"))
    }
    return {**settings, "STOKER_OPERATOR_NAMESPACE": namespace}


def chart_identity_operator(
    cluster, kubectl, namespace: str, service_account: str, watch: list[str]
) -> Operator:
    """`stoker run` signed in as the chart's ServiceAccount (a minted token), with the chart's settings for
    its key and Lease, on ports of its own."""
    kubeconfig = cluster.work_dir / f"chart-operator-{namespace}.kubeconfig"
    token = kubectl("-n", namespace, "create", "token", service_account, "--duration=3600s").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_name = admin["clusters"][0]["name"]
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": service_account, "user": {"token": token}}],
                "contexts": [
                    {"name": "chart", "context": {"cluster": cluster_name, "user": service_account}}
                ],
                "current-context": "chart",
            }
        )
    )
    kubeconfig.chmod(0o600)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    running = Operator(
        cluster,
        ARTIFACTS / f"chart-operator-{namespace}.log",
        metrics_port=METRICS_PORT,
        env={
            "KUBECONFIG": str(kubeconfig),
            "STOKER_NAMESPACES": json.dumps(watch),
            **chart_settings(kubectl, namespace),
        },
    )
    running.env.pop("STOKER_CONTROL_KEY")  # the chart sets none: the key comes from the operator's Secret
    return running


def control_key(kubectl, namespace: str) -> dict[str, str]:
    secret = get_json(kubectl, "-n", namespace, "secret", f"{RELEASE}-control-key")
    assert secret is not None, f"no control key Secret in {namespace}"
    assert len(secret["data"]["key"]) >= 48
    return dict(secret["data"])


def lease_holder(kubectl, namespace: str) -> str:
    lease = get_json(kubectl, "-n", namespace, "lease", f"{RELEASE}-leader")
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def released_objects(kubectl, namespace: str) -> list[str]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/managed-by=Helm"
    namespaced = kubectl(
        "-n",
        namespace,
        "get",
        "deployments,serviceaccounts,services,roles,rolebindings,secrets,configmaps",
        "-l",
        selector,
        "-o",
        "name",
    ).stdout.split()
    cluster_scoped = kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout.split()
    # Other tests' releases share the name; cluster-scoped names carry their namespace.
    return namespaced + [name for name in cluster_scoped if f"/{namespace}-" in name]


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_install_run_with_the_chart_identity_upgrade_uninstall(
    mode: str, namespace: str, kubectl, helm: Helm, cluster, crd: None, admin_operator_paused: None
) -> None:
    watch = [namespace] if mode == "namespaced" else []
    values = ["--set", f"watchNamespaces={{{namespace}}}"] if watch else []
    helm("install", RELEASE, str(CHART), "--namespace", namespace, "--wait", "--timeout", "120s", *values)
    deployment = get_json(kubectl, "-n", namespace, "deployment", RELEASE)
    assert deployment and deployment["status"].get("availableReplicas") == 2
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]

    # What the identity may not do: least privilege, checked by the API server's own authorizer.
    subject = f"--as=system:serviceaccount:{namespace}:{service_account}"
    for denied in (
        ("get", "secrets"),
        ("delete", "deployments"),
        ("delete", "vllmservices.stoker.dev"),
        ("update", "vllmservices.stoker.dev"),
        ("create", "pods"),
        ("delete", "persistentvolumeclaims"),
    ):
        assert (
            kubectl("auth", "can-i", *denied, "-n", namespace, subject, check=False).stdout.strip() == "no"
        ), denied
    if watch:
        assert (
            kubectl("auth", "can-i", "list", "pods", "-n", "default", subject, check=False).stdout.strip()
            == "no"
        )

    with chart_identity_operator(cluster, kubectl, namespace, service_account, watch) as chart_operator:
        kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))
        svc = wait_ready(kubectl, namespace, example_name())
        assert svc["status"]["observedGeneration"] == svc["metadata"]["generation"]
        # Standby replicas with the chart's rights: the control Secret written, pods relabelled and slept.
        apply(kubectl, namespace, standby_service("warm", 1))
        with Fleet(kubectl, namespace, "warm") as fleet:
            wait_for(lambda: settled(fleet, active=1, standby=1), what="1 active and 1 asleep standby")
        metrics, log = chart_operator.metrics(), chart_operator.log()
        assert 'stoker_reconcile_total{result="converged"}' in metrics
        failed = [line for line in log.splitlines() if "Reconcile failed" in line]
        assert 'stoker_reconcile_total{result="error"}' not in metrics, "\n".join(failed[:10])
        assert lease_holder(kubectl, namespace)
    # Nothing the operator or kopf asked for was refused.
    refusals = [line for line in log.splitlines() if "Forbidden" in line or " 403" in line]
    assert not refusals, "\n".join(refusals[:10])

    key = control_key(kubectl, namespace)
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        "120s",
        *values,
        "--set",
        "operator.logLevel=DEBUG",
    )
    upgraded = get_json(kubectl, "-n", namespace, "deployment", RELEASE)
    assert upgraded is not None
    env = {e["name"]: e.get("value") for e in upgraded["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STOKER_LOG_LEVEL"] == "DEBUG"
    assert json.loads(helm("history", RELEASE, "-n", namespace, "-o", "json").stdout)[-1]["revision"] == 2
    # An upgrade and a restart keep the control key: standby pods stay wakeable.
    with chart_identity_operator(cluster, kubectl, namespace, service_account, watch):
        pass  # a restart: the operator reads its key at start, before it is live
    assert control_key(kubectl, namespace) == key

    assert released_objects(kubectl, namespace)
    helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "120s")
    assert released_objects(kubectl, namespace) == []
    # The operator's key is its own (Helm never generated it): a reinstall keeps standby pods wakeable.
    assert control_key(kubectl, namespace) == key
    # CRDs from crds/ stay, as Helm intends, and so do the user's VLLMServices.
    assert get_json(kubectl, "crd", "vllmservices.stoker.dev")
    assert get_json(kubectl, "-n", namespace, "vllmservice", example_name())


def test_kubectl_apply_of_helm_template_installs_in_the_release_namespace_and_keeps_the_key(
    namespace: str, kubectl, helm: Helm, cluster, crd: None, admin_operator_paused: None
) -> None:
    """The README's second install path, applied again, changed (an upgrade) and restarted."""

    def apply_chart(*values: str) -> None:
        manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace, *values).stdout
        kubectl("apply", "-f", "-", input=manifest)

    apply_chart()
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/managed-by=Helm"
    placed = kubectl(
        "get", "all,secrets,roles,rolebindings,serviceaccounts,pdb", "-A", "-l", selector, "-o", "json"
    )
    namespaces = {item["metadata"]["namespace"] for item in json.loads(placed.stdout)["items"]}
    assert namespace in namespaces and "default" not in namespaces
    wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "deployment", RELEASE) or {})
            .get("status", {})
            .get("readyReplicas")
            == 2
        ),
        what="both operator replicas ready",
    )
    service_account = RELEASE
    with chart_identity_operator(cluster, kubectl, namespace, service_account, []):
        kubectl("-n", namespace, "apply", "-f", str(EXAMPLE))
        wait_ready(kubectl, namespace, example_name())
        key = control_key(kubectl, namespace)
        apply_chart()  # re-applied unchanged
    assert control_key(kubectl, namespace) == key
    apply_chart("--set", "operator.logLevel=DEBUG")  # an upgrade
    with chart_identity_operator(cluster, kubectl, namespace, service_account, []):
        svc = wait_ready(kubectl, namespace, example_name())
        assert svc["status"]["observedGeneration"] == svc["metadata"]["generation"]
    assert control_key(kubectl, namespace) == key
    secret = get_json(kubectl, "-n", namespace, "secret", f"{RELEASE}-control-key")
    assert secret and secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "stoker"}
    assert get_json(kubectl, "-n", "default", "secret", f"{RELEASE}-control-key") is None


def test_applying_the_rendered_chart_again_changes_nothing(namespace: str, kubectl, helm: Helm) -> None:
    """The README's `kubectl apply` path run twice, as after an earlier install: its namespace command
    succeeds on an existing namespace, and the second apply changes no object and reports each unchanged.
    The one exception is kubectl's: it always reports a PodDisruptionBudget `configured`, since the PDB's
    selector has patch strategy `replace`, so the patch kubectl computes is never empty; nothing changes."""
    namespace_manifest = kubectl("create", "namespace", namespace, "--dry-run=client", "-o", "yaml").stdout
    kubectl("apply", "-f", "-", input=namespace_manifest)  # the namespace exists already
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace, "--set", "replicas=2").stdout
    try:
        kubectl("apply", "-f", "-", input=manifest)
        versions = {
            f"{item['kind']}/{item['metadata']['name']}": item["metadata"]["resourceVersion"]
            for item in json.loads(kubectl("get", "-f", "-", "-o", "json", input=manifest).stdout)["items"]
        }
        assert "PodDisruptionBudget/stoker" in versions and len(versions) > 10
        again = kubectl("apply", "-f", "-", input=manifest).stdout.splitlines()
        assert len(again) == len(versions)
        changed = [line for line in again if not line.endswith(" unchanged")]
        assert changed == ["poddisruptionbudget.policy/stoker configured"], again
        after = json.loads(kubectl("get", "-f", "-", "-o", "json", input=manifest).stdout)["items"]
        assert {
            f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in after
        } == versions
        assert kubectl("diff", "-f", "-", input=manifest, check=False).returncode == 0
    finally:  # the cluster-scoped objects (the admission policy among them) go with the test
        kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)


# ------------------------------------------------------------------------------------------------- GitOps


def spec_owners(obj: dict[str, Any]) -> set[str]:
    """Field managers that own anything under spec."""
    return {
        entry["manager"]
        for entry in obj["metadata"].get("managedFields") or []
        if "f:spec" in (entry.get("fieldsV1") or {})
    }


def converged_reconciles(operator) -> float:
    for line in operator.metrics().splitlines():
        if line.startswith('stoker_reconcile_total{result="converged"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("apply_mode", ["client-side", "server-side"])
def test_reapplying_the_same_manifests_changes_nothing(
    apply_mode: str, namespace: str, kubectl, operator
) -> None:
    """What Argo CD or Flux do on every sync: apply again and expect no diff and no new generation."""
    manager = ["--server-side", "--field-manager=gitops"] if apply_mode == "server-side" else []
    name = example_name()
    kubectl("-n", namespace, "apply", *manager, "-f", str(EXAMPLE))
    before = wait_ready(kubectl, namespace, name)
    # Let drift-timer reconciles (5 s apart) pass: they must not touch spec either.
    passed = converged_reconciles(operator) + 2
    wait_for(lambda: converged_reconciles(operator) >= passed, what="two more reconciles")
    kubectl("-n", namespace, "apply", *manager, "-f", str(EXAMPLE))
    diff = kubectl("-n", namespace, "diff", *manager, "-f", str(EXAMPLE), check=False)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout + diff.stderr
    after = get_json(kubectl, "-n", namespace, "vllmservice", name, "--show-managed-fields")
    assert after is not None
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    assert condition(after, "Ready")["status"] == "True"
    # Only the applier owns spec; the operator's one field manager owns status, through the subresource.
    applier = "gitops" if apply_mode == "server-side" else "kubectl-client-side-apply"
    assert spec_owners(after) == {applier}
    operator_entries = [e for e in after["metadata"]["managedFields"] if e["manager"] == "stoker"]
    assert operator_entries and all(e.get("subresource") == "status" for e in operator_entries)
