"""The node warmer (coldStart.nodeWarming): a DaemonSet that keeps a service's checkpoint and the seed's
import pages in the page cache of every node its replicas can land on, and its serving image pulled there.

Its pod is the serving pod's, cut down: the same builder (render.pods.pod_spec) gives the same node
selector, affinity, tolerations, service account, pod security context, image pull secrets and volumes, so
the warmer lands exactly where replicas can and passes the admission rules serving pods pass; then the
engine container is replaced by the agent (`python3 -m stoker.inpod.node_warmer`, from the programs
volume), every volume is mounted read-only, and the GPU, the download init container, topology spread,
the priority class and a shared GPU's claim and gate are dropped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from stoker.api import VLLMService
from stoker.api.owned import SHM_VOLUME
from stoker.inpod import node_warmer as node_warmer_program
from stoker.render.names import (
    COMPONENT_LABEL,
    COMPONENT_NODE_WARMER,
    INSTANCE_LABEL,
    Json,
    common_labels,
    node_warmer_name,
    object_meta,
)
from stoker.render.pods import (
    CONTAINER_SECURITY_CONTEXT,
    DEFAULT_PROGRAMS_IMAGE,
    ENGINE_CONTAINER,
    PROGRAMS_CONTAINER,
    pod_metadata,
    pod_spec,
)
from stoker.render.prefetch import import_pages_listing, read_ahead_paths, serving_invocation

# The agent's HTTP port: GET /ready (200 once everything wanted is resident) and GET /metrics.
NODE_WARMER_PORT = node_warmer_program.DEFAULT_PORT
# The agent's exit code when it found no checkpoint data to keep (controller/warming.py reads it).
NODE_WARMER_NOTHING_FOUND_EXIT = node_warmer_program.NOTHING_FOUND_EXIT
NODE_WARMER_MODULE = node_warmer_program.__name__
NODE_WARMER_CONTAINER = "node-warmer"
# Headroom above the pages it keeps: the agent's Python process itself.
WARMER_OVERHEAD_BYTES = 256 << 20
# The scheduler reserves only this much for a warmer: the pages it keeps are page cache, which the kernel
# reclaims under pressure, so a serving pod never finds its request taken by a warmer.
WARMER_REQUESTS: Json = {"cpu": "10m", "memory": "64Mi"}
# Pod fields of the serving pod that a warmer must not have: it holds no GPU (a shared GPU's claim and
# gate included), is one pod per node (no topology spread), and must never preempt anything.
_DROPPED_POD_FIELDS = ("resourceClaims", "schedulingGates", "topologySpreadConstraints", "priorityClassName")


@dataclass(frozen=True)
class Warming:
    """What a warmer is rendered with: the bytes it was admitted to keep per node (its --budget-bytes, and
    its memory limit but for the agent's own), and the node memory it leaves free."""

    wanted_bytes: int
    reserve_bytes: int


def node_warmer_selector_labels(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name, COMPONENT_LABEL: COMPONENT_NODE_WARMER}


def node_warmer_command(svc: VLLMService, warming: Warming) -> list[str]:
    """The agent's command line: the same checkpoint paths and import-pages listing the serving pods'
    read-ahead gets (render.prefetch), and no more bytes to keep than the service was admitted for."""
    return [
        "python3",
        "-m",
        NODE_WARMER_MODULE,
        "--service",
        f"{svc.namespace}/{svc.name}",
        "--pages",
        import_pages_listing(svc),
        "--budget-bytes",
        str(warming.wanted_bytes),
        "--reserve-bytes",
        str(warming.reserve_bytes),
        "--",
        *read_ahead_paths(svc),
    ]


def build_node_warmer(
    svc: VLLMService, warming: Warming, *, programs_image: str = DEFAULT_PROGRAMS_IMAGE
) -> Json:
    """The DaemonSet `<name>-node-warmer`: at most `warming.wanted_bytes` in each node's page cache,
    leaving the reserve of the node's memory free."""
    labels = common_labels(svc.name, COMPONENT_NODE_WARMER)
    spec = pod_spec(svc, "serve", serving_invocation(svc), programs_image)
    for dropped in _DROPPED_POD_FIELDS:
        spec.pop(dropped, None)
    # The agent reads files; it needs no credentials of the API server, whatever the service account.
    spec["automountServiceAccountToken"] = False
    # The programs copy only: the model volume is read, never downloaded into, by the warmer.
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] == PROGRAMS_CONTAINER]
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    mounts = [{**m, "readOnly": True} for m in engine["volumeMounts"] if m["name"] != SHM_VOLUME]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != SHM_VOLUME]
    # Plain values only (HF_HOME to resolve a hub name, PYTHONPATH for the programs); no Secret reaches it.
    env = [var for var in engine["env"] if "value" in var]
    spec["containers"] = [
        {
            "name": NODE_WARMER_CONTAINER,
            # The serving image: running it keeps it pulled on every node a replica can land on, so that a
            # scale-up there pulls nothing (the kubelet's image GC spares images of running containers).
            "image": engine["image"],
            "command": node_warmer_command(svc, warming),
            "env": env,
            "ports": [{"name": "warmer", "containerPort": NODE_WARMER_PORT, "protocol": "TCP"}],
            "readinessProbe": {
                "httpGet": {"path": "/ready", "port": "warmer"},
                "periodSeconds": 10,
                "failureThreshold": 1,
                "timeoutSeconds": 5,
            },
            "resources": {
                "requests": copy.deepcopy(WARMER_REQUESTS),
                # Page cache is charged to the cgroup of the process that read it: a limit below what the
                # agent keeps would make the kernel reclaim the agent's own pages. A limit, not a request,
                # so the scheduler reserves nothing a serving pod needs.
                "limits": {"memory": str(warming.wanted_bytes + WARMER_OVERHEAD_BYTES)},
            },
            "volumeMounts": mounts,
            "securityContext": {**copy.deepcopy(CONTAINER_SECURITY_CONTEXT), "readOnlyRootFilesystem": True},
        }
    ]
    template_meta = pod_metadata(svc, labels, {})
    if not template_meta["annotations"]:
        del template_meta["annotations"]  # the API server drops an empty map: it would differ every pass
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": object_meta(svc, node_warmer_name(svc.name), labels),
        "spec": {
            "selector": {"matchLabels": node_warmer_selector_labels(svc.name)},
            "template": {"metadata": template_meta, "spec": spec},
        },
    }
