"""Patterns for vLLM startup logs that do not depend on the release: clocks, headers, process decorations.

The wordings that mark phases are per release, in `stoker.engines`; `marker_pattern` compiles a profile's.
Markers match the start of a vLLM log message (the text after the `LEVEL date time [file:line] ` header),
never a whole line, so a stray stderr line that happens to contain a marker's words cannot move a phase.
"""

import functools
import re

from stoker.engines import EngineProfile


@functools.cache
def marker_pattern(profile: EngineProfile) -> re.Pattern[str]:
    """One alternation whose named groups are Marker values: `match(...).lastgroup` says which one hit."""
    wordings: dict[str, list[str]] = {}
    for marker, wording in profile.log_markers:
        wordings.setdefault(marker.value, []).append(wording)
    return re.compile("|".join(f"(?P<{name}>{'|'.join(found)})" for name, found in wordings.items()))


# vLLM's header; searched, not matched, because anything may precede it: the process decoration, a
# VLLM_LOGGING_PREFIX, or a progress bar that a merged stream glued in front. The file part is a basename
# at INFO and a relative module path at DEBUG; releases before 0.8 printed it without the opening bracket.
# A custom VLLM_LOGGING_CONFIG_PATH may add a year and milliseconds.
HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?:(?P<year>\d{4})-)?(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<fraction>\d+))? "
    r"\[?[^\s\]]+:\d+\] "
)

# `kubectl logs --timestamps` / CRI log: RFC3339 with up to nanoseconds.
KUBELET_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d) ?")
# Seconds since process start, as a recorder writes them: `[   15.921] `.
RELATIVE_TIMESTAMP = re.compile(r"\[ *(\d+(?:\.\d+)?)\] ?")

# The per-process decoration vLLM puts on every physical line, and torchrun's rank prefix.
# 0.33 writes it from its formatter (logger.py:28), so uvicorn lines and progress bars no longer carry it.
PROCESS = re.compile(r"(?:\((?P<process>[\w.-]+) pid=\d+\) ?)?(?:\[rank\d+\]: ?)?")

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

TRACEBACK_START = "Traceback (most recent call last):"
# `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`: a dotted name, then `:` or the end.
EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::.*)?")

# 0.33 `--logging-config.formatter json` (logger.py:240): one python-json-logger object per record, with
# asctime (year and milliseconds), levelname, name, processName, process and message
# (logging_utils/formatter.py:7).
JSON_RECORD_START = '{"'
