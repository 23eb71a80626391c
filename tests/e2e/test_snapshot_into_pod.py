"""The snapshot agent on the real node (issue 40), as a node runs it (`python -m stoker.snapshot.agent
serve`, root on the host, the node's pods from the API server): pods labelled for snapshots, their PID 1
stoker.inpod.engine_init, vLLM's CPU build serving.

- The first replica of a cache key finds no snapshot: the agent tells it to start at once, and once it
  serves (and before it is Ready, so before anyone but the test reaches it) dumps it; it is Ready after.
- The next replica of the key on the node is restored from that snapshot instead of starting: its engine in
  its own PID and network namespaces and cgroup, its PID 1's child, writing to its own log, Ready by the
  kubelet's probe, answering the same greedy completion through its own pod IP.
- A replica whose key's snapshot cannot be restored (its memory pages removed) starts its engine itself
  within the bound, its log saying why; the agent drops that snapshot and dumps this replica instead, the
  service's other key's snapshot going with it (one per service).
- A pod labelled for the key with a copy of a signed pod's signature but a command of its own is never
  acted on: the agent acts only on pods the operator's key signed (stoker.snapshot.trust), so it waits out
  its restore wait and starts what it runs.
- Called by hand, the agent refuses names that lead out of its directory, another namespace's or service's
  snapshot, and a dump of an engine that is not offered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from bench.conformance import tiny_model
from bench.snapshot.criu_tree import criu_binary

from stoker.api.owned import CACHE_KEY_LABEL, INSTANCE_LABEL, PROGRAMS_MOUNT_PATH, SNAPSHOT_LABEL
from stoker.cli import copy_programs
from stoker.engines import DEFAULT_ENGINE_VERSION
from stoker.inpod import engine_init
from stoker.render.pods import ENGINE_CONTAINER
from stoker.snapshot import plan, trust
from stoker.snapshot.agent import children, container_init
from tests.conftest import REPO, Cluster, Kubectl, RealNode
from tests.e2e.helpers import condition, get_json, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

IMAGE = f"ghcr.io/stoker-dev/stoker-vllm:{DEFAULT_ENGINE_VERSION}"
KEY = "0123456789abcdef"
# The operator's control key, as the agent reads it from the chart's Secret.
SIGNING_KEY = "test-control-key-0123456789"
BROKEN_KEY = "fedcba9876543210"
GATE_PORT = 8001
SERVE = "vllm serve /models/tiny --port 8000 --served-model-name tiny --max-model-len 256"
ENGINE = SERVE.split()


def criu() -> str:
    built = criu_binary()
    if not Path(built).exists():
        message = f"no CRIU at {built}: hack/criu build"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return built


def snapshot_volumes(cluster: Cluster, engine_venv: Path) -> dict[str, Path]:
    """The replicas' host volumes: a tiny model and stoker's programs, readable by anyone."""
    models = cluster.work_dir / "volumes" / "snapshot-models"
    if not (models / "tiny" / "config.json").exists():
        subprocess.run(
            [str(engine_venv / "bin" / "python"), tiny_model.__file__, models / "tiny"], check=True
        )
    programs = cluster.work_dir / "volumes" / "snapshot-programs"
    shutil.rmtree(programs, ignore_errors=True)
    copy_programs(programs)
    for directory in (models, programs):
        for path in [directory, *directory.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    return {"models": models, "programs": programs}


def init_events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, object]]:
    """What the pod's engine_init said, from its log through the kubelet."""
    log = kubectl("-n", namespace, "logs", name).stdout
    prefix = engine_init.LINE_PREFIX
    return [json.loads(line.removeprefix(prefix)) for line in log.splitlines() if line.startswith(prefix)]


def pod(
    name: str,
    key: str,
    placement: dict[str, Any],
    volumes: dict[str, Path],
    namespace: str,
    signing_key: str = SIGNING_KEY,
) -> dict[str, Any]:
    """A replica as the agent finds it: labelled with its service and cache key, signed with the operator's
    key, engine_init waiting up to 10 min for the agent's restore and offering a started engine for a dump
    for up to 10 min."""
    init = ["python3", "-m", "stoker.inpod.engine_init", "--restore-wait", "600", "--restore-bound", "120",
            "--health-url", "http://127.0.0.1:8000/health", "--gate-port", str(GATE_PORT),
            "--offer-bound", "600", "--", *ENGINE]  # fmt: skip
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {SNAPSHOT_LABEL: "true", INSTANCE_LABEL: "tiny", CACHE_KEY_LABEL: key},
            "annotations": {},
        },
        "spec": {
            **placement,
            # Root: CRIU reads each process's rlimits, which for another user's process takes
            # CAP_SYS_RESOURCE: a node's root has it, this machine's lacks it (docs/benchmarks/snapshot.md).
            "securityContext": {
                "runAsUser": 0,
                "runAsGroup": 0,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": ENGINE_CONTAINER,
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": init,
                    "env": [
                        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
                        {"name": "PYTHONPATH", "value": PROGRAMS_MOUNT_PATH},
                        *(
                            {"name": name, "value": value}
                            for name, value in plan.LOOPBACK_ENVIRONMENT.items()
                        ),
                    ],
                    "resources": {"requests": {"memory": "3Gi"}},
                    # engine_init's gate: Ready once an engine serves in it and any dump offer is over.
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": GATE_PORT}, "periodSeconds": 1},
                    "volumeMounts": [
                        {"name": "models", "mountPath": "/models", "readOnly": True},
                        {"name": "programs", "mountPath": PROGRAMS_MOUNT_PATH, "readOnly": True},
                        {"name": "handshake", "mountPath": engine_init.HANDSHAKE_DIRECTORY},
                    ],
                }
            ],
            "volumes": [
                *(
                    {"name": volume, "hostPath": {"path": str(path), "type": "Directory"}}
                    for volume, path in volumes.items()
                ),
                {"name": "handshake", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ],
        },
    }
    manifest["metadata"]["annotations"][trust.SIGNATURE_ANNOTATION] = trust.signature(
        signing_key, namespace, "tiny", key, manifest["spec"], ENGINE_CONTAINER
    )
    return manifest


def forged(signed: dict[str, Any], name: str) -> dict[str, Any]:
    """`signed`'s labels and signature on a pod that runs something else (a 3 s restore wait, then sleep)."""
    manifest = json.loads(json.dumps(signed))
    manifest["metadata"]["name"] = name
    manifest["spec"]["containers"][0]["command"] = [
        "python3", "-m", "stoker.inpod.engine_init", "--restore-wait", "3", "--restore-bound", "5",
        "--", "sleep", "3600",
    ]  # fmt: skip
    manifest["spec"]["containers"][0].pop("readinessProbe")
    return manifest


def complete(ip: str) -> list[object] | None:
    """The text and token IDs of one greedy completion through the pod's IP, or None while it does not
    answer."""
    request = urllib.request.Request(
        f"http://{ip}:8000/v1/completions",
        data=json.dumps(
            {
                "model": "tiny",
                "prompt": "The operator renders one",
                "max_tokens": 12,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
        ).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            choice = json.load(answer)["choices"][0]
    except OSError:
        return None
    return [choice["text"], choice.get("token_ids")]


def agent(
    action: str, base: Path, container: str, namespace: str, **names: str
) -> subprocess.CompletedProcess[str]:
    keyed = {"namespace": namespace, "service": "tiny", "cache_key": KEY, **names}
    return subprocess.run(
        [sys.executable, "-m", "stoker.snapshot.agent", action, "--base", str(base), "--container", container,
         "--criu", criu(), *(f"--{k.replace('_', '-')}={v}" for k, v in keyed.items())],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )  # fmt: skip


def ready_seconds(kubectl: Kubectl, namespace: str, name: str) -> float:
    found = get_json(kubectl, "-n", namespace, "pod", name) or {}
    became = condition(found, "Ready")["lastTransitionTime"]
    created = found["metadata"]["creationTimestamp"]
    return (datetime.fromisoformat(became) - datetime.fromisoformat(created)).total_seconds()


def namespaces_of(pid: int) -> dict[str, str]:
    return {kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("pid", "net")}


def test_the_agent_dumps_a_keys_first_replica_and_restores_the_next_or_falls_back(
    real_node: RealNode, cluster: Cluster, namespace: str, kubectl: Kubectl, engine_venv: Path, tmp_path: Path
) -> None:
    volumes = snapshot_volumes(cluster, engine_venv)

    def create(name: str, key: str) -> dict[str, Any]:
        kubectl(
            "-n",
            namespace,
            "apply",
            "-f",
            "-",
            input=json.dumps(pod(name, key, real_node.placement(), volumes, namespace)),
        )
        return wait_for(lambda: started(name), timeout=120, what=f"{name} running")

    def ready(name: str) -> bool:
        return (
            condition(get_json(kubectl, "-n", namespace, "pod", name) or {}, "Ready").get("status") == "True"
        )

    def started(name: str) -> dict[str, Any] | None:
        found = get_json(kubectl, "-n", namespace, "pod", name) or {}
        statuses = found.get("status", {}).get("containerStatuses") or [{}]
        return found if "running" in statuses[0].get("state", {}) else None

    base = tmp_path / "snapshots"
    service = base / namespace / "tiny"
    agent_log = tmp_path / "agent.log"
    key_file = tmp_path / "control-key"
    key_file.write_text(SIGNING_KEY)
    with agent_log.open("w") as log:
        serving_agent = subprocess.Popen(
            [sys.executable, "-m", "stoker.snapshot.agent", "serve", "--base", str(base), "--key-file",
             str(key_file), "--node", real_node.name, "--criu", criu(), "--interval", "1", "--reserve-bytes",
             "0"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(cluster.env, PYTHONPATH=str(REPO / "src")),
        )  # fmt: skip

    def agent_lines() -> list[dict[str, Any]]:
        """The agent's steps (an API server that did not answer a round is a line without a step)."""
        lines = [json.loads(line) for line in agent_log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if "action" in line]

    try:
        # The key's first replica: told to start at once, dumped once it serves, Ready after.
        src = create("src", KEY)
        wait_for(lambda: ready("src"), timeout=300, what="src Ready once it is dumped")
        assert (service / KEY / "stoker-snapshot.json").exists()
        waiting, starting, offering, serving = init_events(kubectl, namespace, "src")
        assert waiting == {"event": "waiting", "seconds": 600.0}, waiting
        assert starting == {"event": "starting", "reason": plan.NO_SNAPSHOT}, starting
        assert str(offering["warmUp"]).startswith("one completion in"), offering  # served once: its own
        assert serving == {"event": "serving", "dump": "dumped"}, serving
        ip = {"src": src["status"]["podIP"]}
        before = complete(ip["src"])
        assert before is not None

        # The next replica on the node: restored, not started.
        dst = create("dst", KEY)
        ip["dst"] = dst["status"]["podIP"]
        wait_for(lambda: ready("dst"), timeout=120, what="dst Ready by the kubelet's probe, restored")
        assert [event["event"] for event in init_events(kubectl, namespace, "dst")] == [
            "waiting",
            "restoring",
            "restored",
        ]
        dst_init = container_init(dst["status"]["containerStatuses"][0]["containerID"].partition("://")[2])
        (engine,) = children(dst_init)  # PID 1's child, as the engine was in src: PID 1 reaps it
        assert namespaces_of(engine) == namespaces_of(dst_init)
        assert Path(f"/proc/{engine}/cgroup").read_text() == Path(f"/proc/{dst_init}/cgroup").read_text()
        assert complete(ip["dst"]) == before
        # Its output is dst's log: the pipes of src's log became dst's.
        assert all(
            os.readlink(f"/proc/{engine}/fd/{fd}") == os.readlink(f"/proc/{dst_init}/fd/{fd}")
            for fd in (1, 2)
        )
        assert '"POST /v1/completions HTTP/1.1" 200' in kubectl("-n", namespace, "logs", "dst").stdout
        assert complete(ip["src"]) == before

        # A pod with dst's labels and signature that runs something else: the agent never acts on it.
        copy = forged(pod("dst", KEY, real_node.placement(), volumes, namespace), "forged")
        kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(copy))
        wait_for(lambda: started("forged"), timeout=120, what="forged running")
        wait_for(
            lambda: len(init_events(kubectl, namespace, "forged")) >= 2,
            timeout=60,
            what="forged started its own",
        )
        assert init_events(kubectl, namespace, "forged")[1] == {
            "event": "starting",
            "reason": "no restore claimed within 3 s",
        }

        # A snapshot CRIU cannot restore (its memory pages gone): the replica starts its engine as any does,
        # its log says why, and it is dumped in place of the broken snapshot.
        subprocess.run(["cp", "-al", service / KEY, service / BROKEN_KEY], check=True)
        for pages in (service / BROKEN_KEY).glob("pages-*.img"):
            pages.unlink()
        fallback = create("fallback", BROKEN_KEY)
        ip["fallback"] = fallback["status"]["podIP"]
        wait_for(lambda: ready("fallback"), timeout=300, what="fallback Ready by its own start, then dumped")
        _, restoring, starting, offering, serving = init_events(kubectl, namespace, "fallback")
        assert restoring["event"] == "restoring" and starting["event"] == "starting", (restoring, starting)
        assert str(starting["reason"]).startswith("restore failed: criu restore failed 3 times"), starting
        assert serving == {"event": "serving", "dump": "dumped"}, serving
        assert complete(ip["fallback"]) == before
        assert sorted(path.name for path in service.iterdir()) == [BROKEN_KEY]  # one snapshot per service

        by_pod = [(line["action"], line["pod"].split("/")[1], "error" in line) for line in agent_lines()]
        assert by_pod == [
            ("start", "src", False), ("dump", "src", False), ("restore", "dst", False),
            ("restore", "fallback", True), ("dump", "fallback", False),
        ], by_pod  # fmt: skip

        # By hand: nothing outside the agent's directory, of another namespace or service, nor a dump of an
        # engine that is not offered.
        container = fallback["status"]["containerStatuses"][0]["containerID"]
        for names, refusal in (
            ({"namespace": "other", "cache_key": BROKEN_KEY}, "no completed snapshot"),
            ({"service": "other", "cache_key": BROKEN_KEY}, "no completed snapshot"),
            ({"namespace": ".."}, "not a valid name"),
            ({"cache_key": "../../etc"}, "not a valid name"),
        ):
            refused = agent("restore", base, container, **{"namespace": namespace, **names})
            assert refused.returncode == 1 and refusal in refused.stderr, (names, refused.stderr)
        refused = agent("restore", base, container, namespace, cache_key=BROKEN_KEY)
        assert refused.returncode == 1 and "started its engine already" in refused.stderr, refused.stderr
        refused = agent("dump", base, dst["status"]["containerStatuses"][0]["containerID"], namespace)
        assert refused.returncode == 1 and "offers no dump" in refused.stderr, refused.stderr
        # Where users feel it: from the pod's creation to its Ready condition (the API's seconds).
        ready_after = {name: ready_seconds(kubectl, namespace, name) for name in ("src", "dst", "fallback")}
        print("\n" + "\n".join(json.dumps(line) for line in [*agent_lines(), {"readySeconds": ready_after}]))
    finally:
        serving_agent.kill()
        serving_agent.wait()
        shutil.rmtree(base, ignore_errors=True)  # gigabytes
