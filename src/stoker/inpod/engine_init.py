"""PID 1 of an engine container that a snapshot may be restored into (issue 40).

    python3 -m stoker.inpod.engine_init [--directory DIR] --restore-wait S --restore-bound B \
        [--health-url URL --gate-port P [--offer-bound O] [--sleep]] -- COMMAND...

It starts nothing for up to --restore-wait seconds: in that time the node's snapshot agent may claim the
container and restore a snapshot's engine into it (what a container before it left in DIR is removed
first: a restarted container is a new start). Without a claim it starts COMMAND itself, in a session of
its own (as a dump needs it). With one it waits up to --restore-bound seconds for the agent's outcome; a
restored engine is then its child, and a failed restore, or none within the bound, starts COMMAND: a start
is never lost, only delayed by the bound. Each decision is one `stoker-engine-init: {json}` line on stdout
(the container's log).

The decision and the outcome are files in DIR (an emptyDir of the pod that the agent reaches through the
container's root), each created once and never replaced (O_EXCL), so that the program and the agent cannot
both win:

- DIR/decision: `restore` (the agent's claim), or `start` (this program's, when the wait is over, or the
  agent's, with its reason: no snapshot to restore);
- DIR/outcome: `restored PID` or `failed REASON` (the agent's), or `abandoned` (this program's, when the
  bound is over: an agent that finishes later finds it and ends what it restored).

A snapshot is taken only from an engine that has served nobody yet (a replica's memory holds its prompts, and
a client's connection cannot be restored into another pod), and only on a node whose agent answered the
wait (without an agent nobody would take the offer): with --offer-bound, once the engine it started
answers --health-url and one warm-up request of its own (a token of the first model, through the OpenAI API
beside --health-url), it offers a dump and keeps the pod out of its Service for up to O seconds:

- DIR/offer: `ready` (this program's);
- DIR/dump: `dumping` (the agent's claim), or `declined` (this program's, when nobody claimed within O, or
  the agent's, with its reason: the node has this snapshot already);
- DIR/dumped: `dumped` or `failed REASON` (the agent's).

With --sleep (an engine in vLLM's sleep mode, its control endpoints behind stoker.guard with the pod's
control token in $STOKER_CONTROL_TOKEN) the engine is put to sleep at level 2 before the offer: its weights
discarded and the rest of its device memory moved to host memory, so that the snapshot holds neither. After
the offer's outcome, and after a restore, it is woken and its weights reloaded from the model (wake the
weights' memory, `reload_weights`, wake the KV cache); a restored engine that does not wake is ended and
the command started instead.

GET /ready on --gate-port (the pod's readiness probe) answers 200 only once the offer is over (at once for a
restored engine or without --offer-bound) and the engine is awake, and while --health-url answers 200; 503
otherwise.

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
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import NamedTuple

from stoker.guard import CONTROL_TOKEN_ENV, CONTROL_TOKEN_HEADER
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
OFFER = "offer"
DUMP = "dump"
DUMPED = "dumped"
OFFERED = "ready"
DUMPING = "dumping"
DECLINED = "declined"
HANDSHAKE_FILES = (DECISION, OUTCOME, OFFER, DUMP, DUMPED)
HEALTH_TIMEOUT_SECONDS = 2
WARM_UP_TIMEOUT_SECONDS = 120
# --sleep: level 2 discards the weights (the snapshot is then the size of the process's host memory), so a
# wake reloads them from the model before the KV cache comes back, as `vllm snapshot` does.
SLEEP = "/sleep?level=2"
WAKE_STEPS: tuple[tuple[str, dict[str, str] | None], ...] = (
    ("/wake_up?tags=weights", None),
    ("/collective_rpc", {"method": "reload_weights"}),
    ("/wake_up?tags=kv_cache", None),
)
# Reloading a large model's weights from a cold disk takes minutes; the pod stays out of traffic meanwhile.
CONTROL_TIMEOUT_SECONDS = 900
POLL_SECONDS = 0.2
WRITE_GRACE_SECONDS = 2
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


def create_once(name: str, text: str, dir_fd: int | None = None) -> bool:
    """Create NAME (in the open directory `dir_fd`, if given) holding `text`, unless something is there (a
    symlink is never followed); whether this call created it. This program's and the agent's claims."""
    try:
        descriptor = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w", encoding="utf-8") as created:
        created.write(text + "\n")
    return True


# Children that ended while this PID 1 waited for a restore: what a failed attempt of the agent left (CRIU's
# tasks, reparented here when CRIU exits), or a restored engine that died at once. Reaped at once: a zombie
# keeps its PID, and the agent's next attempt needs the tree's PIDs free ("Can't fork for PID: File exists").
ended: dict[int, int] = {}


def ended_children() -> Iterator[tuple[int, int]]:
    """Reap each child of this process that has ended: its PID and wait status. Shared with the GPU benchmark,
    which reaps what it is the subreaper of the same way."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def reap_ended() -> None:
    ended.update(ended_children())


def settled(
    directory: str, name: str, mine: str, deadline: float, waiting: Callable[[], None] = lambda: None
) -> str:
    """DIR/NAME once someone writes it, or `mine` if this call writes it first when `deadline` comes;
    `waiting` runs at every poll."""
    while time.monotonic() < deadline:
        found = read_once(directory, name)
        if found is not None:
            return found
        waiting()
        time.sleep(POLL_SECONDS)
    if create_once(os.path.join(directory, name), mine):
        return mine
    # The other side created it a moment before and writes it next; one that died in between leaves it
    # empty, which settles nothing: "" after a grace.
    grace = time.monotonic() + WRITE_GRACE_SECONDS
    while (found := read_once(directory, name)) is None and time.monotonic() < grace:
        time.sleep(POLL_SECONDS)
    return found or ""


def cleared(directory: str) -> None:
    """DIR without the handshake files a container of the pod before this one left (the emptyDir outlives a
    container's restart, and its `restored PID` names a process this one never had)."""
    for name in HANDSHAKE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))


class Decided(NamedTuple):
    restored: int | None  # the PID of the engine the agent restored, or None: start the command
    answered: bool  # whether the node's agent answered (claimed, or told to start): it may take an offer


def restored_engine(directory: str, wait: float, bound: float) -> Decided:
    """Whether the agent restored an engine into the container."""
    say("waiting", seconds=wait)
    began = time.monotonic()
    decision = settled(directory, DECISION, START, began + wait, reap_ended)
    if decision != RESTORE:
        _, _, told = decision.partition(" ")  # the agent's reason, when it decided
        if not decision:  # a claim its writer never finished: an agent that restores after all must not win
            create_once(os.path.join(directory, OUTCOME), ABANDONED)
            told = "a claim left empty"
        say("starting", reason=told[:1000] or f"no restore claimed within {wait:g} s")
        return Decided(None, answered=decision != START)
    say("restoring", claimedAfterSeconds=round(time.monotonic() - began, 3))
    outcome = settled(directory, OUTCOME, ABANDONED, time.monotonic() + bound, reap_ended)
    word, _, detail = outcome.partition(" ")
    if word == RESTORED and detail.isdigit():
        return Decided(int(detail), answered=True)
    reason = f"no outcome within {bound:g} s" if word == ABANDONED else detail or outcome or "no outcome"
    say("starting", reason=f"restore failed: {reason}"[:1000])
    return Decided(None, answered=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_SECONDS) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def warm_up(health_url: str) -> str:
    """One greedy token from the engine's first model, through its OpenAI API beside `health_url`: the
    snapshot is of an engine that has served (its first request's lazy work done), never a client's request.
    What happened, in a few words."""
    api = urllib.parse.urljoin(health_url, "/v1/")
    began = time.monotonic()
    try:
        with urllib.request.urlopen(api + "models", timeout=WARM_UP_TIMEOUT_SECONDS) as answer:
            model = json.load(answer)["data"][0]["id"]
        request = urllib.request.Request(
            api + "completions",
            data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=WARM_UP_TIMEOUT_SECONDS):
            pass
    except (OSError, ValueError, LookupError, TypeError) as failed:
        return f"failed: {failed}"[:300]
    return f"one completion in {time.monotonic() - began:.2f} s"


def control(health_url: str, token: str, path: str, body: dict[str, str] | None = None) -> None:
    """POST one of the engine's control endpoints, behind stoker.guard, with the pod's control token."""
    request = urllib.request.Request(
        urllib.parse.urljoin(health_url, path),
        data=json.dumps(body).encode() if body is not None else b"",
        headers={"Content-Type": "application/json", CONTROL_TOKEN_HEADER: token},
    )
    with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_SECONDS):
        pass


class NotWoken(RuntimeError):
    pass


def woken(health_url: str, token: str) -> dict[str, float]:
    """Wake an engine asleep at level 2 and reload its weights; the seconds each step took. Raises NotWoken
    with the step that failed."""
    began = time.monotonic()
    steps = {}
    for path, body in WAKE_STEPS:
        step = time.monotonic()
        try:
            control(health_url, token, path, body)
        except OSError as failed:
            raise NotWoken(f"{path}: {failed}"[:1000]) from failed
        steps[body["method"] if body else path] = round(time.monotonic() - step, 3)
    say("woken", seconds=round(time.monotonic() - began, 3), steps=steps)
    return steps


def offer_dump(
    directory: str, health_url: str, bound: float, token: str | None, engine: int, serving: threading.Event
) -> None:
    """Once the engine serves and has answered a warm-up request, offer it for a dump for up to `bound`
    seconds (with the control `token`: put to sleep first, woken after), then let traffic in."""
    while not healthy(health_url):
        time.sleep(POLL_SECONDS)
    warmed = warm_up(health_url)
    asleep = token is not None
    if asleep:
        try:
            control(health_url, token or "", SLEEP)
        except OSError as failed:  # an engine that cannot sleep is not offered: it serves as it is
            say("serving", dump=f"not offered: {SLEEP}: {failed}"[:1000])
            serving.set()
            return
    create_once(os.path.join(directory, OFFER), OFFERED)
    say("offering", boundSeconds=bound, warmUp=warmed, asleep=asleep)
    deadline = time.monotonic() + bound
    outcome = settled(directory, DUMP, DECLINED, deadline)  # `declined`, and the agent's reason if its
    if outcome == DUMPING:
        while (outcome := read_once(directory, DUMPED) or "") == "" and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
    if token is not None:
        try:
            woken(health_url, token)
        except NotWoken as failed:
            # Without its weights it cannot serve: ended, and the container (exiting as the engine did)
            # restarts.
            say("failed", reason=f"the engine did not wake after the offer: {failed}")
            end(engine)
            return
    say("serving", dump=(outcome or f"no outcome within {bound:g} s")[:1000])
    serving.set()


def awake(health_url: str, token: str, bound: float) -> str | None:
    """A restored engine asleep, woken once it answers: None, or why not within `bound` seconds."""
    deadline = time.monotonic() + bound
    while not healthy(health_url):
        if time.monotonic() > deadline:
            return f"no {health_url} within {bound:g} s"
        time.sleep(POLL_SECONDS)
    try:
        woken(health_url, token)
    except NotWoken as failed:
        return str(failed)
    return None


def end(engine: int) -> None:
    """Kill the engine's process group; reap() collects what is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(engine), signal.SIGKILL)


def serve_gate(port: int, health_url: str, serving: threading.Event) -> None:
    """GET /ready: 200 once `serving` is set and while the engine is healthy."""

    class Gate(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ready = self.path == "/ready" and serving.is_set() and healthy(health_url)
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:  # a probe a second is no log line
            pass

    # One thread answers every probe in turn: a thread per request would take a new PID of this namespace
    # each time, and a restore needs the restored tree's PIDs free here.
    server = HTTPServer(("", port), Gate)
    threading.Thread(target=server.serve_forever, name="gate", daemon=True).start()


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def reap(engine: int) -> int:
    """Reap every child until the engine ends; its exit code."""
    if engine in ended:  # a restored engine that died before its outcome was read
        return exit_code(ended.pop(engine))
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
    parser.add_argument("--health-url", help="the engine's health endpoint, for --gate-port and the offer")
    parser.add_argument("--gate-port", type=int, help="where GET /ready answers (the readiness probe)")
    parser.add_argument(
        "--offer-bound",
        type=float,
        default=0,
        help="seconds a started engine is offered for a dump (default 0)",
    )
    parser.add_argument(
        "--sleep",
        action="store_true",
        help="the engine sleeps at level 2 while offered, and wakes after the offer and after a restore",
    )
    own, command = options_and_command(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    if not command:
        parser.error("no COMMAND after --")
    if args.restore_wait < 0 or args.restore_bound <= 0 or args.offer_bound < 0:
        parser.error("--restore-wait and --offer-bound must be 0 or more, --restore-bound more than 0")
    if (args.gate_port is not None or args.offer_bound > 0 or args.sleep) and not args.health_url:
        parser.error("--gate-port, --offer-bound and --sleep need --health-url")
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
    serving = threading.Event()
    if args.gate_port is not None:
        serve_gate(args.gate_port, args.health_url, serving)
    token = os.environ.get(CONTROL_TOKEN_ENV, "") if args.sleep else None
    began = time.monotonic()
    cleared(args.directory)
    decided = restored_engine(args.directory, args.restore_wait, args.restore_bound)
    engine = decided.restored
    if engine is not None:
        engines.append(engine)
        asleep = awake(args.health_url, token, args.restore_bound) if token is not None else None
        if asleep is None:
            say("restored", pid=engine, seconds=round(time.monotonic() - began, 3))
            serving.set()  # offered once already, as the source
        else:
            say("starting", reason=f"the restored engine did not wake: {asleep}"[:1000])
            end(engine)
            engines.clear()
            engine = None
    if engine is None:
        try:
            # Held to the end: a Popen collected once its child has exited would reap it before reap() can.
            started = subprocess.Popen(command, start_new_session=True)
        except OSError as failed:
            say("failed", reason=f"{command[0]}: {failed.strerror}")
            return 127
        engine = started.pid
        engines.append(engine)
        if args.offer_bound > 0 and decided.answered:
            offer = (args.directory, args.health_url, args.offer_bound, token, engine, serving)
            threading.Thread(target=offer_dump, args=offer, name="offer", daemon=True).start()
        else:
            serving.set()
    code = reap(engine)
    say("exited", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
