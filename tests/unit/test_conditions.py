from stoker.controller.conditions import Condition, merge_conditions
from stoker.controller.reconcile import job_outcome


def test_transition_time_moves_only_when_the_status_flips():
    first = merge_conditions(None, [Condition("Ready", False, "RollingOut")], 1, "t1")
    same = merge_conditions(first, [Condition("Ready", False, "StillRolling", "msg")], 2, "t2")
    flipped = merge_conditions(same, [Condition("Ready", True, "ReplicasReady")], 2, "t3")
    assert first[0]["lastTransitionTime"] == "t1"
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "StillRolling"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["status"] == "True"


def test_conditions_come_in_a_stable_order():
    wanted = [Condition("Degraded", False, "AsExpected"), Condition("Ready", True, "ReplicasReady")]
    assert [c["type"] for c in merge_conditions([], wanted, 1, "t")] == ["Ready", "Degraded"]


def test_job_outcome_reads_job_conditions():
    assert job_outcome(None) is None
    assert job_outcome({"status": {}}) == "running"
    assert job_outcome({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "succeeded"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "failed"
    assert job_outcome({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) == "running"
