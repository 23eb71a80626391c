"""The ready gap: from the engine's ready line to the pod's Ready (status.startup.*.readyGapSeconds)."""

import datetime as dt

import pytest

from stoker.phases import ready_gap_seconds

READY_LINE_AT = dt.datetime(2026, 11, 26, 10, 0, 3, 400_000, tzinfo=dt.UTC)


def pod(ready: str, at: str) -> dict:
    return {"status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": at}]}}


def test_the_gap_runs_from_the_ready_line_to_the_ready_condition():
    assert ready_gap_seconds(pod("True", "2026-11-26T10:00:05Z"), READY_LINE_AT) == pytest.approx(1.6)


def test_whole_seconds_of_the_condition_never_make_it_negative():
    # Ready in the same second as the line: the condition's time, cut to the second, reads earlier.
    assert ready_gap_seconds(pod("True", "2026-11-26T10:00:03Z"), READY_LINE_AT) == 0.0


def test_no_gap_without_both_times():
    assert ready_gap_seconds(pod("True", "2026-11-26T10:00:05Z"), None) is None
    assert ready_gap_seconds(pod("False", "2026-11-26T10:00:05Z"), READY_LINE_AT) is None
    assert ready_gap_seconds({"status": {}}, READY_LINE_AT) is None
