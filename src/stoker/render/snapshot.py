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

An engine in vLLM's sleep mode (`--enable-sleep-mode` in runtime.extraArgs, which the seed runs too: it is
part of the compile-cache key) is snapshotted asleep at level 2: the snapshot then holds neither its weights
nor its KV cache, only its host memory, and a restore reloads the weights from the model. engine_init puts
it to sleep and wakes it through the dev endpoints, which sleep mode needs and stoker.guard keeps to the
holder of the pod's control token (the service's control Secret). Without sleep mode the whole device
memory the engine holds goes into the snapshot (a CPU engine's way; a GPU's is its memory's size).
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker.api import VLLMService
from stoker.api.owned import CACHE_KEY_LABEL, SNAPSHOT_LABEL
from stoker.inpod import engine_init
from stoker.render.engine import CONTROL_GUARD, PORT
from stoker.render.group import multi_node
from stoker.render.names import Json
from stoker.render.peers import peers_enabled
from stoker.render.pods import ENGINE_CONTAINER, control_token_env
from stoker.snapshot import plan, trust

# engine_init's GET /ready: 503 while no engine serves in the pod or a dump offer is open.
GATE_PORT = 8079
GATE_PORT_NAME = "snapshot-gate"
HANDSHAKE_VOLUME = "stoker-snapshot"
SPAWNED_ENGINE = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
# What sleep mode's endpoints need (vLLM opens them only in dev mode; ignored by the compile-cache key).
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


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


def sleeps(svc: VLLMService) -> bool:
    """Whether the service's engine runs in vLLM's sleep mode."""
    runtime = svc.spec.runtime
    return runtime.engine_profile.flags.sleep_mode in runtime.extra_args


def snapshotted_asleep(svc: VLLMService, snapshots: Snapshots | None) -> bool:
    """Whether the service's serving pods are made for snapshots taken asleep: they need the control token."""
    return snapshots is not None and not_snapshotted(svc) is None and sleeps(svc)


def with_snapshots(svc: VLLMService, template: Json, snapshots: Snapshots) -> None:
    """The serving pod `template` (labelled with its cache key) made for snapshots, in place."""
    spec = template["spec"]
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    asleep = sleeps(svc)
    guard = [svc.spec.runtime.engine_profile.flags.middleware, CONTROL_GUARD] if asleep else []
    engine["command"] = [
        "python3", "-m", engine_init.__name__,
        "--restore-wait", str(snapshots.restore_wait_seconds),
        "--restore-bound", str(snapshots.restore_bound_seconds),
        "--health-url", f"http://127.0.0.1:{PORT}/health",
        "--gate-port", str(GATE_PORT),
        "--offer-bound", str(snapshots.offer_bound_seconds),
        *(["--sleep"] if asleep else []),
        "--", *engine["command"], *engine.pop("args", []), *guard,
    ]  # fmt: skip
    extra = {**plan.LOOPBACK_ENVIRONMENT, **SPAWNED_ENGINE, **(DEV_MODE if asleep else {})}
    engine["env"] = [e for e in engine["env"] if e["name"] not in extra] + [
        {"name": name, "value": value} for name, value in extra.items()
    ]
    if asleep:
        engine["env"].append(control_token_env(svc))
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
