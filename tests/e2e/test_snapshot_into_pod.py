"""The snapshot agent on the real node (issue 40): a vLLM CPU server running in one pod is dumped by CRIU
(stoker.snapshot.agent, as root on the host, as the privileged node agent runs it) while it goes on serving,
and restored into a second running pod, which then answers the same greedy completion through its own pod
IP, its engine in that pod's PID and network namespaces and cgroup, and the kubelet's readiness probe finds it
(the pod was not Ready before). The agent restores only a snapshot it completed, from its own directory, keyed
by namespace, service and cache key, and only into a pod whose PID 1 (stoker.inpod.engine_init) is still
waiting; the restored engine writes to that pod's log, and a restore that fails ends in the engine's normal
start, which the pod's log says.

The pods are shaped as a restore needs them (stoker.snapshot.plan): engine_init as PID 1, which starts the
engine in a session of its own or takes the restored one as its child, the engine's internal sockets on
loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from bench.conformance import tiny_model
from bench.snapshot.criu_tree import criu_binary

from stoker.api.owned import PROGRAMS_MOUNT_PATH
from stoker.cli import copy_programs
from stoker.engines import DEFAULT_ENGINE_VERSION
from stoker.inpod import engine_init
from stoker.snapshot import plan
from stoker.snapshot.agent import children, container_init
from tests.conftest import REPO, Cluster, Kubectl, RealNode
from tests.e2e.helpers import condition, get_json, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

IMAGE = f"ghcr.io/stoker-dev/stoker-vllm:{DEFAULT_ENGINE_VERSION}"
KEY = "0123456789abcdef"
BROKEN_KEY = "fedcba9876543210"
GATE_PORT = 8001
SERVE = [
    "vllm",
    "serve",
    "/models/tiny",
    "--port",
    "8000",
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "256",
]


def criu() -> str:
    built = criu_binary()
    if not Path(built).exists():
        message = f"no CRIU at {built}: hack/criu build"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return built


def pod(
    name: str, placement: dict[str, Any], volumes: dict[str, Path], restore_wait: int, offer_bound: int
) -> dict[str, Any]:
    """A pod whose engine_init starts `vllm serve` after `restore_wait` s unless a restore is claimed, and
    offers the engine it started for a dump for `offer_bound` s before it lets the readiness probe pass."""
    init = ["python3", "-m", "stoker.inpod.engine_init", "--restore-wait", str(restore_wait),
            "--restore-bound", "120", "--health-url", "http://127.0.0.1:8000/health",
            "--gate-port", str(GATE_PORT), "--offer-bound", str(offer_bound), "--", *SERVE]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
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
                    "name": "vllm",
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


def namespaces_of(pid: int) -> dict[str, str]:
    return {kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("pid", "net")}


def test_an_engine_dumped_from_one_pod_serves_from_another_pod_it_is_restored_into(
    real_node: RealNode, cluster: Cluster, namespace: str, kubectl: Kubectl, engine_venv: Path, tmp_path: Path
) -> None:
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
    # src starts its engine at once and offers it for a dump; dst and fallback wait for a restore.
    for name, restore_wait, offer_bound in (("src", 0, 600), ("dst", 600, 0), ("fallback", 600, 0)):
        volumes = {"models": models, "programs": programs}
        manifest = pod(name, real_node.placement(), volumes, restore_wait, offer_bound)
        kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))

    def ready(name: str) -> bool:
        return (
            condition(get_json(kubectl, "-n", namespace, "pod", name) or {}, "Ready").get("status") == "True"
        )

    def started(name: str) -> dict[str, Any] | None:
        found = get_json(kubectl, "-n", namespace, "pod", name) or {}
        statuses = found.get("status", {}).get("containerStatuses") or [{}]
        return found if "running" in statuses[0].get("state", {}) else None

    def init_events(name: str) -> list[dict[str, object]]:
        log = kubectl("-n", namespace, "logs", name).stdout
        prefix = engine_init.LINE_PREFIX
        return [json.loads(line.removeprefix(prefix)) for line in log.splitlines() if line.startswith(prefix)]

    running = {
        name: wait_for(lambda n=name: started(n), timeout=120, what=f"{name} running")
        for name in ("src", "dst", "fallback")
    }
    ip = {name: p["status"]["podIP"] for name, p in running.items()}
    container = {name: p["status"]["containerStatuses"][0]["containerID"] for name, p in running.items()}
    src_init = container_init(container["src"].removeprefix("containerd://"))
    offer = Path(f"/proc/{src_init}/root{engine_init.HANDSHAKE_DIRECTORY}/{engine_init.OFFER}")
    wait_for(offer.exists, timeout=300, what="src's engine serving and offered for a dump")
    before = complete(ip["src"])  # the agent's warm-up: the engine is out of its Service until the dump
    assert before is not None and not ready("src")

    base = tmp_path / "snapshots"
    try:
        dumped = agent("dump", base, container["src"], namespace)
        assert dumped.returncode == 0, dumped.stderr
        facts = json.loads(dumped.stdout)
        assert facts["imageBytes"] > 0 and facts["files"] > 0, facts
        wait_for(lambda: ready("src"), timeout=30, what="src Ready once its dump is over")
        assert complete(ip["src"]) == before  # src went on serving
        assert [event["event"] for event in init_events("src")] == ["starting", "offering", "serving"]
        again = agent("dump", base, container["src"], namespace)
        assert again.returncode == 1 and "offer is over" in again.stderr, again.stderr

        # Only a snapshot this agent completed, under its own namespace, service and key, is ever restored,
        # and only into a pod whose engine_init still waits.
        for names, refusal in (
            ({"namespace": "other"}, "no completed snapshot"),
            ({"service": "other"}, "no completed snapshot"),
            ({"cache_key": BROKEN_KEY}, "no completed snapshot"),
            ({"namespace": ".."}, "not a valid name"),
            ({"cache_key": "../../etc"}, "not a valid name"),
        ):
            refused = agent("restore", base, container["dst"], **{"namespace": namespace, **names})
            assert refused.returncode == 1 and refusal in refused.stderr, (names, refused.stderr)
        refused = agent("restore", base, container["src"], namespace)
        assert refused.returncode == 1 and "started its engine already" in refused.stderr, refused.stderr
        dst_init = container_init(container["dst"].removeprefix("containerd://"))
        assert children(dst_init) == [] and not ready("dst")

        restored = agent("restore", base, container["dst"], namespace)
        assert restored.returncode == 0, restored.stderr
        engine = json.loads(restored.stdout)["pid"]
        assert children(dst_init) == [engine]  # PID 1's child, as the engine was in src: PID 1 reaps it
        assert namespaces_of(engine) == namespaces_of(dst_init)
        assert Path(f"/proc/{engine}/cgroup").read_text() == Path(f"/proc/{dst_init}/cgroup").read_text()
        assert complete(ip["dst"]) == before
        # Its output is dst's log: the pipes of src's log became dst's.
        assert all(
            os.readlink(f"/proc/{engine}/fd/{fd}") == os.readlink(f"/proc/{dst_init}/fd/{fd}")
            for fd in (1, 2)
        )
        assert '"POST /v1/completions HTTP/1.1" 200' in kubectl("-n", namespace, "logs", "dst").stdout
        wait_for(lambda: ready("dst"), timeout=30, what="dst Ready by the kubelet's probe")
        assert [event["event"] for event in init_events("dst")] == ["restoring", "restored"]
        refused = agent("dump", base, container["dst"], namespace)  # a restored engine is offered nowhere
        assert refused.returncode == 1 and "offers no dump" in refused.stderr, refused.stderr
        assert complete(ip["src"]) == before

        # A snapshot CRIU cannot restore (its memory pages gone): the pod starts its engine as any pod does,
        # and its log says why.
        broken = base / namespace / "tiny" / BROKEN_KEY
        subprocess.run(["cp", "-al", base / namespace / "tiny" / KEY, broken], check=True)
        for pages in broken.glob("pages-*.img"):
            pages.unlink()
        failed = agent("restore", base, container["fallback"], namespace, cache_key=BROKEN_KEY)
        assert failed.returncode == 1 and "criu restore failed" in failed.stderr, failed.stderr
        wait_for(lambda: ready("fallback"), timeout=300, what="fallback Ready by its normal start")
        restoring, starting = init_events("fallback")
        assert restoring["event"] == "restoring" and starting["event"] == "starting", (restoring, starting)
        assert str(starting["reason"]).startswith("restore failed: criu restore failed 3 times"), starting
        assert complete(ip["fallback"]) == before
        print(f"\ndump {facts}, restore {json.loads(restored.stdout)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)  # gigabytes
