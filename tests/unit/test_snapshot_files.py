"""The snapshot agent's copies of a container's files (stoker.snapshot.agent), on directories standing in for
containers' roots: a tenant's symlink or FIFO never makes the agent (root on the host) read or write outside
the container, or hang; a file comes back at its size at the dump, with its mode."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from stoker.snapshot.agent import SnapshotError, changed, copy_in, copy_out, held_file, open_inside


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host directory with a file the tenant must never reach, beside a container's root."""
    (tmp_path / "host-etc").mkdir()
    (tmp_path / "host-etc" / "shadow").write_text("root:secret\n")
    (tmp_path / "root" / "tmp").mkdir(parents=True)
    return tmp_path


def test_a_file_comes_back_in_another_container_at_its_size_at_the_dump_with_its_mode(host: Path) -> None:
    log = host / "root" / "tmp" / "vllm.log"
    log.write_text("started\n")
    log.chmod(0o640)
    held = held_file(host / "root", "/tmp/vllm.log")
    log.write_text("started\nserved a tenant's request\n")  # written after the dump: not carried
    copy_out(host / "root", held, host / "copy")
    target = host / "target"
    target.mkdir()
    copy_in(host / "copy", target, held)
    assert (target / "tmp" / "vllm.log").read_text() == "started\n"
    assert (target / "tmp" / "vllm.log").stat().st_mode & 0o777 == 0o640


def test_a_sparse_file_stays_sparse_through_the_copies(host: Path) -> None:
    """vLLM's shared-memory buffers are mostly holes; copied whole they overflow a pod's 64 MiB /dev/shm."""
    buffer = host / "root" / "tmp" / "psm_buffer"
    with buffer.open("wb") as written:
        written.write(b"head")
        written.seek(64 << 20)
        written.write(b"tail")
    held = held_file(host / "root", "/tmp/psm_buffer")
    copy_out(host / "root", held, host / "copy")
    (host / "target").mkdir()
    copy_in(host / "copy", host / "target", held)
    for copied in (host / "copy", host / "target" / "tmp" / "psm_buffer"):
        assert copied.stat().st_size == (64 << 20) + 4
        assert copied.stat().st_blocks * 512 < 1 << 20, "the hole was written out"
        with copied.open("rb") as read:
            assert read.read(4) == b"head" and (read.seek(64 << 20), read.read())[1] == b"tail"


def test_a_symlink_on_the_way_is_refused_whichever_way_it_points(host: Path) -> None:
    root = host / "root"
    (root / "home").symlink_to(host / "host-etc")  # an absolute symlink: the host's path, seen from the host
    (root / "tmp" / "log").symlink_to("/etc/shadow")
    for path in ("/home/shadow", "/tmp/log"):
        with pytest.raises(SnapshotError, match="symlink on the way"):
            held_file(root, path)
    copy = host / "copy"
    copy.write_text("planted\n")
    held = {"path": "/home/shadow", "size": 8, "mode": 0o644, "uid": os.getuid(), "gid": os.getgid()}
    with pytest.raises(SnapshotError):
        copy_in(copy, root, held)  # type: ignore[arg-type]
    assert (host / "host-etc" / "shadow").read_text() == "root:secret\n"
    assert not changed(root, "/home/shadow")


def test_a_fifo_or_a_directory_is_refused_without_waiting(host: Path) -> None:
    root = host / "root"
    os.mkfifo(root / "tmp" / "fifo")
    (root / "tmp" / "dir").mkdir()
    finished = threading.Event()

    def read() -> None:
        for path in ("/tmp/fifo", "/tmp/dir"):
            with pytest.raises(SnapshotError):
                held_file(root, path)
        finished.set()

    threading.Thread(target=read, daemon=True).start()
    assert finished.wait(5), "the agent waited on a FIFO"


@pytest.mark.parametrize("path", ["relative", "/tmp/../etc/shadow", "/", "/tmp/./x", "/tmp//x", "/tmp/"])
def test_a_path_that_is_not_plain_and_absolute_is_refused(host: Path, path: str) -> None:
    with pytest.raises(SnapshotError, match="not a plain absolute path"):
        open_inside(host / "root", path, os.O_RDONLY)
