"""stoker.phases.parse_log on real vLLM 0.22.1 logs, on hand-written variants, and on transformed copies.

The transformed copies (other clocks, DEBUG paths, colour, CRLF, progress bars, cuts, appended failures)
apply to every real log the same way, so nothing here depends on a particular fixture's content beyond its
table of marker times, which was read off the log by hand.
"""

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from stoker.phases import ENGINE_PHASES, StartupTimeline, parse_log, summarize

DATA = Path(__file__).parent / "data" / "phases"
FIXTURES = DATA / "vllm-0.22.1-h100"

# Seconds since process start of the first occurrence of each phase's end marker, read off each log.
FIXTURE_MARKERS: dict[str, tuple[dict[str, float], str]] = {
    "baseline.log": (
        {
            "bootstrap": 15.926,
            "modelInfo": 33.452,
            "engineStart": 48.340,
            "weightLoad": 57.582,
            "dynamo": 63.703,
            "compile": 75.601,
            "profiling": 85.220,
            "graphCapture": 89.914,
            "apiReady": 90.558,
        },
        "miss",
    ),
    "streamer-cold-cache.log": (
        {
            "bootstrap": 16.346,
            "modelInfo": 37.043,
            "engineStart": 53.804,
            "weightLoad": 63.678,
            "dynamo": 69.833,
            "compile": 81.315,
            "profiling": 92.354,
            "graphCapture": 97.550,
            "apiReady": 98.253,
        },
        "miss",
    ),
    "seed.log": (
        {
            "bootstrap": 20.952,
            "modelInfo": 41.102,
            "engineStart": 60.073,
            "weightLoad": 71.365,
            "dynamo": 78.480,
            "compile": 96.183,
            "profiling": 110.034,
            "graphCapture": 111.564,
            "apiReady": 112.412,
        },
        "miss",
    ),
    "seeded-serving.log": (
        {
            "bootstrap": 19.870,
            "modelInfo": 19.881,
            "engineStart": 38.901,
            "weightLoad": 49.214,
            "dynamo": 52.441,
            "compileLoad": 54.035,
            "profiling": 64.300,
            "graphCapture": 65.571,
            "apiReady": 66.149,
        },
        "hit",
    ),
}

RELATIVE_PREFIX = re.compile(r"^\[ *(\d+(?:\.\d+)?)\] ")
LOG_FILE = re.compile(r"\[([\w.]+\.py):(\d+)\] ")
CONTAINER_START = datetime(2026, 11, 22, 4, 40, 0, 500_000, tzinfo=UTC)


def read_lines(path: Path) -> list[str]:
    # Split on "\n" only, as the CLI does: "\r" belongs to the line.
    return path.read_bytes().decode("utf-8").split("\n")


def seconds_of(line: str) -> float:
    found = RELATIVE_PREFIX.match(line)
    return float(found.group(1)) if found is not None else 0.0


def durations(marker_times: dict[str, float], start: float = 0.0) -> dict[str, float]:
    result: dict[str, float] = {}
    previous = start
    for name in ENGINE_PHASES:
        if name in marker_times:
            result[name] = marker_times[name] - previous
            previous = marker_times[name]
    return result


def assert_consistent(timeline: StartupTimeline) -> None:
    assert list(timeline.phases) == [name for name in ENGINE_PHASES if name in timeline.phases]
    assert all(seconds >= 0 for seconds in timeline.phases.values())
    if timeline.ready:
        assert timeline.total_seconds is not None
        assert sum(timeline.phases.values()) == pytest.approx(timeline.total_seconds, abs=0.1)
    else:
        assert timeline.total_seconds is None


def assert_phases(timeline: StartupTimeline, expected: Mapping[str, float], tolerance: float) -> None:
    assert list(timeline.phases) == list(expected)
    for name, seconds in expected.items():
        assert timeline.phases[name] == pytest.approx(seconds, abs=tolerance), name


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_fixture_phases_match_marker_times(name: str) -> None:
    marker_times, cache = FIXTURE_MARKERS[name]
    timeline = parse_log(read_lines(FIXTURES / name))
    assert_phases(timeline, durations(marker_times), tolerance=0.01)
    assert timeline.total_seconds == pytest.approx(marker_times["apiReady"], abs=0.01)
    assert timeline.compile_cache == cache
    assert timeline.ready and not timeline.failed and timeline.reason is None
    assert_consistent(timeline)


# --- transformations that any real log must survive -------------------------------------------------


def to_kubelet(line: str) -> str:
    found = RELATIVE_PREFIX.match(line)
    if found is None:
        return line
    moment = CONTAINER_START + timedelta(seconds=float(found.group(1)))
    nanoseconds = f"{moment.microsecond:06d}123"
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{nanoseconds}Z {line[found.end() :]}"


def to_debug_paths(line: str) -> str:
    return LOG_FILE.sub(lambda found: f"[vllm/some/module/{found.group(1)}:{found.group(2)}] ", line)


def to_color(line: str) -> str:
    return re.sub(r"\b(INFO|WARNING) ", "\x1b[32m\\1\x1b[0m ", line, count=1)


def to_crlf(line: str) -> str:
    return line + "\r"


def to_worker_tp1(line: str) -> str:
    return line.replace("(EngineCore pid=", "(Worker_TP1 pid=")


def to_logging_prefix(line: str) -> str:
    return re.sub(r"\) (INFO|WARNING|DEBUG) ", r") [pod-a] \1 ", line, count=1)


SAME_CLOCK_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "debug-module-paths": to_debug_paths,
    "ansi-colour": to_color,
    "crlf": to_crlf,
    "tensor-parallel-prefix": to_worker_tp1,
    "vllm-logging-prefix": to_logging_prefix,
}


@pytest.mark.parametrize("transform", sorted(SAME_CLOCK_TRANSFORMS))
@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_fixture_variants_parse_the_same(name: str, transform: str) -> None:
    original = parse_log(read_lines(FIXTURES / name))
    changed = parse_log(SAME_CLOCK_TRANSFORMS[transform](line) for line in read_lines(FIXTURES / name))
    assert changed == original


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_kubelet_timestamps_anchor_on_container_start(name: str) -> None:
    marker_times, cache = FIXTURE_MARKERS[name]
    lines = [to_kubelet(line) for line in read_lines(FIXTURES / name)]
    timeline = parse_log(lines, process_start=CONTAINER_START)
    assert_phases(timeline, durations(marker_times), tolerance=0.01)
    assert timeline.compile_cache == cache
    assert_consistent(timeline)

    # Without startedAt the first line's timestamp is the start: bootstrap shrinks, nothing else moves.
    first_line_at = seconds_of(read_lines(FIXTURES / name)[0])
    unanchored = parse_log(lines)
    assert_phases(unanchored, durations(marker_times, start=first_line_at), tolerance=0.01)


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_ready_at_is_the_wall_time_of_the_server_line(name: str) -> None:
    """What the pod's Ready condition is compared with (status.startup.*.readyGapSeconds)."""
    server_line = next(line for line in read_lines(FIXTURES / name) if "Starting vLLM server on" in line)
    logged_at = CONTAINER_START + timedelta(seconds=seconds_of(server_line))
    kubelet_lines = [to_kubelet(line) for line in read_lines(FIXTURES / name)]
    assert parse_log(kubelet_lines).ready_at == logged_at  # a kubelet clock needs no anchor
    assert parse_log(read_lines(FIXTURES / name), process_start=CONTAINER_START).ready_at == logged_at
    # Seconds since a start of unknown date tell no date; nor does a log that never got ready.
    assert parse_log(read_lines(FIXTURES / name)).ready_at is None
    assert parse_log(kubelet_lines[: kubelet_lines.index(to_kubelet(server_line))]).ready_at is None


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_vllm_clock_alone_gives_whole_seconds(name: str) -> None:
    marker_times, cache = FIXTURE_MARKERS[name]
    lines = [RELATIVE_PREFIX.sub("", line) for line in read_lines(FIXTURES / name)]
    timeline = parse_log(lines)
    # vLLM's clock ticks in whole seconds and starts at the first line: each boundary is off by < 1 s.
    first_line_at = seconds_of(read_lines(FIXTURES / name)[0])
    assert_phases(timeline, durations(marker_times, start=first_line_at), tolerance=2.0)
    assert all(seconds == int(seconds) for seconds in timeline.phases.values())
    assert timeline.compile_cache == cache
    assert_consistent(timeline)


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_carriage_return_progress_bars_glued_to_lines(name: str) -> None:
    # A merged stream may put a bar's redraws on the same physical line as the next log record.
    lines = []
    for line in read_lines(FIXTURES / name):
        found = RELATIVE_PREFIX.match(line)
        if found is not None and "(EngineCore" in line:
            bar = "\rLoading safetensors checkpoint shards:  50% Completed | 2/4 [00:04<00:04,  2.01s/it]\r"
            line = found.group(0) + bar + line[found.end() :]
        lines.append(line)
    assert parse_log(lines) == parse_log(read_lines(FIXTURES / name))


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_stderr_noise_without_timestamps_changes_nothing(name: str) -> None:
    noise = [
        "[W1122 04:40:50.831791819 socket.cpp:207] [c10d] The hostname of the client socket cannot be found.",
        "Starting vLLM server on http://example.invalid (not a vLLM record)",
        "  warnings.warn(",
        "Capturing CUDA graphs (decode, FULL):  57%|█████▋    | 4/7 [00:00<00:00, 31.52it/s]",
        "",
    ]
    lines = []
    for line in read_lines(FIXTURES / name):
        lines.append(line)
        lines.extend(noise)
    assert parse_log(lines) == parse_log(read_lines(FIXTURES / name))


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_truncated_log_keeps_finished_phases(name: str) -> None:
    marker_times, _ = FIXTURE_MARKERS[name]
    lines = read_lines(FIXTURES / name)
    cut_after = marker_times["profiling"]
    kept = [line for line in lines if line and seconds_of(line) <= cut_after]
    timeline = parse_log(kept)
    assert not timeline.ready and not timeline.failed
    expected = durations(marker_times)
    expected.pop("graphCapture")
    expected.pop("apiReady")
    assert_phases(timeline, expected, tolerance=0.01)
    assert_consistent(timeline)
    assert summarize(timeline).startswith("Not ready after ")


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_traceback_at_the_end_fails_with_the_exception_line(name: str) -> None:
    marker_times, _ = FIXTURE_MARKERS[name]
    lines = read_lines(FIXTURES / name)
    compiled_at = marker_times.get("compile", marker_times.get("compileLoad", 0.0))
    before_compile = [line for line in lines if line and seconds_of(line) < compiled_at]
    header = "[  200.000] (EngineCore pid=9) ERROR 11-22 04:50:00 [core.py:1165] "
    crash = [
        header + "Traceback (most recent call last):",
        header + '  File "x.py", line 1, in <module>',
        header + "ValueError: bad compile range",
        "[  200.100] /usr/lib/python3.12/multiprocessing/resource_tracker.py:254: UserWarning: leaked",
    ]
    timeline = parse_log([*before_compile, *crash])
    assert timeline.failed and not timeline.ready
    assert timeline.reason == "ValueError: bad compile range"
    assert not {"compile", "compileLoad"} & set(timeline.phases) and "dynamo" in timeline.phases
    assert_consistent(timeline)
    assert summarize(timeline) == "Failed to start: ValueError: bad compile range"


@pytest.mark.parametrize("name", sorted(FIXTURE_MARKERS))
def test_restart_appended_to_the_log_reports_the_last_run(name: str) -> None:
    failed_run = read_lines(DATA / "traceback-oom.log")
    timeline = parse_log([*failed_run, *read_lines(FIXTURES / name)])
    assert timeline == parse_log(read_lines(FIXTURES / name))


def test_a_traceback_followed_by_progress_is_not_a_failure() -> None:
    lines = read_lines(FIXTURES / "baseline.log")
    at = next(index for index, line in enumerate(lines) if "Dynamo bytecode" in line)
    handled = [
        "[   63.703] (EngineCore pid=1057) Traceback (most recent call last):",
        '[   63.703] (EngineCore pid=1057)   File "x.py", line 1, in <module>',
        "[   63.703] (EngineCore pid=1057) FileNotFoundError: [Errno 2] No such file: 'flashinfer.so'",
    ]
    timeline = parse_log([*lines[:at], *handled, *lines[at:]])
    assert timeline == parse_log(lines)


# --- hand-written logs ----------------------------------------------------------------------------


def test_tensor_parallel_debug_v2_runner_on_vllm_clock() -> None:
    lines = read_lines(DATA / "tp2-debug-v2-runner.log")
    timeline = parse_log(lines)
    expected = {
        "bootstrap": 2,
        "modelInfo": 6,
        "engineStart": 20,
        "weightLoad": 26,
        "dynamo": 9,
        "compile": 27,
        "profiling": 8,
        "graphCapture": 8,
        "apiReady": 3,
    }
    assert_phases(timeline, expected, tolerance=0.001)
    assert timeline.total_seconds == 109
    assert timeline.compile_cache == "miss"
    assert_consistent(timeline)

    # startedAt one second before the first line (vLLM's clock reads UTC in containers).
    anchored = parse_log(lines, process_start=datetime(2026, 3, 14, 9, 0, 0, tzinfo=UTC))
    assert anchored.phases["bootstrap"] == 3
    assert anchored.total_seconds == 110


def test_enforce_eager_with_kubelet_timestamps() -> None:
    lines = read_lines(DATA / "enforce-eager-kubelet.log")
    timeline = parse_log(lines, process_start=datetime(2026, 11, 22, 5, 30, 0, tzinfo=UTC))
    expected = {
        "bootstrap": 7.261,
        "modelInfo": 5.239,
        "engineStart": 12.625,
        "weightLoad": 8.25,
        "profiling": 2.625,
        "apiReady": 1.9,
    }
    assert_phases(timeline, expected, tolerance=0.001)
    assert timeline.total_seconds == pytest.approx(37.9, abs=0.001)
    assert timeline.compile_cache == "none"
    assert_consistent(timeline)
    assert summarize(timeline) == "Started in 37.9 s (weights 8.2 s, no compile)"

    unanchored = parse_log(lines)
    assert unanchored.phases["bootstrap"] == pytest.approx(0.011, abs=0.001)
    assert unanchored.total_seconds == pytest.approx(30.65, abs=0.001)


def test_older_wordings_and_colour() -> None:
    timeline = parse_log(read_lines(DATA / "older-wordings-color.log"))
    expected = {
        "bootstrap": 0,
        "modelInfo": 7,
        "engineStart": 11,
        "weightLoad": 28,
        "dynamo": 7,
        "compileLoad": 6,
        "profiling": 2,
        "graphCapture": 21,
        "apiReady": 1,
    }
    assert_phases(timeline, expected, tolerance=0.001)
    assert timeline.total_seconds == 83
    assert timeline.compile_cache == "hit"
    assert_consistent(timeline)


def test_engine_crash_reports_the_final_exception_line() -> None:
    timeline = parse_log(read_lines(DATA / "traceback-oom.log"))
    assert timeline.failed and not timeline.ready
    assert timeline.reason == (
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore': 1}"
    )
    assert_phases(
        timeline,
        {"bootstrap": 14.002, "modelInfo": 6.498, "engineStart": 12.75, "weightLoad": 26.75},
        tolerance=0.001,
    )
    assert timeline.compile_cache == "none"
    assert_consistent(timeline)
    assert timeline.to_json_dict() == {
        "phases": timeline.phases,
        "totalSeconds": None,
        "compileCache": "none",
        "failed": True,
        "reason": timeline.reason,
    }


def test_vllm_clock_crossing_new_year() -> None:
    lines = [
        "INFO 12-31 23:59:58 [utils.py:278] non-default args: {}",
        "INFO 12-31 23:59:59 [model.py:617] Resolved architecture: LlamaForCausalLM",
        "INFO 01-01 00:00:04 [api_server.py:596] Starting vLLM server on http://0.0.0.0:8000",
    ]
    timeline = parse_log(lines)
    assert timeline.phases == {"bootstrap": 0.0, "modelInfo": 1.0, "apiReady": 5.0}
    assert timeline.total_seconds == 6.0


def test_impossible_dates_are_lines_without_time() -> None:
    lines = [
        "INFO 01-02 03:04:05 [utils.py:278] non-default args: {}",
        "INFO 13-45 99:99:99 [model.py:617] Resolved architecture: LlamaForCausalLM",
        "INFO 01-02 03:04:07 [api_server.py:596] Starting vLLM server on http://0.0.0.0:8000",
    ]
    assert parse_log(lines).phases == {"bootstrap": 0.0, "modelInfo": 0.0, "apiReady": 2.0}
    kubelet = [
        "2026-02-28T00:00:00Z " + lines[0],
        "2026-02-30T00:00:01Z " + lines[1],
        "2026-02-28T00:00:03.5Z " + lines[2],
    ]
    assert parse_log(kubelet).phases == {"bootstrap": 0.0, "modelInfo": 0.0, "apiReady": 3.5}


def test_empty_log() -> None:
    timeline = parse_log([])
    assert timeline == StartupTimeline()
    assert timeline.to_json_dict() == {"phases": {}, "totalSeconds": None, "compileCache": "none"}
    assert summarize(timeline) == "Not ready (no startup phase finished yet)"


@pytest.mark.parametrize(
    ("name", "summary"),
    [
        ("baseline.log", "Started in 90.6 s (weights 9.2 s, compile 18.0 s, cache miss)"),
        ("seeded-serving.log", "Started in 66.1 s (weights 10.3 s, compile 4.8 s, cache hit)"),
    ],
)
def test_summary(name: str, summary: str) -> None:
    assert summarize(parse_log(read_lines(FIXTURES / name))) == summary
