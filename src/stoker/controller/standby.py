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

from stoker.api import DEFAULT_IMAGE, KIND, VLLMService
from stoker.controller import metrics
from stoker.controller.cache import ObjectCache
from stoker.controller.conditions import now_rfc3339
from stoker.controller.kube import Kube, Manifest
from stoker.controller.objects import parse_time, pod_is_ready
from stoker.controller.ownership import created_by_deployment
from stoker.controller.settings import OperatorSettings
from stoker.engines import TOLERANT, UnsupportedEngineVersion, profile_for, resolve_engine_version
from stoker.render import PORT, deployment_name, short_cache_key
from stoker.render.control import control_token
from stoker.render.engine import SLEEP_MODE_FLAG, served_model_name
from stoker.render.names import (
    ASLEEP_ANNOTATION,
    CACHE_KEY_LABEL,
    DELETION_COST_ANNOTATION,
    GPU_SHARE_GATE,
    ROLE_ACTIVE,
    ROLE_LABEL,
    ROLE_STANDBY,
    STANDBY_DELETION_COST,
    STANDBY_SINCE_ANNOTATION,
)
from stoker.standby import (
    EngineControl,
    EngineControlError,
    ServingPod,
    WakeTiming,
    plan_standby,
    replacement_delay,
)
from stoker.standby.gpushare import (
    MakingRoomFailed,
    SharedEngine,
    device_lock,
    plan_memory,
    wake_on_shared_gpu,
)

log = logging.getLogger(__name__)

IS_SLEEPING_TIMEOUT_SECONDS = 5.0
# While an engine waits for room on a shared GPU: its service is looked at again this soon (another
# service's scale-down, which makes the room, does not touch this one's objects).
SHARED_GPU_RECHECK_SECONDS = 2.0
# A pod whose gate was lifted counts as starting until the watch shows it Ready, or this long at most.
STARTING_AT_MOST_SECONDS = 600.0


@dataclass
class StandbyOutcome:
    """What the status needs: each Ready pod's role, the last wake, and when to look again."""

    roles: dict[str, tuple[str, bool]] = field(default_factory=dict)  # pod -> (role, asleep)
    last_wake: Manifest | None = None
    recheck_after: float | None = None
    problem: str | None = None  # why pods are not being replaced now (a backoff after failures)
    shared_gpu: Manifest | None = None  # status.standby.sharedGpu

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
        document: Manifest = {"pods": pods}
        if self.last_wake:
            document["lastWake"] = self.last_wake
        if self.shared_gpu:
            document["sharedGpu"] = self.shared_gpu
        return document


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


def gated(pod: Manifest) -> bool:
    return any(gate.get("name") == GPU_SHARE_GATE for gate in pod["spec"].get("schedulingGates") or [])


def gpu_share(service: Manifest) -> float:
    """The fraction of its GPU each engine of a VLLMService (as the API serves it) holds awake: its
    runtime.gpuMemoryUtilization, rendered as the engine's flag, else its engine's default. Read from the
    spec, not from the pods' arguments, whose flag spelling is the engine profile's to know."""
    runtime = (service.get("spec") or {}).get("runtime") or {}
    share = runtime.get("gpuMemoryUtilization")
    if isinstance(share, int | float):
        return float(share)
    try:
        version = resolve_engine_version(runtime.get("engineVersion"), runtime.get("image") or DEFAULT_IMAGE)
        return profile_for(version).default_gpu_memory_utilization
    except UnsupportedEngineVersion:  # refused by the API server's validation; the newest default stands in
        return TOLERANT.default_gpu_memory_utilization


def claims_of(pod: Manifest) -> set[str]:
    return {claim.get("resourceClaimName") for claim in pod["spec"].get("resourceClaims") or []} - {None}


def shared_engine(pod: Manifest, share: float) -> SharedEngine:
    """An ungated pod on a shared GPU as the planner sees it: it holds its `share` unless the operator saw
    it fall asleep (the engines are asked again before a wake)."""
    meta = pod["metadata"]
    asleep = ASLEEP_ANNOTATION in (meta.get("annotations") or {}) and pod_is_ready(pod)
    return SharedEngine(
        name=meta["name"],
        share=share,
        holds_memory=not asleep,
        wanted=(meta.get("labels") or {}).get(ROLE_LABEL, ROLE_ACTIVE) == ROLE_ACTIVE,
        since=parse_time(meta.get("creationTimestamp")) or dt.datetime.now(dt.UTC),
    )


@dataclass(frozen=True)
class Backoff:
    """Failed sleeps and wakes of one VLLMService's pods, and when the next pod may be replaced."""

    failures: int
    not_before: float  # time.monotonic()
    last_error: str


class StandbyPool:
    def __init__(self, kube: Kube, settings: OperatorSettings, cache: ObjectCache) -> None:
        self.kube = kube
        self.settings = settings
        self.cache = cache
        # Pods whose gate this operator lifted, until the watch shows them Ready: the cache may not show the
        # lift yet, and one engine starts at a time per shared GPU. (namespace, pod) -> time.monotonic()
        self._lifted: dict[tuple[str, str], float] = {}
        self._lifted_guard = threading.Lock()  # the reconcile workers of several claims share it
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

        shared = standby.shared_gpu
        claim = shared.resource_claim_name if shared is not None else None
        waiting: str | None = None

        needed = plan.shortage
        for pod in plan.wake_candidates:
            if needed == 0:
                break
            try:
                if claim is None:
                    timing = engine(pod).wake(served_model_name(svc), standby.wake_timeout_seconds)
                else:
                    woken = self._wake_shared(body, svc, namespace, claim, pod, token)
                    if isinstance(woken, str):
                        waiting = woken
                        hold(SHARED_GPU_RECHECK_SECONDS)
                        break
                    timing = woken
            except MakingRoomFailed as error:
                metrics.STANDBY_TRANSITIONS.labels("sleep", "failed").inc()
                waiting = str(error)
                self.kube.post_event(
                    body, "MakingRoomFailed", f"Pod {pod.name} not woken: {error}", warning=True
                )
                hold(SHARED_GPU_RECHECK_SECONDS)
                break
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
            metrics.STANDBY_WAKE_SECONDS.labels(*key).observe(timing.served_seconds)
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

        if claim is not None:
            waiting = self._start_one(body, namespace, claim, pods, hold) or waiting
            outcome.shared_gpu = self._shared_gpu_status(namespace, claim, waiting)

        if backoff is not None:
            outcome.problem = (
                f"{backoff.last_error}; after {backoff.failures} failed sleeps or wakes, standby pods are"
                f" slept or replaced at most every {replacement_delay(backoff.failures):.0f} s"
            )
        if resync:
            self._verify_asleep(namespace, views, engine, outcome)
        return outcome

    # ------------------------------------------------------------------------------- shared GPU

    def _pods_on_claim(self, namespace: str, claim: str) -> list[tuple[Manifest, Manifest]]:
        """(pod, its VLLMService) for every serving pod of the namespace that references `claim`."""
        found: list[tuple[Manifest, Manifest]] = []
        for owner in self.cache.of_kind(KIND, namespace):
            name = owner["metadata"]["name"]
            deployment = deployment_name(name)
            found.extend(
                (pod, owner)
                for pod in self.cache.of_instance("Pod", namespace, name)
                if created_by_deployment(pod, deployment) and claim in claims_of(pod)
            )
        return found

    def _neighbours(
        self, namespace: str, target: str, on_device: list[tuple[Manifest, Manifest]]
    ) -> tuple[list[SharedEngine], dict[str, EngineControl | None]]:
        """The started engines on the device other than `target`, and how to reach each (its service's
        token; None without a pod IP)."""
        engines: list[SharedEngine] = []
        controls: dict[str, EngineControl | None] = {}
        for pod, owner in on_device:
            name = pod["metadata"]["name"]
            lifted = (namespace, name) in self._lifted
            if name == target or (gated(pod) and not lifted) or pod["metadata"].get("deletionTimestamp"):
                continue
            engines.append(shared_engine(pod, gpu_share(owner)))
            address = (pod.get("status") or {}).get("podIP")
            token = control_token(self.key, str(owner["metadata"]["uid"]))
            controls[name] = EngineControl(f"http://{address}:{PORT}", token) if address else None
        return engines, controls

    def _wake_shared(
        self, body: Manifest, svc: VLLMService, namespace: str, claim: str, pod: ServingPod, token: str
    ) -> WakeTiming | str:
        """Wake `pod` on its shared GPU, first putting to sleep the engines whose services no longer want
        them; when engines that serve hold the memory, nothing is done and the reason is returned. The
        engines on the device are read under its lock, so no start or other wake slips in between."""
        standby = svc.spec.cold_start.standby
        assert standby is not None
        device, gib = f"{namespace}/{claim}", self.settings.shared_gpu_memory_gib

        def slept(engine: SharedEngine, seconds: float) -> None:
            self.kube.patch_pod_metadata(namespace, engine.name, {}, {ASLEEP_ANNOTATION: now_rfc3339()})
            metrics.STANDBY_TRANSITIONS.labels("sleep", "ok").inc()
            self.kube.post_event(
                body,
                "MadeRoom",
                f"Pod {engine.name} (not wanted by its service) fell asleep in {seconds:.2f} s to make room"
                f" for pod {pod.name} on the GPU of ResourceClaim {claim}",
            )

        with device_lock(device):
            on_device = self._pods_on_claim(namespace, claim)
            neighbours, controls = self._neighbours(namespace, pod.name, on_device)
            controls[pod.name] = EngineControl(f"http://{pod.address}:{PORT}", token)
            target = SharedEngine(pod.name, gpu_share(body), False, True, pod.created)
            result = wake_on_shared_gpu(
                device,
                gib,
                target,
                neighbours,
                lambda engine: controls.get(engine.name),
                served_model_name(svc),
                standby.level,
                standby.wake_timeout_seconds,
                on_slept=slept,
            )
        if result.timing is not None:
            return result.timing
        message = result.plan.describe(pod.name, gib)
        self.kube.post_event(body, "WaitingForGPU", f"{message} (ResourceClaim {claim})", warning=True)
        return message

    def _start_one(
        self,
        body: Manifest,
        namespace: str,
        claim: str,
        pods: list[Manifest],
        hold: Callable[[float], None],
    ) -> str | None:
        """Lift the gate of this service's oldest gated pod when no engine is starting on the shared GPU and
        its share fits beside those awake; returns why it waits, if one does."""
        waiting_pods = sorted(
            (pod for pod in pods if gated(pod) and not pod["metadata"].get("deletionTimestamp")),
            key=lambda pod: (pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]),
        )
        if not waiting_pods:
            return None
        candidate = waiting_pods[0]
        name = candidate["metadata"]["name"]
        with device_lock(f"{namespace}/{claim}"):
            now = time.monotonic()
            # Pods lifted long ago and never seen Ready (deleted, say) are forgotten.
            with self._lifted_guard:
                for key in [key for key, at in self._lifted.items() if now - at > STARTING_AT_MOST_SECONDS]:
                    del self._lifted[key]
            on_device = self._pods_on_claim(namespace, claim)
            starting = [
                pod["metadata"]["name"]
                for pod, _ in on_device
                if self._is_starting(namespace, pod, now) and pod["metadata"]["name"] != name
            ]
            if starting:
                hold(SHARED_GPU_RECHECK_SECONDS)
                after = ", ".join(sorted(starting))
                return f"pod {name} starts after {after} on the GPU of ResourceClaim {claim}"
            neighbours, _ = self._neighbours(namespace, name, on_device)
            target = SharedEngine(name, gpu_share(body), False, True, dt.datetime.now(dt.UTC))
            gib = self.settings.shared_gpu_memory_gib
            room = plan_memory(neighbours, target, gib)
            if not room.fits or room.sleep_first:
                # A start never puts an engine to sleep: an unwanted awake one falls asleep after its drain.
                hold(SHARED_GPU_RECHECK_SECONDS)
                return (
                    room.describe(name, gib) if not room.fits else f"pod {name} starts once its share is free"
                )
            self.kube.patch_json(
                "v1", "Pod", namespace, name, [{"op": "remove", "path": "/spec/schedulingGates"}]
            )
            with self._lifted_guard:
                self._lifted[(namespace, name)] = now
        self.kube.post_event(
            body,
            "StartingOnSharedGpu",
            f"Pod {name} may start on the GPU of ResourceClaim {claim}: its share fits",
        )
        hold(SHARED_GPU_RECHECK_SECONDS)
        return None

    def _is_starting(self, namespace: str, pod: Manifest, now: float) -> bool:
        """An engine that holds memory while it starts: ungated (or lifted by this operator and not yet seen
        ungated), not yet Ready, not being deleted."""
        key = (namespace, pod["metadata"]["name"])
        if pod_is_ready(pod) or pod["metadata"].get("deletionTimestamp"):
            self._lifted.pop(key, None)
            return False
        lifted = self._lifted.get(key)
        if lifted is not None and now - lifted > STARTING_AT_MOST_SECONDS:
            self._lifted.pop(key, None)
            lifted = None
        return not gated(pod) or lifted is not None

    def _shared_gpu_status(self, namespace: str, claim: str, waiting: str | None) -> Manifest:
        engines = []
        for pod, owner in self._pods_on_claim(namespace, claim):
            if gated(pod) and (namespace, pod["metadata"]["name"]) not in self._lifted:
                continue
            engine = shared_engine(pod, gpu_share(owner))
            engines.append(
                {
                    "pod": engine.name,
                    "service": owner["metadata"]["name"],
                    "awake": engine.holds_memory,
                    "share": engine.share,
                }
            )
        return {"resourceClaimName": claim, "engines": engines, **({"waiting": waiting} if waiting else {})}

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
