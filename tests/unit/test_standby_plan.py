"""The standby planner: which serving pods to adopt, wake, demote and put to sleep."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from stoker.standby import ServingPod, StandbyPlan, plan_standby, replacement_delay

NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
DRAIN = 30.0


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def pod(name: str, age: float = 600, **fields: Any) -> ServingPod:
    """A Ready pod with an address, created `age` seconds before NOW."""
    fields.setdefault("address", "10.0.0.1")
    return ServingPod(name=name, created=ago(age), **fields)


def active(name: str, age: float = 600, **fields: Any) -> ServingPod:
    return pod(name, age, role="active", **fields)


def standby(name: str, since: float = 300, asleep: bool = True, **fields: Any) -> ServingPod:
    return pod(name, role="standby", asleep=asleep, standby_since=ago(since), **fields)


def plan(pods: list[ServingPod], wanted: int, drain: float = DRAIN) -> StandbyPlan:
    return plan_standby(pods, wanted, NOW, drain)


def names(pods: list[ServingPod]) -> list[str]:
    return [p.name for p in pods]


# ------------------------------------------------------------------------------------------------ adopt


def test_pods_without_a_role_are_adopted_and_count_as_active() -> None:
    result = plan([pod("legacy-a"), pod("legacy-b"), active("a"), standby("s")], wanted=3)
    assert names(result.adopt) == ["legacy-a", "legacy-b"]
    assert result.shortage == 0
    assert result.demote == [] and result.wake_candidates == [] and result.sleep == []
    assert result.recheck_after is None


def test_balanced_pool_needs_nothing() -> None:
    result = plan([active("a"), active("b"), standby("s1"), standby("s2")], wanted=2)
    assert result == StandbyPlan()


# ------------------------------------------------------------------------------------------------- wake


def test_shortage_orders_wake_candidates_current_key_then_awake_then_longest_standby() -> None:
    pods = [
        active("a"),
        standby("old-awake", since=5, asleep=False, current=False),
        standby("old-asleep", since=900, current=False),
        standby("asleep-young", since=100),
        standby("asleep-old", since=800),
        standby("awake-draining", since=10, asleep=False),
    ]
    result = plan(pods, wanted=3)
    assert result.shortage == 2
    assert names(result.wake_candidates) == [
        "awake-draining",
        "asleep-old",
        "asleep-young",
        "old-awake",
        "old-asleep",
    ]


def test_wake_candidates_without_standby_since_fall_back_to_creation_time() -> None:
    pods = [
        pod("young", age=100, role="standby", asleep=True),
        pod("old", age=1000, role="standby", asleep=True),
        standby("since-middle", since=500),
    ]
    result = plan(pods, wanted=1)
    assert result.shortage == 1
    assert names(result.wake_candidates) == ["old", "since-middle", "young"]


def test_shortage_counts_from_ready_active_pods_and_is_never_negative() -> None:
    assert plan([], wanted=2).shortage == 2
    assert plan([active("a"), standby("s")], wanted=0).shortage == 0
    assert plan([active("a"), active("b"), active("c")], wanted=1).shortage == 0
    # Not Ready, or no address yet: neither counts nor is touched.
    result = plan([active("a", ready=False), active("b", address=None), standby("s")], wanted=1)
    assert result.shortage == 1
    assert names(result.wake_candidates) == ["s"]


def test_shortage_without_standby_pods_has_no_candidates() -> None:
    result = plan([active("a")], wanted=4)
    assert result.shortage == 3
    assert result.wake_candidates == []


def test_no_wake_candidate_is_slept_while_short() -> None:
    # Both awake and past their drain: either may be woken (the first can fail), so neither sleeps yet.
    pods = [standby("first", since=200, asleep=False), standby("second", since=100, asleep=False)]
    result = plan(pods, wanted=1)
    assert result.shortage == 1
    assert names(result.wake_candidates) == ["first", "second"]
    assert result.sleep == []
    assert result.recheck_after == DRAIN


# ----------------------------------------------------------------------------------------------- demote


def test_surplus_demotes_old_key_first_then_youngest() -> None:
    pods = [
        active("oldest", age=1000),
        active("young", age=100),
        active("middle", age=500),
        active("old-key-young", age=50, current=False),
        active("old-key-old", age=2000, current=False),
        standby("s"),
    ]
    result = plan(pods, wanted=2)
    assert names(result.demote) == ["old-key-young", "old-key-old", "young"]
    assert result.shortage == 0
    assert result.wake_candidates == []


@pytest.mark.parametrize("surplus", [1, 2, 3])
def test_demote_count_equals_surplus(surplus: int) -> None:
    pods = [active(f"a{i}", age=100 * (i + 1)) for i in range(5)]
    result = plan(pods, wanted=5 - surplus)
    assert len(result.demote) == surplus
    assert names(result.demote) == [f"a{i}" for i in range(surplus)]  # youngest first


def test_demote_includes_adopted_pods() -> None:
    result = plan([pod("legacy", age=10), active("a", age=500)], wanted=1)
    assert names(result.adopt) == ["legacy"]
    assert names(result.demote) == ["legacy"]


def test_demote_sets_recheck_after_to_at_most_the_drain() -> None:
    result = plan([active("a", age=100), active("b", age=200)], wanted=1)
    assert names(result.demote) == ["a"]
    assert result.recheck_after == DRAIN
    # A standby whose drain ends sooner keeps the earlier recheck.
    result = plan([active("a", age=100), active("b", age=200), standby("s", since=20, asleep=False)], 1)
    assert result.recheck_after == pytest.approx(DRAIN - 20)
    assert result.recheck_after is not None and result.recheck_after <= DRAIN


# ---------------------------------------------------------------------------------------- sleep capable


def test_pods_not_sleep_capable_are_never_demoted() -> None:
    pods = [
        active("incapable-young", age=10, sleep_capable=False),
        active("incapable-old-key", age=20, current=False, sleep_capable=False),
        active("capable", age=1000),
    ]
    result = plan(pods, wanted=0)
    assert names(result.demote) == ["capable"]
    assert result.shortage == 0


def test_surplus_of_incapable_pods_demotes_nothing() -> None:
    result = plan([active("a", sleep_capable=False), active("b", sleep_capable=False)], wanted=1)
    assert result.demote == []
    assert result.recheck_after is None


def test_pods_not_sleep_capable_are_never_woken_nor_slept() -> None:
    pods = [
        standby("incapable-awake", since=900, asleep=False, sleep_capable=False),
        standby("incapable-asleep", since=900, sleep_capable=False),
        standby("capable", since=10),
    ]
    result = plan(pods, wanted=2)
    assert result.shortage == 2
    assert names(result.wake_candidates) == ["capable"]
    assert result.sleep == []
    assert result.recheck_after is None


# -------------------------------------------------------------------------------------------- ignored


def test_not_ready_or_addressless_pods_are_ignored() -> None:
    pods = [
        pod("unready-legacy", ready=False),
        pod("addressless-legacy", address=None),
        standby("unready-standby", asleep=False, since=900, ready=False),
        standby("addressless-standby", asleep=False, since=900, address=None),
        active("unready-active", age=1, ready=False),
        active("a"),
    ]
    result = plan(pods, wanted=1)
    assert result == StandbyPlan()
    result = plan(pods, wanted=3)
    assert result.shortage == 2
    assert result.wake_candidates == [] and result.adopt == [] and result.sleep == []


# -------------------------------------------------------------------------------------------------- sleep


def test_awake_standby_sleeps_only_after_the_drain() -> None:
    pods = [
        active("a"),
        standby("drained", since=DRAIN, asleep=False),
        standby("long-drained", since=10 * DRAIN, asleep=False),
        standby("draining", since=DRAIN - 12, asleep=False),
        standby("just-demoted", since=DRAIN - 25, asleep=False),
        standby("asleep", since=1),
    ]
    result = plan(pods, wanted=1)
    assert names(result.sleep) == ["drained", "long-drained"]
    # The earliest drain still running ends in 12 s.
    assert result.recheck_after == pytest.approx(12)
    assert result.demote == [] and result.shortage == 0


def test_standby_asleep_is_left_alone() -> None:
    result = plan([active("a"), standby("s", since=10_000)], wanted=1)
    assert result.sleep == []
    assert result.recheck_after is None


def test_zero_drain_sleeps_at_once() -> None:
    result = plan([standby("s", since=0, asleep=False)], wanted=0, drain=0)
    assert names(result.sleep) == ["s"]
    assert result.recheck_after is None


def test_standby_without_standby_since_waits_a_full_drain() -> None:
    result = plan([pod("s", role="standby", asleep=False)], wanted=0)
    assert result.sleep == []
    assert result.recheck_after == DRAIN


def test_roles_other_than_standby_count_as_active() -> None:
    result = plan([pod("odd", role="something-else"), standby("s")], wanted=1)
    assert result.shortage == 0
    assert result.adopt == []  # it has a role, so it is not adopted


def test_no_wake_candidate_is_also_slept() -> None:
    # shortage 1: "best" (current key, asleep) comes first; "fallback" (old key, awake, drained) second.
    pods = [standby("best", since=100), standby("fallback", since=10 * DRAIN, asleep=False, current=False)]
    result = plan(pods, wanted=1)
    assert names(result.wake_candidates) == ["best", "fallback"]
    assert not set(names(result.wake_candidates)) & set(names(result.sleep))


def test_replacements_of_failing_pods_slow_down_to_a_bound():
    delays = [replacement_delay(failures) for failures in range(1, 10)]
    assert delays[:4] == [5.0, 10.0, 20.0, 40.0]
    assert max(delays) == 300.0 and delays == sorted(delays)
    # 120 s of pods that never sleep: at most 5 replacements (at 0, 5, 15, 35 and 75 s), not 23.
    at, count = 0.0, 0
    while at <= 120:
        count += 1
        at += replacement_delay(count)
    assert count == 5
