"""The snapshot agent's copies of a container's files (stoker.snapshot.agent), on directories standing in for
containers' roots: a tenant's symlink or FIFO never makes the agent (root on the host) read or write outside
the container, or hang; a file comes back at its size at the dump, with its mode."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from stoker.snapshot.agent import (
    SnapshotError,
    changed,
    copy_in,
    copy_out,
    held_file,
    kept_link_remaps,
    link_remap_action,
    open_inside,
    put_back_link_remaps,
    remove_link_remaps,
)
from tests.conftest import REPO


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


def keep(image: Path, root: Path, action: str = "post-dump") -> subprocess.CompletedProcess[str]:
    """CRIU's call of the agent's action script, as CRIU makes it: the file, executed, its action in env."""
    script = link_remap_action(image, root, ["/dev/shm"])
    env = dict(os.environ, CRTOOLS_SCRIPT_ACTION=action, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([script], capture_output=True, text=True, env=env)


def test_criu_s_link_remaps_are_kept_at_post_dump_and_put_back_into_the_target(host: Path) -> None:
    """CRIU deletes its link remaps at the end of a dump that leaves the tree running; the restore needs
    them where they were."""
    shm = host / "root" / "dev" / "shm"
    shm.mkdir(parents=True)
    (shm / "link_remap.214").write_text("semaphore")
    (shm / "link_remap.214").chmod(0o600)
    (shm / "psm_1234").write_text("not a link remap")
    image = host / "image"
    image.mkdir()
    assert keep(image, host / "root", action="pre-dump").returncode == 0
    assert kept_link_remaps(image) == []  # only at post-dump
    done = keep(image, host / "root")
    assert done.returncode == 0, done.stderr
    (shm / "link_remap.214").unlink()  # as CRIU does once the dump is over
    kept = kept_link_remaps(image)
    assert [held["path"] for held in kept] == ["/dev/shm/link_remap.214"]
    target = host / "target"
    (target / "dev" / "shm").mkdir(parents=True)
    put_back_link_remaps(image, kept, target)
    assert (target / "dev" / "shm" / "link_remap.214").read_text() == "semaphore"
    assert (target / "dev" / "shm" / "link_remap.214").stat().st_mode & 0o777 == 0o600
    remove_link_remaps(kept, target)  # a restore that failed leaves none behind
    assert not (target / "dev" / "shm" / "link_remap.214").exists()


def test_a_tenant_s_symlink_named_as_a_link_remap_fails_the_dump_and_copies_nothing(host: Path) -> None:
    shm = host / "root" / "dev" / "shm"
    shm.mkdir(parents=True)
    (shm / "link_remap.7").symlink_to(host / "host-etc" / "shadow")
    image = host / "image"
    image.mkdir()
    done = keep(image, host / "root")
    assert done.returncode == 1 and "a symlink on the way" in done.stderr, done.stderr
    assert "secret" not in "".join(path.read_text() for path in image.rglob("*") if path.is_file())
