"""Refusals in the user's terms: the field, in the manifest's spelling, and the rule it breaks.

pydantic's own text (`1 validation error for ...`, `Value error, `, `[type=...]`, a documentation link) is
for Python programmers. `user_message` says what the API server would say: `spec.runtime.extraArgs: ...`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class FieldError(ValueError):
    """A rule that a model's validator checks across fields, broken by one of them: `field` is its path below
    that model in the manifest's spelling (`runtime.extraArgs`), as the CRD's rule names it (`fieldPath`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def field_path(loc: Sequence[int | str]) -> str:
    """`("spec", "runtime", "extraArgs", 2)` as `spec.runtime.extraArgs[2]`, the way kubectl names fields."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


# pydantic's error types that a manifest can cause, as the rule the value breaks.
_RULES = {
    "missing": "is required",
    "extra_forbidden": "is not a field of this object",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a map",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "datetime_type": "must be a date and time",
    "datetime_parsing": "must be a date and time",
    "string_too_short": "must have at least {min_length} characters",
    "string_too_long": "must have at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
}


def _rule(error: ErrorDetails) -> str:
    """What the value must be, in plain words."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])  # the validator's own message, without pydantic's "Value error, "
    if kind in _RULES:
        with contextlib.suppress(KeyError):  # a context without the bound: pydantic's sentence below
            return _RULES[kind].format(**ctx)
    if kind == "string_pattern_mismatch":
        from stoker.api.models import PATTERN_RULES  # the models import this module

        return PATTERN_RULES.get(ctx["pattern"], f"must match the pattern {ctx['pattern']}")
    # Anything else: pydantic's sentence without its subject ("Input should be ..." -> "must be ...").
    message = error["msg"]
    for subject in ("Input should", "Value should", "String should", "List should", "Dictionary should"):
        if message.startswith(subject):
            return "must" + message[len(subject) :]
    return message


def user_messages(error: ValidationError) -> list[str]:
    """One `field: rule` line per broken rule, in the order pydantic found them."""
    lines = []
    for details in error.errors(include_url=False, include_input=False):
        loc = list(details["loc"])
        cause = (details.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc += cause.field.split(".")
        path = field_path(loc)
        lines.append(f"{path}: {_rule(details)}" if path else _rule(details))
    return list(dict.fromkeys(lines))


def user_message(error: ValidationError) -> str:
    """Every broken rule of `error`, one `field: rule` per line (for a CLI, or a condition's message)."""
    return "\n".join(user_messages(error))
