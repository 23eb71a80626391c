"""Why applied children do not start, from what the API server shows of them. Pure: no I/O.

The causes Kubernetes records on the children themselves (a PVC's provisioning events, a ReplicaSet's
FailedCreate surfaced in the Deployment's ReplicaFailure condition, a Job's FailedCreate events, a
container's waiting reason) become one `Problem` each, for the VLLMService's Degraded condition.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]

# Container waiting reasons that do not resolve by waiting (ContainerCreating, PodInitializing do).
STUCK_WAITING_REASONS = frozenset(
    {
        "InvalidImageName",
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


# A claim still Pending or a Job still without pods this long after creation is looked at closer (its
# events read): younger ones are almost always just on their way, and a burst of new objects should not
# cost an events query each.
STUCK_AFTER_SECONDS = 10.0


def worth_a_closer_look(obj: Manifest, now: dt.datetime) -> bool:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return False
    age = now - dt.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    return age.total_seconds() >= STUCK_AFTER_SECONDS


@dataclass(frozen=True)
class Problem:
    reason: str
    subject: str  # the child it is about, e.g. "PersistentVolumeClaim ns/x-cache"
    detail: str

    @property
    def message(self) -> str:
        return f"{self.subject}: {self.detail}"


@dataclass(frozen=True)
class ObservedChildren:
    """The applied children as read in one reconcile, with the events of those that are stuck."""

    claims: list[Manifest] = field(default_factory=list)
    claim_events: dict[str, list[Manifest]] = field(default_factory=dict)  # claim uid -> its events
    deployment: Manifest | None = None
    job: Manifest | None = None
    job_events: list[Manifest] = field(default_factory=list)
    pods: list[Manifest] = field(default_factory=list)  # serving and seed pods


def child_problems(observed: ObservedChildren) -> list[Problem]:
    problems: list[Problem] = []
    for claim in observed.claims:
        if (claim.get("status") or {}).get("phase") == "Pending":
            event = _latest(observed.claim_events.get(claim["metadata"]["uid"], []), "ProvisioningFailed")
            if event is not None:
                problems.append(
                    Problem(
                        "VolumeProvisioningFailed", _subject("PersistentVolumeClaim", claim), event["message"]
                    )
                )
    if observed.deployment is not None:
        for condition in (observed.deployment.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
                problems.append(
                    Problem(
                        "PodCreationFailed",
                        _subject("Deployment", observed.deployment),
                        condition.get("message", ""),
                    )
                )
    job = observed.job
    if job is not None and not (job.get("status") or {}).get("active") and not _finished(job):
        event = _latest(observed.job_events, "FailedCreate")
        if event is not None:
            problems.append(Problem("PodCreationFailed", _subject("Job", job), event["message"]))
    for pod in observed.pods:
        statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
        statuses += (pod.get("status") or {}).get("containerStatuses") or []
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                detail = f"container {container.get('name')}: {waiting.get('message') or waiting['reason']}"
                problems.append(Problem(waiting["reason"], _subject("Pod", pod), detail))
                break
    return problems


def _subject(kind: str, obj: Manifest) -> str:
    return f"{kind} {obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def _finished(job: Manifest) -> bool:
    return any(
        c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _latest(events: list[Manifest], reason: str) -> Manifest | None:
    matching = [e for e in events if e.get("reason") == reason and e.get("message")]
    return max(matching, key=_event_time, default=None)


def _event_time(event: Manifest) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")
