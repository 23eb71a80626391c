"""Pure status arithmetic: the conditions a reconcile reports, each with a message a user can act on, and
metav1.Condition lists whose lastTransitionTime moves only on a flip."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from stoker.controller.diagnose import Problem
from stoker.controller.warming import NOTHING_FOUND, Verdict, Warmth, gib

CONDITION_TYPES = (
    "Ready",
    "Available",
    "CacheSeeded",
    "Progressing",
    "Degraded",
    "StartupRecorded",
    "NodeWarming",
    "Snapshots",
    "ScaleFromZero",
)
SCALE_FROM_ZERO = "ScaleFromZero"
# Conditions the scale-from-zero loop writes (controller/scalefromzero.py); a reconcile keeps them.
LOOP_CONDITIONS = (SCALE_FROM_ZERO,)


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Rollout:
    """The serving Deployment's (or LeaderWorkerSet's) progress, as counted for the conditions; a
    LeaderWorkerSet counts groups, each ready only when all of its pods are."""

    deployment: str
    desired: int  # serving replicas the spec asks for
    total: int  # pods the Deployment runs (serving plus standby), groups a LeaderWorkerSet runs
    updated: int
    ready: int
    serving: int  # ready pods behind the Service
    done: bool
    kind: str = "Deployment"


def ready_condition(gate_closed: bool, seed_job: str, serves_all: bool, rollout: Rollout) -> Condition:
    counts = f"{rollout.serving}/{rollout.desired} replicas ready"
    if serves_all and gate_closed:
        # The replicas of the previous key keep serving while the seed fills the cache for the new one.
        return Condition(
            "Ready", True, "ReplicasReady", f"{counts}; seed job {seed_job} runs, see Progressing"
        )
    if gate_closed:
        return Condition(
            "Ready", False, "WaitingForSeed", f"Serving replicas wait for seed job {seed_job}; {counts}"
        )
    if serves_all:
        return Condition("Ready", True, "ReplicasReady", counts)
    return Condition("Ready", False, "RollingOut", f"{counts}; see Progressing")


def available_condition(rollout: Rollout) -> Condition:
    """As a Deployment's: enough replicas serve, however far a rollout or a seed has come (the
    Deployment's default maxUnavailable, a quarter rounded down, may be missing)."""
    needed = rollout.desired - rollout.desired // 4
    counts = f"{rollout.serving}/{rollout.desired} replicas serve, {needed} needed"
    if rollout.serving >= needed:
        return Condition("Available", True, "MinimumReplicasAvailable", counts)
    return Condition("Available", False, "MinimumReplicasUnavailable", counts)


def recording_condition(recording: dict[str, Any] | None) -> Condition | None:
    """Whether this service's last start could be recorded (status.startup.recording, written by the
    startup recorder): a refused observation or store write, in the service it concerns."""
    if not recording:
        return None
    refused = recording.get("refused")
    if refused:
        return Condition("StartupRecorded", False, "RecordRefused", str(refused)[:1024])
    return Condition("StartupRecorded", True, "Recorded", "The last start was recorded")


def cache_seeded_condition(
    seeding: bool, seeded: bool, seed_outcome: str | None, seed_job: str, short_key: str
) -> Condition:
    if not seeding:
        return Condition(
            "CacheSeeded",
            False,
            "SeedDisabled",
            "No seed job (coldStart.seed.enabled): the first replica compiles",
        )
    if seeded:
        return Condition("CacheSeeded", True, "Seeded", f"Compile cache seeded for key {short_key}")
    if seed_outcome == "failed":
        return Condition(
            "CacheSeeded",
            False,
            "SeedFailed",
            f"Seed job {seed_job} failed (kubectl logs job/{seed_job}); replicas start cold",
        )
    return Condition(
        "CacheSeeded", False, "Seeding", f"Seed job {seed_job} is filling the cache for key {short_key}"
    )


def progressing_condition(
    gate_closed: bool, seed_job: str, rollout: Rollout, blocking: list[Problem] | None = None
) -> Condition:
    """`blocking`: what keeps the pods the rollout (or, gate closed, the seed) waits for from starting.
    Progressing=False with its reason at once, as a Deployment's ProgressDeadlineExceeded, so that a
    `kubectl wait --for=condition=Available` has a reason to look at."""
    if blocking and (gate_closed or not rollout.done):
        return Condition("Progressing", False, blocking[0].reason, _messages(blocking))
    if gate_closed:
        return Condition(
            "Progressing",
            True,
            "WaitingForSeed",
            f"{rollout.kind} {rollout.deployment} rolls out once seed job {seed_job} has filled"
            " the compile cache",
        )
    counts = f"{rollout.updated}/{rollout.total} pods updated, {rollout.ready}/{rollout.total} ready"
    if not rollout.done:
        return Condition(
            "Progressing",
            True,
            "RollingOut",
            f"{rollout.kind} {rollout.deployment} is rolling out: {counts}; pods that stay Pending or not"
            " Ready show why in kubectl describe",
        )
    return Condition(
        "Progressing", False, "Converged", f"{rollout.kind} {rollout.deployment} rolled out: {counts}"
    )


def degraded_condition(
    apply_errors: list[str],
    problems: list[Problem],
    standby_problem: str | None,
    cache_miss: str | None,
    seed_failed: bool,
) -> Condition:
    """The first fault, in the order a user must fix them; `cache_miss` is the detail of a start that
    compiled despite a seeded cache ("" when its log said no more). A problem counts once its grace is over
    (diagnose.UNSCHEDULABLE_GRACE_SECONDS)."""
    due = [problem for problem in problems if problem.degrades_in <= 0]
    if apply_errors:
        return Condition("Degraded", True, "ApplyFailed", "; ".join(apply_errors)[:1024])
    if due:
        return Condition("Degraded", True, due[0].reason, _messages(due))
    if standby_problem:
        return Condition("Degraded", True, "StandbyBackoff", standby_problem)
    if cache_miss is not None:
        return Condition(
            "Degraded",
            True,
            "CompileCacheMiss",
            f"A replica compiled despite a seeded cache{cache_miss}; something in vLLM's cache key differs"
            " between the seed and the pod (docs/operations/troubleshooting.md)",
        )
    if seed_failed:
        return Condition("Degraded", True, "SeedFailed", "The seed job failed; replicas start cold")
    if problems:
        waiting = problems[0]
        return Condition(
            "Degraded",
            False,
            "AsExpected",
            f"No fault yet: {waiting.subject} is {waiting.reason}, a fault once it stays so past its grace"
            " (docs/concepts/conditions.md); see Progressing",
        )
    return Condition(
        "Degraded", False, "AsExpected", "Children applied; no fault seen in pods, Jobs or volumes"
    )


def _messages(problems: list[Problem]) -> str:
    return "; ".join(p.message for p in problems)[:1024]


def snapshots_condition(left_out: str | None, asleep: bool) -> Condition:
    """Where an admin turned snapshot and restore on: whether this service's replicas are made for it
    (render.snapshot), and taken asleep or awake."""
    if left_out is not None:
        return Condition(
            "Snapshots",
            False,
            "NotEligible",
            f"Snapshot and restore is on in this cluster, but not for this service ({left_out}): its replicas"
            " start as usual",
        )
    if asleep:
        return Condition(
            "Snapshots",
            True,
            "Asleep",
            "Replicas are made for snapshots: on each node the first replica of a cache key is dumped asleep"
            " (no weights or KV cache in it), later ones are restored from it; status.startup.last.snapshot"
            " says which a start was",
        )
    return Condition(
        "Snapshots",
        True,
        "Awake",
        "Replicas are made for snapshots, dumped awake: a snapshot holds the engine's whole memory, a GPU"
        " engine's device memory included; for a GPU engine add --enable-sleep-mode to runtime.extraArgs",
    )


def node_warming_condition(verdict: Verdict, warmth: Warmth) -> Condition:
    """coldStart.nodeWarming: Warm once every node's warmer is Ready, else Warming, else why it is
    skipped (the planner's reason and message, controller/warming.py)."""
    if verdict.warming is None:
        return Condition("NodeWarming", False, verdict.reason, verdict.message)
    wanted = verdict.warming.wanted_bytes
    size = (
        f"{gib(wanted)} ({wanted} bytes) per node, within the per-node budget of {gib(verdict.budget_bytes)}"
    )
    if warmth.nothing_found:
        nodes = ", ".join(warmth.nothing_found[:5])
        return Condition(
            "NodeWarming",
            False,
            NOTHING_FOUND,
            f"The warmer found no checkpoint data to keep on {len(warmth.nothing_found)} of"
            f" {warmth.desired} nodes ({nodes}): no *.safetensors regular file under the model's path (a"
            " missing directory, or links, FIFOs or devices, which it does not read); its log says what it"
            f" skipped. Admitted for {size}",
        )
    if warmth.done:
        return Condition(
            "NodeWarming",
            True,
            "Warm",
            f"Resident on all {warmth.desired} nodes the replicas can land on: {size}",
        )
    return Condition(
        "NodeWarming",
        False,
        "Warming",
        f"{warmth.warm}/{warmth.desired} nodes warm (DaemonSet {warmth.daemonset or 'not created yet'}):"
        f" {size}",
    )


def scale_from_zero_condition(picker: str, refused: str | None, retry_seconds: float | None) -> Condition:
    """Whether the endpoint picker's queue could be read: a refusal names what and when it is read again."""
    if refused is None:
        return Condition(
            SCALE_FROM_ZERO, True, "EndpointPickerRead", f"The queue of endpoint picker {picker} is read"
        )
    return Condition(
        SCALE_FROM_ZERO,
        False,
        "EndpointPickerUnreadable",
        f"Endpoint picker {picker} not read: {refused}; not read again for {retry_seconds or 0:g} s,"
        " so a request waiting there does not scale this service from zero meanwhile"[:1024],
    )


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    previous: list[dict[str, Any]] | None,
    wanted: list[Condition],
    generation: int,
    now: str,
    kept: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The whole list, in a stable order; a condition keeps its transition time unless its status flips.
    The previous conditions of the types in `kept` (another writer's) stay as they are."""
    before = {c.get("type"): c for c in previous or []}
    merged = [c for c in previous or [] if c.get("type") in kept]
    for condition in sorted(wanted, key=lambda c: CONDITION_TYPES.index(c.type)):
        status = "True" if condition.status else "False"
        old = before.get(condition.type)
        since = old["lastTransitionTime"] if old and old.get("status") == status else now
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return sorted(merged, key=lambda c: CONDITION_TYPES.index(str(c["type"])))
