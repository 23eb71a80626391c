"""One idempotent reconcile per VLLMService: observe (watch caches) → decide (pure) → act (only what differs).

Every trigger (create, update, resume, the drift timer, a child's change) runs the same function on the
object as the watch cache has it, so no decision depends on what triggered it. A pass writes nothing when
everything is as rendered: a drift resync of unchanged services costs memory reads only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from stoker.api import GROUP, VLLMService, user_message
from stoker.controller import metrics
from stoker.controller.act import Actor, InTheWay, NamespaceTerminating
from stoker.controller.cache import ObjectCache
from stoker.controller.conditions import now_rfc3339
from stoker.controller.decide import (
    StandbyView,
    StatusPlan,
    blocked_status,
    decide_children,
    decide_status,
    first_reaction,
    trusted_body,
)
from stoker.controller.kube import Kube, Manifest
from stoker.controller.observe import Observer
from stoker.controller.settings import OperatorSettings
from stoker.controller.standby import StandbyPool
from stoker.controller.startups import StartupRecorder
from stoker.controller.workqueue import GONE, Gone, ObjectKey
from stoker.render import deployment_name, short_cache_key
from stoker.render.snapshot import Snapshots, snapshotted_asleep

log = logging.getLogger(__name__)

# Annotations kopf kept on each object for the create/update/resume handlers of earlier versions.
KOPF_ANNOTATIONS = (f"{GROUP}/last-handled-configuration", f"{GROUP}/reconcile", f"{GROUP}/drift")


class ChildrenNotApplied(Exception):
    """Some children were refused by the API server; the status says which and why."""


class Reconciler:
    """Reconciles one object at a time per key; the work queue guarantees no two runs of one key overlap."""

    def __init__(
        self, kube: Kube, settings: OperatorSettings, cache: ObjectCache, startups: StartupRecorder
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.startups = startups
        self.standby = StandbyPool(kube, settings, cache)
        self.observer = Observer(
            kube,
            cache,
            settings.field_manager,
            settings.programs_image,
            settings.node_warming_budget_bytes,
            settings.node_warming_reserve_bytes,
            settings.node_warming_namespace_quota_bytes,
            snapshots=Snapshots(
                self.standby.key,
                settings.snapshot_restore_wait_seconds,
                settings.snapshot_restore_bound_seconds,
                settings.snapshot_offer_bound_seconds,
            )
            if settings.snapshot_enabled
            else None,
        )
        self.actor = Actor(kube, cache, self.standby.key)
        # Whether new specs wait in the work queue (set by whoever runs the queue).
        self.others_waiting: Callable[[], bool] = lambda: False

    def reconcile(self, key: ObjectKey, resync: bool) -> float | Gone | None:
        """Converge one object; returns seconds after which to look again, if time alone changes things,
        or GONE once the object no longer exists."""
        namespace, name = key
        body = self.observer.service(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return self._forget(key)
        self._forget_kopf_state(body)
        started, result = time.monotonic(), "error"
        try:
            result, recheck_after = self._reconcile(body, resync)
        except ApiException as error:
            if error.status != 404 or self.kube.get_service(namespace, name) is not None:
                raise
            # Deleted after the watch cache last saw it (its DELETED event is on the way).
            return self._forget(key)
        except NamespaceTerminating:
            # The namespace controller deletes this object next: not an error, nothing to retry.
            result = "terminating"
            log.debug("Namespace being deleted vllmservice=%s/%s", namespace, name)
            return self._forget(key)
        finally:
            metrics.RECONCILES.labels(result).inc()
            metrics.RECONCILE_SECONDS.labels(result).observe(time.monotonic() - started)
        return recheck_after

    def _forget(self, key: ObjectKey) -> Gone:
        self.standby.forget(key)
        metrics.forget_service(*key)
        return GONE

    def _reconcile(self, body: Manifest, resync: bool) -> tuple[str, float | None]:
        """Returns the result for metrics (converged, waiting, conflict or invalid) and when to look again;
        raises NamespaceTerminating once the namespace's deletion refuses a child."""
        try:
            svc = VLLMService.model_validate(body)
        except ValidationError as error:
            # Reported in status and as an Event; a retry changes nothing until the spec does.
            return self._settle(body, blocked_status(body, "InvalidSpec", user_message(error), now_rfc3339()))
        guarded = svc.spec.cold_start.standby or snapshotted_asleep(svc, self.observer.snapshots)
        token = self.standby.control_token(body) if guarded else None
        # Decided from what the operator knows, not from what a tenant wrote in status; the status written
        # at the end is compared with `body` as read, so a forged field is written over.
        meta = body["metadata"]
        known = trusted_body(
            body,
            svc,
            self.observer.compile_cache_claim(svc),
            self.standby.key,
            self.startups.seed_facts((meta["namespace"], meta["name"]), meta["uid"], short_cache_key(svc)),
        )
        if known.get("status") != body.get("status"):
            svc = VLLMService.model_validate(known)
        snapshot = self.observer.snapshot(known, svc, token, self.standby.key)
        plan = decide_children(snapshot)
        if self.others_waiting() and (first := first_reaction(plan)) is not None:
            plan = first  # a burst of new services: each one's Deployment before anyone's other children
        if plan.blocked is not None:
            return self._settle(body, blocked_status(body, "ChildConflict", plan.blocked, snapshot.now))
        standby, waits = None, [plan.recheck_after]
        if token is not None:
            # Before the children: a scale-up wakes a standby before the Deployment starts its replacement.
            pods = snapshot.pods if snapshot.children.get(("Deployment", deployment_name(svc.name))) else []
            outcome = self.standby.reconcile(body, svc, pods, token, resync)
            standby = StandbyView(outcome.active, outcome.asleep, outcome.problem, outcome.status())
            waits.append(outcome.recheck_after)
        for event in plan.events:
            self.actor.event(body, event)
        try:
            written = self.actor.write_children(body, plan, snapshot.children)
        except InTheWay as conflict:
            return self._settle(
                body, blocked_status(body, "ChildConflict", conflict.conflict.message, snapshot.now)
            )
        status = decide_status(snapshot, plan, written, standby)
        self._settle(body, status)
        metrics.set_node_warming((svc.namespace or "", svc.name), status.status.get("nodeWarming"))
        self.startups.follow(
            (meta["namespace"], meta["name"]), int(meta.get("generation") or 0), plan.cache.get("seededKey")
        )
        if written.apply_errors:
            # Reported in status; the work queue retries with a growing delay.
            raise ChildrenNotApplied("; ".join(written.apply_errors))
        waits.append(status.recheck_after)
        due = [seconds for seconds in waits if seconds is not None]
        return status.result, min(due) if due else None

    def _settle(self, body: Manifest, plan: StatusPlan) -> tuple[str, float | None]:
        for event in plan.events:
            self.actor.event(body, event)
        self.actor.write_status(body, plan.status)
        return plan.result, None

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
