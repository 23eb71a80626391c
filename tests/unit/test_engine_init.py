"""stoker.inpod.engine_init, the PID 1 a snapshot is restored into, run as a real process: it starts its
command when no restore is claimed in time, takes a restored engine as its child when the agent says so, and
falls back to its command when a claimed restore fails or outlasts the bound. The agent's side of the
handshake is engine_init.create_once on a directory descriptor, as the agent calls it; the "restored" engine
is put into engine_init's PID namespace by nsenter, as CRIU is, so it becomes engine_init's child the way a
restored engine does."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stoker.guard import CONTROL_TOKEN_ENV
from stoker.inpod import engine_init
from stoker.snapshot.agent import children
from tests.conftest import REPO

ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"))


def command(
    directory: Path, wait: float, bound: float, *engine: str, options: tuple[str, ...] = ()
) -> list[str]:
    return [sys.executable, "-m", "stoker.inpod.engine_init", "--directory", str(directory),
            "--restore-wait", str(wait), "--restore-bound", str(bound), *options, "--", *engine]  # fmt: skip


def events(stdout: str) -> list[dict[str, object]]:
    return [
        json.loads(line.removeprefix(engine_init.LINE_PREFIX))
        for line in stdout.splitlines()
        if line.startswith(engine_init.LINE_PREFIX)
    ]


def claim(directory: Path, name: str, text: str) -> bool:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return engine_init.create_once(name, text, dir_fd=descriptor)
    finally:
        os.close(descriptor)


def until_waiting(process: subprocess.Popen[str]) -> None:
    """engine_init's output read up to its `waiting` line: its directory is cleared of what an earlier
    container left, and a claim made now is the agent's."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(engine_init.LINE_PREFIX) and events(line)[0]["event"] == "waiting":
            return
    raise AssertionError("engine_init ended before it waited")


def wait_until(check: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_without_a_claim_it_starts_its_command_and_exits_as_the_command_does(tmp_path: Path) -> None:
    done = subprocess.run(
        command(tmp_path, 0.3, 5, "sh", "-c", "echo engine; exit 3"), capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 3, done.stderr
    assert "engine" in done.stdout
    assert events(done.stdout) == [
        {"event": "waiting", "seconds": 0.3},
        {"event": "starting", "reason": "no restore claimed within 0.3 s"},
        {"event": "exited", "code": 3},
    ]
    assert (tmp_path / engine_init.DECISION).read_text() == "start\n"
    # An agent that comes later finds the pod decided and restores nothing.
    assert not claim(tmp_path, engine_init.DECISION, engine_init.RESTORE)


@contextlib.contextmanager
def claimed_in_a_namespace(
    directory: Path, script: str, options: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """engine_init as PID 1 of a PID namespace of its own, as in a container, running `script` if it starts
    its command, its restore claimed; it and its host PID, killed at the end."""
    engine = command(directory, 30, 30, "sh", "-c", script, options=options)
    container = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *engine], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        until_waiting(container)
        (init,) = children(container.pid)  # PID 1 of the new namespace
        assert claim(directory, engine_init.DECISION, engine_init.RESTORE)
        yield container, init
    finally:
        container.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of its own needs root")
def test_a_restored_engine_becomes_its_child_and_its_exit_is_the_containers(tmp_path: Path) -> None:
    with claimed_in_a_namespace(tmp_path, "echo the command ran; exit 9") as (container, init):
        # As CRIU restores it: started in engine_init's PID namespace by a process that then exits, so the
        # engine is reparented to that namespace's init.
        engine = subprocess.run(
            ["nsenter", f"--target={init}", "--pid", "--", "sh", "-c", "setsid sleep 1 & echo $!"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert claim(tmp_path, engine_init.OUTCOME, f"{engine_init.RESTORED} {engine}")
        stdout, _ = container.communicate(timeout=30)
    assert container.returncode == 0  # sleep's
    found = events(stdout)
    assert [event["event"] for event in found] == ["restoring", "restored", "exited"]
    assert found[1]["pid"] == int(engine)
    assert "the command ran" not in stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of its own needs root")
def test_what_a_failed_restore_attempt_leaves_is_reaped_while_it_waits(tmp_path: Path) -> None:
    """CRIU's tasks of a failed attempt are reparented to PID 1 when CRIU exits; as zombies they would keep
    their PIDs, which the agent's next attempt needs."""
    with claimed_in_a_namespace(tmp_path, "exit 4") as (container, init):
        # A task left behind: orphaned at once (its parent exits), then it exits itself.
        subprocess.run(
            ["nsenter", f"--target={init}", "--pid", "--", "sh", "-c", "(sleep 0.3; exit 0) &"], check=True
        )
        wait_until(lambda: children(init))
        wait_until(lambda: not children(init), timeout=5)  # reaped, not a zombie
        assert claim(tmp_path, engine_init.OUTCOME, f"{engine_init.FAILED} criu restore failed")
        stdout, _ = container.communicate(timeout=30)
    assert container.returncode == 4
    assert [event["event"] for event in events(stdout)] == ["restoring", "starting", "exited"]


def test_a_failed_restore_starts_the_command_and_says_why(tmp_path: Path) -> None:
    running = subprocess.Popen(
        command(tmp_path, 30, 30, "sh", "-c", "echo engine started"),
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    until_waiting(running)
    assert claim(tmp_path, engine_init.DECISION, engine_init.RESTORE)
    assert claim(
        tmp_path, engine_init.OUTCOME, f"{engine_init.FAILED} criu restore failed 3 times: Error (x)"
    )
    stdout, _ = running.communicate(timeout=30)
    assert running.returncode == 0
    assert "engine started" in stdout
    assert events(stdout)[1] == {
        "event": "starting",
        "reason": "restore failed: criu restore failed 3 times: Error (x)",
    }


def test_a_claimed_restore_without_an_outcome_within_the_bound_is_abandoned(tmp_path: Path) -> None:
    running = subprocess.Popen(command(tmp_path, 30, 0.5, "true"), stdout=subprocess.PIPE, text=True, env=ENV)
    until_waiting(running)
    assert claim(tmp_path, engine_init.DECISION, engine_init.RESTORE)
    stdout, _ = running.communicate(timeout=30)
    assert running.returncode == 0
    assert events(stdout)[1] == {"event": "starting", "reason": "restore failed: no outcome within 0.5 s"}
    # The agent, done later, cannot say "restored": it finds the outcome taken and ends what it restored.
    assert (tmp_path / engine_init.OUTCOME).read_text() == "abandoned\n"
    assert not claim(tmp_path, engine_init.OUTCOME, f"{engine_init.RESTORED} 42")


def test_sigterm_reaches_the_engine_and_before_any_engine_ends_the_wait(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        command(tmp_path, 0, 5, "sleep", "60"), stdout=subprocess.PIPE, text=True, env=ENV
    )
    wait_until(lambda: children(serving.pid))
    serving.send_signal(signal.SIGTERM)
    stdout, _ = serving.communicate(timeout=10)
    assert serving.returncode == 128 + signal.SIGTERM  # sleep's death by SIGTERM, as a shell reports it
    assert events(stdout)[-1] == {"event": "exited", "code": 128 + signal.SIGTERM}

    (tmp_path / "other").mkdir()
    waiting = subprocess.Popen(
        command(tmp_path / "other", 60, 5, "sleep", "60"), stdout=subprocess.PIPE, text=True, env=ENV
    )
    time.sleep(1)
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=10) == 128 + signal.SIGTERM
    assert not (tmp_path / "other" / engine_init.DECISION).exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--restore-wait", "1", "--restore-bound", "1"], "no COMMAND after --"),
        (["--restore-wait", "-1", "--restore-bound", "1", "--", "true"], "must be 0 or more"),
        (["--directory", "/nonexistent", "--restore-wait", "1", "--restore-bound", "1", "--", "true"],
         "is not a directory"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(arguments: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stoker.inpod.engine_init", *arguments],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return 0


# The engine: /health, one model and its completions, and the control endpoints, each call to these logged
# as [path, body, control token] (answered 500 for $FAIL_PATH).
FAKE_ENGINE = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Engine(BaseHTTPRequestHandler):
    def answer(self, code, body=b"{}"):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        models = json.dumps({"data": [{"id": "m"}]}).encode()
        self.answer(200) if self.path == "/health" else self.answer(200, models)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        if self.path != "/v1/completions":
            with open(sys.argv[2], "a") as calls:
                calls.write(json.dumps([self.path, body, self.headers.get("x-stoker-control-token")]) + "\\n")
        self.answer(500 if self.path == os.environ.get("FAIL_PATH") else 200)

    def log_message(self, *_):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Engine).serve_forever()
"""
TOKEN = "the-pod-control-token"
WAKE_CALLS = [
    ["/wake_up?tags=weights", "", TOKEN],
    ["/collective_rpc", '{"method": "reload_weights"}', TOKEN],
    ["/wake_up?tags=kv_cache", "", TOKEN],
]


def fake_engine(tmp_path: Path) -> tuple[list[str], str, Path]:
    """The fake engine's command, its health URL and its calls' log."""
    script, calls, port = tmp_path / "engine.py", tmp_path / "calls.jsonl", free_port()
    script.write_text(FAKE_ENGINE)
    return [sys.executable, str(script), str(port), str(calls)], f"http://127.0.0.1:{port}/health", calls


def logged(calls: Path) -> list[list[str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def gated(
    tmp_path: Path, offer_bound: float, wait: float = 30, sleep: bool = False
) -> tuple[subprocess.Popen[str], Path, int, Path]:
    """engine_init with its gate and a dump offer around the fake engine, started: the process, the handshake
    directory, the gate's port and the engine's calls."""
    engine, health, calls = fake_engine(tmp_path)
    handshake = tmp_path / "handshake"
    handshake.mkdir()
    gate = free_port()
    options = ("--health-url", health, "--gate-port", str(gate), "--offer-bound", str(offer_bound))
    argv = command(handshake, wait, 5, *engine, options=(*options, "--sleep") if sleep else options)
    env = dict(ENV, **{CONTROL_TOKEN_ENV: TOKEN})
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env), handshake, gate, calls


def told_to_start(serving: subprocess.Popen[str], handshake: Path) -> None:
    """The node's agent answers: no snapshot to restore."""
    until_waiting(serving)
    assert claim(handshake, engine_init.DECISION, f"{engine_init.START} no snapshot of this cache key")


def test_a_started_engine_is_offered_for_a_dump_and_kept_out_of_traffic_until_the_outcome(
    tmp_path: Path,
) -> None:
    serving, handshake, gate, calls = gated(tmp_path, 60)
    try:
        told_to_start(serving, handshake)
        wait_until(lambda: (handshake / engine_init.OFFER).exists())
        assert ready(gate) == 503  # the engine serves, but is offered: out of traffic
        assert claim(handshake, engine_init.DUMP, engine_init.DUMPING)
        time.sleep(0.5)
        assert ready(gate) == 503  # the dump under way
        assert claim(handshake, engine_init.DUMPED, engine_init.DUMPED)
        wait_until(lambda: ready(gate) == 200)
        serving.send_signal(signal.SIGTERM)
        stdout, _ = serving.communicate(timeout=10)
    finally:
        serving.kill()
    found = events(stdout)
    assert [event["event"] for event in found] == ["starting", "offering", "serving", "exited"]
    assert str(found[1]["warmUp"]).startswith("one completion in"), found[1]
    assert found[2]["dump"] == "dumped"
    assert logged(calls) == []  # not in sleep mode: no control call


def test_an_offer_nobody_takes_is_declined_within_its_bound(tmp_path: Path) -> None:
    serving, handshake, gate, _ = gated(tmp_path, 0.5)
    try:
        told_to_start(serving, handshake)
        wait_until(lambda: ready(gate) == 200)
        # An agent that comes after the bound dumps nothing: the pod serves traffic now.
        assert (handshake / engine_init.DUMP).read_text() == "declined\n"
        assert not claim(handshake, engine_init.DUMP, engine_init.DUMPING)
    finally:
        serving.terminate()
        serving.wait(timeout=10)


def test_without_an_agent_s_answer_nothing_is_offered_and_the_engine_serves_at_once(tmp_path: Path) -> None:
    serving, handshake, gate, _ = gated(tmp_path, 300, wait=0.3)
    try:
        wait_until(lambda: ready(gate) == 200)  # not kept out of traffic for the offer's 300 s
        assert not (handshake / engine_init.OFFER).exists()
    finally:
        serving.terminate()
        serving.wait(timeout=10)


def test_a_sleeping_engine_is_offered_asleep_and_woken_with_its_weights_after_the_dump(
    tmp_path: Path,
) -> None:
    serving, handshake, gate, calls = gated(tmp_path, 60, sleep=True)
    try:
        told_to_start(serving, handshake)
        wait_until(lambda: (handshake / engine_init.OFFER).exists())
        # Asleep at level 2 before the offer, through the guard with the pod's control token.
        assert logged(calls) == [["/sleep?level=2", "", TOKEN]]
        assert claim(handshake, engine_init.DUMP, engine_init.DUMPING)
        assert claim(handshake, engine_init.DUMPED, engine_init.DUMPED)
        wait_until(lambda: ready(gate) == 200)
        assert logged(calls)[1:] == WAKE_CALLS
        serving.send_signal(signal.SIGTERM)
        stdout, _ = serving.communicate(timeout=10)
    finally:
        serving.kill()
    names = [event["event"] for event in events(stdout)]
    assert names == ["starting", "offering", "woken", "serving", "exited"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace of its own needs root")
def test_a_restored_engine_that_does_not_wake_is_ended_and_the_command_started(tmp_path: Path) -> None:
    engine, health, calls = fake_engine(tmp_path)
    options = ("--health-url", health, "--sleep")
    with claimed_in_a_namespace(tmp_path, "echo the command ran; exit 5", options) as (container, init):
        background = f"setsid {shlex.join(engine)} >/dev/null 2>&1 & echo $!"  # its output not run()'s pipe
        restored = subprocess.run(
            ["nsenter", f"--target={init}", "--pid", "--", "sh", "-c", background],
            capture_output=True, text=True, check=True, env=dict(ENV, FAIL_PATH="/collective_rpc"),
        ).stdout.strip()  # fmt: skip
        assert claim(tmp_path, engine_init.OUTCOME, f"{engine_init.RESTORED} {restored}")
        stdout, _ = container.communicate(timeout=30)
    assert container.returncode == 5
    found = events(stdout)
    assert [event["event"] for event in found] == ["restoring", "starting", "exited"]
    assert str(found[1]["reason"]).startswith(
        "the restored engine did not wake: /collective_rpc: HTTP Error 500"
    )
    assert "the command ran" in stdout
    assert [call[0] for call in logged(calls)] == ["/wake_up?tags=weights", "/collective_rpc"]


def test_a_claim_left_empty_by_an_agent_that_died_does_not_hold_the_start(tmp_path: Path) -> None:
    running = subprocess.Popen(command(tmp_path, 1, 5, "true"), stdout=subprocess.PIPE, text=True, env=ENV)
    until_waiting(running)
    (tmp_path / engine_init.DECISION).touch()  # created, never written
    stdout, _ = running.communicate(timeout=30)
    assert running.returncode == 0
    assert events(stdout)[0] == {"event": "starting", "reason": "a claim left empty"}
    # Were that agent alive after all, its restore would find the outcome taken, and end what it restored.
    assert not claim(tmp_path, engine_init.OUTCOME, f"{engine_init.RESTORED} 42")


def test_a_restarted_container_finds_none_of_its_predecessors_handshake(tmp_path: Path) -> None:
    for name, text in ((engine_init.DECISION, "restore"), (engine_init.OUTCOME, "restored 12345")):
        (tmp_path / name).write_text(text)  # what the container before it left: PID 12345 is not its child
    done = subprocess.run(
        command(tmp_path, 0.3, 5, "sh", "-c", "exit 6"), capture_output=True, text=True, env=ENV
    )
    assert done.returncode == 6, done.stdout
    assert [event["event"] for event in events(done.stdout)] == ["waiting", "starting", "exited"]
    assert not (tmp_path / engine_init.OUTCOME).exists()
