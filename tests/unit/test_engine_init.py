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

from stoker.inpod import engine_init
from stoker.snapshot.agent import children
from tests.conftest import REPO

ENV = dict(os.environ, PYTHONPATH=str(REPO / "src"))


def command(directory: Path, wait: float, bound: float, *engine: str) -> list[str]:
    return [sys.executable, "-m", "stoker.inpod.engine_init", "--directory", str(directory),
            "--restore-wait", str(wait), "--restore-bound", str(bound), "--", *engine]  # fmt: skip


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
        {"event": "starting", "reason": "no restore claimed within 0.3 s"},
        {"event": "exited", "code": 3},
    ]
    assert (tmp_path / engine_init.DECISION).read_text() == "start\n"
    # An agent that comes later finds the pod decided and restores nothing.
    assert not claim(tmp_path, engine_init.DECISION, engine_init.RESTORE)


@contextlib.contextmanager
def claimed_in_a_namespace(directory: Path, script: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """engine_init as PID 1 of a PID namespace of its own, as in a container, running `script` if it starts
    its command, its restore claimed; it and its host PID, killed at the end."""
    container = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *command(directory, 30, 30, "sh", "-c", script)],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        wait_until(lambda: children(container.pid))
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


def gated(tmp_path: Path, offer_bound: float) -> tuple[list[str], Path, int]:
    """engine_init with its gate and a dump offer, around Python's own HTTP server as the engine (it answers
    /health once it listens); the argv, the handshake directory and the gate's port."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    handshake = tmp_path / "handshake"
    handshake.mkdir()
    engine_port, gate = free_port(), free_port()
    engine = [
        sys.executable,
        "-m",
        "http.server",
        "-d",
        str(tmp_path / "www"),
        "-b",
        "127.0.0.1",
        str(engine_port),
    ]
    argv = [*command(handshake, 0, 5, *engine)]
    argv[argv.index("--"):argv.index("--")] = [
        "--health-url", f"http://127.0.0.1:{engine_port}/health", "--gate-port", str(gate),
        "--offer-bound", str(offer_bound),
    ]  # fmt: skip
    return argv, handshake, gate


def test_a_started_engine_is_offered_for_a_dump_and_kept_out_of_traffic_until_the_outcome(
    tmp_path: Path,
) -> None:
    argv, handshake, gate = gated(tmp_path, 60)
    serving = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
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
    # This engine has no OpenAI API: the warm-up fails, and the engine is offered all the same.
    assert str(found[1]["warmUp"]).startswith("failed: HTTP Error 404"), found[1]
    assert found[2]["dump"] == "dumped"


def test_an_offer_nobody_takes_is_declined_within_its_bound(tmp_path: Path) -> None:
    argv, handshake, gate = gated(tmp_path, 0.5)
    serving = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_until(lambda: ready(gate) == 200)
        # An agent that comes after the bound dumps nothing: the pod serves traffic now.
        assert (handshake / engine_init.DUMP).read_text() == "declined\n"
        assert not claim(handshake, engine_init.DUMP, engine_init.DUMPING)
    finally:
        serving.terminate()
        serving.wait(timeout=10)


def test_a_claim_left_empty_by_an_agent_that_died_does_not_hold_the_start(tmp_path: Path) -> None:
    (tmp_path / engine_init.DECISION).touch()  # created, never written
    done = subprocess.run(
        command(tmp_path, 0.3, 5, "true"), capture_output=True, text=True, env=ENV, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert events(done.stdout)[0] == {"event": "starting", "reason": "a claim left empty"}
    # Were that agent alive after all, its restore would find the outcome taken, and end what it restored.
    assert not claim(tmp_path, engine_init.OUTCOME, f"{engine_init.RESTORED} 42")
