"""Pods on a real node: kubelet, containerd and runc (hack/node) run stoker's images in containers.

The node sits beside the kwok nodes, tainted so that only pods placed here on purpose land on it. The
images are built offline (hack/node images) and imported into the node's containerd, pinned; pods use
them with imagePullPolicy IfNotPresent. Nothing here is faked: the logs come from the kubelet, the
probes are the kubelet's, the Lease is written by the operator running in its own pod.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from typing import Any

import pytest

from stoker import __version__
from tests.conftest import REPO, Helm, Kubectl, RealNode
from tests.e2e.helpers import get_json, wait_for

# The first test brings the node up (hack/node up imports a new image archive once: minutes for vLLM's).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

STOKER_IMAGE = f"ghcr.io/stoker-dev/stoker:{__version__}"
NODE_POD_CIDR = ipaddress.ip_network("10.89.0.0/24")  # hack/node's default STOKER_NODE_NET
CHART = REPO / "charts" / "stoker"


def pod_phase(kubectl: Kubectl, namespace: str, name: str) -> str:
    pod = get_json(kubectl, "-n", namespace, "pod", name) or {}
    return str((pod.get("status") or {}).get("phase", ""))


def test_a_pod_of_the_stoker_image_runs_to_completion_and_its_log_comes_from_the_kubelet(
    real_node: RealNode, namespace: str, kubectl: Kubectl
) -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {
            **real_node.placement(),
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": STOKER_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    # The programs the init container of every stoker pod copies, then one of them imported.
                    "command": [
                        "sh",
                        "-c",
                        "stoker programs /tmp/p >/dev/null && PYTHONPATH=/tmp/p python3 -c "
                        "'import stoker.inpod, sys; print(\"in-pod programs of\", sys.version.split()[0])'",
                    ],
                }
            ],
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
    wait_for(
        lambda: pod_phase(kubectl, namespace, "hello") in ("Succeeded", "Failed"),
        timeout=180,
        what="the pod to finish",
    )
    done = get_json(kubectl, "-n", namespace, "pod", "hello") or {}
    logs = kubectl("-n", namespace, "logs", "hello").stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], logs)
    assert done["spec"]["nodeName"] == real_node.name
    assert ipaddress.ip_address(done["status"]["podIP"]) in NODE_POD_CIDR
    assert logs.strip() == "in-pod programs of 3.11.2"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"


def test_helm_install_runs_the_operator_in_a_pod_that_holds_its_lease_and_serves_metrics(
    real_node: RealNode, namespace: str, kubectl: Kubectl, helm: Helm, crd: None
) -> None:
    placement = real_node.placement()
    values = {
        "replicas": 1,
        # Only this namespace: the session's operator (a local process) owns every other one.
        "watchNamespaces": [namespace],
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
        # A single namespace of a shared test cluster: no cluster-wide policy or user roles.
        "admission": {"enabled": False},
        "rbac": {"create": True, "userRoles": False},
    }
    values_file = REPO / ".artifacts" / f"values-{namespace}.json"
    values_file.parent.mkdir(parents=True, exist_ok=True)
    values_file.write_text(json.dumps(values))
    release = "stoker"
    helm("install", release, str(CHART), "-n", namespace, "-f", str(values_file), "--skip-crds")
    try:
        kubectl("-n", namespace, "rollout", "status", f"deployment/{release}", "--timeout=240s", timeout=260)
        pods = get_json(kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/name=stoker")
        (pod,) = (pods or {})["items"]
        assert pod["spec"]["nodeName"] == real_node.name
        assert pod["spec"]["containers"][0]["image"] == STOKER_IMAGE

        def lease_holder() -> str | None:
            leases = get_json(kubectl, "-n", namespace, "leases") or {}
            holders = [item["spec"].get("holderIdentity") or "" for item in leases.get("items", [])]
            return next((h for h in holders if pod["metadata"]["name"] in h), None)

        wait_for(lease_holder, timeout=120, what="the operator pod to hold its Lease")
        # The metrics port listens on the pod IP; from this machine it is one hop through the pod's veth.
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        assert "stoker_" in metrics
        # Through the kubelet: the operator's own log.
        log = kubectl("-n", namespace, "logs", pod["metadata"]["name"]).stdout
        assert log.strip(), "the operator pod logged nothing"
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", check=False)
        values_file.unlink(missing_ok=True)
