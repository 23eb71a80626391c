"""The read-ahead wrapper: it reads the checkpoint and then gets out of the way of the server it execs. The
programs run as a pod runs them: `python3 -m stoker.inpod.NAME`, from the programs directory alone."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stoker.inpod.pagecache import files_under, resident_pages
from stoker.inpod.read_ahead import listed_ranges, read_ahead, script_of_this_python
from stoker.render.prefetch import BYTECODE_DIRECTORY, GENTLE_BYTES, read_ahead_command
from stoker.render.seed import seed_invocation
from tests.unit.test_render import service


def with_programs(programs: Path, env: dict[str, str] | None = None, *before: Path) -> dict[str, str]:
    """`env` (this process's by default) with the programs directory on PYTHONPATH, after `before`."""
    return {**(os.environ if env is None else env), "PYTHONPATH": ":".join(map(str, [*before, programs]))}


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


def test_small_requests_still_read_every_byte(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    assert read_ahead([str(model)], readers=3, chunk=1 << 20, request=4096) == (4 << 20) + 1
    assert read_ahead([str(model)], readers=3, chunk=1 << 20, gentle=512, request=4096) == (4 << 20) + 1


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


def test_the_engine_is_the_servers_child_that_is_not_the_reader(programs: Path) -> None:
    # A server of its own: the test runner has other children (the e2e cluster's processes, when the suites
    # run in one session).
    server = """
import os, subprocess, sys
from stoker.inpod.pagecache import server_has_child

sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
reader = subprocess.Popen(sleeper)
alone = server_has_child(os.getpid(), reader.pid)
engine = subprocess.Popen(sleeper)
print(alone, server_has_child(os.getpid(), reader.pid))
for child in (reader, engine):
    child.kill()
"""
    result = subprocess.run(
        [sys.executable, "-c", server],
        env=with_programs(programs),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["False", "True"]


def test_the_server_keeps_the_process_its_arguments_and_its_exit_code(tmp_path: Path, programs: Path) -> None:
    model = checkpoint(tmp_path)
    program = "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(7)"
    server = [sys.executable, "-c", program, "--a", "b"]
    process = subprocess.Popen(
        [sys.executable, *read_ahead_command([str(model)])[1:], *server],
        env=with_programs(programs),
        stdout=subprocess.PIPE,
        text=True,
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 7
    # exec, not a child: the server runs as the container's own process.
    assert output.split()[0] == str(process.pid)
    assert output.strip().endswith("['--a', 'b']")


# A console script of this interpreter, as pip writes them (`vllm`), that reports its collector before and
# after it starts a child the way vLLM starts its engine process (forked or spawned), then exits 3.
SERVER_SCRIPT = """#!{python}
import gc, os, subprocess, sys, time

def collector():
    return f"on={{gc.isenabled()}} frozen={{gc.get_freeze_count() > 0}}"

print("server", os.getpid(), sys.argv[1:], sys.path[0], collector(), flush=True)
if sys.argv[1] == "fork":
    child = os.fork()
    if child == 0:
        print("engine", collector(), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
else:
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    time.sleep(1)
    engine.wait()
print("after", collector(), flush=True)
sys.exit(3)
"""


def console_script(directory: Path, name: str, python: str = sys.executable) -> Path:
    directory.mkdir(exist_ok=True)
    script = directory / name
    script.write_text(SERVER_SCRIPT.format(python=python))
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_python_server_imports_without_its_collector_until_it_starts_its_engine(
    tmp_path: Path, programs: Path, start: str
) -> None:
    script = console_script(tmp_path / "bin", "serve")
    command = read_ahead_command([str(tmp_path / "absent")], defer_gc=True)
    process = subprocess.Popen(
        [sys.executable, *command[1:], "serve", start, "--a", "b"],
        stdout=subprocess.PIPE,
        text=True,
        env=with_programs(programs, {**os.environ, "PATH": f"{script.parent}:{os.environ['PATH']}"}),
    )
    output, _ = process.communicate(timeout=60)
    lines = dict(line.split(" ", 1) for line in output.splitlines())
    assert process.returncode == 3
    # In the wrapper's process (the container's own), with its arguments, run as python3 SCRIPT runs it.
    arguments = f"['{start}', '--a', 'b']"
    assert lines["server"] == f"{process.pid} {arguments} {script.parent} on=False frozen=False"
    assert lines["after"] == "on=True frozen=True"
    if start == "fork":
        assert lines["engine"] == "on=True frozen=True"


def test_a_server_of_another_interpreter_is_execd_with_its_collector_as_it_is(
    tmp_path: Path, programs: Path
) -> None:
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "python3").symlink_to(sys.executable)
    script = console_script(tmp_path / "bin", "serve", python=str(elsewhere / "python3"))
    command = read_ahead_command([str(tmp_path / "absent")], defer_gc=True)
    process = subprocess.run(
        [sys.executable, *command[1:], "serve", "fork"],
        capture_output=True,
        text=True,
        timeout=60,
        env=with_programs(programs, {**os.environ, "PATH": f"{script.parent}:{os.environ['PATH']}"}),
    )
    assert process.returncode == 3
    assert "on=True frozen=False" in process.stdout.splitlines()[0]
    assert f"stoker: serve is not a script of {sys.executable}: exec'd" in process.stderr


def test_a_script_of_this_python_is_named_by_its_path_or_through_env(tmp_path: Path, monkeypatch) -> None:
    here = console_script(tmp_path / "bin", "here")
    (tmp_path / "bin" / "through-env").write_text(f"#!/usr/bin/env {Path(sys.executable).name}\n")
    (tmp_path / "bin" / "through-env").chmod(0o755)
    (tmp_path / "bin" / "shell").write_text("#!/bin/sh\nexec true\n")
    (tmp_path / "bin" / "shell").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert script_of_this_python("here") == str(here)
    assert script_of_this_python("through-env") == str(tmp_path / "bin" / "through-env")
    assert script_of_this_python("shell") is None
    assert script_of_this_python("absent-command") is None
    assert script_of_this_python(sys.executable) is None  # a binary, not a script


def test_the_command_is_python3_with_the_program_and_ends_where_the_server_begins() -> None:
    command = read_ahead_command(["/models/m"])
    assert command[:3] == ["python3", "-m", "stoker.inpod.read_ahead"]
    assert command[3:] == [
        "--gentle",
        str(GENTLE_BYTES),
        "--pin-ptxas",
        "--bytecode",
        BYTECODE_DIRECTORY,
        "/models/m",
        "--",
    ]
    assert read_ahead_command(["/models/m"], gentle=0)[3:] == [
        "--gentle",
        "0",
        "--pin-ptxas",
        "--bytecode",
        BYTECODE_DIRECTORY,
        "/models/m",
        "--",
    ]


def test_resident_pages_are_the_runs_of_each_file_in_the_page_cache(tmp_path: Path) -> None:
    page = mmap.PAGESIZE
    library = tmp_path / "site" / "module.so"
    library.parent.mkdir()
    library.write_bytes(os.urandom(64 * page))
    (tmp_path / "site" / "empty.py").touch()
    (tmp_path / "link.so").symlink_to(library)
    descriptor = os.open(library, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)  # these pages and no read-ahead
        os.pread(descriptor, 2 * page, 8 * page)
        os.pread(descriptor, page, 40 * page)
    finally:
        os.close(descriptor)
    expected = [(str(library), 8 * page, 10 * page), (str(library), 40 * page, 41 * page)]
    # The link is the same file: listed once.
    files = files_under([str(tmp_path / "site"), str(tmp_path / "link.so"), str(tmp_path / "absent")])
    assert files == [str(tmp_path / "site" / "empty.py"), str(library)]
    assert resident_pages(files) == expected


def test_a_listing_is_read_in_ranges_clamped_to_its_files_and_an_absent_one_is_none(tmp_path: Path) -> None:
    library = tmp_path / "a.so"
    library.write_bytes(os.urandom(10 << 20))
    spaced = tmp_path / "b c.py"
    spaced.write_bytes(os.urandom(6000))
    listing = tmp_path / "import-pages"
    # The second range ends past the file's end: read up to it.
    listing.write_text(f"{library} 0 {10 << 20}\n{spaced} 4096 8192\n")
    assert list(listed_ranges(str(listing))) == [
        (str(library), 0, 4 << 20),
        (str(library), 4 << 20, 4 << 20),
        (str(library), 8 << 20, 2 << 20),
        (str(spaced), 4096, 6000 - 4096),
    ]
    skips: list[tuple[str, str]] = []
    assert list(listed_ranges(str(tmp_path / "absent"), skipped=lambda *skip: skips.append(skip))) == []
    assert skips == [(str(tmp_path / "absent"), "no import pages listing (No such file or directory)")]


def test_the_listed_pages_are_read_before_the_checkpoint(tmp_path: Path, programs: Path) -> None:
    model = checkpoint(tmp_path)
    library = tmp_path / "module.so"
    library.write_bytes(os.urandom(3 * mmap.PAGESIZE))
    listing = tmp_path / "import-pages"
    listing.write_text(f"{library} 0 {2 * mmap.PAGESIZE}\n{tmp_path / 'gone.so'} 0 4096\n")
    server = [sys.executable, "-c", "pass"]
    command = read_ahead_command([str(model)], pages=str(listing))
    assert command[3:] == [
        "--gentle",
        str(GENTLE_BYTES),
        "--pages",
        str(listing),
        "--pin-ptxas",
        "--bytecode",
        BYTECODE_DIRECTORY,
        str(model),
        "--",
    ]
    result = subprocess.run(
        [sys.executable, *command[1:], *server],
        env=with_programs(programs),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line for line in result.stderr.splitlines() if not any(w in line for w in ("PTXAS", "bytecode"))]
    assert lines[0] == f"stoker read-ahead: skipped {tmp_path / 'gone.so'}: No such file or directory"
    assert lines[1].startswith(f"stoker read-ahead: {2 * mmap.PAGESIZE} bytes of the imports' pages in ")
    assert lines[2].startswith(f"stoker read-ahead: {(4 << 20) + 1} bytes in ")


@pytest.mark.parametrize("planted", [False, True], ids=["", "over-a-planted-fifo"])
def test_the_seed_records_the_pages_its_server_read_before_starting_the_engine(
    tmp_path: Path, programs: Path, planted: bool
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    module = site / "engine_module.py"
    module.write_text("VALUE = 1\n" * 1000)
    # Cached now (just written; synced, as an image's files are), but no start reads it: the seed evicts it.
    with (site / "unused_module.py").open("w") as unused:
        unused.write("VALUE = 2\n" * 1000)
        unused.flush()
        os.fsync(unused.fileno())
    listing = tmp_path / "cache" / "stoker" / "import-pages-0123456789"
    if planted:  # where the seed writes the listing before it moves it in place: an open would block
        listing.parent.mkdir(parents=True)
        os.mkfifo(f"{listing}.part")
    # The server imports, then starts its "engine process", then waits for the listing and fails (it never
    # answers /health, so the wrapper exits with its code).
    server = f"""
import os, subprocess, sys, time
import engine_module
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
for _ in range(300):
    if os.path.exists({str(listing)!r}):
        break
    time.sleep(0.1)
engine.kill()
sys.exit(3)
"""
    seed = seed_invocation(service()).command  # python3 -m stoker.inpod.seed
    result = subprocess.run(
        [sys.executable, *seed[1:], "--pages", str(listing), "--", sys.executable, "-c", server],
        env=with_programs(programs, None, site),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3
    assert "stoker-seed: recorded " in result.stdout
    recorded = [line.rsplit(" ", 2) for line in listing.read_text().splitlines()]
    assert [str(module), "0", str(module.stat().st_size)] in recorded
    assert not [path for path, _, _ in recorded if path.endswith("unused_module.py")]
