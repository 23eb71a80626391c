"""Startup phases of a vLLM pod: parse its log (and its pod status) into a typed timeline.

Pure code: imports only the standard library, so the GPU benchmark can use it on a bare host.
"""

from stoker.phases.kubernetes import (
    KUBERNETES_PHASES,
    READY_GAP_PHASE,
    kubernetes_phases,
    ready_gap_seconds,
)
from stoker.phases.parser import ENGINE_PHASES, StartupLogParser, logged_phase_name, parse_log
from stoker.phases.timeline import (
    COMPILE_PHASES,
    CompileCache,
    CompileCacheReason,
    StartupTimeline,
    summarize,
)

__all__ = [
    "COMPILE_PHASES",
    "ENGINE_PHASES",
    "KUBERNETES_PHASES",
    "READY_GAP_PHASE",
    "CompileCache",
    "CompileCacheReason",
    "StartupLogParser",
    "StartupTimeline",
    "kubernetes_phases",
    "logged_phase_name",
    "parse_log",
    "ready_gap_seconds",
    "summarize",
]
