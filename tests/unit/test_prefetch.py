"""The read-ahead wrapper: it reads the checkpoint and then gets out of the way of the server it execs."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

from stoker.render.prefetch import GENTLE_BYTES, read_ahead, read_ahead_command, server_has_child


def checkpoint(root: Path) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3 << 20))
    (model / "model-00002-of-00002.safetensors").write_bytes(os.urandom(1 << 20) + b"x")
    (model / "config.json").write_text("{}")
    return model


def test_reads_every_safetensors_file_in_chunks_and_nothing_else(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    assert read_ahead([str(model)], readers=3, chunk=1 << 20) == (4 << 20) + 1


def test_a_hub_id_is_read_from_the_hugging_face_cache(tmp_path: Path, monkeypatch) -> None:
    blob = tmp_path / "hub" / "models--org--name" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"w" * 1000)
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blob)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read_ahead(["org/name"]) == 1000
    assert read_ahead(["org/absent", "s3://bucket/model"]) == 0


def test_the_gentle_reader_alone_reads_everything_when_the_engine_never_starts(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    never = threading.Event()
    assert (
        read_ahead([str(model)], readers=4, chunk=1 << 20, gentle=4096, engine_started=never.is_set)
        == (4 << 20) + 1
    )


def test_all_readers_join_in_once_the_engine_has_started(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    polls = []

    def started_on_the_second_poll() -> bool:
        polls.append(True)
        return len(polls) > 1

    read = read_ahead(
        [str(model)], readers=4, chunk=1 << 20, gentle=1, engine_started=started_on_the_second_poll
    )
    assert read == (4 << 20) + 1
    # One-byte requests alone would still be at it: the readers widened after the second poll.
    assert len(polls) == 2


def test_the_engine_is_the_servers_child_that_is_not_the_reader() -> None:
    # A server of its own, with the function embedded as the pod's program embeds it: the test runner has
    # other children (the e2e cluster's processes, when the suites run in one session).
    server = (
        "import os, subprocess, sys\n"
        + inspect.getsource(server_has_child)
        + """
sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
reader = subprocess.Popen(sleeper)
alone = server_has_child(os.getpid(), reader.pid)
engine = subprocess.Popen(sleeper)
print(alone, server_has_child(os.getpid(), reader.pid))
for child in (reader, engine):
    child.kill()
"""
    )
    result = subprocess.run(
        [sys.executable, "-c", server], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "True"]


def test_the_server_keeps_the_process_its_arguments_and_its_exit_code(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    program = "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(7)"
    server = [sys.executable, "-c", program, "--a", "b"]
    process = subprocess.Popen(
        [sys.executable, *read_ahead_command([str(model)])[1:], *server], stdout=subprocess.PIPE, text=True
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 7
    # exec, not a child: the server runs as the container's own process.
    assert output.split()[0] == str(process.pid)
    assert output.strip().endswith("['--a', 'b']")


def test_the_command_is_python3_with_the_program_and_ends_where_the_server_begins() -> None:
    command = read_ahead_command(["/models/m"])
    assert command[:2] == ["python3", "-c"]
    assert command[3:] == ["--gentle", str(GENTLE_BYTES), "/models/m", "--"]
    assert read_ahead_command(["/models/m"], gentle=0)[3:] == ["--gentle", "0", "/models/m", "--"]
