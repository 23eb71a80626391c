"""Carrying out the standby plan: role labels on pods, sleep and wake calls to the engines, Events.

Each step's result is written on the pod (label, annotations) right after it succeeded, so an operator that
restarts mid-way reads where things stand from the pods: a pod woken but not yet relabelled is still a
standby candidate and is woken again (a no-op for an awake engine); on a resync every pod marked asleep is
asked whether it is, and slept again if not.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stoker.api import VLLMService
from stoker.controller import metrics
from stoker.controller.conditions import now_rfc3339
from stoker.controller.kube import Kube, Manifest
from stoker.controller.objects import parse_time, pod_is_ready
from stoker.controller.settings import OperatorSettings
from stoker.render import PORT, short_cache_key
from stoker.render.control import control_token
from stoker.render.engine import SLEEP_MODE_FLAG, served_model_name
from stoker.render.names import (
    ASLEEP_ANNOTATION,
    CACHE_KEY_LABEL,
    DELETION_COST_ANNOTATION,
    ROLE_ACTIVE,
    ROLE_LABEL,
    ROLE_STANDBY,
    STANDBY_DELETION_COST,
    STANDBY_SINCE_ANNOTATION,
)
from stoker.standby import EngineControl, EngineControlError, ServingPod, plan_standby, replacement_delay

log = logging.getLogger(__name__)

IS_SLEEPING_TIMEOUT_SECONDS = 5.0


@dataclass
class StandbyOutcome:
    """What the status needs: each Ready pod's role, the last wake, and when to look again."""

    roles: dict[str, tuple[str, bool]] = field(default_factory=dict)  # pod -> (role, asleep)
    last_wake: Manifest | None = None
    recheck_after: float | None = None
    problem: str | None = None  # why pods are not being replaced now (a backoff after failures)

    @property
    def active(self) -> int:
        return sum(role == ROLE_ACTIVE for role, _ in self.roles.values())

    @property
    def asleep(self) -> int:
        return sum(role == ROLE_STANDBY and asleep for role, asleep in self.roles.values())

    def status(self) -> Manifest:
        pods = [
            {"pod": pod, "role": role, "asleep": asleep} for pod, (role, asleep) in sorted(self.roles.items())
        ]
        return {"pods": pods, **({"lastWake": self.last_wake} if self.last_wake else {})}


def serving_pod(pod: Manifest, short_key: str) -> ServingPod:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return ServingPod(
        name=meta["name"],
        created=parse_time(meta.get("creationTimestamp")) or dt.datetime.now(dt.UTC),
        ready=pod_is_ready(pod) and not meta.get("deletionTimestamp"),
        role=labels.get(ROLE_LABEL),
        asleep=ASLEEP_ANNOTATION in annotations,
        standby_since=parse_time(annotations.get(STANDBY_SINCE_ANNOTATION)),
        current=labels.get(CACHE_KEY_LABEL) == short_key,
        sleep_capable=SLEEP_MODE_FLAG in (pod["spec"]["containers"][0].get("args") or []),
        address=status.get("podIP"),
        uid=meta.get("uid", ""),
    )


@dataclass(frozen=True)
class Backoff:
    """Failed sleeps and wakes of one VLLMService's pods, and when the next pod may be replaced."""

    failures: int
    not_before: float  # time.monotonic()
    last_error: str


class StandbyPool:
    def __init__(self, kube: Kube, settings: OperatorSettings) -> None:
        self.kube = kube
        self.settings = settings
        if settings.control_key is not None:
            self.key = settings.control_key.get_secret_value()
        else:
            self.key = secrets.token_urlsafe(32)
            log.warning("STOKER_CONTROL_KEY is unset: standby pods started before a restart will be replaced")
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._backoff_guard = threading.Lock()

    def forget(self, key: tuple[str, str]) -> None:
        with self._backoff_guard:
            self._backoff.pop(key, None)

    def control_token(self, body: Manifest) -> str:
        return control_token(self.key, str(body["metadata"]["uid"]))

    def reconcile(
        self, body: Manifest, svc: VLLMService, pods: list[Manifest], token: str, resync: bool
    ) -> StandbyOutcome:
        standby = svc.spec.cold_start.standby
        assert standby is not None
        namespace = body["metadata"]["namespace"]
        key = (namespace, body["metadata"]["name"])
        with self._backoff_guard:
            backoff = self._backoff.get(key)
        views = [serving_pod(pod, short_cache_key(svc)) for pod in pods]
        plan = plan_standby(
            views, svc.spec.runtime.replicas, dt.datetime.now(dt.UTC), self.settings.standby_drain_seconds
        )
        outcome = StandbyOutcome(
            roles={
                pod.name: (pod.role or ROLE_ACTIVE, pod.asleep) for pod in views if pod.ready and pod.address
            },
            recheck_after=plan.recheck_after,
        )

        def engine(pod: ServingPod) -> EngineControl:
            return EngineControl(f"http://{pod.address}:{PORT}", token)

        def mark(pod: ServingPod, role: str, asleep: bool, **annotations: str | None) -> None:
            self.kube.patch_pod_metadata(namespace, pod.name, {ROLE_LABEL: role}, annotations)
            outcome.roles[pod.name] = (role, asleep)

        def backing_off() -> float:
            """Seconds until a pod may be replaced again; 0 when it may now."""
            return max(backoff.not_before - time.monotonic(), 0.0) if backoff else 0.0

        def hold(remaining: float) -> None:
            outcome.recheck_after = (
                remaining if outcome.recheck_after is None else min(outcome.recheck_after, remaining)
            )

        def replace(pod: ServingPod, reason: str, message: str) -> None:
            """Delete a pod that failed, unless the last replacement is too recent (then wait)."""
            nonlocal backoff
            failures = (backoff.failures if backoff else 0) + 1
            remaining = backing_off()
            if backoff is not None and remaining > 0:
                backoff = Backoff(backoff.failures, backoff.not_before, message)
                hold(remaining)
            else:
                self.kube.delete("v1", "Pod", namespace, pod.name, pod.uid)
                outcome.roles.pop(pod.name, None)
                backoff = Backoff(failures, time.monotonic() + replacement_delay(failures), message)
                self.kube.post_event(body, reason, f"{message}; pod deleted for a new one", warning=True)
            with self._backoff_guard:
                self._backoff[key] = backoff

        def succeeded() -> None:
            nonlocal backoff
            backoff = None
            with self._backoff_guard:
                self._backoff.pop(key, None)

        for pod in plan.adopt:
            mark(pod, ROLE_ACTIVE, False)
        for pod in plan.demote:
            mark(
                pod,
                ROLE_STANDBY,
                False,
                **{
                    STANDBY_SINCE_ANNOTATION: now_rfc3339(),
                    DELETION_COST_ANNOTATION: STANDBY_DELETION_COST,
                },
            )
            metrics.STANDBY_TRANSITIONS.labels("demote", "ok").inc()
            self.kube.post_event(body, "Demoted", f"Pod {pod.name} left the Service to become a standby")

        needed = plan.shortage
        for pod in plan.wake_candidates:
            if needed == 0:
                break
            try:
                timing = engine(pod).wake(served_model_name(svc), standby.wake_timeout_seconds)
            except EngineControlError as error:
                metrics.STANDBY_TRANSITIONS.labels("wake", "failed").inc()
                outcome.last_wake = {
                    "pod": pod.name,
                    "failed": True,
                    "reason": str(error),
                    "at": now_rfc3339(),
                }
                replace(pod, "WakeFailed", f"Pod {pod.name} did not wake: {error}")
                continue
            mark(
                pod,
                ROLE_ACTIVE,
                False,
                **{
                    ASLEEP_ANNOTATION: None,
                    STANDBY_SINCE_ANNOTATION: None,
                    DELETION_COST_ANNOTATION: None,
                },
            )
            needed -= 1
            succeeded()
            metrics.STANDBY_TRANSITIONS.labels("wake", "ok").inc()
            metrics.STANDBY_WAKE_SECONDS.observe(timing.served_seconds)
            outcome.last_wake = {
                "pod": pod.name,
                "wakeSeconds": round(timing.wake_seconds, 3),
                "healthSeconds": round(timing.health_seconds, 3),
                "servedSeconds": round(timing.served_seconds, 3),
                "at": now_rfc3339(),
            }
            self.kube.post_event(
                body,
                "Woke",
                f"Pod {pod.name} woke in {timing.wake_seconds:.2f} s and served a completion "
                f"{timing.served_seconds:.2f} s after /wake_up",
            )

        remaining = backing_off()
        if remaining > 0 and plan.sleep:
            hold(remaining)  # the next pod to sleep is likely to fail as the last one did
        for pod in plan.sleep if remaining == 0 else []:
            try:
                seconds = engine(pod).sleep(standby.level, self.settings.standby_sleep_timeout_seconds)
            except EngineControlError as error:
                metrics.STANDBY_TRANSITIONS.labels("sleep", "failed").inc()
                replace(pod, "SleepFailed", f"Pod {pod.name} did not fall asleep: {error}")
                continue
            mark(pod, ROLE_STANDBY, True, **{ASLEEP_ANNOTATION: now_rfc3339()})
            succeeded()
            metrics.STANDBY_TRANSITIONS.labels("sleep", "ok").inc()
            self.kube.post_event(
                body,
                "Asleep",
                f"Pod {pod.name} is a standby, asleep at level {standby.level} in {seconds:.1f} s",
            )

        if backoff is not None:
            outcome.problem = (
                f"{backoff.last_error}; after {backoff.failures} failed sleeps or wakes, standby pods are"
                f" slept or replaced at most every {replacement_delay(backoff.failures):.0f} s"
            )
        if resync:
            self._verify_asleep(namespace, views, engine, outcome)
        return outcome

    def _verify_asleep(
        self,
        namespace: str,
        views: list[ServingPod],
        engine: Callable[[ServingPod], EngineControl],
        outcome: StandbyOutcome,
    ) -> None:
        """A pod marked asleep that is awake (its wake was cut short) is marked awake, to be slept again."""
        for pod in views:
            if outcome.roles.get(pod.name) != (ROLE_STANDBY, True):
                continue
            try:
                sleeping = engine(pod).is_sleeping(IS_SLEEPING_TIMEOUT_SECONDS)
            except EngineControlError as error:
                log.warning(
                    "Asking whether a standby sleeps failed pod=%s/%s: %s", namespace, pod.name, error
                )
                continue
            if not sleeping:
                self.kube.patch_pod_metadata(namespace, pod.name, {}, {ASLEEP_ANNOTATION: None})
                outcome.roles[pod.name] = (ROLE_STANDBY, False)
                outcome.recheck_after = 0.0
