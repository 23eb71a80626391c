"""The parser on logs of releases after 0.22: synthetic fixtures written from the releases' format strings."""

from pathlib import Path

import pytest

from stoker.phases import parse_log, summarize

SYNTHETIC = Path(__file__).parent / "data" / "phases" / "synthetic"


def read(name: str) -> list[str]:
    return (SYNTHETIC / name).read_text(encoding="utf-8").split("\n")


@pytest.mark.parametrize(
    ("name", "version", "phases", "cache", "reason"),
    [
        (
            "vllm-0.26.0-v2-hit.log",
            "0.26.0",
            {"bootstrap": 12, "modelInfo": 0.5, "engineStart": 3.5, "weightLoad": 10, "compileLoad": 2}
            | {"profiling": 3, "graphCapture": 2, "jitWarmup": 1, "apiReady": 1},
            "hit",
            None,
        ),
        (
            "vllm-0.32.0-load-failed.log",
            "0.32.0",
            {
                "bootstrap": 10,
                "modelInfo": 0.2,
                "engineStart": 3.8,
                "weightLoad": 6,
                "dynamo": 4,
                "compile": 11,
            }
            | {"profiling": 3, "jitWarmup": 14, "graphCapture": 2, "apiReady": 0.5},
            "miss",
            "loadFailed",
        ),
        (
            "vllm-0.33.0-json.log",
            "0.33.0",
            {"bootstrap": 11.25, "modelInfo": 0.25, "engineStart": 3.5, "weightLoad": 6, "compileLoad": 1}
            | {"profiling": 3, "jitWarmup": 0.9, "graphCapture": 1.6, "apiReady": 0.75},
            "hit",
            None,
        ),
    ],
)
def test_phases_of_newer_releases(
    name: str, version: str, phases: dict[str, float], cache: str, reason: str | None
) -> None:
    timeline = parse_log(read(name))
    assert timeline.engine_version == version
    assert list(timeline.phases) == list(phases)
    assert timeline.phases == pytest.approx(phases, abs=0.001)
    assert timeline.total_seconds == pytest.approx(sum(phases.values()), abs=0.001)
    assert (timeline.compile_cache, timeline.compile_cache_reason) == (cache, reason)


def test_the_told_version_is_used_until_the_log_names_its_own() -> None:
    lines = [line for line in read("vllm-0.26.0-v2-hit.log") if "version" not in line]
    told = parse_log(lines, engine_version="0.26.0")
    untold = parse_log(lines)
    assert told.engine_version == "0.26.0" and "jitWarmup" in told.phases
    # Without a version the tolerant layout has no silent warm-up: that second goes to apiReady.
    assert untold.engine_version is None and "jitWarmup" not in untold.phases
    assert untold.total_seconds == told.total_seconds == 35.0
    assert parse_log(read("vllm-0.26.0-v2-hit.log"), engine_version="0.33.0").engine_version == "0.26.0"


def test_a_load_failure_is_a_miss_with_its_reason_in_the_event_line() -> None:
    assert summarize(parse_log(read("vllm-0.32.0-load-failed.log"))) == (
        "Started in 54.5 s (weights 6.0 s, compile 15.0 s, cache miss (the kept cache failed to load))"
    )
