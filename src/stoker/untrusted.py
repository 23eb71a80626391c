"""What a tenant's pods print, made fit to show in status, Events and logs of the operator."""

from __future__ import annotations

import re
import unicodedata

_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def printable(line: str) -> str:
    """One line without terminal escapes, control and format characters (bidirectional overrides)."""
    return "".join(c for c in _TERMINAL_ESCAPE.sub("", line) if not unicodedata.category(c).startswith("C"))
