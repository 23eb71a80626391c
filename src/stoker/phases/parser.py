"""Streaming parser from a vLLM startup log to a StartupTimeline.

Each line is looked at once and dropped, so memory stays constant however long the log is. A line's time
comes from, in order of preference: the kubelet's RFC3339 prefix (`kubectl logs --timestamps`), a recorder's
`[seconds since process start]` prefix, or vLLM's own `MM-DD HH:MM:SS` header (no year, whole seconds). The
first line that carries one of them fixes the clock for the rest of the log, so a stray `[12]` or date in a
later line cannot switch clocks halfway.

Which wordings mark which phase, and in which order the phases run, come from the engine profile: the
version the caller names, replaced by the one the log announces (its banner comes first), else a tolerant
union of every supported release's wordings. JSON records (0.33 `--logging-config.formatter json`) are read
as the text records they stand for.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum

from stoker.engines import (
    SUPPORTED,
    TOLERANT,
    EngineProfile,
    Marker,
    UnsupportedEngineVersion,
    detect_version_in_log,
    profile_for,
)
from stoker.phases.patterns import (
    ANSI_ESCAPE,
    EXCEPTION_LINE,
    HEADER,
    JSON_RECORD_START,
    KUBELET_TIMESTAMP,
    PROCESS,
    RELATIVE_TIMESTAMP,
    TRACEBACK_START,
    marker_pattern,
)
from stoker.phases.snapshot import SnapshotTracker
from stoker.phases.timeline import CompileCache, CompileCacheReason, StartupTimeline
from stoker.phases.weights import WeightsTracker

# On a cache hit the phase that ends at torch.compile's total loaded artifacts: it compiled nothing.
COMPILE_PHASE, COMPILE_LOAD_PHASE = "compile", "compileLoad"
# Every engine phase name, in the order of the tolerant layout; a release may run some in another order.
ENGINE_PHASES = tuple(
    dict.fromkeys(
        phase
        for profile in (TOLERANT, *SUPPORTED)
        for name, _ in profile.phase_ends
        for phase in ((name, COMPILE_LOAD_PHASE) if name == COMPILE_PHASE else (name,))
    )
)

_COMPILE_EVIDENCE = (Marker.DYNAMO, Marker.COMPILED, Marker.GRAPH_STORED)
# Lines that can announce the version contain one of these; the regex runs only on them.
_VERSION_HINTS = ("version ", "(v")
# vLLM's clock has no year: a timestamp this far before the previous one means the log crossed New Year.
_YEAR_WRAP_SECONDS = 180 * 24 * 3600.0
# Streams merged by a recorder may be slightly out of order; a restarted process's clock jumps back further.
_RESTART_JUMP_SECONDS = 1.0
# Any year works when nothing anchors the clock; a leap year keeps 02-29 valid.
_ANY_LEAP_YEAR = 2000


class _Clock(Enum):
    KUBELET = "kubelet"
    RELATIVE = "relative"
    VLLM = "vllm"


@dataclass
class _Run:
    """What one process run has logged so far; a restarted process appended to the same log starts anew."""

    start: float | None
    marks: dict[Marker, float] = field(default_factory=dict)
    # Processes (by their `(name pid=N)` decoration) that are between `Traceback ...` and the exception line.
    in_traceback: set[str] = field(default_factory=set)
    # The last exception line that no phase marker has followed yet.
    exception: str | None = None
    # Device memory the first worker that said so loaded its weights into.
    worker_weight_bytes: int | None = None
    # coldStart.peerWeights: what ModelExpress said about where the weights came from.
    weights: WeightsTracker = field(default_factory=WeightsTracker)
    # Snapshot and restore: what the pod's engine_init said.
    snapshot: SnapshotTracker = field(default_factory=SnapshotTracker)


class StartupLogParser:
    """Feed lines one at a time; `timeline()` may be called at any point (a pod still starting)."""

    def __init__(self, process_start: datetime | None = None, engine_version: str | None = None) -> None:
        self._engine_version = engine_version
        self._use_profile(_profile_or_tolerant(engine_version))
        self._version_seen = False
        self._anchor: float | None = None
        self._year = _ANY_LEAP_YEAR
        if process_start is not None:
            if process_start.tzinfo is None:
                process_start = process_start.replace(tzinfo=UTC)
            self._anchor = process_start.timestamp()
            self._year = process_start.astimezone(UTC).year
        self._clock: _Clock | None = None
        self._last_time: float | None = None
        self._run = _Run(start=None)
        # One-entry caches: consecutive lines mostly share their whole-second part.
        self._kubelet_key: tuple[str, str] | None = None
        self._kubelet_seconds = 0.0
        self._wall_key: tuple[str | None, str, str, str] | None = None
        self._wall_seconds = 0.0

    def feed(self, raw_line: str) -> None:
        line = raw_line.rstrip("\r\n")
        time, line = self._prefix_time(line)
        if line.startswith(JSON_RECORD_START):
            line = _text_record(line)
        if not self._version_seen and any(hint in line for hint in _VERSION_HINTS):
            self._learn_version(line)
        if "\x1b" in line:
            line = ANSI_ESCAPE.sub("", line)
        header = HEADER.search(line)
        if header is not None:
            if self._clock is None:
                self._clock = _Clock.VLLM
            if self._clock is _Clock.VLLM:
                time = self._wall_time(header)
            message = line[header.end() :]
            if "\r" in message:
                message = message.split("\r", 1)[0]
        else:
            decoration = PROCESS.match(line)
            message = line[decoration.end() :] if decoration is not None else line
            if "\r" in message:
                # A progress bar redraws itself after each carriage return; the last drawing is what shows.
                message = message.rsplit("\r", 1)[1]
        if time is not None:
            self._advance(time)
        if header is not None:
            found = self._markers.match(message)
            if found is not None and found.lastgroup is not None and self._last_time is not None:
                marker = Marker(found.lastgroup)
                self._mark(marker, self._last_time)
                if marker is Marker.LOADED and self._run.worker_weight_bytes is None:
                    self._run.worker_weight_bytes = self._profile.logged_weight_bytes(message)
            else:
                self._run.weights.feed(message)
        else:
            self._run.snapshot.feed(line)
        self._follow_traceback(line, message)

    def timeline(self) -> StartupTimeline:
        run = self._run
        cache, cache_reason = self._compile_cache()
        phases: dict[str, float] = {}
        boundary = 0.0
        if run.start is not None:
            for phase, marker in self._profile.phase_ends:
                name = logged_phase_name(phase, cache)
                at = run.marks.get(marker)
                if at is None:
                    continue
                # A marker logged before its predecessor (clock skew between processes) yields 0, not < 0.
                end = max(boundary, at - run.start)
                phases[name] = round(end - boundary, 3)
                boundary = end
        server_at = run.marks.get(Marker.SERVER)
        total = None
        if server_at is not None and run.start is not None:
            total = round(max(0.0, server_at - run.start), 3)
        ready = total is not None
        failed = not ready and run.exception is not None
        return StartupTimeline(
            phases=phases,
            total_seconds=total,
            compile_cache=cache,
            compile_cache_reason=cache_reason,
            engine_version=self._engine_version,
            worker_weight_bytes=run.worker_weight_bytes,
            weights=run.weights.result(),
            snapshot=run.snapshot.start,
            failed=failed,
            reason=run.exception if failed else None,
            ready=ready,
            ready_at=self._wall_time_of(server_at),
        )

    def _wall_time_of(self, moment: float | None) -> datetime | None:
        """A time on the log's clock as a date: the recorder's clock counts from the process start, vLLM's
        has no year of its own but the process start's."""
        if moment is None or self._clock is None:
            return None
        if self._clock is _Clock.KUBELET:
            return datetime.fromtimestamp(moment, UTC)
        if self._anchor is None:
            return None
        return datetime.fromtimestamp(moment + (self._anchor if self._clock is _Clock.RELATIVE else 0.0), UTC)

    def _compile_cache(self) -> tuple[CompileCache, CompileCacheReason | None]:
        marks = self._run.marks
        if Marker.CACHE_LOAD_FAILED in marks:
            return "miss", "loadFailed"
        if Marker.GRAPH_COMPILED in marks:
            return "miss", None
        if Marker.GRAPH_FROM_CACHE in marks:
            return "hit", None
        if any(marker in marks for marker in _COMPILE_EVIDENCE):
            return "miss", None
        return "none", None

    def _learn_version(self, line: str) -> None:
        version = detect_version_in_log(line)
        if version is None:
            return
        # What the process says it is wins over what the caller expected it to be.
        self._version_seen = True
        self._engine_version = version
        self._use_profile(_profile_or_tolerant(version))

    def _use_profile(self, profile: EngineProfile) -> None:
        self._profile = profile
        self._markers = marker_pattern(profile)

    def _prefix_time(self, line: str) -> tuple[float | None, str]:
        if self._clock is None or self._clock is _Clock.KUBELET:
            stamp = KUBELET_TIMESTAMP.match(line)
            if stamp is not None:
                self._clock = _Clock.KUBELET
                return self._kubelet_time(stamp.group(1), stamp.group(2), stamp.group(3)), line[stamp.end() :]
        if self._clock is None or self._clock is _Clock.RELATIVE:
            stamp = RELATIVE_TIMESTAMP.match(line)
            if stamp is not None:
                self._clock = _Clock.RELATIVE
                return float(stamp.group(1)), line[stamp.end() :]
        return None, line

    def _kubelet_time(self, whole_seconds: str, fraction: str | None, zone: str) -> float | None:
        key = (whole_seconds, zone)
        if key != self._kubelet_key:
            offset = "+00:00" if zone == "Z" else zone
            try:
                self._kubelet_seconds = datetime.fromisoformat(whole_seconds + offset).timestamp()
            except ValueError:  # shaped like a timestamp but no real date: the line has no time
                return None
            self._kubelet_key = key
        return self._kubelet_seconds + (float(fraction) if fraction else 0.0)

    def _wall_time(self, header: re.Match[str]) -> float | None:
        year, month, day, clock, fraction = header.group("year", "month", "day", "time", "fraction")
        key = (year, month, day, clock)
        if key != self._wall_key:
            try:
                seconds = self._wall_seconds_at(int(year) if year else self._year, month, day, clock)
                last = self._last_time
                if year is None and last is not None and seconds < last - _YEAR_WRAP_SECONDS:
                    self._year += 1
                    seconds = self._wall_seconds_at(self._year, month, day, clock)
            except ValueError:  # shaped like a timestamp but no real date: the line has no time
                return None
            self._wall_key = key
            self._wall_seconds = seconds
        return self._wall_seconds + (float("0." + fraction) if fraction else 0.0)

    @staticmethod
    def _wall_seconds_at(year: int, month: str, day: str, clock: str) -> float:
        # vLLM logs local time; containers run in UTC unless someone set TZ.
        hours, minutes, seconds = clock.split(":")
        moment = datetime(year, int(month), int(day), int(hours), int(minutes), int(seconds), tzinfo=UTC)
        return moment.timestamp()

    def _advance(self, time: float) -> None:
        last = self._last_time
        if self._clock is _Clock.RELATIVE and last is not None and time < last - _RESTART_JUMP_SECONDS:
            # The recorder's clock restarts with the process: a new run was appended to the log.
            self._run = _Run(start=0.0)
        elif self._run.start is None:
            if self._clock is _Clock.RELATIVE:
                self._run.start = 0.0
            else:
                self._run.start = self._anchor if self._anchor is not None else time
        self._last_time = time

    def _mark(self, marker: Marker, time: float) -> None:
        run = self._run
        if marker is Marker.ARGS and marker in run.marks and (Marker.SERVER in run.marks or run.exception):
            # `non-default args` is logged once per `vllm serve`: a second one after the first run ended
            # means the log holds a restart. Its own bootstrap is unknown, so its clock starts here.
            run = self._run = _Run(start=time)
        run.marks.setdefault(marker, time)
        # Startup went on after the exception, so it was not fatal.
        run.exception = None

    def _follow_traceback(self, line: str, message: str) -> None:
        run = self._run
        if message.startswith(TRACEBACK_START):
            run.in_traceback.add(self._process(line))
        elif run.in_traceback and message[:1] not in ("", " ", "\t"):
            process = self._process(line)
            if process in run.in_traceback and EXCEPTION_LINE.fullmatch(message):
                run.in_traceback.discard(process)
                run.exception = message.strip()

    @staticmethod
    def _process(line: str) -> str:
        found = PROCESS.match(line)
        return (found.group("process") or "") if found is not None else ""


def logged_phase_name(phase: str, cache: CompileCache) -> str:
    """The name a profile's phase gets in a timeline: on a cache hit the compile phase only loaded."""
    return COMPILE_LOAD_PHASE if phase == COMPILE_PHASE and cache == "hit" else phase


def _profile_or_tolerant(version: str | None) -> EngineProfile:
    if version is None:
        return TOLERANT
    try:
        return profile_for(version)
    except UnsupportedEngineVersion:
        return TOLERANT


def _text_record(line: str) -> str:
    """A JSON log record as vLLM's text record: `(proc pid=N) LEVEL time [name:0] message`."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or not isinstance(record.get("message"), str):
        return line
    process = f"({record.get('processName', '')} pid={record.get('process', 0)}) "
    header = (
        f"{record.get('levelname', 'INFO')} {record.get('asctime', '')} [{record.get('name', 'vllm')}:0] "
    )
    return process + header + record["message"]


def parse_log(
    lines: Iterable[str], *, process_start: datetime | None = None, engine_version: str | None = None
) -> StartupTimeline:
    """Parse a vLLM startup log; `process_start` (container startedAt) anchors absolute clocks.

    Without it, an absolute clock (kubelet or vLLM's) starts at the log's first timestamp; the recorder's
    `[seconds]` clock always starts at 0. `engine_version` picks the release's wordings until the log
    names its own version.
    """
    parser = StartupLogParser(process_start, engine_version)
    for line in lines:
        parser.feed(line)
    return parser.timeline()
