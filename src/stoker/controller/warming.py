"""Which VLLMServices with coldStart.nodeWarming get a node warmer, and what it keeps: pure.

What a service may keep warm is its claim: the checkpoint's bytes as its seed reported them, never more
than the capacity of the volume that holds them (the API server's figure for the bound claim, which the
tenant cannot write), plus the import pages as the seed recorded them. The seed runs the tenant's image,
so the claim is untrusted; what bounds the harm of a false one:
- the warmer is started with its admitted bytes as --budget-bytes and a memory limit just above them, so
  it never holds more than it was admitted for, whatever it finds or runs (a claim too small hurts only
  its own service);
- the per-node budget (STOKER_NODE_WARMING_BUDGET_GIB) is shared fairly between namespaces: each first
  gets its fair share (the budget split evenly between the namespaces that warm, or its admin-set quota
  where smaller), and only what that leaves goes to services over a share, the namespace that holds least
  first. So a claim too large costs only its own namespace's share, and a namespace arriving later gets
  its share back from one that borrowed it.
The budget is per node and conservative: services whose replicas land on disjoint nodes still share it,
since which nodes overlap changes with every label and the sum is what one node may be asked to hold. A
service also needs a node its replicas can land on (runtime.nodeSelector, the required node affinity and
the taints its tolerations tolerate) with allocatable memory for its pages beside one serving pod's
memory request.
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
from stoker.render.names import model_pvc_name
from stoker.render.nodewarmer import NODE_WARMER_NOTHING_FOUND_EXIT

Manifest = dict[str, Any]

# The import pages the seed records (stoker.inpod.seed), until its facts line has said how many it
# recorded (status.startup.model.importPagesBytes; seeds before 2026-11-27 did not): measured 1.7 GB for
# vLLM 0.26 on H100 hosts (bench/results/coldstart-h100-v0.26.0-pages*.json), rounded up.
IMPORT_PAGES_BYTES = 2 * GIB

WAITING_FOR_SEED = "WaitingForSeed"
OVER_BUDGET = "OverBudget"
NODE_MEMORY_TOO_SMALL = "NodeMemoryTooSmall"
WEIGHTS_NOT_ON_VOLUME = "WeightsNotOnVolume"
VOLUME_NOT_BOUND = "VolumeNotBound"
NOTHING_FOUND = "NothingFound"


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
    claim: str = ""  # the PersistentVolumeClaim holding the weights
    volume_bound: bool = True  # the claim is bound: its capacity, which bounds wanted_bytes, is known

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


def weights_claim(svc: VLLMService) -> str:
    """The PersistentVolumeClaim the weights are files of ("" where they are not on a volume)."""
    source = svc.spec.model.source.pvc
    if source is not None:
        return source.claim_name
    return model_pvc_name(svc.name) if svc.spec.cold_start.model_cache.enabled else ""


def claim_capacity(claim: Manifest | None) -> int | None:
    """A bound claim's status.capacity.storage in bytes (the volume's size, which the PV controller copies
    from the PersistentVolume), else None."""
    status = (claim or {}).get("status") or {}
    storage = (status.get("capacity") or {}).get("storage")
    if status.get("phase") != "Bound" or not storage:
        return None
    try:
        return int(parse_quantity(storage))
    except ValueError:
        return None


def wanted_bytes(svc: VLLMService, volume_bytes: int | None = None) -> int | None:
    """Bytes a warmer keeps per node: the checkpoint as the seed measured it, at most `volume_bytes` (the
    capacity of the volume it is on: no more of it can be read from there), plus the import pages where
    a seed records them (as it reported them, else an estimate); None before the seed has reported."""
    weights = checkpoint_bytes(svc)
    if weights is None:
        return None
    if volume_bytes is not None:
        weights = min(weights, volume_bytes)
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


def candidate(svc: VLLMService, volume_bytes: int | None = None) -> Candidate:
    """`svc` as the planner sees it; `volume_bytes`: the capacity of its weights' claim (claim_capacity)."""
    affinity = svc.spec.pod.affinity
    return Candidate(
        namespace=str(svc.namespace),
        name=svc.name,
        created=str(svc.metadata.get("creationTimestamp") or ""),
        on_volume=weights_from_volume(svc),
        wanted_bytes=wanted_bytes(svc, volume_bytes),
        memory_request=serving_memory_request(svc),
        node_selector=dict(svc.spec.runtime.node_selector),
        node_affinity=affinity.node_affinity if affinity is not None else None,
        tolerations=tuple(
            t.model_dump(by_alias=True, exclude_none=True) for t in svc.spec.runtime.tolerations
        ),
        claim=weights_claim(svc),
        volume_bound=volume_bytes is not None,
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
    candidates: Iterable[Candidate],
    nodes: Iterable[Node],
    budget: int,
    reserve: int,
    quotas: Mapping[str, int] | None = None,
) -> dict[tuple[str, str], Verdict]:
    """Every candidate's verdict. Services that cannot warm (no volume, no size yet, no node with room)
    take nothing. The others share the per-node `budget` fairly between namespaces: first each
    namespace's services, in creation order, while they fit its fair share (the budget split evenly
    between the namespaces that warm, or its quota where `quotas` sets a smaller one); then what is
    left, always to the namespace that holds least so far, never past a namespace's quota."""
    quotas = quotas or {}
    nodes = list(nodes)
    verdicts: dict[tuple[str, str], Verdict] = {}
    eligible: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.created, c.namespace, c.name)):
        refused = _refusal(c, nodes)
        if refused is not None:
            verdicts[c.key] = Verdict(c.wanted_bytes, budget, None, *refused)
        else:
            eligible.append(c)
    namespaces = {c.namespace for c in eligible}
    fair = budget // max(len(namespaces), 1)

    def quota(namespace: str) -> int:
        return min(quotas.get(namespace, budget), budget)

    used = dict.fromkeys(namespaces, 0)
    admitted: list[Candidate] = []

    def admit(c: Candidate, wanted: int) -> None:
        used[c.namespace] += wanted
        admitted.append(c)
        verdicts[c.key] = Verdict(wanted, budget, Warming(wanted, reserve))

    for c in eligible:
        wanted = c.wanted_bytes or 0
        if used[c.namespace] + wanted <= min(fair, quota(c.namespace)):
            admit(c, wanted)
    pending = [c for c in eligible if c.key not in verdicts]
    while pending:
        c = min(pending, key=lambda c: (used[c.namespace], c.created, c.namespace, c.name))
        pending.remove(c)
        wanted = c.wanted_bytes or 0
        left = budget - sum(used.values())
        if wanted <= left and used[c.namespace] + wanted <= quota(c.namespace):
            admit(c, wanted)
            continue
        # Services of other namespaces are counted, never named: a condition is read by this namespace's
        # users.
        here = [f"{a.namespace}/{a.name}" for a in admitted if a.namespace == c.namespace]
        named = f" ({', '.join(here[:5])})" if here else ""
        quoted = f", its quota {gib(quota(c.namespace))}" if c.namespace in quotas else ""
        verdicts[c.key] = Verdict(
            wanted,
            budget,
            None,
            OVER_BUDGET,
            f"Needs {gib(wanted)} ({wanted} bytes) per node; the node warming budget is {gib(budget)} per"
            f" node, shared by {len(namespaces)} namespaces: this one's fair share is {gib(fair)}{quoted};"
            f" {len(here)} warming services of this namespace take {gib(used[c.namespace])}{named} and"
            f" {gib(left)} is left; raise STOKER_NODE_WARMING_BUDGET_GIB or turn warming off elsewhere",
        )
    return verdicts


def _refusal(c: Candidate, nodes: list[Node]) -> tuple[str, str] | None:
    """Why `c` cannot warm whatever the budget (reason, message), or None."""
    if not c.on_volume:
        return (
            WEIGHTS_NOT_ON_VOLUME,
            "Node warming keeps files of a volume in the page cache: set model.source.pvc or"
            " coldStart.modelCache.enabled (weights read from an object store or the hub are not files)",
        )
    if c.wanted_bytes is None:
        return WAITING_FOR_SEED, "Waiting for the seed to report the checkpoint's size"
    if not c.volume_bound:
        return (
            VOLUME_NOT_BOUND,
            f"Waiting for the claim {c.claim} to be bound: the checkpoint kept warm is bounded by the"
            " capacity of its volume",
        )
    matching = [n for n in nodes if node_matches(n, c.node_selector, c.node_affinity, c.tolerations)]
    needed = c.wanted_bytes + c.memory_request
    if any(n.allocatable_memory >= needed for n in matching):
        return None
    if matching:
        largest = max(matching, key=lambda n: n.allocatable_memory)
        where = (
            f"the largest node the replicas can land on, {largest.name}, has"
            f" {gib(largest.allocatable_memory)} allocatable"
        )
    else:
        where = "no node matches the replicas' nodeSelector, required node affinity and tolerations"
    return (
        NODE_MEMORY_TOO_SMALL,
        f"Needs {gib(needed)} of a node's memory ({gib(c.wanted_bytes)} warm beside a serving pod's"
        f" {gib(c.memory_request)} request); {where}",
    )


@dataclass(frozen=True)
class Warmth:
    """Where a warming service's pages are resident: from its DaemonSet's status and its pods."""

    daemonset: str
    desired: int  # nodes the DaemonSet runs a warmer on
    warm: int  # of those, nodes whose warmer is Ready (everything wanted is resident)
    done: bool  # the DaemonSet's current template is Ready on every node it wants
    document: Manifest  # status.nodeWarming
    nothing_found: tuple[str, ...] = ()  # nodes whose warmer found no checkpoint data (and exited so)


def found_nothing(pod: Manifest) -> bool:
    """Whether the pod's warmer last ended with the agent's exit code for no checkpoint data."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if (state.get("terminated") or {}).get("exitCode") == NODE_WARMER_NOTHING_FOUND_EXIT:
                return True
    return False


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
    empty: set[str] = set()
    for pod in pods if verdict.warming is not None else []:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not pod["metadata"].get("deletionTimestamp"):
            ready = pod_is_ready(pod)
            per_node[node] = per_node.get(node, False) or ready
            if not ready and found_nothing(pod):
                empty.add(node)
    document: Manifest = {
        "budgetBytes": verdict.budget_bytes,
        "desiredNodes": desired,
        "warmNodes": warm,
        "nodes": [{"node": n, "warm": per_node[n]} for n in sorted(per_node)[:WARM_NODES_LISTED]],
    }
    if verdict.wanted_bytes is not None:
        document["wantedBytes"] = verdict.wanted_bytes
    name = ((warmer or {}).get("metadata") or {}).get("name", "")
    nothing_found = tuple(sorted(n for n in empty if not per_node[n]))
    return Warmth(name, desired, warm, done, document, nothing_found)
