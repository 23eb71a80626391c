"""Prometheus metrics on the operator's own port. Labels stay bounded: phases, roles and results, and for
the expected-vs-observed gauges one series per VLLMService and phase, removed with the object."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from stoker.phases.weights import WeightsLoad

STARTUP_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200)

RECONCILES = Counter("stoker_reconcile_total", "Reconciles by result.", ["result"])
RECONCILE_SECONDS = Histogram(
    "stoker_reconcile_duration_seconds",
    "Time one reconcile took.",
    ["result"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
URGENT_WAIT_SECONDS = Histogram(
    "stoker_workqueue_urgent_wait_seconds",
    "Time a new or edited VLLMService waited in the work queue for a free worker.",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STARTUP_PHASE_SECONDS = Histogram(
    "stoker_startup_phase_seconds",
    "Seconds each startup phase took, per replica or seed run.",
    ["phase", "role"],
    buckets=STARTUP_BUCKETS,
)
STARTUP_TOTAL_SECONDS = Histogram(
    "stoker_startup_total_seconds",
    "Seconds from process start to a serving engine.",
    ["namespace", "name", "role"],
    buckets=STARTUP_BUCKETS,
)
STARTUP_READY_GAP_SECONDS = Histogram(
    "stoker_startup_ready_gap_seconds",
    "Seconds from a serving engine's `Starting vLLM server on` log line to its pod's Ready condition (the"
    " readiness probes' delay; the condition has whole seconds).",
    ["namespace", "name"],
    buckets=(0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 60),
)
COMPILE_CACHE_RESULTS = Counter(
    "stoker_compile_cache_total",
    "Startups by compile-cache outcome (hit, miss, none).",
    ["namespace", "name", "result", "role"],
)
WEIGHTS_SOURCES = Counter(
    "stoker_weights_source_total",
    "Serving starts with coldStart.peerWeights by where their weights came from (peer, storage).",
    ["namespace", "name", "source"],
)
PEER_TRANSFER_GIGABYTES_PER_SECOND = Histogram(
    "stoker_peer_transfer_gigabytes_per_second",
    "Rate of each weights transfer from a peer replica (coldStart.peerWeights), all ranks together.",
    ["namespace", "name"],
    buckets=(0.5, 1, 2, 5, 10, 20, 50, 100, 200),
)
STANDBY_WAKE_SECONDS = Histogram(
    "stoker_standby_wake_seconds",
    "Seconds from POST /wake_up to a served completion, per woken standby pod.",
    ["namespace", "name"],
    buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30),
)
STANDBY_TRANSITIONS = Counter(
    "stoker_standby_transitions_total",
    "Standby transitions by kind (demote, sleep, wake) and result (ok, failed).",
    ["transition", "result"],
)
STARTUP_EXPECTED_SECONDS = Gauge(
    "stoker_startup_expected_seconds",
    "Predicted seconds of the next serving start per phase (phase=total: their sum), as in"
    " status.startup.expected.",
    ["namespace", "name", "phase"],
)
STARTUP_OBSERVED_SECONDS = Gauge(
    "stoker_startup_observed_seconds",
    "Seconds the last serving start took per engine phase (phase=total: process start to serving).",
    ["namespace", "name", "phase"],
)
STARTUP_UNTIL_SERVING_SECONDS = Gauge(
    "stoker_startup_until_serving_seconds",
    "Expected seconds from a new serving pod's creation until it serves (status.startup.expected"
    ".untilServingSeconds): the predicted engine phases plus the last serving start's Kubernetes phases and"
    " readiness gap. An autoscaler's scale-up lead time.",
    ["namespace", "name"],
)

NODE_WARMING_WANTED_BYTES = Gauge(
    "stoker_node_warming_wanted_bytes",
    "Bytes a VLLMService with coldStart.nodeWarming keeps in the page cache of each of its nodes (the"
    " checkpoint and the import pages), as in status.nodeWarming.wantedBytes.",
    ["namespace", "service"],
)
NODE_WARMING_NODES = Gauge(
    "stoker_node_warming_nodes",
    "Nodes of a VLLMService's node warmer by state: warm (everything wanted resident) or cold.",
    ["namespace", "service", "state"],
)

# The phases each gauge has a series of, per VLLMService, so that phases that stop applying (and the
# object, once deleted) lose their series.
_PER_SERVICE_GAUGES = (STARTUP_EXPECTED_SECONDS, STARTUP_OBSERVED_SECONDS)
_labelled: dict[tuple[Gauge, tuple[str, str]], set[str]] = {}
_labelled_guard = threading.Lock()


def set_startup_seconds(gauge: Gauge, service: tuple[str, str], seconds: dict[str, float]) -> None:
    """One VLLMService's series of `gauge`: exactly the phases in `seconds`."""
    with _labelled_guard:
        before = _labelled.get((gauge, service), set())
        for phase in before - seconds.keys():
            gauge.remove(*service, phase)
        for phase, value in seconds.items():
            gauge.labels(*service, phase).set(value)
        if seconds:
            _labelled[(gauge, service)] = set(seconds)
        else:
            _labelled.pop((gauge, service), None)


def set_until_serving_seconds(service: tuple[str, str], seconds: float | None) -> None:
    """One VLLMService's series of STARTUP_UNTIL_SERVING_SECONDS, none while there is no prediction."""
    if seconds is not None:
        STARTUP_UNTIL_SERVING_SECONDS.labels(*service).set(seconds)
        return
    with contextlib.suppress(KeyError):  # none was set
        STARTUP_UNTIL_SERVING_SECONDS.remove(*service)


def set_node_warming(service: tuple[str, str], document: dict[str, Any] | None) -> None:
    """One VLLMService's node warming series from its status.nodeWarming; none without it."""
    if document is None:
        for gauge, labels in (
            (NODE_WARMING_WANTED_BYTES, [service]),
            (NODE_WARMING_NODES, [(*service, "warm"), (*service, "cold")]),
        ):
            for values in labels:
                with contextlib.suppress(KeyError):  # none was set
                    gauge.remove(*values)
        return
    wanted = document.get("wantedBytes")
    if wanted is not None:
        NODE_WARMING_WANTED_BYTES.labels(*service).set(wanted)
    else:
        with contextlib.suppress(KeyError):
            NODE_WARMING_WANTED_BYTES.remove(*service)
    warm, desired = int(document.get("warmNodes") or 0), int(document.get("desiredNodes") or 0)
    NODE_WARMING_NODES.labels(*service, "warm").set(warm)
    NODE_WARMING_NODES.labels(*service, "cold").set(max(0, desired - warm))


# The per-service histograms and counter, with the label values each may carry after namespace and name.
_ROLES = [("serve",), ("seed",)]
_PER_SERVICE_SERIES = (
    (STARTUP_TOTAL_SECONDS, _ROLES),
    (STARTUP_READY_GAP_SECONDS, [()]),
    (STANDBY_WAKE_SECONDS, [()]),
    (COMPILE_CACHE_RESULTS, [(result, *role) for result in ("hit", "miss", "none") for role in _ROLES]),
    (WEIGHTS_SOURCES, [("peer",), ("storage",)]),
    (PEER_TRANSFER_GIGABYTES_PER_SECOND, [()]),
)


def forget_service(namespace: str, name: str) -> None:
    for gauge in _PER_SERVICE_GAUGES:
        set_startup_seconds(gauge, (namespace, name), {})
    set_until_serving_seconds((namespace, name), None)
    set_node_warming((namespace, name), None)
    for metric, label_sets in _PER_SERVICE_SERIES:
        for values in label_sets:
            with contextlib.suppress(KeyError):  # none was observed
                metric.remove(namespace, name, *values)


def observe_weights(service: tuple[str, str], weights: WeightsLoad | None) -> None:
    """A start's weights source (coldStart.peerWeights), and its peer transfer's rate."""
    if weights is None:
        return
    WEIGHTS_SOURCES.labels(*service, weights.source).inc()
    rate = weights.gigabytes_per_second
    if rate is not None:
        PEER_TRANSFER_GIGABYTES_PER_SECOND.labels(*service).observe(rate)
