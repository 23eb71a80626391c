"""`stoker phases [--json] FILE`: print the startup timeline of a vLLM log (FILE `-` reads stdin); a
gzip-compressed log (as the recorded ones in bench/results are) is read as the log it holds."""

import argparse
import gzip
import io
import json
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO, cast

from stoker.phases.parser import parse_log
from stoker.phases.timeline import StartupTimeline

EXIT_OK = 0
EXIT_STARTUP_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_A_STARTUP_LOG = 3
GZIP_MAGIC = b"\x1f\x8b"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stoker phases",
        description="Break a vLLM startup log (plain or gzip-compressed) into timed phases.",
        epilog="Exit status: 0 parsed, 1 the log shows a failed startup, 2 bad usage, or a file unreadable"
        " or not valid gzip, 3 no vLLM startup lines in the file.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("file", metavar="FILE", help="log file, or - for standard input")
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:
        return EXIT_USAGE if exit_request.code else EXIT_OK

    try:
        if arguments.file == "-":
            timeline = parse_log(decoded_lines(uncompressed(sys.stdin.buffer)))
        else:
            with open(arguments.file, "rb") as log:
                timeline = parse_log(decoded_lines(uncompressed(log)))
    except (OSError, EOFError, zlib.error) as error:
        # gzip.BadGzipFile is an OSError; a cut-off or corrupt stream ends in EOFError or zlib.error.
        why = getattr(error, "strerror", None) or error or type(error).__name__
        print(f"stoker phases: cannot read {arguments.file}: {why}", file=sys.stderr)
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


def uncompressed(stream: BinaryIO) -> Iterable[bytes]:
    """The stream's lines, or those of what it holds if it starts with gzip's magic bytes (whatever its
    name)."""
    buffered = io.BufferedReader(cast(io.RawIOBase, stream))  # to peek, whatever the stream is
    if buffered.peek(len(GZIP_MAGIC))[: len(GZIP_MAGIC)] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=buffered)
    return buffered


def decoded_lines(stream: Iterable[bytes]) -> Iterator[str]:
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
