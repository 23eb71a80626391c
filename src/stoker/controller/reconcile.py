"""One idempotent reconcile per VLLMService: apply its children, observe them, write its status.

Every trigger (create, update, resume, the drift timer, a child's change) runs the same function,
which reads the object fresh from the API server, so no decision depends on what triggered it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
import time
from typing import cast

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from stoker.api import GROUP, VLLMService, VLLMServiceStatus
from stoker.controller import metrics
from stoker.controller.conditions import (
    Condition,
    Rollout,
    cache_seeded_condition,
    degraded_condition,
    merge_conditions,
    now_rfc3339,
    progressing_condition,
    ready_condition,
)
from stoker.controller.diagnose import (
    STUCK_WAITING_REASONS,
    ObservedChildren,
    child_problems,
    worth_a_closer_look,
)
from stoker.controller.kube import Kube, Manifest
from stoker.controller.objects import job_outcome, merge_patch, still_running
from stoker.controller.ownership import (
    ChildConflict,
    conflicts,
    created_by_deployment,
    foreign_template_items,
    never_shrink,
    owned_by,
    release,
    stokers,
)
from stoker.controller.settings import OperatorSettings
from stoker.controller.standby import StandbyOutcome, StandbyPool
from stoker.controller.startups import StartupRecorder
from stoker.controller.workqueue import GONE, Gone, ObjectKey
from stoker.render import (
    CACHE_KEY_LABEL,
    COMPONENT_LABEL,
    COMPONENT_SEED,
    INSTANCE_LABEL,
    MODEL_FACTS_ANNOTATION,
    SEEDED_KEY_ANNOTATION,
    cache_key,
    cache_pvc_name,
    deployment_name,
    pod_count,
    render_children,
    seed_job_name,
    seed_wanted,
    server_selector,
    serving_selector,
    short_cache_key,
)

log = logging.getLogger(__name__)


# Degraded reasons that are faults of a child or of the cluster, each worth a Warning Event when it starts
# or changes (SeedFailed and CompileCacheMiss post their own).
FAULT_REASONS = frozenset(
    {"ApplyFailed", "VolumeProvisioningFailed", "PodCreationFailed", "StandbyBackoff"}
) | (STUCK_WAITING_REASONS)
# Annotations kopf kept on each object for the create/update/resume handlers of earlier versions.
KOPF_ANNOTATIONS = (f"{GROUP}/last-handled-configuration", f"{GROUP}/reconcile", f"{GROUP}/drift")


def validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"


class Reconciler:
    """Reconciles one object at a time per key; the work queue guarantees no two runs of one key overlap."""

    def __init__(self, kube: Kube, settings: OperatorSettings, startups: StartupRecorder) -> None:
        self.kube = kube
        self.settings = settings
        self.startups = startups
        # Digest of each child as this process last applied it, per object: an unchanged child is not
        # sent again until the next resync, which re-applies everything and so undoes hand edits.
        self._applied: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
        self._applied_guard = threading.Lock()
        self.standby = StandbyPool(kube, settings)

    def reconcile(self, key: ObjectKey, resync: bool) -> float | Gone | None:
        """Converge one object; returns seconds after which to look again, if time alone changes things,
        or GONE once the object no longer exists."""
        namespace, name = key
        body = self.kube.get_service(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            with self._applied_guard:
                self._applied.pop((namespace, name), None)
            self.standby.forget(key)
            metrics.forget_service(namespace, name)
            return GONE
        self._forget_kopf_state(body)
        with self._applied_guard:
            applied = self._applied.setdefault((namespace, name), {})
        started, result = time.monotonic(), "error"
        try:
            result, recheck_after = self._reconcile(body, applied, resync)
        finally:
            metrics.RECONCILES.labels(result).inc()
            metrics.RECONCILE_SECONDS.labels(result).observe(time.monotonic() - started)
        return recheck_after

    def _reconcile(
        self, body: Manifest, applied: dict[tuple[str, str], str], resync: bool
    ) -> tuple[str, float | None]:
        """Converge one object; returns the result for metrics (converged, waiting, conflict or invalid)
        and when to look again."""
        meta, status = body["metadata"], body.get("status") or {}
        namespace, uid = meta["namespace"], meta["uid"]
        generation = int(meta.get("generation") or 0)
        try:
            svc = VLLMService.model_validate(body)
        except ValidationError as error:
            # Reported in status and as an Event; a retry changes nothing until the spec does.
            self._block(body, "InvalidSpec", validation_message(error))
            return "invalid", None

        # Observe: the children as they are. Only what carries this object's owner reference is stoker's,
        # and a compile-cache claim kept for this name (ownership.retained_cache_of).
        key, short_key = cache_key(svc), short_cache_key(svc)
        cache = dict(status.get("cache") or {})
        compile_cache = svc.spec.cold_start.compile_cache
        claim_name = cache_pvc_name(svc.name)
        claim = (
            self.kube.get("v1", "PersistentVolumeClaim", namespace, claim_name)
            if compile_cache.enabled
            else None
        )
        claim_annotations = (
            (claim["metadata"].get("annotations") or {})
            if claim is not None and stokers("PersistentVolumeClaim", claim, uid, svc.name)
            else {}
        )
        claim_seeded_key = claim_annotations.get(SEEDED_KEY_ANNOTATION)
        seeding = seed_wanted(svc)
        if seeding and claim_seeded_key == key and cache.get("seededKey") != key:
            # A kept cache (an earlier VLLMService of this name, or this one before an edit and back)
            # already holds this key's artifacts: no seed Job; the startup recorder takes the model facts
            # its seed printed from the claim.
            cache["seededKey"], cache["seededAt"] = key, now_rfc3339()
            self.kube.post_event(
                body,
                "CacheReused",
                f"PVC {claim_name} holds the compile cache for key {short_key}; no seed job",
            )
        seed_name = seed_job_name(svc.name, short_key)
        seed_recorded = ((status.get("startup") or {}).get("seed") or {}).get("cacheKey") == short_key
        # Once seeded and its run recorded, the Job has nothing more to tell.
        seed_needed = seeding and not (cache.get("seededKey") == key and seed_recorded)
        seed_job = self.kube.get("batch/v1", "Job", namespace, seed_name) if seed_needed else None
        in_the_way = conflicts(uid, svc.name, [("Job", seed_job)] if seed_job is not None else [])
        if in_the_way:
            seed_job = None  # a Job stoker did not create tells nothing about the cache
        seed_outcome = job_outcome(seed_job)
        if seed_outcome == "succeeded" and cache.get("seededKey") != key:
            cache["seededKey"] = key
            cache["seededAt"] = (seed_job or {}).get("status", {}).get("completionTime") or now_rfc3339()
            self.kube.post_event(body, "CacheSeeded", f"Seed job {seed_name} filled the compile cache")
        seeded = seeding and cache.get("seededKey") == key
        gate_closed = (
            seeding and svc.spec.cold_start.seed.gate_rollout and not seeded and seed_outcome != "failed"
        )
        token = self.standby.control_token(body) if svc.spec.cold_start.standby else None
        children = render_children(svc, serving_replicas=0 if gate_closed else None, control_token=token)
        live = self._read_children(namespace, children, {("PersistentVolumeClaim", claim_name): claim})
        in_the_way += conflicts(
            uid, svc.name, [(kind, obj) for (kind, _), obj in live.items() if obj is not None]
        )
        if in_the_way:
            # Nothing is applied, patched or deleted while anything is in the way: the serving pods do
            # not roll out without their cache volume, and the user's object stays as it is.
            self._block(body, "ChildConflict", "; ".join(conflict.message for conflict in in_the_way))
            return "conflict", None
        deployment = live.get(("Deployment", deployment_name(svc.name)))
        pods = [
            pod
            for pod in self.kube.list_objects("v1", "Pod", namespace, server_selector(svc.name))
            if deployment is not None and created_by_deployment(pod, deployment_name(svc.name))
        ]
        # Before the children: a scale-up wakes a standby before the Deployment starts its replacement.
        standby = self.standby.reconcile(body, svc, pods, token, resync) if token is not None else None

        # Act: create what is missing, apply what is stoker's.
        apply_errors = []
        for child in children:
            kind, child_name = child["kind"], child["metadata"]["name"]
            # A Job's pod template is immutable and its name carries the key: create it once, never update.
            if kind == "Job" and (seed_job is not None or seeded):
                continue
            # While the seed for a new key runs, what serves now keeps serving unchanged.
            if kind == "Deployment" and gate_closed and deployment is not None:
                continue
            current = live.get((kind, child_name))
            if kind == "PersistentVolumeClaim" and current is not None:
                child = never_shrink(child, current)
            is_cache_claim = kind == "PersistentVolumeClaim" and child_name == claim_name
            if is_cache_claim and seeded:
                child["metadata"]["annotations"][SEEDED_KEY_ANNOTATION] = key
                # A reused claim's facts stay on it until the startup recorder has them in status.
                facts = _facts_of_key(status, short_key) or (
                    claim_annotations.get(MODEL_FACTS_ANNOTATION) if claim_seeded_key == key else None
                )
                if facts is not None:
                    child["metadata"]["annotations"][MODEL_FACTS_ANNOTATION] = facts
            retained = is_cache_claim and compile_cache.retention_policy == "Retain"
            if not retained:
                kopf.append_owner_reference(child, owner=kopf.Body(cast(kopf.RawBody, body)))
            child_id = (kind, child_name)
            digest = hashlib.sha256(json.dumps(child, sort_keys=True).encode()).hexdigest()
            if not resync and applied.get(child_id) == digest:
                continue
            try:
                written = self._write_child(child, current, uid)
            except ApiException as error:
                if error.status == 409:
                    raise  # created or replaced meanwhile: the next run reads it
                apply_errors.append(f"{kind} {namespace}/{child_name}: {api_error_message(error)}")
                continue
            if written is None:  # a Secret of that name that is not stoker's
                conflict = ChildConflict(kind, namespace, child_name)
                self._block(body, "ChildConflict", conflict.message)
                return "conflict", None
            if retained and owned_by(written, uid):
                # Switched to Retain: apply leaves the reference stoker created the claim with.
                self.kube.patch_json("v1", kind, namespace, child_name, release(written, uid))
            applied[child_id] = digest
            live[child_id] = written
            if kind == "Deployment":
                deployment = written
            elif kind == "Job":
                seed_job, seed_outcome = written, "running"
                self.kube.post_event(body, "SeedStarted", f"Started seed job {child_name}")
        if resync or cache.get("key") != key:
            self._remove_superseded_seeds(svc, uid, short_key)

        # status.startup is the startup recorder's (stoker.controller.startups): read here, never written.
        last = (status.get("startup") or {}).get("last") or {}
        if last and not still_running(last, pods):
            last = {}  # its ReplicaSet was replaced (an edit) or scaled away; the recorder drops it too
        cache["key"] = key
        if last:
            cache["lastHit"] = last.get("compileCache") == "hit"
        else:
            cache.pop("lastHit", None)
        cache_missed = seeded and last.get("cacheKey") == short_key and last.get("compileCache") == "miss"
        problems = child_problems(self._observe_started(namespace, live, deployment, seed_job, pods))

        desired = svc.spec.runtime.replicas
        total = pod_count(svc)
        dep_status = (deployment or {}).get("status") or {}
        ready_replicas = int(dep_status.get("readyReplicas") or 0)
        updated_replicas = int(dep_status.get("updatedReplicas") or 0)
        updated = deployment is not None and (
            int(dep_status.get("observedGeneration") or 0)
            >= int(deployment["metadata"].get("generation") or 0)
            and updated_replicas >= total
        )
        rolled_out = updated and ready_replicas >= total and int(dep_status.get("replicas") or 0) == total
        serving, serves_all = ready_replicas, rolled_out
        if standby is not None:
            # Ready means the active pods serve; a standby pod still starting or falling asleep is progress.
            serving, serves_all = standby.active, updated and standby.active >= desired
            rolled_out = rolled_out and standby.asleep >= total - desired
        degraded = degraded_condition(
            apply_errors,
            problems,
            standby.problem if standby is not None else None,
            _miss_detail(last) if cache_missed else None,
            seed_outcome == "failed",
        )
        rollout = Rollout(
            deployment_name(svc.name), desired, total, updated_replicas, ready_replicas, serving, rolled_out
        )
        conditions = [
            ready_condition(gate_closed, seed_name, serves_all, rollout),
            cache_seeded_condition(seeding, seeded, seed_outcome, seed_name, short_key),
            progressing_condition(gate_closed, seed_name, rollout),
            degraded,
        ]
        if seed_outcome == "failed" and self._condition_reason(status, "CacheSeeded") != "SeedFailed":
            self.kube.post_event(
                body, "SeedFailed", f"Seed job {seed_name} failed; replicas start cold", warning=True
            )
        if cache_missed and self._condition_reason(status, "Degraded") != "CompileCacheMiss":
            self.kube.post_event(
                body,
                "CompileCacheMiss",
                f"Pod {last.get('pod')} compiled despite a seeded cache{_miss_detail(last)}",
                warning=True,
            )
        if degraded.reason in FAULT_REASONS and _changed(status, degraded):
            self.kube.post_event(body, degraded.reason, degraded.message, warning=True)
        new_status = {
            "observedGeneration": generation,
            "conditions": merge_conditions(status.get("conditions"), conditions, generation, now_rfc3339()),
            "replicas": int(dep_status.get("replicas") or 0) if standby is None else standby.active,
            "readyReplicas": serving,
            "selector": serving_selector(svc),
            "cache": cache,
            "startup": status.get("startup"),
        }
        if standby is not None:
            new_status["standbyReplicas"] = standby.asleep
            new_status["standby"] = _standby_status(standby, status)
        self._write_status(body, new_status)
        self.startups.follow((namespace, meta["name"]), generation, cache.get("seededKey"))
        if apply_errors:
            # Reported above; the work queue retries with a growing delay.
            raise ChildrenNotApplied("; ".join(apply_errors))
        return ("waiting" if gate_closed else "converged"), (standby.recheck_after if standby else None)

    def _read_children(
        self, namespace: str, children: list[Manifest], known: dict[tuple[str, str], Manifest | None]
    ) -> dict[tuple[str, str], Manifest | None]:
        """Each child as it is now, by name. Not the Secret (the operator never reads Secrets: it learns
        whether the Secret is its own when it writes it), not the seed Job and not what is `known` (each
        read before)."""
        live: dict[tuple[str, str], Manifest | None] = {}
        for child in children:
            kind, name = child["kind"], child["metadata"]["name"]
            if (kind, name) in known:
                live[(kind, name)] = known[(kind, name)]
            elif kind not in ("Secret", "Job"):
                live[(kind, name)] = self.kube.get(child["apiVersion"], kind, namespace, name)
        return live

    def _write_child(self, child: Manifest, current: Manifest | None, owner_uid: str) -> Manifest | None:
        """Create a missing child, or apply one that is stoker's; None if a Secret in the way is not."""
        if child["kind"] == "Secret":
            return self._write_secret(child, owner_uid)
        if current is None:
            # Create, not apply: if an object of that name appeared since the read, this fails (409)
            # instead of taking it over.
            created = self.kube.create(child)
            if child["kind"] == "Deployment":
                # So that later applies remove what stoker stops rendering in the pod template (a label
                # dropped from spec.pod). Only here: the other kinds' specs are immutable or hold fields the
                # server allocates, and what stoker renders on them does not shrink.
                self._own_as_applied(created)
            return created
        # The uid read with the owner reference: if the object was replaced since, the API server refuses
        # the apply (uid is immutable) instead of applying to the newcomer.
        child["metadata"]["uid"] = current["metadata"]["uid"]
        written = self.kube.apply(child)
        if child["kind"] == "Deployment":
            foreign = foreign_template_items(written, child)
            if foreign:
                meta = child["metadata"]
                self.kube.patch_json("apps/v1", "Deployment", meta["namespace"], meta["name"], foreign)
                log.info(
                    "Removed items stoker does not render from the pod template deployment=%s/%s items=%d",
                    meta["namespace"],
                    meta["name"],
                    len(foreign) // 2,
                )
        return written

    def _own_as_applied(self, created: Manifest) -> None:
        try:
            self.kube.own_as_applied(created)
        except ApiException as error:  # the child exists as created; only later pruning is at stake
            meta = created["metadata"]
            log.warning(
                "Taking created fields as applied failed %s=%s/%s: %s",
                created["kind"].lower(),
                meta["namespace"],
                meta["name"],
                api_error_message(error),
            )

    def _write_secret(self, secret: Manifest, owner_uid: str) -> Manifest | None:
        """Create the Secret, or patch it only if its first owner reference is this object's: a JSON
        patch whose `test` makes the ownership check and the write one atomic step, without a read."""
        try:
            return self.kube.create(secret)
        except ApiException as error:
            if error.status != 409:
                raise
        meta = secret["metadata"]
        ops = [
            {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": owner_uid},
            {"op": "add", "path": "/metadata/labels", "value": meta["labels"]},
            {"op": "add", "path": "/data", "value": secret["data"]},
        ]
        try:
            self.kube.patch_json("v1", "Secret", meta["namespace"], meta["name"], ops)
        except ApiException as error:
            if error.status == 422:  # the test failed: no owner reference, or another owner's
                return None
            raise
        return secret

    def _observe_started(
        self,
        namespace: str,
        live: dict[tuple[str, str], Manifest | None],
        deployment: Manifest | None,
        seed_job: Manifest | None,
        pods: list[Manifest],
    ) -> ObservedChildren:
        """What child_problems needs; events are read only for a claim still Pending or a Job without
        pods, and the seed's pods only while it runs, each only once it had time to get going."""
        now = dt.datetime.now(dt.UTC)
        claims = [obj for (kind, _), obj in live.items() if kind == "PersistentVolumeClaim" and obj]
        claim_events = {
            claim["metadata"]["uid"]: self.kube.events_about(
                namespace, f"involvedObject.uid={claim['metadata']['uid']}"
            )
            for claim in claims
            if (claim.get("status") or {}).get("phase") == "Pending" and worth_a_closer_look(claim, now)
        }
        job_events: list[Manifest] = []
        seed_pods: list[Manifest] = []
        if seed_job is not None and job_outcome(seed_job) == "running" and worth_a_closer_look(seed_job, now):
            job_meta = seed_job["metadata"]
            seed_pods = self.kube.list_objects(
                "v1", "Pod", namespace, f"batch.kubernetes.io/job-name={job_meta['name']}"
            )
            if not (seed_job.get("status") or {}).get("active"):
                job_events = self.kube.events_about(namespace, f"involvedObject.uid={job_meta['uid']}")
        return ObservedChildren(
            claims=claims,
            claim_events=claim_events,
            deployment=deployment,
            job=seed_job,
            job_events=job_events,
            pods=pods + seed_pods,
        )

    def _forget_kopf_state(self, body: Manifest) -> None:
        """An object from an operator version with kopf's create/update handlers carries their progress
        and diff-base annotations (kopf itself removes the old finalizer): remove them once."""
        annotations = body["metadata"].get("annotations") or {}
        stale = [name for name in KOPF_ANNOTATIONS if name in annotations]
        if stale:
            meta = body["metadata"]
            patch = {
                "metadata": {"annotations": dict.fromkeys(stale), "resourceVersion": meta["resourceVersion"]}
            }
            self.kube.patch_service_metadata(meta["namespace"], meta["name"], patch)
            log.info(
                "Removed kopf state of an earlier operator version vllmservice=%s/%s",
                meta["namespace"],
                meta["name"],
            )

    @staticmethod
    def _condition_reason(status: Manifest, kind: str) -> str | None:
        return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == kind), None)

    def _block(self, body: Manifest, reason: str, message: str) -> None:
        """Report what stops the object (an invalid spec, an object in the way) and write nothing else; a
        Warning Event when it first happens or changes, not on every retry."""
        status = body.get("status") or {}
        generation = int(body["metadata"].get("generation") or 0)
        conditions = [
            Condition("Ready", False, reason, message),
            Condition("Progressing", False, reason, message),
            Condition("Degraded", True, reason, message),
        ]
        if _changed(status, conditions[-1]) or status.get("observedGeneration") != generation:
            self.kube.post_event(body, reason, message, warning=True)
        new_status = dict(status, observedGeneration=generation)
        new_status["conditions"] = merge_conditions(
            status.get("conditions"), conditions, generation, now_rfc3339()
        )
        self._write_status(body, new_status)

    def _write_status(self, body: Manifest, new_status: Manifest) -> None:
        # Through the status model: what is written has the CRD's shape, or this fails loudly here.
        wanted, written = _status_document(new_status), _status_document(body.get("status") or {})
        if wanted == written:
            return  # nothing changed: no write, no watch event, no churn
        self.kube.patch_service_status(
            body["metadata"]["namespace"], body["metadata"]["name"], merge_patch(written, wanted)
        )

    def _remove_superseded_seeds(self, svc: VLLMService, owner_uid: str, short_key: str) -> None:
        """Seed Jobs of earlier keys that stoker created; a Job with look-alike labels is left alone."""
        namespace, name = str(svc.namespace), svc.name
        selector = f"{INSTANCE_LABEL}={name},{COMPONENT_LABEL}={COMPONENT_SEED}"
        for job in self.kube.list_objects("batch/v1", "Job", namespace, selector):
            job_meta = job["metadata"]
            if owned_by(job, owner_uid) and job_meta.get("labels", {}).get(CACHE_KEY_LABEL) != short_key:
                self.kube.delete("batch/v1", "Job", namespace, job_meta["name"], job_meta["uid"])
                log.info("Removed superseded seed job job=%s/%s", namespace, job_meta["name"])


class ChildrenNotApplied(Exception):
    """Some children were refused by the API server; the status says which and why."""


def api_error_message(error: ApiException) -> str:
    """The API server's own message for a refused request, with its status code."""
    try:
        message = json.loads(error.body or "{}").get("message") or error.reason
    except (ValueError, AttributeError):
        message = error.reason
    return f"{message} (HTTP {error.status})"


def _changed(status: Manifest, condition: Condition) -> bool:
    """Whether a condition differs from the one in the status in reason or message: an Event's worth."""
    before: Manifest = next(
        (c for c in status.get("conditions") or [] if c.get("type") == condition.type), {}
    )
    return (before.get("reason"), before.get("message")) != (condition.reason, condition.message)


def _status_document(status: Manifest) -> Manifest:
    return VLLMServiceStatus.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)


def _standby_status(standby: StandbyOutcome, status: Manifest) -> Manifest:
    """The pods' roles now, and the last wake of this or an earlier reconcile."""
    document = standby.status()
    previous_wake = (status.get("standby") or {}).get("lastWake")
    if "lastWake" not in document and previous_wake:
        document["lastWake"] = previous_wake
    return document


def _miss_detail(record: Manifest) -> str:
    """Why a start missed the compile cache, when its log said."""
    if record.get("compileCacheReason") == "loadFailed":
        return " (loadFailed: the kept cache was there but failed to load)"
    return ""


def _facts_of_key(status: Manifest, short_key: str) -> str | None:
    """The model facts in status, as JSON, if a seed run of this key printed them."""
    startup = status.get("startup") or {}
    if startup.get("modelCacheKey") != short_key or not startup.get("model"):
        return None
    return json.dumps(startup["model"], sort_keys=True, separators=(",", ":"))
