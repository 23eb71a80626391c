from dataclasses import replace

import pytest

from stoker.controller.conditions import (
    Condition,
    Rollout,
    cache_seeded_condition,
    degraded_condition,
    merge_conditions,
    progressing_condition,
    ready_condition,
)
from stoker.controller.diagnose import Problem
from stoker.controller.objects import job_outcome


def test_transition_time_moves_only_when_the_status_flips():
    first = merge_conditions(None, [Condition("Ready", False, "RollingOut", "m")], 1, "t1")
    same = merge_conditions(first, [Condition("Ready", False, "StillRolling", "msg")], 2, "t2")
    flipped = merge_conditions(same, [Condition("Ready", True, "ReplicasReady", "m")], 2, "t3")
    assert first[0]["lastTransitionTime"] == "t1"
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "StillRolling"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_conditions_come_in_a_stable_order():
    wanted = [Condition("Degraded", False, "AsExpected", "m"), Condition("Ready", True, "ReplicasReady", "m")]
    assert [c["type"] for c in merge_conditions([], wanted, 1, "t")] == ["Ready", "Degraded"]


def test_job_outcome_reads_job_conditions():
    assert job_outcome(None) is None
    assert job_outcome({"status": {}}) == "running"
    assert job_outcome({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "succeeded"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "failed"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) == "running"


ROLLING = Rollout("llm", desired=2, total=3, updated=1, ready=1, serving=1, done=False)
DONE = Rollout("llm", desired=2, total=3, updated=3, ready=3, serving=2, done=True)
SEED = "llm-seed-2b247a7d85"
UNSCHEDULABLE = Problem(
    "Unschedulable", "Pod ns/llm-1", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", degrades_in=30
)


def every_condition() -> list[Condition]:
    """Each builder in each of its branches."""
    return [
        ready_condition(True, SEED, False, ROLLING),
        ready_condition(False, SEED, True, DONE),
        ready_condition(False, SEED, False, ROLLING),
        *(
            cache_seeded_condition(seeding, seeded, outcome, SEED, "2b247a7d85")
            for seeding, seeded, outcome in [
                (False, False, None),
                (True, True, "succeeded"),
                (True, False, "failed"),
                (True, False, "running"),
            ]
        ),
        progressing_condition(True, SEED, ROLLING),
        progressing_condition(False, SEED, ROLLING),
        progressing_condition(False, SEED, DONE),
        progressing_condition(False, SEED, ROLLING, [UNSCHEDULABLE]),
        degraded_condition(["Deployment ns/llm: forbidden (HTTP 403)"], [], None, None, False),
        degraded_condition([], [Problem("ErrImagePull", "Pod ns/llm-1", "no such image")], None, None, False),
        degraded_condition([], [], "standby pod llm-1 failed to sleep", None, False),
        degraded_condition([], [], None, "", False),
        degraded_condition([], [], None, None, True),
        degraded_condition([], [], None, None, False),
    ]


@pytest.mark.parametrize("built", every_condition(), ids=lambda c: f"{c.type}-{c.reason}")
def test_every_condition_carries_a_message(built):
    assert built.message.strip()


def test_progressing_names_the_deployment_and_counts_pods():
    rolling = progressing_condition(False, SEED, ROLLING)
    assert (rolling.status, rolling.reason) == (True, "RollingOut")
    assert "Deployment llm" in rolling.message and "1/3 pods updated, 1/3 ready" in rolling.message
    done = progressing_condition(False, SEED, DONE)
    assert (done.status, done.reason) == (False, "Converged") and "3/3 pods updated" in done.message
    waiting = progressing_condition(True, SEED, ROLLING)
    assert waiting.reason == "WaitingForSeed" and SEED in waiting.message


def test_degraded_reports_the_first_fault_to_fix():
    problem = Problem("ErrImagePull", "Pod ns/llm-1", "no such image")
    first = degraded_condition(["x: refused (HTTP 422)"], [problem], "standby", "", True)
    assert first.reason == "ApplyFailed"
    assert degraded_condition([], [problem], "standby", "", True).message == "Pod ns/llm-1: no such image"
    missed = degraded_condition(
        [], [], None, " (loadFailed: the kept cache was there but failed to load)", True
    )
    assert missed.reason == "CompileCacheMiss" and "loadFailed" in missed.message
    fine = degraded_condition([], [], None, None, False)
    assert (fine.status, fine.reason) == (False, "AsExpected")


def test_ready_and_cache_seeded_name_the_seed_job():
    assert SEED in ready_condition(True, SEED, False, ROLLING).message
    assert ready_condition(False, SEED, True, DONE).message == "2/2 replicas ready"
    failed = cache_seeded_condition(True, False, "failed", SEED, "2b247a7d85")
    assert failed.reason == "SeedFailed" and f"kubectl logs job/{SEED}" in failed.message


def test_what_keeps_pods_from_starting_stops_progress_at_once_and_degrades_after_its_grace():
    """As a Deployment's ProgressDeadlineExceeded: a `kubectl wait --for=condition=Available` sees why."""
    stuck = progressing_condition(False, SEED, ROLLING, [UNSCHEDULABLE])
    assert (stuck.status, stuck.reason) == (False, "Unschedulable")
    assert stuck.message == "Pod ns/llm-1: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert progressing_condition(True, SEED, ROLLING, [UNSCHEDULABLE]).reason == "Unschedulable"
    # A rollout that is done has nothing left to wait for.
    assert progressing_condition(False, SEED, DONE, [UNSCHEDULABLE]).reason == "Converged"
    waiting = degraded_condition([], [UNSCHEDULABLE], None, None, False)
    assert (waiting.status, waiting.reason) == (False, "AsExpected")
    assert waiting.message.startswith("No fault yet: Pod ns/llm-1 is Unschedulable")
    due = replace(UNSCHEDULABLE, degrades_in=0.0)
    degraded = degraded_condition([], [due], None, None, False)
    assert (degraded.status, degraded.reason) == (True, "Unschedulable")
