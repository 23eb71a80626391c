"""The chart's snapshot agent as an admin installs it: `helm install` with `snapshot.enabled` on the real
node runs the operator and the agent's privileged DaemonSet from the snapshot agent's image (hack/node images
builds it as the Dockerfile's `snapshot-agent` target: the operator's image with CRIU). The agent in its pod,
with only what the chart mounts, dumps the first replica of a cache key signed with the operator's control key
(read from the Secret the operator made) and restores the next one into its own pod, which answers the same
completion.

The replicas run as root, as in test_snapshot_into_pod (this machine's root lacks CAP_SYS_RESOURCE, which CRIU
needs for another user's process); the agent's node paths are the real node's (`hack/node paths`).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stoker import __version__
from tests.conftest import HACK_NODE, REPO, Cluster, Helm, Kubectl, RealNode
from tests.e2e.helpers import condition, get_json, wait_for
from tests.e2e.test_snapshot_into_pod import KEY, complete, init_events, pod, snapshot_volumes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHART = REPO / "charts" / "stoker"
AGENT_IMAGE = f"ghcr.io/stoker-dev/stoker:{__version__}-snapshot-agent"


def test_the_charts_agent_dumps_a_keys_first_replica_and_restores_the_next_from_its_own_pod(
    real_node: RealNode,
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    helm: Helm,
    crd: None,
    engine_venv: Path,
) -> None:
    volumes = snapshot_volumes(cluster, engine_venv)
    placement = real_node.placement()
    paths = json.loads(
        subprocess.run(
            [HACK_NODE, "paths"], env=cluster.env, capture_output=True, text=True, check=True
        ).stdout
    )
    snapshots = cluster.work_dir / "volumes" / f"agent-snapshots-{namespace}"
    values = {
        "replicas": 1,
        # Only this namespace: the session's operator (a local process) owns every other one.
        "watchNamespaces": [namespace],
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
        "admission": {"enabled": False},
        "rbac": {"create": True, "userRoles": False},
        "snapshot": {
            "enabled": True,
            "hostPath": str(snapshots),
            "reserveGiB": 0,
            "hostPaths": paths,
            "nodeSelector": placement["nodeSelector"],
            "tolerations": placement["tolerations"],
        },
    }
    values_file = REPO / ".artifacts" / f"values-{namespace}.json"
    values_file.parent.mkdir(parents=True, exist_ok=True)
    values_file.write_text(json.dumps(values))
    release = "stoker"
    helm("install", release, str(CHART), "-n", namespace, "-f", str(values_file), "--skip-crds")

    def ready(name: str) -> bool:
        found = get_json(kubectl, "-n", namespace, "pod", name) or {}
        return condition(found, "Ready").get("status") == "True"

    def create(name: str, key: str) -> dict[str, Any]:
        manifest = pod(name, KEY, placement, volumes, namespace, signing_key=key)
        kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))
        wait_for(lambda: ready(name), timeout=300, what=f"{name} Ready")
        return get_json(kubectl, "-n", namespace, "pod", name) or {}

    def agent_steps() -> list[dict[str, Any]]:
        log = kubectl("-n", namespace, "logs", f"ds/{release}-snapshot-agent").stdout
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        return [line for line in lines if "action" in line]

    try:
        kubectl("-n", namespace, "rollout", "status", f"deployment/{release}", "--timeout=240s", timeout=260)
        # Ready only where its image runs CRIU (its probe): the image hack/node built.
        daemonset = f"ds/{release}-snapshot-agent"
        kubectl("-n", namespace, "rollout", "status", daemonset, "--timeout=240s", timeout=260)
        agents = get_json(
            kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/component=snapshot-agent"
        )
        (agent,) = (agents or {})["items"]
        assert agent["spec"]["nodeName"] == real_node.name
        assert agent["spec"]["containers"][0]["image"] == AGENT_IMAGE
        secret = get_json(kubectl, "-n", namespace, "secret", f"{release}-control-key") or {}
        key = base64.b64decode(secret["data"]["key"]).decode()

        create("src", key)  # Ready once the agent's dump of it is over
        steps = agent_steps()
        assert [(step["action"], step["pod"], "error" in step) for step in steps] == [
            ("start", f"{namespace}/src", False),
            ("dump", f"{namespace}/src", False),
        ], steps
        assert (snapshots / namespace / "tiny" / KEY / "stoker-snapshot.json").exists()
        before = complete(get_json(kubectl, "-n", namespace, "pod", "src")["status"]["podIP"])
        assert before is not None

        dst = create("dst", key)
        said = init_events(kubectl, namespace, "dst")
        assert [event["event"] for event in said] == ["waiting", "restoring", "restored"], (
            said,
            agent_steps(),
        )
        restore = agent_steps()[2]
        assert (restore["action"], restore["pod"], "error" in restore) == (
            "restore",
            f"{namespace}/dst",
            False,
        )
        assert complete(dst["status"]["podIP"]) == before
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", check=False)
        values_file.unlink(missing_ok=True)
