"""A VLLMService whose pods the operator makes for snapshot and restore (STOKER_SNAPSHOT_ENABLED), on the real
node, with the node's agent (`python -m stoker.snapshot.agent serve`, root on the host) running beside it.

The operator renders the serving pod under stoker.inpod.engine_init, signed with its control key; the agent
finds the pod by its label, checks the signature against the live pod (what the API server defaulted
included), tells it there is no snapshot yet, and tries to dump it once it is offered. On this machine the
dump fails: the engine runs as uid 1000, and CRIU then needs CAP_SYS_RESOURCE, which this machine's root
lacks (a node's root has it; docs/benchmarks/snapshot.md). So what is checked is the operator's side: the
restricted pod runs engine_init as its PID 1, is kept out of its Service until the dump's outcome, serves
through the Service after it, and its start is recorded as started, with the reason, in status and Events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.realnode import (
    SERVICE,
    START_TIMEOUT_SECONDS,
    advertise_gpus,
    model_and_cache_volumes,
    vllm_service,
)

from stoker.api.owned import CACHE_KEY_LABEL, SNAPSHOT_LABEL
from stoker.inpod import engine_init
from stoker.render.pods import ENGINE_CONTAINER
from stoker.snapshot import plan, trust
from stoker.snapshot.agent import container_init
from tests.conftest import ARTIFACTS, REPO, Cluster, Kubectl, Operator, RealNode
from tests.e2e.helpers import condition, get_json, seeded_service, wait_for
from tests.e2e.test_real_node_service import ready_pods, served
from tests.e2e.test_snapshot_into_pod import criu

pytestmark = pytest.mark.e2e

CONTROL_KEY = "e2e-snapshot-control-key-0123"


@pytest.mark.timeout(3 * START_TIMEOUT_SECONDS)
def test_the_operator_renders_signed_snapshot_pods_that_the_agent_takes_and_that_serve(
    real_node: RealNode,
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    engine_venv: Path,
    tmp_path: Path,
    crd: None,
    admin_operator_paused: None,
) -> None:
    python = engine_venv / "bin" / "python"
    model_and_cache_volumes(kubectl, namespace, cluster.work_dir / "volumes" / namespace, python)
    advertise_gpus(kubectl, 4)
    key_file = tmp_path / "control-key"
    key_file.write_text(CONTROL_KEY)
    agent_log = tmp_path / "agent.log"
    port = int(os.environ.get("STOKER_TEST_METRICS_PORT", "28080")) + 12
    operator = Operator(
        cluster,
        ARTIFACTS / f"snapshot-operator-{namespace}.log",
        metrics_port=port,
        env={
            "STOKER_NAMESPACES": json.dumps([namespace]),
            "STOKER_CONTROL_KEY": CONTROL_KEY,
            "STOKER_SNAPSHOT_ENABLED": "true",
            "STOKER_SNAPSHOT_OFFER_BOUND_SECONDS": "300",
        },
    )
    with operator, agent_log.open("w") as log:
        serving_agent = subprocess.Popen(
            [sys.executable, "-m", "stoker.snapshot.agent", "serve", "--base", str(tmp_path / "snapshots"),
             "--key-file", str(key_file), "--node", real_node.name, "--criu", criu(), "--interval", "1",
             "--reserve-bytes", "0"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(cluster.env, PYTHONPATH=str(REPO / "src")),
        )  # fmt: skip
        try:
            kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(vllm_service(1)))
            wait_for(
                lambda: seeded_service(kubectl, namespace, SERVICE),
                START_TIMEOUT_SECONDS,
                "the seed Job to fill the cache",
            )
            (pod,) = wait_for(lambda: ready_pods(kubectl, namespace), START_TIMEOUT_SECONDS, "a Ready pod")
            name = pod["metadata"]["name"]
            labels = pod["metadata"]["labels"]
            assert labels[SNAPSHOT_LABEL] == "true"
            # The live pod signs as the operator's template did, the API server's defaults filled in.
            assert trust.signed(CONTROL_KEY, pod, SERVICE, labels[CACHE_KEY_LABEL], ENGINE_CONTAINER)
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
            status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == ENGINE_CONTAINER)
            init = container_init(status["containerID"].partition("://")[2])
            assert engine_init.__name__ in Path(f"/proc/{init}/cmdline").read_text()

            # The agent's round: no snapshot yet, so start; then the offered engine's dump (which this
            # machine's root cannot make of a uid-1000 process) and its outcome, which opened the gate.
            log_text = kubectl("-n", namespace, "logs", name, "-c", ENGINE_CONTAINER).stdout
            prefix = engine_init.LINE_PREFIX
            said = [
                json.loads(line[len(prefix) :]) for line in log_text.splitlines() if line.startswith(prefix)
            ]
            waiting, starting, offering, serving = said[:4]
            assert waiting["event"] == "waiting", said
            assert starting == {"event": "starting", "reason": plan.NO_SNAPSHOT}, said
            assert offering["event"] == "offering", said
            assert serving["event"] == "serving" and serving["dump"].split()[0] in ("dumped", "failed"), said
            steps = [json.loads(line) for line in agent_log.read_text().splitlines() if line.startswith("{")]
            acted = [(line["action"], line["pod"]) for line in steps if "action" in line]
            assert acted[:2] == [("start", f"{namespace}/{name}"), ("dump", f"{namespace}/{name}")], steps
            assert served(kubectl, namespace)

            # Recorded as started by itself, with the agent's reason.
            def recorded() -> dict[str, Any] | None:
                svc = get_json(kubectl, "-n", namespace, "vllmservice", SERVICE) or {}
                last = ((svc.get("status") or {}).get("startup") or {}).get("last") or {}
                return last if last.get("pod") == name else None

            last = wait_for(recorded, 120, "the start in status.startup.last")
            assert last["snapshot"] == "started" and last["snapshotReason"] == plan.NO_SNAPSHOT, last
            assert last["totalSeconds"] > 0, last
            # The seed's cache found under the pod's own environment (loopback, a spawned engine): the CPU
            # platform's one outcome of a kept cache (test_real_node_service says why it is no hit).
            assert (last["compileCache"], last.get("compileCacheReason")) == ("miss", "loadFailed"), last
            events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "reason=Started") or {}
            messages = [event["message"] for event in events.get("items", [])]
            assert any(f"not restored: {plan.NO_SNAPSHOT}; pod {name}" in m for m in messages), messages
            assert condition(pod, "Ready")["status"] == "True"
            print("\n" + agent_log.read_text())
        finally:
            serving_agent.kill()
            serving_agent.wait()
