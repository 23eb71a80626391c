"""`stoker phases [--json] FILE`: print the startup timeline of a vLLM log (FILE `-` reads stdin)."""

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from stoker.phases.parser import parse_log
from stoker.phases.timeline import StartupTimeline

EXIT_OK = 0
EXIT_STARTUP_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_A_STARTUP_LOG = 3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stoker phases",
        description="Break a vLLM startup log into timed phases.",
        epilog="Exit status: 0 parsed, 1 the log shows a failed startup, 2 bad usage or unreadable file,"
        " 3 no vLLM startup lines in the file.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("file", metavar="FILE", help="log file, or - for standard input")
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:
        return EXIT_USAGE if exit_request.code else EXIT_OK

    try:
        if arguments.file == "-":
            timeline = parse_log(decoded_lines(sys.stdin.buffer))
        else:
            with open(arguments.file, "rb") as log:
                timeline = parse_log(decoded_lines(log))
    except OSError as error:
        print(f"stoker phases: cannot read {arguments.file}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE

    if not (timeline.phases or timeline.failed or timeline.ready):
        print(
            f"stoker phases: {arguments.file} has no vLLM startup lines (no startup phase ends in it):"
            " not a vLLM log, or one cut off before its first phase",
            file=sys.stderr,
        )
        return EXIT_NOT_A_STARTUP_LOG
    if arguments.json:
        print(json.dumps(timeline.to_json_dict(), indent=2))
    else:
        print(format_table(timeline))
    return EXIT_STARTUP_FAILED if timeline.failed else EXIT_OK


def decoded_lines(stream: BinaryIO) -> Iterator[str]:
    """A log's lines, one at a time."""
    # Binary iteration splits on "\n" only; text mode would also split on the "\r" of progress bars and
    # of vLLM's multi-line records. Undecodable bytes must not stop the parse.
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")


def format_table(timeline: StartupTimeline) -> str:
    rows: Iterable[tuple[str, str]] = [(name, f"{seconds:.2f}") for name, seconds in timeline.phases.items()]
    total = f"{timeline.total_seconds:.2f}" if timeline.total_seconds is not None else "not ready"
    rows = [("phase", "seconds"), *rows, ("total", total)]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value:>9}" for name, value in rows]
    if timeline.engine_version is not None:
        lines.append(f"vLLM version: {timeline.engine_version}")
    reason = f" ({timeline.compile_cache_reason})" if timeline.compile_cache_reason else ""
    lines.append(f"compile cache: {timeline.compile_cache}{reason}")
    if timeline.failed:
        lines.append(f"failed: {timeline.reason}")
    return "\n".join(lines)
