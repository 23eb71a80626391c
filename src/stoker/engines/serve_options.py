"""Whether `vllm serve` of a given release would accept `extraArgs`, judged without vLLM.

serve_options.txt lists every option of `vllm serve` per release (one release per supported minor version),
as each release's own parser has it: written by `python -m bench.conformance.serve_options`, checked against
the real parsers by tests/conformance/test_serve_options.py. `check_extra_args` reads arguments the way
vLLM does: its FlexibleArgumentParser (vllm/utils/argparse_utils.py, the same from 0.22.1 to 0.33.0) first
rewrites them (`_` for `-` in a long option's name, `-O<x>` and `-O=<x>` as `--optimization-level <x>`,
`--name.key value` as `--name <json>`), then Python's argparse (allow_abbrev, as vLLM leaves it) resolves
each option: an exact option string, else the one option string it is a prefix of (an ambiguous prefix is
an error), a short option with its value glued on (`-qfp8`), `=value`; then each option takes the number
of values its nargs says, and a value no option takes is an unrecognized argument (the model is already
the positional one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

OPTIONS_FILE = Path(__file__).with_name("serve_options.txt")
_HEADER = (
    "# Every option of `vllm serve`, one line per option: RELEASES NARGS OPTION-STRINGS...\n"
    "# RELEASES: releases and ranges (A-B: each release listed from A to B); NARGS: argparse's (1: one).\n"
    "# Written by `python -m bench.conformance.serve_options` from each release's own parser; do not edit.\n"
)
_RELEASES_LINE = "releases"
# argparse's own test for an argument that reads as a negative number (a value, not an option).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_OPTIMIZATION_LEVEL = "--optimization-level"
_SHOWN_MATCHES = 6


@dataclass(frozen=True)
class ServeOption:
    strings: tuple[str, ...]
    nargs: str  # argparse's nargs: "0" (a switch), "1", "?", "*", "+", or another count


@dataclass(frozen=True)
class ArgProblem:
    index: int  # of the argument in extraArgs
    message: str


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def _spans(indexes: list[int], releases: list[str]) -> str:
    """Consecutive indexes into `releases` as `A-B` ranges: `0.22.1-0.26.0,0.28.0`."""
    spans: list[list[int]] = []
    for index in indexes:
        if spans and spans[-1][-1] == index - 1:
            spans[-1].append(index)
        else:
            spans.append([index])
    return ",".join(
        releases[span[0]] if len(span) == 1 else f"{releases[span[0]]}-{releases[span[-1]]}" for span in spans
    )


def format_options(per_release: Mapping[str, Sequence[ServeOption]]) -> str:
    """The file's text: each option once, with the releases that have it (in the first release's order)."""
    releases = sorted(per_release, key=_release_key)
    having: dict[ServeOption, list[int]] = {}
    for index, release in enumerate(releases):
        for option in per_release[release]:
            having.setdefault(option, []).append(index)
    lines = [
        f"{_spans(indexes, releases)} {option.nargs} {' '.join(option.strings)}"
        for option, indexes in having.items()
    ]
    return _HEADER + f"{_RELEASES_LINE} {' '.join(releases)}\n" + "\n".join(lines) + "\n"


def parse_options(text: str) -> dict[str, tuple[ServeOption, ...]]:
    """The file's options per release; ValueError for a line that is not as `format_options` writes."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    if not lines or not lines[0].startswith(f"{_RELEASES_LINE} "):
        raise ValueError(f"{OPTIONS_FILE.name}: the first line must list the releases")
    releases = lines[0].split()[1:]
    per_release: dict[str, list[ServeOption]] = {release: [] for release in releases}
    for line in lines[1:]:
        spans, nargs, *strings = line.split()
        if not strings:
            raise ValueError(f"{OPTIONS_FILE.name}: no option strings in {line!r}")
        for span in spans.split(","):
            first, _, last = span.partition("-")
            start, end = releases.index(first), releases.index(last or first)
            for release in releases[start : end + 1]:
                per_release[release].append(ServeOption(tuple(strings), nargs))
    return {release: tuple(options) for release, options in per_release.items()}


@functools.cache
def stored_options() -> dict[str, tuple[ServeOption, ...]]:
    return parse_options(OPTIONS_FILE.read_text())


def options_for(version: str) -> tuple[str, tuple[ServeOption, ...]] | None:
    """The stored release of `version`'s minor version and its options; None if none is stored."""
    minor = _release_key(version)[:2]
    for release, options in stored_options().items():
        if _release_key(release)[:2] == minor:
            return release, options
    return None


def _rewritten(args: Sequence[str]) -> list[tuple[int, str, bool]]:
    """(index in args, argument, whether a value follows it glued) after FlexibleArgumentParser's rewriting.

    A dotted `--name.key v` becomes `--name` with a value glued on (vLLM appends `--name <json>` at the
    end; where it goes changes nothing here); it takes the next argument as its value, whatever it is."""
    rewritten: list[tuple[int, str, bool]] = []
    skip_next = False
    for index, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        if arg.startswith("--"):
            key, equals, value = arg.partition("=")
            name, dot, keys = key[2:].partition(".")
            arg = f"--{name.replace('_', '-')}{dot}{keys}{equals}{value}"
        elif arg.startswith("-O") and arg != "-O":
            rewritten += [(index, _OPTIMIZATION_LEVEL, True)]
            continue
        elif arg == "-O" and args[index + 1 : index + 2] in (["0"], ["1"], ["2"], ["3"]):
            arg = _OPTIMIZATION_LEVEL
        if arg.startswith("-") and "." in arg.partition("=")[0]:
            skip_next = "=" not in arg
            rewritten.append((index, arg.partition(".")[0], True))
        else:
            rewritten.append((index, arg, False))
    return rewritten


def _matches(arg: str, strings: Mapping[str, ServeOption]) -> list[tuple[str, bool]]:
    """argparse's candidate option strings for `arg` (its `_get_option_tuples`), each with whether a value is
    glued on."""
    if arg.startswith("--"):
        prefix, equals, _ = arg.partition("=")
        return [(string, bool(equals)) for string in strings if string.startswith(prefix)]
    found = []
    for string in strings:
        if string == arg[:2]:
            found.append((string, len(arg) > 2))
        elif string.startswith(arg):
            found.append((string, False))
    return found


def _resolve(
    arg: str, strings: Mapping[str, ServeOption], version: str
) -> tuple[ServeOption, bool] | str | None:
    """The option `arg` names and whether a value is glued on; None for a value; a message if neither."""
    if not arg.startswith("-") or arg == "-":
        return None
    if arg in strings:
        return strings[arg], False
    head, equals, _ = arg.partition("=")
    if equals and head in strings:
        return strings[head], True
    matches = _matches(arg, strings)
    if len(matches) == 1:
        ((string, glued),) = matches
        return strings[string], glued
    if matches:
        names = [string for string, _ in matches]
        shown = ", ".join(names[:_SHOWN_MATCHES]) + (
            f" and {len(names) - _SHOWN_MATCHES} more" if len(names) > _SHOWN_MATCHES else ""
        )
        return f"is ambiguous in vLLM {version}: it abbreviates {shown}"
    if _NEGATIVE_NUMBER.match(arg) or " " in arg:
        return None
    return f"is not an option of `vllm serve` in vLLM {version}"


def _takes(nargs: str, values: int) -> int | str:
    """How many of the `values` that follow an option it takes, or what it is missing."""
    if nargs in ("?", "*"):
        return min(values, 1) if nargs == "?" else values
    if nargs == "+":
        return values if values else "expects at least one value"
    needed = int(nargs)
    if values < needed:
        return "expects a value" if needed == 1 else f"expects {needed} values"
    return needed


def check_extra_args(args: Sequence[str], version: str) -> ArgProblem | None:
    """The first argument `vllm serve` of `version` would refuse, appended after stoker's own; None when it
    would accept them all, or when no list is stored for `version`'s minor version."""
    found = options_for(version)
    if found is None:
        return None
    release, options = found
    strings = {string: option for option in options for string in option.strings}
    rewritten = _rewritten(args)
    resolved = [_resolve(arg, strings, release) for _, arg, _ in rewritten]
    position = 0
    while position < len(rewritten):
        index, _, dotted = rewritten[position]
        written = args[index].partition("=")[0]
        outcome = resolved[position]
        position += 1
        if outcome is None:
            return ArgProblem(
                index, f"{args[index]!r} is neither an option nor a value of the option before it"
            )
        if isinstance(outcome, str):
            return ArgProblem(index, f"{written} {outcome}")
        option, glued = outcome
        if glued or dotted:
            if option.nargs == "0":
                return ArgProblem(index, f"{written} takes no value")
            if option.nargs not in ("1", "?", "*", "+"):
                return ArgProblem(index, f"{written} expects {option.nargs} values")
            continue
        values = 0
        while position + values < len(rewritten) and resolved[position + values] is None:
            values += 1
        taken = _takes(option.nargs, values)
        if isinstance(taken, str):
            return ArgProblem(index, f"{written} {taken}")
        position += taken
    return None
