"""PID 1 of an engine container that a snapshot may be restored into (issue 40).

    python3 -m stoker.inpod.engine_init [--directory DIR] --restore-wait S --restore-bound B -- COMMAND...

It starts nothing for up to --restore-wait seconds: in that time the node's snapshot agent may claim the
container and restore a snapshot's engine into it. Without a claim it starts COMMAND itself, in a session of
its own (as a dump needs it). With one it waits up to --restore-bound seconds for the agent's outcome; a
restored engine is then its child, and a failed restore, or none within the bound, starts COMMAND: a start
is never lost, only delayed by the bound. Each decision is one `stoker-engine-init: {json}` line on stdout
(the container's log).

The decision and the outcome are files in DIR (an emptyDir of the pod that the agent reaches through the
container's root), each created once and never replaced (O_EXCL), so that the program and the agent cannot
both win:

- DIR/decision: `restore` (the agent's claim) or `start` (this program's, when the wait is over);
- DIR/outcome: `restored PID` or `failed REASON` (the agent's), or `abandoned` (this program's, when the
  bound is over: an agent that finishes later finds it and ends what it restored).

Then it reaps every process that ends up its child and exits with the engine's exit status (128 + the
signal for a signal); SIGTERM and SIGINT go to the engine's process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from stoker.inpod import options_and_command, program_parser

LINE_PREFIX = "stoker-engine-init: "
# The pod's emptyDir for the handshake, where the agent looks for it inside the container.
HANDSHAKE_DIRECTORY = "/run/stoker-snapshot"
DECISION = "decision"
OUTCOME = "outcome"
RESTORE = "restore"
START = "start"
RESTORED = "restored"
FAILED = "failed"
ABANDONED = "abandoned"
POLL_SECONDS = 0.2
# prctl(PR_SET_CHILD_SUBREAPER): as PID 1 of its container it reaps orphans anyway; run anywhere else (a
# test, a wrapper's child), the restored engine must still become its child.
PR_SET_CHILD_SUBREAPER = 36


def say(event: str, **facts: object) -> None:
    print(LINE_PREFIX + json.dumps({"event": event, **facts}), flush=True)


def read_once(directory: str, name: str) -> str | None:
    """The text of DIR/NAME, or None while it is absent (or not yet written: created and written are two
    steps, and an empty file is read again)."""
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as found:
            text = found.read().strip()
    except FileNotFoundError:
        return None
    return text or None


def claim(directory: str, name: str, text: str) -> bool:
    """Create DIR/NAME holding `text`, unless it exists; whether this call created it."""
    try:
        descriptor = os.open(
            os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
        )
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w", encoding="utf-8") as created:
        created.write(text + "\n")
    return True


def settled(directory: str, name: str, mine: str, deadline: float) -> str:
    """DIR/NAME once someone writes it, or `mine` if this call writes it first when `deadline` comes."""
    while time.monotonic() < deadline:
        found = read_once(directory, name)
        if found is not None:
            return found
        time.sleep(POLL_SECONDS)
    if claim(directory, name, mine):
        return mine
    while (found := read_once(directory, name)) is None:  # the other side created it a moment before
        time.sleep(POLL_SECONDS)
    return found


def restored_engine(directory: str, wait: float, bound: float) -> int | None:
    """The PID of the engine the agent restored, or None: start the command."""
    began = time.monotonic()
    if settled(directory, DECISION, START, began + wait) != RESTORE:
        say("starting", reason=f"no restore claimed within {wait:g} s")
        return None
    say("restoring", claimedAfterSeconds=round(time.monotonic() - began, 3))
    outcome = settled(directory, OUTCOME, ABANDONED, time.monotonic() + bound)
    word, _, detail = outcome.partition(" ")
    if word == RESTORED and detail.isdigit():
        say("restored", pid=int(detail), seconds=round(time.monotonic() - began, 3))
        return int(detail)
    reason = f"no outcome within {bound:g} s" if word == ABANDONED else detail or outcome
    say("starting", reason=f"restore failed: {reason}"[:1000])
    return None


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def reap(engine: int) -> int:
    """Reap every child until the engine ends; its exit code."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # the engine is gone and was reaped by no one here
            return 1
        if pid == engine:
            return exit_code(status)


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(
        "stoker.inpod.engine_init",
        __doc__,
        "%(prog)s [--directory DIR] --restore-wait S --restore-bound B -- COMMAND...",
    )
    parser.add_argument(
        "--directory",
        default=HANDSHAKE_DIRECTORY,
        help="the handshake directory, an emptyDir (default: %(default)s)",
    )
    parser.add_argument("--restore-wait", type=float, required=True, help="seconds to wait for a claim")
    parser.add_argument(
        "--restore-bound", type=float, required=True, help="seconds a restore may take once claimed"
    )
    own, command = options_and_command(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    if not command:
        parser.error("no COMMAND after --")
    if args.restore_wait < 0 or args.restore_bound <= 0:
        parser.error("--restore-wait must be 0 or more and --restore-bound more than 0")
    if not os.path.isdir(args.directory):
        parser.error(f"--directory {args.directory} is not a directory")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    engines: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if not engines:  # stopped before any engine: nothing to wait for
            sys.exit(128 + number)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(engines[0]), number)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, forward)
    engine = restored_engine(args.directory, args.restore_wait, args.restore_bound)
    if engine is None:
        try:
            engine = subprocess.Popen(command, start_new_session=True).pid
        except OSError as failed:
            say("failed", reason=f"{command[0]}: {failed.strerror}")
            return 127
    engines.append(engine)
    code = reap(engine)
    say("exited", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
