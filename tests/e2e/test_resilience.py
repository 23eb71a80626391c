"""The loop keeps its promises under faults: a refused write backs off as logged, one log line per change of
state; a 60 s API server outage costs under 5 % of one core and a bounded number of log lines, and the
operator recovers by itself. Each test runs its own `stoker run` on one namespace; the outage stops the
session's real kube-apiserver (hack/cluster stop-apiserver) and starts it again."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.conftest import ARTIFACTS, HACK_CLUSTER, REPO, Cluster, Operator, kubectl_of
from tests.e2e.helpers import apply_namespace_policy, delete_policy, get_json, wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
# asctime, level, key, failures in a row, retry in seconds
FAILED = re.compile(r"^(\S+ \S+) (\w+) \S+: Reconcile failed key=(\S+) failures=(\d+) retryIn=(\S+)s")
OUTAGE_SECONDS = 60
CPU_BOUND_SECONDS = 0.05 * OUTAGE_SECONDS  # 5 % of one core
LOG_LINES_BOUND = 100


def own_operator(cluster: Cluster, namespace: str, name: str, **env: str) -> Operator:
    # Ports next to the session operator's, clear of test_leader's replicas (+4 to +7).
    port = int(os.environ.get("STOKER_TEST_METRICS_PORT", "28080")) + 10
    return Operator(
        cluster,
        ARTIFACTS / f"{name}-{namespace}.log",
        metrics_port=port,
        env={"STOKER_NAMESPACES": json.dumps([namespace]), "STOKER_OPERATOR_NAMESPACE": namespace, **env},
    )


def service(namespace: str, name: str) -> str:
    return json.dumps({**EXAMPLE, "metadata": {"name": name, "namespace": namespace}})


def converged(kubectl, namespace: str, name: str) -> bool:
    svc = get_json(kubectl, "-n", namespace, "vllmservice", name) or {}
    deployment = get_json(kubectl, "-n", namespace, "deployment", name)
    generation = (svc.get("metadata") or {}).get("generation")
    return deployment is not None and (svc.get("status") or {}).get("observedGeneration") == generation


def cpu_seconds(pid: int) -> float:
    """User and system time of a process so far (/proc/PID/stat fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def logged_at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.fixture
def refusing_policy(namespace: str, kubectl) -> Iterator[str]:
    """A ValidatingAdmissionPolicy of the cluster that refuses Deployments of more than one replica in the
    test's namespace: a spec the CRD accepts whose child the API server refuses."""
    policy = f"refuse-scale-{namespace}"
    apply_namespace_policy(
        kubectl,
        policy,
        namespace,
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["deployments"],
        },
        {
            "expression": "!has(object.spec.replicas) || object.spec.replicas <= 1",
            "message": "this cluster runs one replica per Deployment",
        },
    )
    try:
        yield policy
    finally:
        delete_policy(kubectl, policy)


def test_a_refused_child_backs_off_as_logged_with_one_warning(
    namespace: str, kubectl, cluster: Cluster, crd: None, admin_operator_paused: None, refusing_policy: str
) -> None:
    key = f"{namespace}/refused"
    with own_operator(cluster, namespace, "backoff", STOKER_LOG_LEVEL="DEBUG") as operator:
        kubectl("apply", "-f", "-", input=service(namespace, "refused"))
        wait_for(lambda: converged(kubectl, namespace, "refused"), what="the service converged")
        # The policy needs a moment to take effect: until a scale is refused, nothing fails.
        kubectl("-n", namespace, "scale", "vllmservice", "refused", "--replicas=2")
        wait_for(lambda: f"key={key} failures=1 " in operator.log(), timeout=60, what="the first failure")
        cpu_before = cpu_seconds(operator.process.pid)  # type: ignore[union-attr]
        time.sleep(40)
        cpu = cpu_seconds(operator.process.pid) - cpu_before  # type: ignore[union-attr]
        failures = [m.groups() for m in map(FAILED.match, operator.log().splitlines()) if m and m[3] == key]

        kubectl(
            "-n", namespace, "scale", "vllmservice", "refused", "--replicas=1"
        )  # a new spec ends the wait
        fixed_at = time.time()
        wait_for(lambda: f"Reconcile recovered key={key}" in operator.log(), timeout=15, what="the recovery")
        recovered = next(
            line for line in operator.log().splitlines() if f"Reconcile recovered key={key}" in line
        )
    print(
        f"\n{len(failures)} failed reconciles in about 40 s, {cpu:.2f} CPU-s; "
        + ", ".join(f"#{n} retryIn={retry}s" for _, _, _, n, retry in failures)
    )
    # Backoff kept as logged: each retry no sooner than the wait the failure before it named.
    for (stamp, _, _, _, retry), (next_stamp, *_) in itertools.pairwise(failures):
        assert logged_at(next_stamp) - logged_at(stamp) >= float(retry) - 0.05
    assert [int(n) for *_, n, _ in failures] == list(range(1, len(failures) + 1))
    assert 4 <= len(failures) <= 7  # 1, 2, 4, 8, 16 s: failures at about 0, 1, 3, 7, 15 and 31 s
    assert cpu < 2.0
    # One line per change of state: the first failure at WARNING, its repeats at DEBUG, the recovery at INFO.
    assert [level for _, level, *_ in failures] == ["WARNING"] + ["DEBUG"] * (len(failures) - 1)
    assert logged_at(recovered.split(" INFO ")[0]) - fixed_at < 5  # not after the pending 16 or 32 s


@pytest.fixture
def outage_cluster(cluster: Cluster, tmp_path: Path) -> Iterator[Cluster]:
    """A control plane of its own for the outage: after an API server restart kwok serves no pod log and
    the controllers' watches take a while to come back, which the session's later tests must not meet."""
    work = tmp_path / "cluster"
    port_base = int(os.environ.get("STOKER_TEST_PORT_BASE", "24790")) + 3100
    env = dict(
        cluster.env,
        STOKER_CLUSTER_DIR=str(work),
        STOKER_CLUSTER_PORT_BASE=str(port_base),
        STOKER_POD_CIDR="10.248.0.0/16",
        GPU_NODES="1",
    )
    env.pop("KUBECONFIG", None)
    subprocess.run([HACK_CLUSTER, "up"], env=env, check=True, timeout=600)
    try:
        kubeconfig = work / "admin.kubeconfig"
        yield Cluster(work, kubeconfig, cluster.bin_dir, dict(env, KUBECONFIG=str(kubeconfig)))
    finally:
        subprocess.run([HACK_CLUSTER, "down"], env=env, check=False, timeout=120)


def test_an_api_server_outage_costs_little_and_the_operator_recovers(outage_cluster: Cluster) -> None:
    cluster = outage_cluster
    kubectl = kubectl_of(cluster)
    kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/vllmservices.stoker.dev", "--timeout=60s")
    namespace = "outage"
    kubectl("create", "namespace", namespace)
    wait_for(lambda: kubectl("-n", namespace, "get", "sa", "default", check=False).returncode == 0, 60)
    with own_operator(cluster, namespace, "outage") as operator:
        names = [f"svc-{i}" for i in range(3)]
        for name in names:
            kubectl("apply", "-f", "-", input=service(namespace, name))
        for name in names:
            wait_for(lambda name=name: converged(kubectl, namespace, name), what=f"{name} converged")
        pid = operator.process.pid  # type: ignore[union-attr]
        lines_before, cpu_before = len(operator.log().splitlines()), cpu_seconds(pid)
        subprocess.run([HACK_CLUSTER, "stop-apiserver"], env=cluster.env, check=True, timeout=60)
        try:
            time.sleep(OUTAGE_SECONDS)
            cpu = cpu_seconds(pid) - cpu_before
            during = operator.log().splitlines()[lines_before:]
        finally:
            subprocess.run([HACK_CLUSTER, "start-apiserver"], env=cluster.env, check=True, timeout=240)
        assert operator.process.poll() is None  # type: ignore[union-attr]
        print(f"\n{OUTAGE_SECONDS} s outage: {cpu:.2f} CPU-s, {len(during)} log lines")
        print("\n".join(during[:40]))

        restarted = time.monotonic()
        kubectl("apply", "-f", "-", input=service(namespace, "after"))
        wait_for(lambda: converged(kubectl, namespace, "after"), timeout=90, what="a new service converged")
        print(f"a new service converged {time.monotonic() - restarted:.1f} s after the API server was back")
    assert cpu < CPU_BOUND_SECONDS
    assert len(during) < LOG_LINES_BOUND


@pytest.fixture
def undeletable_services(namespace: str, kubectl) -> Iterator[None]:
    """A ValidatingAdmissionPolicy that refuses deleting the namespace's VLLMServices: its deletion then
    removes the children and keeps the VLLMService, the moment a Deployment controller meets when the
    namespace controller deletes the children before their owner."""
    policy = f"keep-services-{namespace}"
    apply_namespace_policy(
        kubectl,
        policy,
        namespace,
        {
            "apiGroups": ["stoker.dev"],
            "apiVersions": ["*"],
            "operations": ["DELETE"],
            "resources": ["vllmservices"],
        },
        {"expression": "false", "message": "kept for the test"},
    )
    try:
        yield
    finally:
        delete_policy(kubectl, policy)


def test_a_service_in_a_namespace_being_deleted_is_let_go_without_an_error(
    namespace: str,
    kubectl,
    cluster: Cluster,
    crd: None,
    admin_operator_paused: None,
    undeletable_services: None,
) -> None:
    with own_operator(cluster, namespace, "terminating") as operator:
        kubectl("apply", "-f", "-", input=service(namespace, "doomed"))
        wait_for(lambda: converged(kubectl, namespace, "doomed"), what="the service converged")
        refused = ("-n", namespace, "delete", "vllmservice", "doomed", "--dry-run=server")
        wait_for(lambda: kubectl(*refused, check=False).returncode != 0, 30, what="the policy in effect")
        kubectl("delete", "namespace", namespace, "--wait=false")
        # The namespace controller deletes the Deployment, but in a long-lived cluster its queue of namespaces
        # can hold it back past the wait: delete it as the controller would. Recreating it is refused
        # (NamespaceTerminating).
        kubectl("-n", namespace, "delete", "deployment", "doomed", "--ignore-not-found", "--wait=false")
        wait_for(
            lambda: 'stoker_reconcile_total{result="terminating"}' in operator.metrics(),
            60,
            what="a reconcile that met the namespace's deletion",
        )
        time.sleep(3)  # a retry, had there been one, comes after 1 s
        metrics, log = operator.metrics(), operator.log()
    assert 'stoker_reconcile_total{result="error"}' not in metrics
    assert "Reconcile failed" not in log, log
    assert "WARNING stoker.controller.kube: Posting event failed" not in log, log
