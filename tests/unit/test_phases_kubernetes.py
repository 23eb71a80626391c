"""stoker.phases.kubernetes_phases from a pod manifest and its events, as the API returns them."""

from typing import Any

from stoker.phases import kubernetes_phases


def pod(*, scheduled: bool = True, started: str | None = "2026-11-22T05:31:12Z") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [], "containerStatuses": []}
    if scheduled:
        status["conditions"] = [
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-22T05:30:01Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-22T05:30:01Z"},
        ]
    state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    if started is not None:
        state = {"running": {"startedAt": started}}
    status["containerStatuses"] = [
        {"name": "sidecar", "state": {"running": {"startedAt": "2026-11-22T05:30:02Z"}}},
        {"name": "vllm", "state": state},
    ]
    return {
        "metadata": {"name": "llama-8b-0", "creationTimestamp": "2026-11-22T05:30:00Z"},
        "spec": {"containers": [{"name": "vllm"}, {"name": "sidecar"}]},
        "status": status,
    }


def event(reason: str, message: str, at: str, container: str = "vllm") -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "involvedObject": {
            "kind": "Pod",
            "name": "llama-8b-0",
            "fieldPath": f"spec.containers{{{container}}}",
        },
        "firstTimestamp": at,
        "lastTimestamp": at,
        "eventTime": None,
    }


PULL_EVENTS = [
    event("Scheduled", "Successfully assigned default/llama-8b-0 to gpu-1", "2026-11-22T05:30:01Z"),
    event("Pulling", 'Pulling image "vllm/vllm-openai:v0.22.1"', "2026-11-22T05:30:02Z"),
    event(
        "Pulled",
        'Successfully pulled image "vllm/vllm-openai:v0.22.1" in 1m2.5s (1m3.1s including waiting). '
        "Image size: 9876543210 bytes.",
        "2026-11-22T05:31:05Z",
    ),
    event(
        "Pulled", 'Container image "busybox" already present on machine', "2026-11-22T05:30:02Z", "sidecar"
    ),
    event("Started", "Started container vllm", "2026-11-22T05:31:12Z"),
]


def test_pulled_image_uses_the_kubelets_figure() -> None:
    phases = kubernetes_phases(pod(), PULL_EVENTS)
    assert phases == {"scheduling": 1.0, "imagePull": 62.5, "containerStart": 8.5}
    assert sum(phases.values()) == 72.0  # created → startedAt


def test_image_already_present() -> None:
    events = [event("Pulled", 'Container image "vllm/vllm-openai:v0.22.1" already present on machine', "x")]
    events[0]["firstTimestamp"] = events[0]["lastTimestamp"] = "2026-11-22T05:30:02Z"
    assert kubernetes_phases(pod(), events) == {"scheduling": 1.0, "imagePull": 0.0, "containerStart": 71.0}


def test_pull_time_from_event_timestamps_when_the_message_has_none() -> None:
    events = [
        event("Pulling", 'Pulling image "vllm"', "2026-11-22T05:30:02Z"),
        event("Pulled", 'Successfully pulled image "vllm"', "2026-11-22T05:30:40Z"),
    ]
    assert kubernetes_phases(pod(), events)["imagePull"] == 38.0


def test_other_containers_pick_their_own_pull() -> None:
    phases = kubernetes_phases(pod(), PULL_EVENTS, container="sidecar")
    assert phases == {"scheduling": 1.0, "imagePull": 0.0, "containerStart": 1.0}


def test_events_expired() -> None:
    assert kubernetes_phases(pod(), []) == {"scheduling": 1.0, "containerStart": 71.0}


def test_pending_pod() -> None:
    assert kubernetes_phases(pod(scheduled=False, started=None), []) == {}
    assert kubernetes_phases(pod(started=None), PULL_EVENTS[:2]) == {"scheduling": 1.0}
