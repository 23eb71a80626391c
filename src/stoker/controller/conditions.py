"""Pure status arithmetic: metav1.Condition lists whose lastTransitionTime moves only on a flip."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

CONDITION_TYPES = ("Ready", "CacheSeeded", "Progressing", "Degraded")


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    previous: list[dict[str, Any]] | None, wanted: list[Condition], generation: int, now: str
) -> list[dict[str, Any]]:
    """The whole list, in a stable order; a condition keeps its transition time unless its status flips."""
    before = {c.get("type"): c for c in previous or []}
    merged = []
    for condition in sorted(wanted, key=lambda c: CONDITION_TYPES.index(c.type)):
        status = "True" if condition.status else "False"
        old = before.get(condition.type)
        since = old["lastTransitionTime"] if old and old.get("status") == status else now
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return merged
