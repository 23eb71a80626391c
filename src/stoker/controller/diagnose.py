"""Why applied children do not start, from what the API server shows of them. Pure: no I/O.

The causes Kubernetes records on the children themselves (a PVC's provisioning events, a ReplicaSet's
FailedCreate surfaced in the Deployment's ReplicaFailure condition, a Job's FailedCreate events, the
scheduler's Unschedulable condition on a pod, a container's waiting reason, an OOM kill, a seed container's
non-zero exit with the last lines of its log) become one `Problem` each, for the VLLMService's Progressing
and Degraded conditions.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from dataclasses import dataclass, field
from typing import Any

from stoker.controller.objects import parse_time
from stoker.inpod.seed import MODEL_PATH_MISSING_LINE
from stoker.untrusted import printable

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
    created = parse_time(obj["metadata"].get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() >= STUCK_AFTER_SECONDS


# A pod the scheduler cannot place is Degraded only this long after it said so: a cluster autoscaler may be
# adding the node it waits for. Every other problem does not resolve by waiting, and degrades at once.
UNSCHEDULABLE_GRACE_SECONDS = 60.0

# What of a failed seed's log tail (the kubelet's termination message, FallbackToLogsOnError: at most 80
# lines or 2 KiB) goes into a condition: the pod's output is untrusted, so it is cut to its last lines and
# to printable characters.
LOG_TAIL_LINES = 5
LOG_TAIL_CHARS = 600


@dataclass(frozen=True)
class Problem:
    reason: str
    subject: str  # the child it is about, e.g. "PersistentVolumeClaim ns/x-cache"
    detail: str
    of_seed: bool = False  # about the seed Job or its pods (not what serves)
    degrades_in: float = 0.0  # seconds until it counts as Degraded (Progressing=False at once)

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
    pods: list[Manifest] = field(default_factory=list)  # serving pods
    seed_pods: list[Manifest] = field(default_factory=list)  # the seed Job's, while it runs or once failed


def child_problems(observed: ObservedChildren, now: dt.datetime | None = None) -> list[Problem]:
    """Every problem seen, once each (a seed's second pod failing as its first did adds nothing)."""
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
            problems.append(
                Problem("PodCreationFailed", _subject("Job", job), event["message"], of_seed=True)
            )
    pods = [(pod, False) for pod in observed.pods] + [(pod, True) for pod in observed.seed_pods]
    for pod, of_seed in pods:
        problem = pod_problem(pod, of_seed, now or dt.datetime.now(dt.UTC))
        if problem is not None and all(
            (p.reason, p.detail) != (problem.reason, problem.detail) for p in problems
        ):
            problems.append(problem)
    return problems


def pod_problem(pod: Manifest, of_seed: bool, now: dt.datetime) -> Problem | None:
    """Why a pod does not start, from the scheduler's condition or its containers' states; None if nothing
    says it will not (Pending on its way, creating, running). A seed pod runs once: its non-zero exit is
    a problem too."""
    status = pod.get("status") or {}
    subject = _subject("Pod", pod)
    scheduled: Manifest = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
    )
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        since = parse_time(scheduled.get("lastTransitionTime"))
        waited = (now - since).total_seconds() if since is not None else 0.0
        detail = scheduled.get("message") or "the scheduler found no node for it"
        return Problem(
            "Unschedulable", subject, detail, of_seed, max(0.0, UNSCHEDULABLE_GRACE_SECONDS - waited)
        )
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        name = f"container {container.get('name')}"
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        if waiting.get("reason") == "CrashLoopBackOff" and last.get("reason") == "OOMKilled":
            restarts = container.get("restartCount") or 0
            detail = (
                f"{name} was killed for using more memory than its limit (OOMKilled), {restarts} restarts"
            )
            return Problem("OOMKilled", subject, detail, of_seed)
        if waiting.get("reason") in STUCK_WAITING_REASONS:
            detail = f"{name}: {waiting.get('message') or waiting['reason']}"
            if waiting["reason"] == "CrashLoopBackOff" and last.get("exitCode") is not None:
                detail += f" (last exit code {last['exitCode']})"
            return Problem(waiting["reason"], subject, detail, of_seed)
        terminated = state.get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return Problem(
                "OOMKilled", subject, f"{name} was killed for using more memory than its limit", of_seed
            )
        if of_seed and terminated.get("exitCode"):
            log = str(terminated.get("message") or "")
            missing = _missing_model_path(pod) if MODEL_PATH_MISSING_LINE in log else None
            if missing is not None:
                return Problem("ModelPathMissing", subject, missing, of_seed)
            tail = log_tail(log)
            detail = f"{name} exited with code {terminated['exitCode']}" + (
                f"; its log ends: {tail}" if tail else ""
            )
            return Problem("SeedFailed", subject, detail, of_seed)
    return None


def log_tail(log: str) -> str:
    """The last lines of untrusted pod output that say something, printable and bounded, on one line."""
    lines = [printable(line).strip() for line in log.splitlines()]
    tail = " | ".join([line for line in lines if line][-LOG_TAIL_LINES:])
    return tail if len(tail) <= LOG_TAIL_CHARS else "..." + tail[-LOG_TAIL_CHARS:]


def _missing_model_path(pod: Manifest) -> str | None:
    """What the seed found missing, told from its pod's own spec (the path is the argument after `serve`,
    the volume the one mounted over it), not from what it printed."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if "serve" not in argv[:-1]:
            continue
        path = argv[argv.index("serve") + 1]
        mounts = [m for m in container.get("volumeMounts") or [] if _under(path, m.get("mountPath", ""))]
        if not mounts:
            return f"the model path {path} does not exist in the container"
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        volume: Manifest = next(
            (v for v in (pod.get("spec") or {}).get("volumes") or [] if v.get("name") == mount["name"]), {}
        )
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        inside = "/" + posixpath.relpath(path, mount["mountPath"]).removeprefix(".")
        where = f"PersistentVolumeClaim {claim}" if claim else f"volume {mount['name']}"
        return (
            f"the model path {path} does not exist: {where} (mounted at {mount['mountPath']}) has nothing at"
            f" {inside.replace('//', '/')} (spec.model.source.pvc.path)"
        )
    return None


def _under(path: str, directory: str) -> bool:
    return bool(directory) and (path == directory or path.startswith(directory.rstrip("/") + "/"))


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
