"""What the pod's engine_init said of a start made for snapshots (stoker.inpod.engine_init's
`stoker-engine-init: {json}` lines): restored from the node's snapshot, or started by itself and why. The
lines are the tenant's pod's output: each is bounded and read as data, and anything else is skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from stoker.inpod.engine_init import LINE_PREFIX

SnapshotOutcome = Literal["restored", "started"]
# engine_init's own lines are short; a longer one is not engine_init's.
MAXIMUM_LINE = 2048
REASON_LENGTH = 256


@dataclass(frozen=True, slots=True)
class SnapshotStart:
    outcome: SnapshotOutcome
    reason: str | None = None  # started: why no restore (the agent's word, or engine_init's)
    restore_seconds: float | None = None  # restored: from engine_init's start to the restored engine


@dataclass
class SnapshotTracker:
    """Fed every line of one process run's log; `result()` at any point."""

    start: SnapshotStart | None = None

    def feed(self, line: str) -> None:
        if not line.startswith(LINE_PREFIX) or len(line) > MAXIMUM_LINE or self.start is not None:
            return
        try:
            said = json.loads(line[len(LINE_PREFIX) :])
        except ValueError:
            return
        if not isinstance(said, dict):
            return
        seconds = said.get("seconds")
        if said.get("event") == "restored" and isinstance(seconds, int | float) and seconds >= 0:
            self.start = SnapshotStart("restored", restore_seconds=round(float(seconds), 3))
        elif said.get("event") == "starting" and isinstance(said.get("reason"), str):
            self.start = SnapshotStart("started", reason=said["reason"][:REASON_LENGTH])
