"""Which VLLMServices with coldStart.nodeWarming get a node warmer, and what it keeps: pure.

The per-node budget (STOKER_NODE_WARMING_BUDGET_GIB) is shared by every warming service in the cluster,
admitted in creation order (ties by namespace/name) while their wanted bytes fit what is left of it. That
is conservative: two services whose replicas land on disjoint nodes still share one budget, since which
nodes overlap changes with every label and the sum is what one node may be asked to hold. A service also
needs a node its replicas can land on (runtime.nodeSelector, the required node affinity and the taints its
tolerations tolerate) with allocatable memory for its pages beside one serving pod's memory request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

from stoker.api import VLLMService
from stoker.api.models import WARM_NODES_LISTED
from stoker.controller.objects import pod_is_ready
from stoker.render import Warming, seed_wanted
from stoker.render.engine import weights_from_volume
from stoker.render.memory import GIB, checkpoint_bytes, default_memory_request_bytes

Manifest = dict[str, Any]

# The import pages the seed records (stoker.inpod.seed), until its facts line has said how many it
# recorded (status.startup.model.importPagesBytes; seeds before 2026-11-27 did not): measured 1.7 GB for
# vLLM 0.26 on H100 hosts (bench/results/coldstart-h100-v0.26.0-pages*.json), rounded up.
IMPORT_PAGES_BYTES = 2 * GIB

WAITING_FOR_SEED = "WaitingForSeed"
OVER_BUDGET = "OverBudget"
NODE_MEMORY_TOO_SMALL = "NodeMemoryTooSmall"
WEIGHTS_NOT_ON_VOLUME = "WeightsNotOnVolume"


# Taints that keep pods off a node for good; the node lifecycle controller's condition taints
# (node.kubernetes.io/not-ready, .../memory-pressure, ...) come and go, and do not make a node one the
# replicas can never land on.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
CONDITION_TAINTS = "node.kubernetes.io/"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Node:
    """What the planner reads of a Node."""

    name: str
    labels: Mapping[str, str]
    allocatable_memory: int
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """A VLLMService with coldStart.nodeWarming enabled, as the planner sees it."""

    namespace: str
    name: str
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text)
    on_volume: bool
    wanted_bytes: int | None  # None until the seed has reported the checkpoint's size
    memory_request: int  # one serving pod's memory request, bytes
    node_selector: Mapping[str, str]
    node_affinity: Manifest | None
    tolerations: tuple[Manifest, ...] = ()  # core/v1 Tolerations, as the API serves them

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Verdict:
    """Whether a service warms its nodes (`warming` set) or why not (`reason`, `message`)."""

    wanted_bytes: int | None
    budget_bytes: int
    warming: Warming | None = None
    reason: str = ""
    message: str = ""


def node_of(obj: Manifest) -> Node:
    """The parts of a Node object the planner reads."""
    allocatable = ((obj.get("status") or {}).get("allocatable") or {}).get("memory")
    try:
        memory = int(parse_quantity(allocatable)) if allocatable else 0
    except ValueError:
        memory = 0
    meta = obj["metadata"]
    taints = tuple(
        Taint(str(taint.get("key") or ""), str(taint.get("value") or ""), str(taint.get("effect") or ""))
        for taint in (obj.get("spec") or {}).get("taints") or []
        if taint.get("effect") in BLOCKING_EFFECTS
        and not str(taint.get("key") or "").startswith(CONDITION_TAINTS)
    )
    return Node(meta["name"], dict(meta.get("labels") or {}), memory, taints)


def wanted_bytes(svc: VLLMService) -> int | None:
    """Bytes a warmer keeps per node: the checkpoint as the seed measured it, plus the import pages where
    a seed records them (as it reported them, else an estimate); None before the seed has reported."""
    weights = checkpoint_bytes(svc)
    if weights is None:
        return None
    if not seed_wanted(svc):
        return weights
    startup = svc.status.startup if svc.status is not None else None
    recorded = startup.model.import_pages_bytes if startup is not None and startup.model is not None else None
    return weights + (IMPORT_PAGES_BYTES if recorded is None else recorded)


def serving_memory_request(svc: VLLMService) -> int:
    """One serving pod's memory request in bytes, as render.pods sets it."""
    memory = svc.spec.runtime.resources.memory
    if memory is not None:
        return int(parse_quantity(memory))
    return default_memory_request_bytes(svc, "serve")


def candidate(svc: VLLMService) -> Candidate:
    affinity = svc.spec.pod.affinity
    return Candidate(
        namespace=str(svc.namespace),
        name=svc.name,
        created=str(svc.metadata.get("creationTimestamp") or ""),
        on_volume=weights_from_volume(svc),
        wanted_bytes=wanted_bytes(svc),
        memory_request=serving_memory_request(svc),
        node_selector=dict(svc.spec.runtime.node_selector),
        node_affinity=affinity.node_affinity if affinity is not None else None,
        tolerations=tuple(
            t.model_dump(by_alias=True, exclude_none=True) for t in svc.spec.runtime.tolerations
        ),
    )


def _expression_matches(expression: Manifest, value: str | None) -> bool:
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: Manifest, node: Node) -> bool:
    """A NodeSelectorTerm: all its label expressions and field expressions (metadata.name) hold."""
    labels = all(
        _expression_matches(e, node.labels.get(e.get("key", ""))) for e in term.get("matchExpressions") or []
    )
    fields = all(
        _expression_matches(e, node.name if e.get("key") == "metadata.name" else None)
        for e in term.get("matchFields") or []
    )
    return labels and fields


def tolerated(taint: Taint, tolerations: Iterable[Manifest]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (core/v1 semantics: an empty key with Exists
    tolerates every taint, an empty effect every effect, Equal compares the value)."""
    for toleration in tolerations:
        key, effect = toleration.get("key") or "", toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        if toleration.get("operator") == "Exists":
            if not key or key == taint.key:
                return True
        elif key == taint.key and (toleration.get("value") or "") == taint.value:
            return True
    return False


def node_matches(
    node: Node,
    node_selector: Mapping[str, str],
    node_affinity: Manifest | None,
    tolerations: Iterable[Manifest] = (),
) -> bool:
    """Whether the scheduler may place a pod with this nodeSelector, node affinity and tolerations on
    `node`: every selector label, one of the required affinity's terms (ORed; a term's expressions ANDed),
    and every lasting NoSchedule or NoExecute taint tolerated. Preferred affinity is not considered."""
    if any(node.labels.get(key) != value for key, value in node_selector.items()):
        return False
    tolerations = list(tolerations)
    if not all(tolerated(taint, tolerations) for taint in node.taints):
        return False
    required = (node_affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_term_matches(term, node) for term in terms)


def gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def plan_warming(
    candidates: Iterable[Candidate], nodes: Iterable[Node], budget: int, reserve: int
) -> dict[tuple[str, str], Verdict]:
    """Every candidate's verdict: admitted in creation order (ties by namespace/name) while its wanted
    bytes fit what earlier admitted services left of the per-node `budget`, and a node its replicas can
    land on has allocatable memory for them beside one serving pod's request. Skipped services take
    nothing of the budget."""
    nodes = list(nodes)
    verdicts: dict[tuple[str, str], Verdict] = {}
    used, admitted = 0, list[tuple[str, str]]()
    for c in sorted(candidates, key=lambda c: (c.created, c.namespace, c.name)):
        wanted = c.wanted_bytes

        def skip(reason: str, message: str, c: Candidate = c, wanted: int | None = wanted) -> None:
            verdicts[c.key] = Verdict(wanted, budget, None, reason, message)

        if not c.on_volume:
            skip(
                WEIGHTS_NOT_ON_VOLUME,
                "Node warming keeps files of a volume in the page cache: set model.source.pvc or"
                " coldStart.modelCache.enabled (weights read from an object store or the hub are not files)",
            )
            continue
        if wanted is None:
            skip(WAITING_FOR_SEED, "Waiting for the seed to report the checkpoint's size")
            continue
        if used + wanted > budget:
            # Services of other namespaces are counted, never named: a condition is read by this
            # namespace's users.
            here = [f"{ns}/{name}" for ns, name in admitted if ns == c.namespace]
            named = f"; in this namespace: {', '.join(here[:5])}" if here else ""
            skip(
                OVER_BUDGET,
                f"Needs {gib(wanted)} ({wanted} bytes) per node; the node warming budget is {gib(budget)}"
                f" per node and {gib(used)} of it is taken by {len(admitted)} warming services created"
                f" earlier{named}; raise STOKER_NODE_WARMING_BUDGET_GIB or turn warming off elsewhere",
            )
            continue
        matching = [n for n in nodes if node_matches(n, c.node_selector, c.node_affinity, c.tolerations)]
        needed = wanted + c.memory_request
        if not any(n.allocatable_memory >= needed for n in matching):
            if matching:
                largest = max(matching, key=lambda n: n.allocatable_memory)
                where = (
                    f"the largest node the replicas can land on, {largest.name}, has"
                    f" {gib(largest.allocatable_memory)} allocatable"
                )
            else:
                where = "no node matches the replicas' nodeSelector, required node affinity and tolerations"
            skip(
                NODE_MEMORY_TOO_SMALL,
                f"Needs {gib(needed)} of a node's memory ({gib(wanted)} warm beside a serving pod's"
                f" {gib(c.memory_request)} request); {where}",
            )
            continue
        used += wanted
        admitted.append(c.key)
        verdicts[c.key] = Verdict(wanted, budget, Warming(wanted, budget, reserve))
    return verdicts


@dataclass(frozen=True)
class Warmth:
    """Where a warming service's pages are resident: from its DaemonSet's status and its pods."""

    daemonset: str
    desired: int  # nodes the DaemonSet runs a warmer on
    warm: int  # of those, nodes whose warmer is Ready (everything wanted is resident)
    done: bool  # the DaemonSet's current template is Ready on every node it wants
    document: Manifest  # status.nodeWarming


def node_warmth(verdict: Verdict, warmer: Manifest | None, pods: list[Manifest]) -> Warmth:
    status = (warmer or {}).get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0) if verdict.warming is not None else 0
    warm = int(status.get("numberReady") or 0) if verdict.warming is not None else 0
    generation = int(((warmer or {}).get("metadata") or {}).get("generation") or 0)
    done = (
        warmer is not None
        and desired > 0
        and int(status.get("observedGeneration") or 0) >= generation
        and int(status.get("updatedNumberScheduled") or 0) >= desired
        and warm >= desired
    )
    per_node: dict[str, bool] = {}
    for pod in pods if verdict.warming is not None else []:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not pod["metadata"].get("deletionTimestamp"):
            per_node[node] = per_node.get(node, False) or pod_is_ready(pod)
    document: Manifest = {
        "budgetBytes": verdict.budget_bytes,
        "desiredNodes": desired,
        "warmNodes": warm,
        "nodes": [{"node": n, "warm": per_node[n]} for n in sorted(per_node)[:WARM_NODES_LISTED]],
    }
    if verdict.wanted_bytes is not None:
        document["wantedBytes"] = verdict.wanted_bytes
    name = ((warmer or {}).get("metadata") or {}).get("name", "")
    return Warmth(name, desired, warm, done, document)
