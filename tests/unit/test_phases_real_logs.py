"""The parser on real logs of each vLLM version, checked against each log's own lines: the CPU logs the
conformance harness recorded (data/phases/vllm-<version>-cpu/) and the H100 logs of the GPU benchmark
(data/phases/vllm-<version>-h100/); nothing in the shared test knows a particular log."""

import re
from pathlib import Path

import pytest

from stoker.phases import COMPILE_PHASES, parse_log

DATA = Path(__file__).parent / "data" / "phases"
LOGS = sorted([*DATA.glob("vllm-*-cpu/*.log"), *DATA.glob("vllm-*-h100/*.log")])
H100_V0_26 = DATA / "vllm-0.26.0-h100"
STAMP = re.compile(r"^\[ *(\d+(?:\.\d+)?)\] ")
# Dynamo's transform runs on a cache hit too (GPU logs show it), so only the first two say it compiled.
COMPILED = ("saved AOT compiled function", "Compiling a graph for ")
COMPILE_WORK = (*COMPILED, "Dynamo bytecode transform time")
CACHE_LOADS = ("Directly load AOT compilation", "Directly load the compiled graph")


def stamps_of(lines: list[str], *needles: str) -> list[float]:
    found = (STAMP.match(line) for line in lines if any(needle in line for needle in needles))
    return [float(match.group(1)) for match in found if match is not None]


def version_of(path: Path) -> str:
    return path.parent.name.removeprefix("vllm-").rsplit("-", 1)[0]


def phase_windows(phases: dict[str, float]) -> dict[str, tuple[float, float]]:
    windows, start = {}, 0.0
    for name, seconds in phases.items():
        windows[name] = (start, start + seconds)
        start += seconds
    return windows


def test_real_logs_are_present() -> None:
    assert {path.parent.name for path in LOGS} >= {"vllm-0.22.1-cpu", "vllm-0.32.0-cpu", "vllm-0.26.0-h100"}


@pytest.mark.parametrize("path", LOGS, ids=[f"{p.parent.name}/{p.name}" for p in LOGS])
def test_real_log(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    timeline = parse_log(lines)
    assert timeline.ready and timeline.engine_version == version_of(path)
    server_at = stamps_of(lines, "Starting vLLM server on ")[0]
    assert timeline.total_seconds == pytest.approx(server_at, abs=0.5)
    assert sum(timeline.phases.values()) == pytest.approx(timeline.total_seconds, abs=0.01)
    # Every line of compile work falls inside a compile phase.
    windows = phase_windows(timeline.phases)
    for at in stamps_of(lines, *COMPILE_WORK):
        assert any(start <= at <= end for name, (start, end) in windows.items() if name in COMPILE_PHASES), at
    compiled = bool(stamps_of(lines, *COMPILED))
    loaded = bool(stamps_of(lines, *CACHE_LOADS))
    failed_load = bool(stamps_of(lines, "Compiling model again due to a load failure"))
    expected = "miss" if compiled or failed_load else ("hit" if loaded else "none")
    assert timeline.compile_cache == expected
    assert (timeline.compile_cache_reason == "loadFailed") == failed_load


@pytest.mark.parametrize(
    ("log", "warmup_range"),
    [("stock.log", (14.0, 19.0)), ("seed.log", (14.0, 19.0)), ("seeded-serving.log", (0.0, 1.0))],
)
def test_h100_v0_26_jit_warmup_is_its_own_phase_after_graph_capture(
    log: str, warmup_range: tuple[float, float]
) -> None:
    # Model Runner V2's silent kernel warm-up: from the end of graph capture to the JIT monitor's line.
    lines = (H100_V0_26 / log).read_text(encoding="utf-8").split("\n")
    windows = phase_windows(parse_log(lines).phases)
    (captured,) = stamps_of(lines, "Graph capturing finished in")
    (monitor,) = stamps_of(lines, "Kernel JIT monitor activated")
    assert list(windows)[-3:] == ["graphCapture", "jitWarmup", "apiReady"]
    assert windows["jitWarmup"] == pytest.approx((captured, monitor), abs=0.01)
    low, high = warmup_range
    assert low < windows["jitWarmup"][1] - windows["jitWarmup"][0] < high


def test_h100_v0_26_seeded_start_loads_compiled_artifacts_in_compile_load() -> None:
    lines = (H100_V0_26 / "seeded-serving.log").read_text(encoding="utf-8").split("\n")
    timeline = parse_log(lines)
    windows = phase_windows(timeline.phases)
    assert timeline.compile_cache == "hit" and "compile" not in timeline.phases
    (dynamo_done,) = stamps_of(lines, "Dynamo bytecode transform time")
    (aot_loaded,) = stamps_of(lines, "Directly load AOT compilation")
    assert windows["compileLoad"] == pytest.approx((dynamo_done, aot_loaded), abs=0.01)
