"""Version-tolerant patterns for vLLM startup logs (0.22.x wordings, plus older ones where they differ).

Markers match the start of a vLLM log message (the text after the `LEVEL date time [file:line] ` header),
never a whole line, so a stray stderr line that happens to contain a marker's words cannot move a phase.
"""

import re
from enum import StrEnum


class Marker(StrEnum):
    """A log message that bounds a phase or tells how torch.compile used its cache."""

    ARGS = "args"
    ARCHITECTURE = "architecture"
    LOAD_START = "load_start"
    LOADED = "loaded"
    DYNAMO = "dynamo"
    COMPILED = "compiled"
    KV_CACHE = "kv_cache"
    GRAPHS = "graphs"
    SERVER = "server"
    GRAPH_FROM_CACHE = "graph_from_cache"
    GRAPH_COMPILED = "graph_compiled"
    GRAPH_STORED = "graph_stored"


# Each alternative is a named group whose name is a Marker value; `match(...).lastgroup` says which one hit.
MARKERS = re.compile(
    r"(?P<args>non-default args: )"
    r"|(?P<architecture>Resolved architecture: )"
    # V1 runner | V2 runner
    r"|(?P<load_start>Starting to load model |Loading model from scratch)"
    # V1/V2 | V0 before 0.7
    r"|(?P<loaded>Model loading took |Loading model weights took )"
    r"|(?P<dynamo>Dynamo bytecode transform time: )"
    # 0.22 "took" | older "takes"; the non-AOT path adds "and initial profiling/warmup run together"
    r"|(?P<compiled>torch\.compile (?:and initial profiling/warmup run together )?(?:took|takes) "
    r"[\d.]+ s(?:ec(?:ond)?s?)? in total)"
    # V1 | V0
    r"|(?P<kv_cache>GPU KV cache size: |# (?:GPU|cuda) blocks: )"
    r"|(?P<graphs>Graph capturing finished )"
    # 0.22 "Starting vLLM server on" | older "Starting vLLM API server on" / "Starting vLLM API server 0 on"
    r"|(?P<server>Starting vLLM (?:API )?server (?:\d+ )?on )"
    # AOT artifact | per-range inductor artifact ("for shape None" in older releases)
    r"|(?P<graph_from_cache>Directly load (?:AOT compilation from path|the compiled graph))"
    r"|(?P<graph_compiled>Compiling a graph for )"
    r"|(?P<graph_stored>saved AOT compiled function |Cache the graph of )"
)

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
PROCESS = re.compile(r"(?:\((?P<process>[\w.-]+) pid=\d+\) ?)?(?:\[rank\d+\]: ?)?")

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

TRACEBACK_START = "Traceback (most recent call last):"
# `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`: a dotted name, then `:` or the end.
EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::.*)?")
