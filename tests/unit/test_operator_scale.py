"""The operator scale benchmark's pure parts: percentiles, watch events, the audit log by phase, and the
field names of the committed results that issue 24 asks for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench import operator_scale

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
REQUIRED = {
    "burstP99RatioToDeploymentController",
    "scaleP50Seconds",
    "scaleP99Seconds",
    "quietResyncWrites",
}


def test_percentile_is_nearest_rank():
    samples = [float(v) for v in range(1, 51)]  # 1 .. 50
    assert operator_scale.percentile(samples, 0.5) == 25.0  # 0-based rank round(24.5) = 24
    assert operator_scale.percentile(samples, 0.99) == 50.0
    assert operator_scale.percentile([3.0], 0.99) == 3.0
    # A scale without a reaction counts as slower than every other and leaves p99 unknown, not small.
    assert math.isinf(operator_scale.percentile([0.1] * 49 + [math.inf], 0.99))
    with pytest.raises(ValueError):
        operator_scale.percentile([], 0.5)


def test_summary_of_nothing_says_so():
    assert operator_scale.summary([])["samples"] == 0
    assert operator_scale.summary([1.0, 2.0, 3.0]) == {
        "p50": 2.0,
        "p99": 3.0,
        "mean": 2.0,
        "max": 3.0,
        "samples": 3,
    }


def test_sighting_reads_owner_replicas_and_settled():
    deployment = {
        "kind": "Deployment",
        "metadata": {
            "name": "svc-0000",
            "ownerReferences": [{"kind": "VLLMService", "name": "svc-0000", "controller": True}],
        },
        "spec": {"replicas": 2},
    }
    seen = operator_scale.sighting("MODIFIED", deployment, 1.5)
    assert (seen.owner, seen.replicas, seen.settled) == ("svc-0000", 2, False)
    service = {
        "kind": "VLLMService",
        "metadata": {"name": "svc-0001", "generation": 2},
        "spec": {"runtime": {"replicas": 3}},
        "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert operator_scale.sighting("MODIFIED", service, 2.0).settled is False  # spec not yet observed
    service["status"]["observedGeneration"] = 2
    seen = operator_scale.sighting("MODIFIED", service, 2.0)
    assert (seen.owner, seen.replicas, seen.settled) == (None, 3, True)


def test_audit_log_counts_only_the_operators_completed_requests_per_phase(tmp_path):
    def event(
        user: str, verb: str, at: str, resource: str, subresource: str = "", stage: str = "ResponseComplete"
    ):
        ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
        return json.dumps(
            {
                "stage": stage,
                "user": {"username": user},
                "verb": verb,
                "requestReceivedTimestamp": at,
                "objectRef": ref,
            }
        )

    operator = operator_scale.OPERATOR_USER
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                event(operator, "patch", "2026-01-01T00:00:01.000000Z", "deployments"),
                event(operator, "patch", "2026-01-01T00:00:02.000000Z", "vllmservices", "status"),
                event(operator, "get", "2026-01-01T00:00:02.500000Z", "deployments"),
                event(operator, "create", "2026-01-01T00:00:03.000000Z", "events", stage="ResponseStarted"),
                event("kubernetes-admin", "update", "2026-01-01T00:00:03.000000Z", "replicasets"),
                event(operator, "create", "2026-01-01T00:00:09.000000Z", "events"),
            ]
        )
        + "\n"
    )
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    phases = {"quiet-resync": (start, start + 5), "scale": (start + 5, start + 10)}
    counts = operator_scale.requests_by_phase(list(operator_scale.audit_requests(log, operator)), phases)
    assert counts["quiet-resync"]["writes"] == 2
    assert counts["quiet-resync"]["reads"] == 1
    assert counts["quiet-resync"]["writesByVerbAndResource"] == {
        "patch deployments": 1,
        "patch vllmservices/status": 1,
    }
    assert counts["quiet-resync"]["readsByVerbAndResource"] == {"get deployments": 1}
    assert counts["scale"]["writes"] == 1


def test_changed_fields_names_the_leaves_that_differ():
    before = {"observedGeneration": 1, "startup": {"recording": {"next": "a"}, "history": [1]}, "gone": 1}
    after = {
        "observedGeneration": 1,
        "startup": {"recording": {"next": "b"}, "history": [1, 2]},
        "new": {"x": 1},
    }
    assert operator_scale.changed_fields(before, after) == [
        "gone",
        "new.x",
        "startup.history",
        "startup.recording.next",
    ]
    assert operator_scale.changed_fields(after, after) == []


def test_sizes_default_to_the_issue_and_must_nest():
    args = operator_scale.parser().parse_args([])
    assert (args.burst, args.existing, args.scales, args.at) == (200, 500, 50, 1000)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("operator-scale*.json")), ids=lambda p: p.name)
def test_committed_results_carry_the_issues_fields(path):
    figures = json.loads(path.read_text())
    if "sizes" not in figures:
        pytest.skip("written by the benchmark before issue 24")
    assert figures.keys() >= REQUIRED
    assert f"rssMiBAt{figures['sizes']['at']}" in figures


def test_a_baseline_is_committed():
    figures = json.loads((RESULTS / "operator-scale-baseline.json").read_text())
    assert {*REQUIRED, "rssMiBAt1000"} <= figures.keys()
