"""Serving pods made for snapshot and restore (issue 40; docs/benchmarks/snapshot.md), when an admin turned it
on (the chart's `snapshot.enabled`, which also runs the node agent, stoker.snapshot.agent).

The engine container's PID 1 becomes stoker's engine_init (stoker.inpod.engine_init), which waits a bounded
time for the agent to restore an engine of the pod's cache key into it, else starts the engine itself, warms
it up and offers it for a dump, keeping the pod out of its Service until the dump's outcome. So the pod gets:
the handshake directory (an emptyDir), engine_init's gate as the readiness probe, the engine's internal
sockets on loopback (the restored engine finds only the target pod's loopback, not the source's IP), a
spawned engine (a forked one shares the API server's GPU device files, which CRIU cannot dump), the
snapshot label the agent lists, and the operator's signature (stoker.snapshot.trust), without which the
agent acts on nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker.api import VLLMService
from stoker.api.owned import CACHE_KEY_LABEL, SNAPSHOT_LABEL
from stoker.inpod import engine_init
from stoker.render.engine import PORT
from stoker.render.group import multi_node
from stoker.render.names import Json
from stoker.render.peers import peers_enabled
from stoker.render.pods import ENGINE_CONTAINER
from stoker.snapshot import plan, trust

# engine_init's GET /ready: 503 while no engine serves in the pod or a dump offer is open.
GATE_PORT = 8079
GATE_PORT_NAME = "snapshot-gate"
HANDSHAKE_VOLUME = "stoker-snapshot"
SPAWNED_ENGINE = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


@dataclass(frozen=True)
class Snapshots:
    """The admin's settings, and the operator's control key that signs the pods."""

    key: str
    restore_wait_seconds: int
    restore_bound_seconds: int
    offer_bound_seconds: int


def not_snapshotted(svc: VLLMService) -> str | None:
    """Why this service's pods are not made for snapshots, or None. A snapshot is one process tree on one
    node, taken from an engine nobody else talks to."""
    if multi_node(svc):
        return "a replica spans several nodes"
    if svc.spec.runtime.effective_tensor_parallel_size > 1:
        return "a replica spans several GPUs (the driver's checkpoint does not cover NCCL's connections)"
    if svc.spec.cold_start.standby is not None:
        return "standby replicas sleep and wake under the operator's control"
    if peers_enabled(svc):
        return "replicas serve their weights to peers"
    return None


def with_snapshots(svc: VLLMService, template: Json, snapshots: Snapshots) -> None:
    """The serving pod `template` (labelled with its cache key) made for snapshots, in place."""
    spec = template["spec"]
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    engine["command"] = [
        "python3", "-m", engine_init.__name__,
        "--restore-wait", str(snapshots.restore_wait_seconds),
        "--restore-bound", str(snapshots.restore_bound_seconds),
        "--health-url", f"http://127.0.0.1:{PORT}/health",
        "--gate-port", str(GATE_PORT),
        "--offer-bound", str(snapshots.offer_bound_seconds),
        "--", *engine["command"], *engine.pop("args", []),
    ]  # fmt: skip
    extra = {**plan.LOOPBACK_ENVIRONMENT, **SPAWNED_ENGINE}
    engine["env"] = [e for e in engine["env"] if e["name"] not in extra] + [
        {"name": name, "value": value} for name, value in extra.items()
    ]
    engine["ports"].append({"name": GATE_PORT_NAME, "containerPort": GATE_PORT, "protocol": "TCP"})
    # Every second, as the startup probe: the gate opens the moment a dump's outcome is in.
    gate = {"path": "/ready", "port": GATE_PORT_NAME}
    engine["readinessProbe"] = {**engine["readinessProbe"], "httpGet": gate, "periodSeconds": 1}
    engine["volumeMounts"].append({"name": HANDSHAKE_VOLUME, "mountPath": engine_init.HANDSHAKE_DIRECTORY})
    spec["volumes"].append({"name": HANDSHAKE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    labels = template["metadata"]["labels"]
    labels[SNAPSHOT_LABEL] = "true"
    template["metadata"]["annotations"][trust.SIGNATURE_ANNOTATION] = trust.signature(
        snapshots.key, str(svc.namespace), svc.name, labels[CACHE_KEY_LABEL], spec, ENGINE_CONTAINER
    )
