"""The startup recorder's pure part: the ready gap from the engine's ready line to the pod's Ready."""

import datetime as dt

from stoker.controller.startups import ready_gap_seconds

READY_LINE_AT = dt.datetime(2026, 11, 26, 10, 0, 3, 400_000, tzinfo=dt.UTC)


def pod(ready: str, at: str) -> dict:
    return {"status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": at}]}}


def test_the_gap_runs_from_the_ready_line_to_the_ready_condition():
    assert ready_gap_seconds(READY_LINE_AT, pod("True", "2026-11-26T10:00:05Z")) == 1.6


def test_whole_seconds_of_the_condition_never_make_it_negative():
    # Ready in the same second as the line: the condition's time, cut to the second, reads earlier.
    assert ready_gap_seconds(READY_LINE_AT, pod("True", "2026-11-26T10:00:03Z")) == 0.0


def test_no_gap_without_both_times():
    assert ready_gap_seconds(None, pod("True", "2026-11-26T10:00:05Z")) is None
    assert ready_gap_seconds(READY_LINE_AT, pod("False", "2026-11-26T10:00:05Z")) is None
    assert ready_gap_seconds(READY_LINE_AT, {"status": {}}) is None
