"""Decide: from one observed snapshot of a VLLMService and its children to what should be written.

Pure: no API calls, no clocks but the `now` in the snapshot. `decide_children` says which children to
create or apply (only those whose live object lacks something stoker renders, or whose spec carries
fields only others set), which to delete, what the cache status becomes and which Events to post;
`decide_status` turns the outcome of those writes into the status and its conditions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.controller.conditions import (
    LOOP_CONDITIONS,
    Condition,
    Rollout,
    available_condition,
    cache_seeded_condition,
    degraded_condition,
    merge_conditions,
    node_warming_condition,
    progressing_condition,
    ready_condition,
    recording_condition,
    snapshots_condition,
)
from stoker.controller.diagnose import STUCK_WAITING_REASONS, ObservedChildren, child_problems
from stoker.controller.objects import facts_json, job_outcome, parse_time, still_running
from stoker.controller.ownership import (
    SeededClaim,
    claim_signature,
    conflicts,
    covers,
    foreign_fields,
    made_before_owners_were_recorded,
    never_shrink,
    owned_by,
    owner_signature,
    proven_seed,
    seeded_annotations,
    stokers,
)
from stoker.controller.warming import Verdict, node_warmth
from stoker.predict.model import ModelFacts
from stoker.render import (
    CACHE_KEY_LABEL,
    CACHE_OWNER_ANNOTATION,
    CACHE_OWNER_SIGNATURE_ANNOTATION,
    CLAIM_SIGNATURE_ANNOTATION,
    INFERENCE_POOL_KIND,
    SEED_CLAIM_UID_ANNOTATION,
    cache_key,
    cache_pvc_name,
    deployment_name,
    node_warmer_name,
    pod_count,
    render_children,
    seed_job_name,
    seed_wanted,
    serving_selector,
    short_cache_key,
)
from stoker.render.children import SERVING_KINDS, serving_kind
from stoker.render.group import LWS_KIND
from stoker.render.peers import Peer
from stoker.render.snapshot import Snapshots, not_snapshotted, sleeps

Manifest = dict[str, Any]

# Degraded reasons that are faults of a child or of the cluster, each worth a Warning Event when it starts
# or changes (SeedFailed and CompileCacheMiss post their own).
FAULT_REASONS = frozenset(
    {
        "ApplyFailed",
        "VolumeProvisioningFailed",
        "PodCreationFailed",
        "Unschedulable",
        "OOMKilled",
        "ModelPathMissing",
        "StandbyBackoff",
        "InferencePoolCRDMissing",
        "LeaderWorkerSetCRDMissing",
    }
) | (STUCK_WAITING_REASONS)
# How long serving replicas wait for the learning path to record a finished seed's run (its facts).
SEED_RECORD_GRACE_SECONDS = 10.0
# How soon to look again at a LeaderWorkerSet that has not rolled out (it is not watched).
GROUP_RECHECK_SECONDS = 5.0
# How soon to look again while a superseded seed Job of a re-created claim is being deleted.
DELETION_RECHECK_SECONDS = 2.0


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Snapshot:
    """One VLLMService and what it owns, as observed (from the watch caches) at `now`."""

    body: Manifest
    svc: VLLMService
    # What stoker renders for it (render_children, the Deployment at its replicas), and each rendered
    # child's live object by (kind, name), None if absent; never the control Secret.
    rendered: list[Manifest]
    children: dict[tuple[str, str], Manifest | None]
    seed_jobs: list[Manifest]  # Jobs labelled as this service's seeds, any key
    pods: list[Manifest]  # serving pods its Deployment's ReplicaSets created
    seed_pods: list[Manifest]  # pods of its seed Jobs
    claim_events: dict[str, list[Manifest]]  # Pending claims' events, by claim uid
    job_events: list[Manifest]  # the running seed Job's events, when it has no pods
    control_token: str | None  # a standby service, or one snapshotted asleep (render.snapshot)
    signing_key: str | None  # the operator's key, which signs what it seeded
    field_manager: str
    programs_image: str  # the image the pods copy stoker's programs from
    now: str  # RFC 3339
    # spec.inferencePool set and the cluster does not serve InferencePools: the resource, as `plural.group/
    # version` (the pool is then neither read nor written).
    inference_pool_crd_missing: str | None = None
    # runtime.nodesPerReplica above 1 and the cluster does not serve LeaderWorkerSets: the resource, as
    # above (the group is neither read nor written).
    group_crd_missing: str | None = None
    snapshots: Snapshots | None = None  # the admin's snapshot settings, when snapshot and restore is on
    # spec.inferencePool unset but status names a pool: that pool as read, to delete if stoker's.
    stale_inference_pool: Manifest | None = None
    # coldStart.nodeWarming enabled: whether this service warms its nodes, or why not (controller/warming.py).
    warming: Verdict | None = None
    # The live node warmer DaemonSet, if the watch cache has one of this service (also when not rendered:
    # stoker deletes its own once warming is skipped or off), and its pods.
    node_warmer: Manifest | None = None
    warmer_pods: list[Manifest] = field(default_factory=list)
    # coldStart.peerWeights: the serving pods its EndpointSlices list (controller/peers.py), and every peer
    # child the watch cache has of this service (also when not rendered: stoker deletes its own).
    peer_sources: list[Peer] = field(default_factory=list)
    peer_objects: list[Manifest] = field(default_factory=list)


@dataclass(frozen=True)
class ChildWrite:
    """A child to create (`current` None) or apply; a seed Job learns its claim's uid when written."""

    desired: Manifest
    current: Manifest | None
    release_owner: bool = False  # switched to Retain: remove the owner reference stoker created it with


@dataclass
class ChildrenPlan:
    key: str
    short_key: str
    seed_name: str
    seeding: bool
    seeded: bool
    gate_closed: bool
    seed_job: Manifest | None
    seed_outcome: str | None
    cache: Manifest
    claim_name: str
    blocked: str | None = None  # why nothing is written: objects in the way
    writes: list[ChildWrite] = field(default_factory=list)
    deletions: list[Manifest] = field(default_factory=list)  # live objects to delete (uid precondition)
    events: list[Event] = field(default_factory=list)
    # What the cache claim proves, or this pass's successful seed Job says, was seeded for the key.
    seeded_record: SeededClaim | None = None
    recheck_after: float | None = None


def decide_children(snap: Snapshot) -> ChildrenPlan:
    svc, meta = snap.svc, snap.body["metadata"]
    status, uid = snap.body.get("status") or {}, meta["uid"]
    key, short_key = cache_key(svc), short_cache_key(svc)
    # Status is output only: what was seeded is what the operator signed on the claim, or what its own
    # seed Job says now; status.cache as read serves to tell what changed (Events), never to decide.
    previous = status.get("cache") or {}
    compile_cache = svc.spec.cold_start.compile_cache
    claim_name = cache_pvc_name(svc.name)
    claim = snap.children.get(("PersistentVolumeClaim", claim_name)) if compile_cache.enabled else None
    # Asked for in the spec (admitted only from an author who may `use` the claim), or this service's own
    # claim from before owners were recorded.
    reuse_retained = compile_cache.reuse_retained or made_before_owners_were_recorded(
        claim, snap.body, snap.signing_key
    )
    claim_is_ours = claim is not None and stokers(
        "PersistentVolumeClaim", claim, uid, svc.name, snap.signing_key, reuse_retained
    )
    claim_uid = claim["metadata"]["uid"] if claim is not None and claim_is_ours else None
    seeding = seed_wanted(svc)
    events: list[Event] = []
    proven = proven_seed(claim, snap.signing_key, uid) if claim_is_ours else None
    seeded_record = proven if seeding and proven is not None and proven.key == key else None
    if seeded_record is not None and previous.get("seededKey") != key:
        # A kept cache (this VLLMService's before an edit and back, or one it took over and reseeded) that
        # the operator's signature proves it seeded for this key: no seed Job.
        events.append(Event("CacheReused", f"PVC {claim_name} holds the compile cache for key {short_key}"))

    seed_name = seed_job_name(svc.name, short_key)
    seed_recorded = ((status.get("startup") or {}).get("seed") or {}).get("cacheKey") == short_key
    # Once seeded and its run recorded, the Job has nothing more to tell.
    seed_needed = seeding and not (seeded_record is not None and seed_recorded)
    seed_job = next((j for j in snap.seed_jobs if j["metadata"]["name"] == seed_name), None)
    in_the_way = conflicts(
        uid, svc.name, [("Job", seed_job)] if seed_job is not None else [], snap.signing_key
    )
    deletions: list[Manifest] = []
    seed_job_leaving = False
    # The claim a seed Job filled (none on the first one, created with its claim): its success counts only
    # for that claim, and only while the claim is there.
    filled = ((seed_job or {}).get("metadata", {}).get("annotations") or {}).get(SEED_CLAIM_UID_ANNOTATION)
    if seed_job is not None and not in_the_way and seeded_record is None:
        if filled and claim_uid and filled != claim_uid:
            # It filled a claim that is gone: run it again for the new one, once this one is deleted.
            deletions.append(seed_job)
            seed_job_leaving = True
        replaced = claim_uid is not None and previous.get("claimUid") not in (None, claim_uid)
        if seed_job_leaving or replaced:
            events.append(
                Event("CacheClaimReplaced", f"PVC {claim_name} was re-created empty; seeding it again", True)
            )
    if not seed_needed or in_the_way or seed_job_leaving:
        seed_job = None  # a Job stoker did not create tells nothing about the cache
    seed_outcome = job_outcome(seed_job)
    facts = _facts_of_key(status, short_key)  # the operator's own (Reconciler.trusted_body), not a tenant's
    fills_this_claim = claim_uid is not None and filled in (None, claim_uid)
    if seed_outcome == "succeeded" and seeded_record is None and fills_this_claim:
        at = (seed_job or {}).get("status", {}).get("completionTime") or snap.now
        seeded_record = SeededClaim(key, at, facts)
        if previous.get("seededKey") != key:
            events.append(Event("CacheSeeded", f"Seed job {seed_name} filled the compile cache"))
    if seeded_record is not None and facts is not None:
        seeded_record = replace(seeded_record, facts=facts)
    seeded = seeded_record is not None
    cache: Manifest = {}
    if seeded_record is not None:
        cache = {"seededKey": key, "seededAt": seeded_record.at}
        if claim_uid is not None:
            cache["claimUid"] = claim_uid
    # The serving pods' memory request counts the checkpoint the seed measured (render/memory.py): the
    # replicas wait for its run to be recorded, a second after the Job as a rule, so that they do not roll
    # again when it is; SEED_RECORD_GRACE_SECONDS at most, for a log that cannot be read.
    record_wait = (
        _seconds_left(cache.get("seededAt"), snap.now, SEED_RECORD_GRACE_SECONDS)
        if seeded and seed_outcome == "succeeded" and not seed_recorded
        else 0.0
    )
    gate_closed = (
        seeding
        and svc.spec.cold_start.seed.gate_rollout
        and (not seeded or record_wait > 0)
        and seed_outcome != "failed"
    )
    plan = ChildrenPlan(
        key=key,
        short_key=short_key,
        seed_name=seed_name,
        seeding=seeding,
        seeded=seeded,
        gate_closed=gate_closed,
        seed_job=seed_job,
        seed_outcome=seed_outcome,
        cache=cache,
        claim_name=claim_name,
        events=events,
        deletions=deletions,
        seeded_record=seeded_record,
        recheck_after=DELETION_RECHECK_SECONDS if seed_job_leaving else record_wait or None,
    )
    rendered = (
        render_children(
            svc,
            serving_replicas=0,
            control_token=snap.control_token,
            programs_image=snap.programs_image,
            warming=snap.warming.warming if snap.warming is not None else None,
            peer_sources=snap.peer_sources,
            snapshots=snap.snapshots,
        )
        if gate_closed
        else snap.rendered
    )
    if snap.inference_pool_crd_missing is not None:
        rendered = [child for child in rendered if child["kind"] != INFERENCE_POOL_KIND]
    if snap.group_crd_missing is not None:
        rendered = [child for child in rendered if child["kind"] != LWS_KIND]
    in_the_way += conflicts(
        uid,
        svc.name,
        [(kind, obj) for (kind, _), obj in snap.children.items() if obj is not None],
        snap.signing_key,
        reuse_retained,
    )
    if in_the_way:
        # Nothing is applied, patched or deleted while anything is in the way: the serving pods do not
        # roll out without their cache volume, and the user's object stays as it is.
        plan.blocked = "; ".join(conflict.message for conflict in in_the_way)
        plan.deletions, plan.events = [], []
        return plan

    workload = serving_kind(svc)
    deployment = snap.children.get((workload, deployment_name(svc.name)))
    retain = compile_cache.retention_policy == "Retain" and snap.signing_key is not None
    for child in map(copy.deepcopy, rendered):  # annotated and owned below: the snapshot stays as it was
        kind, name = child["kind"], child["metadata"]["name"]
        # A Job's pod template is immutable and its name carries the key: create it once, never update.
        if kind == "Job" and (seed_job is not None or seeded or seed_job_leaving):
            continue
        # While the seed for a new key runs, what serves now keeps serving unchanged.
        if kind == workload and gate_closed and deployment is not None:
            continue
        current = snap.children.get((kind, name))
        if kind == "PersistentVolumeClaim" and current is not None:
            child = never_shrink(child, current)
        if kind == "Job" and claim_uid is not None:
            child["metadata"].setdefault("annotations", {})[SEED_CLAIM_UID_ANNOTATION] = claim_uid
        is_cache_claim = kind == "PersistentVolumeClaim" and name == claim_name
        # Kept on delete (and a key to sign with): the claim lets go of its owner reference once signed,
        # so that a later VLLMService of this name can prove the claim is stoker's.
        retained = is_cache_claim and retain and current is not None
        if kind == "PersistentVolumeClaim" and current is not None and snap.signing_key is not None:
            # Signed when created (act.py); applied with the rest so that the apply owns it too.
            annotations = child["metadata"].setdefault("annotations", {})
            annotations[CLAIM_SIGNATURE_ANNOTATION] = claim_signature(snap.signing_key, current)
            if is_cache_claim:
                # Whose it is (a claim taken over with reuseRetained changes owner here), and what was
                # seeded into it for that owner.
                annotations[CACHE_OWNER_ANNOTATION] = uid
                signature = owner_signature(snap.signing_key, current, uid)
                annotations[CACHE_OWNER_SIGNATURE_ANNOTATION] = signature
                if seeded_record is not None:
                    annotations.update(seeded_annotations(snap.signing_key, current, uid, seeded_record))
        release_owner = retained and current is not None and owned_by(current, uid)
        if not retained:
            # A cache claim to keep is created with an owner reference too, and lets go of it next pass.
            kopf.append_owner_reference(child, owner=kopf.Body(snap.body))  # type: ignore[arg-type]
        if is_cache_claim and current is None and retain:
            plan.recheck_after = 0.0  # let go of it as soon as it exists
        if (
            kind != "Secret"
            and current is not None
            and not release_owner
            and _as_rendered(snap, child, current)
        ):
            continue
        plan.writes.append(ChildWrite(child, current, release_owner))
    stale_pool = snap.stale_inference_pool
    if stale_pool is not None and owned_by(stale_pool, uid):  # spec.inferencePool was unset
        plan.deletions.append(stale_pool)
    wanted = {(c["kind"], c["metadata"]["name"]) for c in rendered}
    # Warming skipped or turned off; peer weights turned off, or fewer ranks.
    plan.deletions += [
        obj
        for obj in [snap.node_warmer, *snap.peer_objects]
        if obj is not None and owned_by(obj, uid) and (obj["kind"], obj["metadata"]["name"]) not in wanted
    ]
    plan.deletions += [
        job
        for job in snap.seed_jobs
        if owned_by(job, uid) and (job["metadata"].get("labels") or {}).get(CACHE_KEY_LABEL) != short_key
    ]
    return plan


def _seconds_left(since: str | None, now: str, grace: float) -> float:
    """Seconds until `grace` seconds have passed since the RFC 3339 time `since` (0 if unknown)."""
    started, current = parse_time(since), parse_time(now)
    if started is None or current is None:
        return 0.0
    return max(0.0, grace - (current - started).total_seconds())


def first_reaction(plan: ChildrenPlan) -> ChildrenPlan | None:
    """A new service's first pass cut to its Deployment, for when other new services wait: the Deployment
    is what users watch first, and while the seed gate is closed it runs nothing (no replicas), so it needs
    no volume or seed yet. The next pass, after the others' first ones, creates the rest. None when the
    plan is not a new service's (anything to apply, or the gate open)."""
    creates = [write for write in plan.writes if write.current is None]
    deployment = next((write for write in creates if write.desired["kind"] in SERVING_KINDS), None)
    if deployment is None or not plan.gate_closed or len(creates) != len(plan.writes) or len(creates) < 2:
        return None
    return replace(plan, writes=[deployment], recheck_after=0.0)


def _as_rendered(snap: Snapshot, desired: Manifest, live: Manifest) -> bool:
    """Whether the live child has everything stoker renders, and nothing in its spec that only others
    set: every kind compared whole, as the pod template is. An EndpointSlice's endpoints are compared
    whole too (the API server returns an empty list as none)."""
    if desired["kind"] == "EndpointSlice":
        live = {**live, "endpoints": live.get("endpoints") or []}
    return covers(live, desired) and not foreign_fields(desired["kind"], live, snap.field_manager)


def _facts_of_key(status: Manifest, short_key: str) -> str | None:
    """The model facts in status, as JSON, if a seed run of this key printed them."""
    startup = status.get("startup") or {}
    if startup.get("modelCacheKey") != short_key or not startup.get("model"):
        return None
    return facts_json(startup["model"])


@dataclass(frozen=True)
class Outcome:
    """What acting on a ChildrenPlan did: every child as written, or as observed if not written; the
    refused writes."""

    children: dict[tuple[str, str], Manifest | None]
    apply_errors: list[str]


@dataclass(frozen=True)
class StandbyView:
    """The standby pool's counts for the status (controller.standby.StandbyOutcome)."""

    active: int
    asleep: int
    problem: str | None
    document: Manifest


@dataclass
class StatusPlan:
    status: Manifest
    events: list[Event]
    result: str  # for metrics: converged or waiting
    recheck_after: float | None = None  # seconds until a problem seen counts as Degraded


def decide_status(
    snap: Snapshot, plan: ChildrenPlan, outcome: Outcome, standby: StandbyView | None
) -> StatusPlan:
    svc, meta = snap.svc, snap.body["metadata"]
    status = snap.body.get("status") or {}
    generation = int(meta.get("generation") or 0)
    startup = status.get("startup") or {}
    last = startup.get("last") or {}
    if last and not still_running(last, snap.pods):
        last = {}  # its ReplicaSet was replaced (an edit) or scaled away; the recorder drops it too
    cache = dict(plan.cache, key=plan.key)
    cache.pop("lastHit", None)
    if last:
        cache["lastHit"] = last.get("compileCache") == "hit"
    cache_missed = (
        plan.seeded and last.get("cacheKey") == plan.short_key and last.get("compileCache") == "miss"
    )
    workload = serving_kind(svc)
    deployment = outcome.children.get((workload, deployment_name(svc.name)))
    observed = ObservedChildren(
        claims=[o for (kind, _), o in outcome.children.items() if kind == "PersistentVolumeClaim" and o],
        claim_events=snap.claim_events,
        deployment=deployment if workload == "Deployment" else None,
        job=plan.seed_job,
        job_events=snap.job_events,
        pods=snap.pods,
        seed_pods=snap.seed_pods,
    )
    problems = child_problems(observed, parse_time(snap.now))
    # What the gate waits for is the seed; once open, the replicas.
    blocking = [p for p in problems if plan.gate_closed or not p.of_seed]

    desired = svc.spec.runtime.replicas
    total = pod_count(svc)
    dep_status = (deployment or {}).get("status") or {}
    ready_replicas = int(dep_status.get("readyReplicas") or 0)
    updated_replicas = int(dep_status.get("updatedReplicas") or 0)
    updated = deployment is not None and current_generation_observed(deployment) and updated_replicas >= total
    rolled_out = updated and ready_replicas >= total and int(dep_status.get("replicas") or 0) == total
    serving, serves_all = ready_replicas, rolled_out
    if standby is not None:
        # Ready means the active pods serve; a standby pod still starting or falling asleep is progress.
        serving, serves_all = standby.active, updated and standby.active >= desired
        rolled_out = rolled_out and standby.asleep >= total - desired
    miss = _miss_detail(last) if cache_missed else None
    degraded = degraded_condition(
        outcome.apply_errors,
        problems,
        standby.problem if standby is not None else None,
        miss,
        plan.seed_outcome == "failed",
    )
    if snap.inference_pool_crd_missing is not None and not degraded.status:
        degraded = inference_pool_crd_missing_condition(snap.inference_pool_crd_missing)
    if snap.group_crd_missing is not None:
        degraded = group_crd_missing_condition(snap.group_crd_missing)
    rollout = Rollout(
        deployment_name(svc.name),
        desired,
        total,
        updated_replicas,
        ready_replicas,
        serving,
        rolled_out,
        workload,
    )
    conditions = [
        ready_condition(plan.gate_closed, plan.seed_name, serves_all, rollout),
        available_condition(rollout),
        cache_seeded_condition(plan.seeding, plan.seeded, plan.seed_outcome, plan.seed_name, plan.short_key),
        progressing_condition(plan.gate_closed, plan.seed_name, rollout, blocking),
        degraded,
    ]
    recording = recording_condition(startup.get("recording"))
    if recording is not None:
        conditions.append(recording)
    warmth = None
    if snap.warming is not None:
        warmer = outcome.children.get(("DaemonSet", node_warmer_name(svc.name)))
        warmth = node_warmth(snap.warming, warmer, snap.warmer_pods)
        conditions.append(node_warming_condition(snap.warming, warmth))
    if snap.snapshots is not None:
        conditions.append(snapshots_condition(not_snapshotted(svc), sleeps(svc)))
    events: list[Event] = []  # plan.events are the children's, posted when they were written
    if plan.seed_outcome == "failed" and _reason(status, "CacheSeeded") != "SeedFailed":
        events.append(Event("SeedFailed", f"Seed job {plan.seed_name} failed; replicas start cold", True))
    if cache_missed and _reason(status, "Degraded") != "CompileCacheMiss":
        events.append(
            Event("CompileCacheMiss", f"Pod {last.get('pod')} compiled despite a seeded cache{miss}", True)
        )
    if degraded.reason in FAULT_REASONS and _changed(status, degraded):
        events.append(Event(degraded.reason, degraded.message, True))
    new_status: Manifest = {
        **status,
        "observedGeneration": generation,
        "conditions": merge_conditions(
            status.get("conditions"), conditions, generation, snap.now, loop_conditions(snap.body)
        ),
        "replicas": int(dep_status.get("replicas") or 0) if standby is None else standby.active,
        "readyReplicas": serving,
        "ready": f"{serving}/{desired}",
        "selector": serving_selector(svc),
        "cache": cache,
    }
    pool = outcome.children.get((INFERENCE_POOL_KIND, svc.name)) if svc.spec.inference_pool else None
    new_status.pop("inferencePool", None)
    if pool is not None:
        new_status["inferencePool"] = pool["metadata"]["name"]
    if standby is not None:
        new_status["standbyReplicas"] = standby.asleep
        new_status["standby"] = _standby_document(standby, status)
    new_status.pop("nodeWarming", None)
    if warmth is not None:
        new_status["nodeWarming"] = warmth.document
    graces = [p.degrades_in for p in problems if p.degrades_in > 0]
    if workload == LWS_KIND and deployment is not None and not rolled_out:
        # LeaderWorkerSets are read, not watched (observe.py): a pod turning Ready brings a pass, and the
        # group's status may count it a moment later.
        graces.append(GROUP_RECHECK_SECONDS)
    return StatusPlan(
        new_status, events, "waiting" if plan.gate_closed else "converged", min(graces, default=None)
    )


def current_generation_observed(workload: Manifest) -> bool:
    """Whether the workload's controller has acted on its current spec: a Deployment says so in
    status.observedGeneration; a LeaderWorkerSet has none, and says UpdateInProgress while it rolls."""
    status = workload.get("status") or {}
    if workload["kind"] == LWS_KIND:
        return not any(
            c.get("type") == "UpdateInProgress" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    return int(status.get("observedGeneration") or 0) >= int(workload["metadata"].get("generation") or 0)


def group_crd_missing_condition(resource: str) -> Condition:
    """Degraded: a multi-node service has nothing to run its groups with."""
    return Condition(
        "Degraded",
        True,
        "LeaderWorkerSetCRDMissing",
        f"runtime.nodesPerReplica is above 1 but the cluster does not serve {resource}: install"
        " LeaderWorkerSet (https://github.com/kubernetes-sigs/lws, v0.9.0 or later) and its controller;"
        " no replica runs until then",
    )


def inference_pool_crd_missing_condition(resource: str) -> Condition:
    """Degraded, naming the resource the cluster lacks and how to install it; the rest is served."""
    return Condition(
        "Degraded",
        True,
        "InferencePoolCRDMissing",
        f"spec.inferencePool is set but the cluster does not serve {resource}: install the InferencePool"
        " CRD of the Gateway API Inference Extension (kubectl apply -f https://github.com/kubernetes-sigs/"
        "gateway-api-inference-extension/releases/download/v1.5.0/manifests.yaml); the pods and Service"
        " are served meanwhile, the pool is created once the CRD is there",
    )


def blocked_status(body: Manifest, reason: str, message: str, now: str) -> StatusPlan:
    """What stops the object (an invalid spec, an object in the way), and nothing else; a Warning Event
    when it first happens or changes, not on every retry."""
    status = body.get("status") or {}
    generation = int(body["metadata"].get("generation") or 0)
    conditions = [
        Condition("Ready", False, reason, message),
        Condition("Available", False, reason, message),
        Condition("Progressing", False, reason, message),
        Condition("Degraded", True, reason, message),
    ]
    events = []
    if _changed(status, conditions[-1]) or status.get("observedGeneration") != generation:
        events.append(Event(reason, message, True))
    new_status = dict(status, observedGeneration=generation)
    new_status["conditions"] = merge_conditions(
        status.get("conditions"), conditions, generation, now, loop_conditions(body)
    )
    return StatusPlan(new_status, events, "invalid" if reason == "InvalidSpec" else "conflict")


def loop_conditions(body: Manifest) -> tuple[str, ...]:
    """The conditions another writer keeps on this VLLMService: the scale-from-zero loop's while the spec
    asks for scale from zero (dropped with it)."""
    pool = (body.get("spec") or {}).get("inferencePool")
    return LOOP_CONDITIONS if isinstance(pool, dict) and pool.get("scaleFromZero") is not None else ()


def trusted_body(
    body: Manifest,
    svc: VLLMService,
    claim: Manifest | None,
    signing_key: str | None,
    recorded_facts: str | None,
) -> Manifest:
    """`body` with status.startup.model and modelCacheKey as the operator itself knows them for the current
    cache key: the facts it signed on the compile-cache claim with this service's seed, else those its
    startup recorder read from this service's seed log (`recorded_facts`, JSON), else none. What a tenant
    with /status rights wrote there is never read, and the status written from this body restores it."""
    short_key = short_cache_key(svc)
    proven = proven_seed(claim, signing_key, body["metadata"]["uid"])
    facts = proven.facts if proven is not None and proven.key == cache_key(svc) and proven.facts else None
    model = _valid_model(facts or recorded_facts)
    status = dict(body.get("status") or {})
    startup = {name: value for name, value in (status.get("startup") or {}).items() if name not in _FACTS}
    if model is not None:
        startup.update(model=model, modelCacheKey=short_key)
    if startup:
        status["startup"] = startup
    else:
        status.pop("startup", None)
    return {**body, "status": status}


_FACTS = ("model", "modelCacheKey")


def _valid_model(facts: str | None) -> Manifest | None:
    """Facts as JSON (a claim's annotation, the recorder's), if they are valid model facts."""
    if not facts:
        return None
    try:
        return ModelFacts.model_validate_json(facts).model_dump(mode="json", by_alias=True)
    except ValidationError:
        return None


def _changed(status: Manifest, condition: Condition) -> bool:
    """Whether a condition differs from the one in the status in reason or message: an Event's worth."""
    before: Manifest = next(
        (c for c in status.get("conditions") or [] if c.get("type") == condition.type), {}
    )
    return (before.get("reason"), before.get("message")) != (condition.reason, condition.message)


def _reason(status: Manifest, kind: str) -> str | None:
    return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == kind), None)


def _standby_document(standby: StandbyView, status: Manifest) -> Manifest:
    """The pods' roles now, and the last wake of this or an earlier reconcile."""
    document = dict(standby.document)
    previous_wake = (status.get("standby") or {}).get("lastWake")
    if "lastWake" not in document and previous_wake:
        document["lastWake"] = previous_wake
    return document


def _miss_detail(record: Manifest) -> str:
    """Why a start missed the compile cache, when its log said."""
    if record.get("compileCacheReason") == "loadFailed":
        return " (loadFailed: the kept cache was there but failed to load)"
    return ""
