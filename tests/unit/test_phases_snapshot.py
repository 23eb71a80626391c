"""What the phase parser takes from engine_init's lines (stoker.phases.snapshot): restored or started and why,
bounded, and nothing from lines that are not engine_init's."""

from __future__ import annotations

import json

import pytest

from stoker.inpod.engine_init import LINE_PREFIX
from stoker.phases import parse_log, summarize
from stoker.phases.snapshot import MAXIMUM_LINE, REASON_LENGTH, SnapshotStart

SERVER = "(APIServer pid=7) INFO 11-29 10:00:05 [api_server.py:1] Starting vLLM server on http://0.0.0.0:8000"
FIRST = "(APIServer pid=7) INFO 11-29 10:00:00 [utils.py:1] vLLM API server version 0.26.0"


def said(event: str, **facts: object) -> str:
    return LINE_PREFIX + json.dumps({"event": event, **facts})


def test_a_restored_start_is_restored_with_its_seconds_and_not_a_start() -> None:
    timeline = parse_log([said("restoring"), said("restored", pid=9, seconds=2.345)], engine_version="0.26.0")
    assert timeline.snapshot == SnapshotStart("restored", restore_seconds=2.345)
    assert timeline.to_json_dict()["snapshot"] == "restored"
    assert timeline.to_json_dict()["snapshotRestoreSeconds"] == 2.345
    assert summarize(timeline) == "Restored from the node's snapshot in 2.3 s"


def test_a_start_says_why_it_was_not_restored() -> None:
    lines = [said("starting", reason="restore failed: criu restore failed 3 times"), FIRST, SERVER]
    timeline = parse_log(lines, engine_version="0.26.0")
    assert timeline.snapshot == SnapshotStart("started", reason="restore failed: criu restore failed 3 times")
    assert timeline.ready and timeline.to_json_dict()["snapshotReason"].startswith("restore failed")
    assert summarize(timeline).endswith("; not restored: restore failed: criu restore failed 3 times")


def test_a_log_without_engine_init_has_no_snapshot_fields() -> None:
    timeline = parse_log([FIRST, SERVER], engine_version="0.26.0")
    assert timeline.snapshot is None
    assert "snapshot" not in timeline.to_json_dict()


@pytest.mark.parametrize(
    "line",
    [
        LINE_PREFIX + "{not json",
        LINE_PREFIX + "[1, 2]",
        said("restored", seconds="soon"),
        said("restored", seconds=-1),
        said("starting", reason=7),
        said("restored", seconds=1, padding="x" * MAXIMUM_LINE),
        "   " + said("restored", seconds=1),  # not at the line's start: not engine_init's
        "(APIServer pid=7) " + said("restored", seconds=1),
    ],
)
def test_what_is_not_engine_init_s_own_line_is_skipped(line: str) -> None:
    assert parse_log([line], engine_version="0.26.0").snapshot is None


def test_a_reason_is_bounded_and_the_first_outcome_stands() -> None:
    lines = [said("starting", reason="r" * 1000), said("restored", seconds=1.0)]  # engine_init cuts at 1000
    start = parse_log(lines, engine_version="0.26.0").snapshot
    assert start is not None and start.outcome == "started" and start.reason == "r" * REASON_LENGTH
