"""Dump a served vLLM process tree with CRIU and restore it, with what a restore of vLLM needs beside
the image (issue 40): the files vLLM keeps in /dev/shm (CRIU keeps shared file mappings by path, and vLLM
deletes them when it exits), the server's log as it was at the dump (CRIU checks the size of the files a
process holds open), and the directories a restore must find as they were (a container's changed files,
which a runtime keeps beside its checkpoint). The CPU benchmark (cpu.py) and the GPU one
(bench/gpu/snapshot_restore.py) share it.

CRIU options: `--tcp-established` (the engine's gloo connection, on loopback inside the tree) and
`--link-remap` (multiprocessing's semaphores, created under a temporary name and renamed).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from stoker.inpod.engine_init import ended_children
from stoker.snapshot import plan
from stoker.snapshot.agent import held_paths, kept_link_remaps, link_remap_action, put_back_link_remaps, tree
from stoker.snapshot.plan import CRIU_FILE_OPTIONS

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
# Right after a dump the dead tree's PIDs can stay taken for a moment ("Can't fork for PID: File exists").
RESTORE_ATTEMPTS = 20
# A tarball of the directories a restore must find as they were (container-local files the tree holds open).
KEPT_FILES = "kept-files.tar"


@functools.cache
def criu_binary() -> str:
    """CRIU: $CRIU (a carried build, `hack/criu bundle`), else `hack/criu build`'s binary."""
    if os.environ.get("CRIU"):
        return os.environ["CRIU"]
    return subprocess.run(
        [REPO / "hack/criu", "bin"], check=True, capture_output=True, text=True
    ).stdout.strip()


def group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid and (entry / "stat").read_text().split()[2] != "Z":
                    return True
            except (OSError, IndexError):
                continue
    return False


def stop_group(pgid: int) -> None:
    """TERM a process group, KILL it after 30 s, and wait until none of it is left."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.1)


def dump(
    root: int,
    image: Path,
    shm_before: set[str],
    log: Path,
    kept: Sequence[Path] = (),
    options: Sequence[str] = (),
    leave_running: bool = False,
) -> dict[str, object]:
    """Dump the tree under `root` into `image` (the tree is gone after it, unless `leave_running`), then keep
    beside the image the /dev/shm files made since `shm_before`, `log` as it is, and the directories `kept`.
    Raises with CRIU's log if the dump fails (the tree then runs on).

    A tree left running keeps CRIU's link remaps only while CRIU runs (it deletes them at the end of such a
    dump), and a restore needs them (`Can't link dev/shm/link_remap.N -> ...`): the agent's post-dump action
    keeps them (stoker.snapshot.agent.link_remap_action), and put_back puts them back."""
    shutil.rmtree(image, ignore_errors=True)
    (image / "shm").mkdir(parents=True)
    began = time.monotonic()
    argv = [criu_binary(), "dump", "-t", str(root), "-D", str(image), *CRIU_FILE_OPTIONS]
    running = []
    if leave_running:
        directories = plan.remap_directories(held_paths(tree(root)))
        running = ["--leave-running", "--action-script", link_remap_action(image, Path("/"), directories)]
    done = subprocess.run([*argv, *running, *options, "-o", "dump.log"], capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"criu dump failed: {(image / 'dump.log').read_text()[-3000:]}")
    while not leave_running and group_alive(root):
        time.sleep(0.05)
    for name in set(os.listdir(SHM)) - shm_before:
        subprocess.run(
            ["cp", "-a", "--sparse=always", str(SHM / name), str(image / "shm" / name)], check=True
        )
    shutil.copy2(log, image / "log.at-dump")
    present = [str(path) for path in kept if path.exists()]
    if present:
        subprocess.run(["tar", "-cPf", str(image / KEPT_FILES), *present], check=True)
    pages = sum(path.stat().st_size for path in image.glob("pages-*.img"))
    return {"dumpSeconds": round(seconds, 3), "imageBytes": pages}


def put_back(image: Path, log: Path) -> None:
    """What the tree held besides its memory, as it was at the dump."""
    put_back_link_remaps(image, kept_link_remaps(image), Path("/"))
    for entry in (image / "shm").iterdir():
        subprocess.run(["cp", "-a", "--sparse=always", str(entry), str(SHM / entry.name)], check=True)
    shutil.copy2(image / "log.at-dump", log)
    if (image / KEPT_FILES).exists():
        subprocess.run(["tar", "-xPf", str(image / KEPT_FILES)], check=True)


def reap_orphans() -> None:
    """Reap every child of this process that has ended. A driver that makes itself the subreaper of what it
    starts (PR_SET_CHILD_SUBREAPER) gets the orphans of a stopped tree and of CRIU's failed attempts: as
    zombies they would keep PIDs that a restore of the tree needs, on a host whose PID 1 reaps slowly."""
    for _ in ended_children():
        pass


def restore(image: Path, name: str, options: Sequence[str] = ()) -> tuple[int, int]:
    """`criu restore` of `image`, detached, retried while the dumped PIDs are still taken (what ended as
    this process's child reaped before each). Returns the restored root's PID and the attempts it took;
    raises with CRIU's log if it never restored."""
    pidfile = image / "restored.pid"
    pidfile.unlink(missing_ok=True)
    argv = [criu_binary(), "restore", "-d", "-D", str(image), "--tcp-established", "--pidfile", str(pidfile)]
    for attempt in range(1, RESTORE_ATTEMPTS + 1):
        reap_orphans()
        done = subprocess.run([*argv, *options, "-o", f"restore-{name}.log"], capture_output=True, text=True)
        if done.returncode == 0:
            return int(pidfile.read_text()), attempt
        time.sleep(0.5)
    raise RuntimeError(f"criu restore failed: {(image / f'restore-{name}.log').read_text()[-3000:]}")
