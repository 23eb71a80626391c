"""Kubernetes' phases of a start, from a pod (as the API returns it) and the pod's events: those before the
vLLM process starts, and the one after its engine is ready, until the pod is."""

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# After the engine's ready line, until the pod's Ready condition: what the kubelet's probes add.
READY_GAP_PHASE = "podReady"
KUBERNETES_PHASES = ("scheduling", "imagePull", "containerStart", READY_GAP_PHASE)

# kubelet: `Successfully pulled image "vllm/vllm-openai:v0.22.1" in 1m2.5s (1m3s including waiting). ...`
_PULLED_IN = re.compile(
    r"Successfully pulled image .* in (?P<duration>(?:\d+(?:\.\d+)?(?:h|m|s|ms|us|µs|ns))+)"
)
_ALREADY_PRESENT = "already present on machine"
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def kubernetes_phases(
    pod: Mapping[str, Any], events: list[dict[str, Any]], *, container: str | None = None
) -> dict[str, float]:
    """scheduling (created → PodScheduled), imagePull, containerStart (→ the container's startedAt).

    `container` defaults to the pod's first container. A phase whose bounds are not known yet is left
    out; the three add up to startedAt - creationTimestamp when all are present.
    """
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    name = container if container is not None else containers[0].get("name")

    created = api_timestamp(metadata.get("creationTimestamp"))
    scheduled = _scheduled_at(status)
    started = _started_at(status, name)
    pull = _image_pull_seconds(events, metadata.get("name"), name)

    phases: dict[str, float] = {}
    if created is not None and scheduled is not None:
        phases["scheduling"] = round(max(0.0, scheduled - created), 3)
    if pull is not None:
        phases["imagePull"] = round(pull, 3)
    if scheduled is not None and started is not None:
        phases["containerStart"] = round(max(0.0, started - scheduled - (pull or 0.0)), 3)
    return phases


def ready_gap_seconds(pod: Mapping[str, Any], ready_at: datetime | None) -> float | None:
    """Seconds from the engine's ready line (`ready_at`, StartupTimeline.ready_at) to the pod's Ready
    condition. Both come from the node's clock; the condition's whole seconds may put it up to 1 s early,
    so never < 0. None unless the pod is Ready and the line's time is known."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            became_ready = api_timestamp(condition.get("lastTransitionTime"))
            if ready_at is None or became_ready is None:
                return None
            return max(0.0, became_ready - ready_at.timestamp())
    return None


def _scheduled_at(status: Mapping[str, Any]) -> float | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return api_timestamp(condition.get("lastTransitionTime"))
    return None


def _started_at(status: Mapping[str, Any], name: str | None) -> float | None:
    for container_status in status.get("containerStatuses") or []:
        if container_status.get("name") != name:
            continue
        state = container_status.get("state") or {}
        for kind in ("running", "terminated"):
            started = (state.get(kind) or {}).get("startedAt")
            if started is not None:
                return api_timestamp(started)
    return None


def _image_pull_seconds(events: list[dict[str, Any]], pod_name: str | None, name: str | None) -> float | None:
    """The first pull of the container's image: the kubelet's own figure, else Pulling → Pulled."""
    field_path = f"spec.containers{{{name}}}"
    pulling_at: float | None = None
    for event in sorted(events, key=lambda event: _event_time(event) or 0.0):
        involved = event.get("involvedObject") or {}
        if pod_name is not None and involved.get("name", pod_name) != pod_name:
            continue
        if involved.get("fieldPath", field_path) != field_path:
            continue
        reason = event.get("reason")
        message = event.get("message") or ""
        if reason == "Pulling" and pulling_at is None:
            pulling_at = _event_time(event)
        elif reason == "Pulled":
            if _ALREADY_PRESENT in message:
                return 0.0
            pulled_in = _PULLED_IN.search(message)
            if pulled_in is not None:
                return _go_duration_seconds(pulled_in.group("duration"))
            pulled_at = _event_time(event)
            if pulling_at is not None and pulled_at is not None:
                return max(0.0, pulled_at - pulling_at)
    return None


def _go_duration_seconds(duration: str) -> float:
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _GO_DURATION_PART.findall(duration))


def _event_time(event: Mapping[str, Any]) -> float | None:
    for key in ("eventTime", "firstTimestamp", "lastTimestamp"):
        moment = api_timestamp(event.get(key))
        if moment is not None:
            return moment
    return api_timestamp((event.get("metadata") or {}).get("creationTimestamp"))


def api_timestamp(value: object) -> float | None:
    """RFC3339 from the API (`...Z`, optional fraction), or a datetime from a client that parsed it."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, str) and value:
        moment = datetime.fromisoformat(value)
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return None
