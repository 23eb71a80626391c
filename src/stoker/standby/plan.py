"""Deciding, from the serving pods as they are, what the standby pool needs next. No I/O.

Every pod starts active (the Deployment's template says so). The operator keeps `spec.runtime.replicas`
of them active: short, it wakes standby pods; over, it demotes active ones (out of the Service first,
asleep after a drain period). The Deployment runs active plus standby replicas, so each woken pod is
replaced by a new one that, once Ready, is over the count and is demoted in its turn.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from stoker.render.names import ROLE_STANDBY


@dataclass(frozen=True)
class ServingPod:
    name: str
    created: dt.datetime
    ready: bool = True
    role: str | None = None  # the role label; None on pods started before standby was configured
    asleep: bool = False  # the operator saw /sleep succeed and has not woken it since
    standby_since: dt.datetime | None = None
    current: bool = True  # started from the current cache key
    sleep_capable: bool = True  # started with --enable-sleep-mode
    address: str | None = None  # pod IP
    uid: str = ""


REPLACEMENT_DELAY_SECONDS = 5.0
MAX_REPLACEMENT_DELAY_SECONDS = 300.0


def replacement_delay(failures: int) -> float:
    """How long after its `failures`-th failed sleep or wake a VLLMService may lose another pod: a pod that
    cannot sleep is most likely replaced by one that cannot either, so the pace halves each time."""
    return min(REPLACEMENT_DELAY_SECONDS * 2 ** (failures - 1), MAX_REPLACEMENT_DELAY_SECONDS)


@dataclass(frozen=True)
class StandbyPlan:
    adopt: list[ServingPod] = field(default_factory=list)  # Ready pods without a role: label them active
    wake_candidates: list[ServingPod] = field(default_factory=list)  # best first; wake until shortage met
    shortage: int = 0
    demote: list[ServingPod] = field(default_factory=list)
    sleep: list[ServingPod] = field(default_factory=list)
    recheck_after: float | None = None  # seconds until a demoted pod's drain ends


def _is_standby(pod: ServingPod) -> bool:
    return pod.role == ROLE_STANDBY


def plan_standby(
    pods: list[ServingPod], wanted_active: int, now: dt.datetime, drain_seconds: float
) -> StandbyPlan:
    ready = [pod for pod in pods if pod.ready and pod.address]
    active = [pod for pod in ready if not _is_standby(pod)]
    standby = [pod for pod in ready if _is_standby(pod)]
    adopt = [pod for pod in active if pod.role is None]
    shortage = wanted_active - len(active)

    wake_candidates: list[ServingPod] = []
    demote: list[ServingPod] = []
    if shortage > 0:
        # Current-key pods first (old ones are on their way out); an awake one still draining needs no
        # wake at all; then the longest asleep.
        wake_candidates = sorted(
            (pod for pod in standby if pod.sleep_capable),
            key=lambda pod: (not pod.current, pod.asleep, pod.standby_since or pod.created),
        )
    elif shortage < 0:
        # Old-key pods first (the rollout replaces them anyway), then the youngest: the least established.
        capable = [pod for pod in active if pod.sleep_capable]
        capable.sort(key=lambda pod: pod.created, reverse=True)
        capable.sort(key=lambda pod: pod.current)
        demote = capable[:-shortage]

    # Any candidate may be woken (the first ones can fail), so none is put to sleep in the same pass.
    candidates = {pod.name for pod in wake_candidates}
    sleep: list[ServingPod] = []
    recheck_after: float | None = None
    for pod in standby:
        if pod.asleep or not pod.sleep_capable:
            continue
        if pod.name in candidates:
            recheck_after = drain_seconds if recheck_after is None else min(recheck_after, drain_seconds)
            continue
        waited = (now - (pod.standby_since or now)).total_seconds()
        if waited >= drain_seconds:
            sleep.append(pod)
        else:
            remaining = drain_seconds - waited
            recheck_after = remaining if recheck_after is None else min(recheck_after, remaining)
    if demote:
        recheck_after = drain_seconds if recheck_after is None else min(recheck_after, drain_seconds)
    return StandbyPlan(
        adopt=adopt,
        wake_candidates=wake_candidates,
        shortage=max(shortage, 0),
        demote=demote,
        sleep=sleep,
        recheck_after=recheck_after,
    )
