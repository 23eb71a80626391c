"""The parser on real CPU logs of each vLLM version (data/phases/vllm-<version>-cpu/, recorded by the
conformance harness), checked against each log's own lines; nothing here knows a particular log."""

import re
from pathlib import Path

import pytest

from stoker.phases import parse_log

DATA = Path(__file__).parent / "data" / "phases"
LOGS = sorted(DATA.glob("vllm-*-cpu/*.log"))
STAMP = re.compile(r"^\[ *(\d+(?:\.\d+)?)\] ")
COMPILE_WORK = ("saved AOT compiled function", "Compiling a graph for ", "Dynamo bytecode transform time")
CACHE_LOADS = ("Directly load AOT compilation", "Directly load the compiled graph")
COMPILE_PHASES = ("dynamo", "compile", "compileLoad")


def stamps_of(lines: list[str], *needles: str) -> list[float]:
    found = (STAMP.match(line) for line in lines if any(needle in line for needle in needles))
    return [float(match.group(1)) for match in found if match is not None]


def version_of(path: Path) -> str:
    return path.parent.name.removeprefix("vllm-").removesuffix("-cpu")


def test_real_cpu_logs_are_present() -> None:
    assert LOGS, "no recorded CPU logs under tests/unit/data/phases/vllm-*-cpu/"


@pytest.mark.parametrize("path", LOGS, ids=[f"{p.parent.name}/{p.name}" for p in LOGS])
def test_real_cpu_log(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    timeline = parse_log(lines)
    assert timeline.ready and timeline.engine_version == version_of(path)
    server_at = stamps_of(lines, "Starting vLLM server on ")[0]
    assert timeline.total_seconds == pytest.approx(server_at, abs=0.5)
    assert sum(timeline.phases.values()) == pytest.approx(timeline.total_seconds, abs=0.01)
    # Every line of compile work falls inside a compile phase.
    ends, boundary = {}, 0.0
    for name, seconds in timeline.phases.items():
        ends[name] = (boundary, boundary + seconds)
        boundary += seconds
    for at in stamps_of(lines, *COMPILE_WORK):
        assert any(start <= at <= end for name, (start, end) in ends.items() if name in COMPILE_PHASES), at
    compiled = bool(stamps_of(lines, *COMPILE_WORK))
    loaded = bool(stamps_of(lines, *CACHE_LOADS))
    failed_load = bool(stamps_of(lines, "Compiling model again due to a load failure"))
    expected = "miss" if compiled or failed_load else ("hit" if loaded else "none")
    assert timeline.compile_cache == expected
    assert (timeline.compile_cache_reason == "loadFailed") == failed_load
