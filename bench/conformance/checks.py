"""What a conformance run checks: stoker's reading of a real log against the log's own evidence.

Pure apart from compile_artifacts() (a directory listing): takes the recorded log's lines (`[seconds]
text`, see process.py), stoker's timeline of it and what the cache directory showed, and returns named
booleans. The evidence is read by plain substring search here, not by stoker's patterns, so a parser
that misses a line cannot agree with itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from stoker.phases import COMPILE_PHASES, StartupTimeline

SERVER_LINE = "Starting vLLM server on"
TOLERANCE_SECONDS = 0.5
# The clock of the recorder and of phase boundaries are the same; sums are of rounded phases.
SUM_TOLERANCE_SECONDS = 0.01
# Lines vLLM prints while torch.compile works or loads its artifacts (GPU and CPU runners, 0.22-0.32).
COMPILE_WORK = (
    "Dynamo bytecode transform",
    "torch.compile took",
    "torch.compile and initial profiling",
    "Compiling a graph for",
    "Cache the graph of",
    "Directly load the compiled graph",
    "Directly load AOT compilation",
    "saved AOT compiled function",
    "Compiling model again",
)
LOAD_FAILURE = "Compiling model again due to a load failure"
ARGPARSE_ERROR = re.compile(r"^vllm(?: serve)?: error: ", re.MULTILINE)
_RECORDED = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\] ?(.*)$", re.DOTALL)


@dataclass(frozen=True)
class CacheEvidence:
    """Compile artifacts in the shared cache dir before and after one run (paths with size and mtime)."""

    before: frozenset[tuple[str, int, int]]
    after: frozenset[tuple[str, int, int]]

    @property
    def written(self) -> bool:
        return bool(self.after - self.before)

    def observed_state(self) -> str:
        """miss: the run wrote artifacts; hit: it found some and wrote none; none: no artifacts at all."""
        if self.written:
            return "miss"
        return "hit" if self.before else "none"


def compile_artifacts(cache_dir: Path) -> frozenset[tuple[str, int, int]]:
    """Files under VLLM_CACHE_ROOT/torch_compile_cache, with size and mtime, for CacheEvidence."""
    root = cache_dir / "torch_compile_cache"
    if not root.exists():
        return frozenset()
    return frozenset(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    )


def recorded_lines(text: str) -> list[tuple[float, str]]:
    lines = []
    for raw in text.split("\n"):
        found = _RECORDED.match(raw)
        if found is not None:
            lines.append((float(found.group(1)), found.group(2)))
    return lines


def _phase_windows(timeline: StartupTimeline) -> dict[str, tuple[float, float]]:
    windows = {}
    start = 0.0
    for name, seconds in timeline.phases.items():
        windows[name] = (start, start + seconds)
        start += seconds
    return windows


def log_checks(
    prefix: str, lines: list[tuple[float, str]], timeline: StartupTimeline, cache: CacheEvidence
) -> dict[str, bool]:
    server_at = next((at for at, text in lines if SERVER_LINE in text), None)
    total = timeline.total_seconds
    windows = [w for name, w in _phase_windows(timeline).items() if name in COMPILE_PHASES]
    compile_lines = [at for at, text in lines if any(marker in text for marker in COMPILE_WORK)]
    return {
        f"{prefix}_args_accepted": not any(ARGPARSE_ERROR.search(text) for _, text in lines),
        f"{prefix}_ready": server_at is not None,
        f"{prefix}_total_matches_server_line": server_at is not None
        and total is not None
        and abs(total - server_at) <= TOLERANCE_SECONDS,
        f"{prefix}_phases_sum_to_total": total is not None
        and abs(sum(timeline.phases.values()) - total) <= SUM_TOLERANCE_SECONDS,
        # Every compile line falls inside a dynamo/compileLoad/compile phase (vacuous only when nothing
        # compiled).
        f"{prefix}_compile_in_compile_phase": all(
            any(low - SUM_TOLERANCE_SECONDS <= at <= high + SUM_TOLERANCE_SECONDS for low, high in windows)
            for at in compile_lines
        )
        and (bool(windows) or not cache.written),
        # The reason too: a miss is loadFailed exactly when the log itself says it compiled again because
        # the kept cache could not be loaded.
        f"{prefix}_cache_state": timeline.compile_cache == cache.observed_state()
        and timeline.compile_cache_reason == ("loadFailed" if load_failed(lines) else None),
    }


def load_failed(lines: list[tuple[float, str]]) -> bool:
    """The run found a compile cache it could not load and compiled again."""
    return any(LOAD_FAILURE in text for _, text in lines)
