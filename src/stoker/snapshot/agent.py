"""The node agent's snapshot work (issue 40): dump the engine served in one pod's container and restore it
into another pod's running container on the same node, by CRIU, without the container runtime (Kubernetes
restores no pod before KEP-5823). It needs root in the host's PID and mount namespaces (a privileged node
agent); what it does is planned by stoker.snapshot.plan.

    python -m stoker.snapshot.agent dump|restore --base DIR --namespace NS --service NAME --cache-key KEY \
        --container ID

`--container` is the runtime's container ID (a pod's containerStatuses[].containerID without its scheme). A
snapshot lives in DIR/NS/NAME/KEY, a directory no pod mounts; a restore takes only a directory that a dump of
this agent completed, and never another namespace's, service's or key's. Both go through the container's
PID 1, stoker.inpod.engine_init, and its handshake files: a dump takes only an engine that engine_init
offers (serving, and kept out of its Service until the dump's outcome), a restore goes only into a
container whose engine_init still waits; the agent claims each first and tells the outcome, so that a
restore that fails or comes too late ends in the engine's normal start, never in two engines. Each prints
one JSON line; a failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from stoker.api.owned import CACHE_KEY_LABEL, INSTANCE_LABEL, SNAPSHOT_LABEL
from stoker.inpod import engine_init
from stoker.render.pods import ENGINE_CONTAINER
from stoker.snapshot import cuda, plan, trust

# Written last by a dump that completed: what the restore needs beside CRIU's images.
MANIFEST = "stoker-snapshot.json"
FILES = "files"
# CRIU's link remaps, kept at post-dump (keep_link_remaps): what to look for, the copies, what they were.
LINK_REMAP_REQUEST = "link-remap-request.json"
LINK_REMAPS = "link-remaps"
LINK_REMAPS_KEPT = "link-remaps.json"
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
CONTAINER_IN_CGROUP = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
PROC = Path("/proc")
# Right after a failed attempt the tree's PIDs can stay taken a moment ("Can't fork for PID: File exists").
RESTORE_ATTEMPTS = 3


class SnapshotError(RuntimeError):
    pass


# What a dump or a restore raises when it fails: one line on stderr (and, for a restore, the pod told).
FAILURES = (
    SnapshotError,
    cuda.CudaCheckpointError,
    ValueError,
    LookupError,
    OSError,
    subprocess.CalledProcessError,
)


class HeldFile(TypedDict):
    """A file the engine holds in its container, as the dump found it."""

    path: str
    size: int
    mode: int
    uid: int
    gid: int


def namespace_pids(status: Path) -> list[str]:
    """A process's or thread's PIDs from its `status`, the host's first, its own namespace's last."""
    lines = status.read_text().splitlines()
    return next((line.split()[1:] for line in lines if line.startswith("NSpid:")), [])


def container_inits() -> dict[str, int]:
    """Every running container's ID and the host PID of its PID 1 (a process in a cgroup named by the ID,
    PID 1 in its own namespace), from one scan of /proc."""
    found: dict[str, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            nspid = namespace_pids(entry / "status")
            if len(nspid) < 2 or nspid[-1] != "1":
                continue
            ids = set(CONTAINER_IN_CGROUP.findall((entry / "cgroup").read_text()))
        except OSError:
            continue
        for container in ids:
            found[container] = int(entry.name)
    return found


def container_init(container: str) -> int:
    """The host PID of the container's PID 1."""
    if not CONTAINER_ID.fullmatch(container):
        raise SnapshotError(f"{container!r} is not a container ID (64 hex digits)")
    init = container_inits().get(container)
    if init is None:
        raise SnapshotError(f"no running container {container} on this node")
    return init


def process_children() -> dict[int, list[int]]:
    """Every process's children, from one scan of /proc (no CONFIG_PROC_CHILDREN needed)."""
    found: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found.setdefault(parent, []).append(int(entry.name))
    return {parent: sorted(pids) for parent, pids in found.items()}


def children(pid: int) -> list[int]:
    return process_children().get(pid, [])


def tree(root: int) -> list[int]:
    """`root` and its descendants, parents first."""
    known = process_children()
    pids, queue = [], [root]
    while queue:
        pid = queue.pop(0)
        pids.append(pid)
        queue += known.get(pid, [])
    return pids


def last_pid(init: int) -> int:
    """The last PID the namespace of the container whose PID 1 is `init` handed out: above every PID and
    thread ID of a tree dumped in it before now (a thread that ended right after the dump included)."""
    done = subprocess.run(plan.last_pid_arguments(init), capture_output=True, text=True, check=True)
    return int(done.stdout)


def held_paths(pids: list[int]) -> set[str]:
    """What the processes hold open or map, as paths inside their container."""
    held = set()
    for pid in pids:
        for kind in ("fd", "map_files"):
            try:
                entries = list((PROC / str(pid) / kind).iterdir())
            except OSError:
                continue
            for entry in entries:
                try:
                    held.add(os.readlink(entry))
                except OSError:
                    continue
    return held


def cgroup_of(pid: int) -> str:
    """The process's cgroup path (cgroup v2's, else the memory controller's, which a container shares with
    every other controller)."""
    lines = [line.split(":", 2) for line in (PROC / str(pid) / "cgroup").read_text().splitlines()]
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" or "memory" in controllers.split(","):
            return path
    raise SnapshotError(f"no memory cgroup for {pid}")


def open_inside(root: Path, path: str, flags: int, mode: int = 0o600, make_parents: bool = False) -> int:
    """Opens `path` of the container whose root is `root` (/proc/PID/root, or its overlay's upper directory)
    without following a symlink anywhere on the way: the container's files are its author's, and a symlink
    of theirs (/tmp -> /etc) would resolve against the host's root, not the container's."""
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != "" or any(part in ("", ".", "..") for part in parts[1:]):
        raise SnapshotError(f"{path!r} is not a plain absolute path")
    directory = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for part in parts[1:-1]:
            if make_parents:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=directory)
            inner = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = inner
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
    except OSError as refused:
        raise SnapshotError(
            f"{path} in the container: {refused.strerror} (a symlink on the way?)"
        ) from refused
    finally:
        os.close(directory)


def open_regular(root: Path, path: str, flags: int, make_parents: bool = False) -> int:
    """open_inside, refusing what is not a regular file (non-blocking: a FIFO put there must not hang the
    agent)."""
    descriptor = open_inside(root, path, flags | os.O_NONBLOCK, make_parents=make_parents)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise SnapshotError(f"{path} in the container is not a regular file")
    return descriptor


def held_file(root: Path, path: str) -> HeldFile:
    """A regular file the engine holds, as it is now: its size, mode and owner."""
    descriptor = open_regular(root, path, os.O_RDONLY)
    try:
        facts = os.fstat(descriptor)
    finally:
        os.close(descriptor)
    return {"path": path, "size": facts.st_size, "mode": stat.S_IMODE(facts.st_mode), "uid": facts.st_uid,
            "gid": facts.st_gid}  # fmt: skip


def copy_sparse(source: int, target: int, size: int) -> None:
    """The first `size` bytes of `source` into `target`, holes left holes: vLLM's shared-memory buffers are
    mostly holes, and written out whole they overflow the pod's 64 MiB /dev/shm."""
    os.ftruncate(target, 0)
    offset = 0
    while offset < size:
        try:
            data = os.lseek(source, offset, os.SEEK_DATA)
        except OSError as none:  # ENXIO: only a hole is left
            if none.errno != errno.ENXIO:
                raise
            break
        end = min(os.lseek(source, data, os.SEEK_HOLE), size)
        while data < end:
            chunk = os.pread(source, min(end - data, 1 << 20), data)
            if not chunk:
                break
            os.pwrite(target, chunk, data)
            data += len(chunk)
        offset = end
    os.ftruncate(target, size)


def copy_out(root: Path, held: HeldFile, copy: Path) -> None:
    """The file's first `size` bytes (its size at the dump: a log that grew since is cut back) into `copy`."""
    source = open_regular(root, held["path"], os.O_RDONLY)
    try:
        target = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            copy_sparse(source, target, held["size"])
        finally:
            os.close(target)
    finally:
        os.close(source)


def copy_in(copy: Path, root: Path, held: HeldFile) -> None:
    """`copy` to the file's path in the target container, with its mode and owner."""
    source = os.open(copy, os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = open_regular(root, held["path"], os.O_WRONLY | os.O_CREAT, make_parents=True)
        try:
            copy_sparse(source, target, os.fstat(source).st_size)
            os.fchown(target, held["uid"], held["gid"])
            os.fchmod(target, held["mode"])
        finally:
            os.close(target)
    finally:
        os.close(source)


def criu_log(image: Path, name: str) -> str:
    log = image / name
    return log.read_text()[-3000:] if log.exists() else "(no log)"


def changed(upper: Path, path: str) -> bool:
    """Whether the container changed `path` of its root filesystem (the overlay's upper directory has it)."""
    try:
        os.close(open_inside(upper, path, os.O_PATH))
    except SnapshotError:
        return False
    return True


def link_remap_action(image: Path, root: Path, directories: list[str]) -> str:
    """CRIU's action script for a dump left running: at post-dump, the tree still frozen, it copies the link
    remaps CRIU made in `directories` of the tree's root filesystem (`root`: /proc/PID/root) into `image`
    (keep_link_remaps), since CRIU deletes them at the dump's end. CRIU executes it as a file, with its own
    environment (this agent's)."""
    (image / LINK_REMAP_REQUEST).write_text(json.dumps({"root": str(root), "directories": directories}))
    script = image / "keep-link-remaps"
    script.write_text(
        '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] || exit 0\n'
        f"exec {shlex.quote(sys.executable)} -m stoker.snapshot.agent keep-link-remaps "
        f"--image {shlex.quote(str(image))}\n"
    )
    script.chmod(0o700)
    return str(script)


def keep_link_remaps(image: Path) -> list[HeldFile]:
    """Copy the link remaps (plan.remap_directories) into `image`, as link_remap_action asked; what was
    kept. The directories are the tenant's: opened without following a symlink, regular files only."""
    request = json.loads((image / LINK_REMAP_REQUEST).read_text())
    root = Path(request["root"])
    (image / LINK_REMAPS).mkdir(exist_ok=True)
    kept: list[HeldFile] = []
    for directory in request["directories"]:
        descriptor = open_inside(root, directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = sorted(name for name in os.listdir(descriptor) if name.startswith(plan.LINK_REMAP_PREFIX))
        finally:
            os.close(descriptor)
        for name in names:
            held = held_file(root, f"{directory}/{name}")
            copy_out(root, held, image / LINK_REMAPS / str(len(kept)))
            kept.append(held)
    (image / LINK_REMAPS_KEPT).write_text(json.dumps(kept))
    return kept


def kept_link_remaps(image: Path) -> list[HeldFile]:
    kept = image / LINK_REMAPS_KEPT
    return list(json.loads(kept.read_text())) if kept.exists() else []


def put_back_link_remaps(image: Path, kept: list[HeldFile], root: Path) -> None:
    """The kept link remaps into the root filesystem `root`, where the restore links them back."""
    for number, held in enumerate(kept):
        copy_in(image / LINK_REMAPS / str(number), root, held)


def remove_link_remaps(kept: list[HeldFile], root: Path) -> None:
    """The link remaps put back into `root` for a restore that did not take them."""
    for held in kept:
        directory, _, name = held["path"].rpartition("/")
        try:
            descriptor = open_inside(root, directory, os.O_RDONLY | os.O_DIRECTORY)
        except SnapshotError:
            continue
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=descriptor)
        finally:
            os.close(descriptor)


def dump(image: Path, container: str, criu: str) -> dict[str, object]:
    """Dump the engine (PID 1's only child) of `container`, which goes on serving, into `image`: its CUDA
    processes checkpointed by the driver for the dump (their device memory in their host memory, which CRIU
    dumps; an engine in sleep mode was put to sleep by engine_init first) and back on their GPU after it."""
    init = container_init(container)
    engines = children(init)
    if len(engines) != 1:
        raise SnapshotError(f"PID 1 of {container} has {len(engines)} children, not the one engine")
    engine = engines[0]
    mounts = plan.parse_mountinfo((PROC / str(engine) / "mountinfo").read_text())
    carried = plan.carried_mounts(mounts)
    upper = Path(plan.upper_directory(mounts))
    if not upper.is_dir():  # else every file the engine changed would pass for the image's own
        raise SnapshotError(
            f"the container's own changes ({upper}) are not reachable here: the agent needs the container"
            " runtime's root (snapshot.hostPaths.containerdRoot)"
        )
    root = PROC / str(init) / "root"
    pids = tree(engine)
    holding = held_paths(pids)
    files = [
        held_file(root, path)
        for path, on_root in plan.local_files(holding, mounts, carried)
        if not on_root or changed(upper, path)
    ]
    namespaces = {kind: (PROC / str(init) / "ns" / kind).stat().st_ino for kind in ("pid", "net")}
    log_pipes = {
        str(fd): pipe
        for fd in plan.LOG_DESCRIPTORS
        if plan.PIPE.fullmatch(pipe := os.readlink(PROC / str(engine) / "fd" / str(fd)))
    }
    gpus = cuda.container_gpus(root, cuda.node_gpus())
    shutil.rmtree(image, ignore_errors=True)
    image.mkdir(parents=True)
    try:
        action = link_remap_action(image, root, plan.remap_directories(holding))
        checkpointed = cuda.holding(pids)
        began = time.monotonic()
        try:
            cuda.checkpoint(checkpointed)
            checkpoint_seconds = time.monotonic() - began
            done = subprocess.run(
                plan.dump_arguments(criu, engine, image, namespaces, carried, "dump.log", action),
                capture_output=True,
                text=True,
            )
            seconds = time.monotonic() - began - checkpoint_seconds
        finally:
            resuming = time.monotonic()
            cuda.resume(checkpointed)  # the source serves on, whatever became of the dump
            resume_seconds = time.monotonic() - resuming
        if done.returncode != 0:
            raise SnapshotError(f"criu dump failed: {criu_log(image, 'dump.log')}")
        (image / FILES).mkdir()
        for number, held in enumerate(files):  # by number: no name of the tenant's becomes a path of ours
            copy_out(root, held, image / FILES / str(number))
        manifest = {
            "carried": carried,
            "files": files,
            "highestPid": last_pid(init),
            "logPipes": log_pipes,
            "gpus": gpus,
            "linkRemaps": kept_link_remaps(image),
        }
        (image / MANIFEST).write_text(json.dumps(manifest))
    except BaseException:
        shutil.rmtree(image, ignore_errors=True)  # gigabytes that no restore would take
        raise
    pages = sum(path.stat().st_size for path in image.glob("pages-*.img"))
    return {
        "dumpSeconds": round(seconds, 3),
        "imageBytes": pages,
        "files": len(files),
        "cudaProcesses": len(checkpointed),
        "cudaCheckpointSeconds": round(checkpoint_seconds, 3),
        "cudaResumeSeconds": round(resume_seconds, 3),
    }


def completed_manifest(image: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((image / MANIFEST).read_text())
    except (OSError, ValueError) as missing:
        raise SnapshotError(f"no completed snapshot in {image}: {missing}") from missing
    return manifest


@contextlib.contextmanager
def handshake_directory(init: int, handshake: str) -> Iterator[int]:
    """engine_init's directory in the container whose PID 1 is `init`, open (no symlink followed)."""
    directory = open_inside(PROC / str(init) / "root", handshake, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield directory
    finally:
        os.close(directory)


def read_small(directory: int, name: str) -> str | None:
    """The first line of NAME in the open `directory` (a regular file, no symlink followed), or None."""
    try:
        descriptor = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        return os.read(descriptor, 256).decode(errors="replace").strip() or None
    finally:
        os.close(descriptor)


def told(failed: BaseException) -> str:
    """A failure as one line for engine_init's log (CRIU's error is at the end of its log)."""
    reason = " | ".join(str(failed).splitlines())
    return f"{reason[:300]} ... {reason[-600:]}" if len(reason) > 1000 else reason


def dump_offered(image: Path, container: str, criu: str, handshake: str) -> dict[str, object]:
    """Dump the engine of `container` while its engine_init offers it (serving, and nobody else yet), and
    tell engine_init the outcome."""
    init = container_init(container)
    with handshake_directory(init, handshake) as directory:
        if read_small(directory, engine_init.OFFER) != engine_init.OFFERED:
            raise SnapshotError(
                f"{container} offers no dump (its engine is not serving yet, or was restored)"
            )
        if not engine_init.create_once(engine_init.DUMP, engine_init.DUMPING, dir_fd=directory):
            raise SnapshotError(f"{container}'s offer is over (it serves): not dumped")
        try:
            facts = dump(image, container, criu)
        except FAILURES as failed:
            engine_init.create_once(
                engine_init.DUMPED, f"{engine_init.FAILED} {told(failed)}", dir_fd=directory
            )
            raise
        engine_init.create_once(engine_init.DUMPED, engine_init.DUMPED, dir_fd=directory)
    return facts


def restore_into_pod(image: Path, container: str, criu: str, handshake: str) -> dict[str, int | float]:
    """Claim `container` from its waiting engine_init (`handshake`: its directory in the container), restore
    `image` into it and tell engine_init the outcome."""
    manifest = completed_manifest(image)  # no snapshot: the pod is left to its normal start
    init = container_init(container)
    # A waiting engine_init has no child: a restore beside a running engine would overwrite the files it
    # uses (its /dev/shm) whatever the handshake files say.
    if children(init):
        raise SnapshotError(f"{container} started its engine already (its PID 1 has a child): not restored")
    with handshake_directory(init, handshake) as directory:
        if not engine_init.create_once(engine_init.DECISION, engine_init.RESTORE, dir_fd=directory):
            raise SnapshotError(f"{container} started its engine already (or was claimed): not restored")
        try:
            # Waiting while engine_init has written no outcome (it abandons the claim after its bound and
            # starts its own engine, which nothing of the restore may touch).
            restored = restore(
                image,
                manifest,
                container,
                init,
                criu,
                lambda: read_small(directory, engine_init.OUTCOME) is None,
            )
        except FAILURES as failed:
            engine_init.create_once(
                engine_init.OUTCOME, f"{engine_init.FAILED} {told(failed)}", dir_fd=directory
            )
            raise
        engine = int(restored["pid"])
        inside = namespace_pids(PROC / str(engine) / "status")[-1]
        if not engine_init.create_once(
            engine_init.OUTCOME, f"{engine_init.RESTORED} {inside}", dir_fd=directory
        ):
            end_tree(tree(engine))  # engine_init gave up waiting and starts its own
            raise SnapshotError(f"{container} stopped waiting before the restore ended: its engine ended")
    return restored


def restore(
    image: Path, manifest: dict[str, Any], container: str, init: int, criu: str, waiting: Callable[[], bool]
) -> dict[str, int | float]:
    """Restore `image` into `container` (PID 1 `init`): its namespaces, root and cgroup, its engine then
    PID 1's child, its CUDA processes back on the GPU the container has (another than the source's: the
    driver moves them)."""
    remap = cuda.remapping(
        manifest.get("gpus", []), cuda.container_gpus(PROC / str(init) / "root", cuda.node_gpus())
    )
    target = plan.parse_mountinfo((PROC / str(init) / "mountinfo").read_text())
    # Paths as CRIU, in the agent's (the host's) mount namespace, finds them.
    host = plan.parse_mountinfo((PROC / "self" / "mountinfo").read_text())
    sources = plan.mapped_mounts(manifest["carried"], target, host)
    (target_root,) = [mount for mount in target if mount.mount_point == "/"]
    root = plan.host_path(target_root, host)
    inside = PROC / str(init) / "root"
    for number, held in enumerate(manifest["files"]):
        copy_in(image / FILES / str(number), inside, held)
    link_remaps = manifest.get("linkRemaps", [])
    descriptors = {kind: os.open(PROC / str(init) / "ns" / kind, os.O_RDONLY) for kind in ("pid", "net")}
    pipes: dict[str, int] = {}
    made: list[int] = []
    try:
        for fd, pipe in manifest["logPipes"].items():
            if pipe not in pipes:  # standard error the same pipe as the output: one descriptor
                pipes[pipe] = log_pipe(init, int(fd))

        def attempt(number: int) -> bool:
            made.append(number)
            # CRIU consumes the link remaps it links back, and a failed attempt may have: each gets them.
            put_back_link_remaps(image, link_remaps, inside)
            subprocess.run(plan.pid_counter_arguments(init, manifest["highestPid"]), check=True)
            argv = plan.restore_arguments(
                criu, init, image, descriptors, pipes, root, sources, cgroup_of(init), f"restore-{number}.log"
            )
            fds = (*descriptors.values(), *pipes.values())
            return subprocess.run(argv, capture_output=True, pass_fds=fds).returncode == 0

        began = time.monotonic()

        def cleared() -> bool:
            if not waiting():
                return False
            end_leftovers(init)
            return True

        attempts = attempt_restore(attempt, cleared)
    finally:
        for descriptor in (*descriptors.values(), *pipes.values()):
            os.close(descriptor)
    if attempts is None:
        remove_link_remaps(link_remaps, inside)  # a later dump of the target would trip over them
        first, last = criu_log(image, "restore-1.log"), criu_log(image, f"restore-{made[-1]}.log")
        taken = re.search(r"Can't fork for ([0-9]+)", last)
        held = f" ({holder(init, int(taken.group(1)))})" if taken else ""
        raise SnapshotError(f"criu restore failed {len(made)} times{held}: first {first} ... last {last}")
    seconds = round(time.monotonic() - began, 3)
    engines = children(init)  # CRIU's own PIDs are the target namespace's; the host's is PID 1's child
    if len(engines) != 1:
        raise SnapshotError(
            f"after the restore PID 1 of {container} has {len(engines)} children, not the engine"
        )
    resuming = time.monotonic()
    restored = tree(engines[0])
    try:
        cuda.resume(cuda.holding(restored, "checkpointed"), remap)
    except cuda.CudaCheckpointError:
        end_tree(restored)  # locked without its device memory: it could never serve
        raise
    return {
        "restoreSeconds": seconds,
        "pid": engines[0],
        "attempts": attempts,
        "cudaResumeSeconds": round(time.monotonic() - resuming, 3),
        "gpusRemapped": len(remap),
    }


def holder(init: int, pid: int) -> str:
    """What has PID `pid` in the PID namespace of `init` (a restore found it taken), from /proc."""
    namespace = os.readlink(PROC / str(init) / "ns" / "pid")
    for entry in PROC.iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "ns" / "pid") != namespace:
                continue
            for task in (entry / "task").iterdir():
                if namespace_pids(task / "status")[-1] == str(pid):
                    return (
                        f"{pid} is {(task / 'stat').read_text()[:150].strip()}, of host process {entry.name}"
                    )
        except OSError:
            continue
    return f"{pid} is free now"


def end_tree(pids: list[int]) -> None:
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def log_pipe(init: int, fd: int) -> int:
    """The target container's log pipe that its PID 1 holds as `fd`, open for writing in blocking mode (as
    the engine's standard output is)."""
    path = PROC / str(init) / "fd" / str(fd)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # no reader: ENXIO, no hang
    except OSError as failed:
        raise SnapshotError(f"the container's descriptor {fd}: {failed.strerror}") from failed
    if not stat.S_ISFIFO(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise SnapshotError(f"the container's descriptor {fd} is not its log's pipe")
    os.set_blocking(descriptor, True)
    return descriptor


def attempt_restore(attempt: Callable[[int], bool], cleared: Callable[[], bool]) -> int | None:
    """The attempts `criu restore` took, or None if none of RESTORE_ATTEMPTS restored. Each attempt moves
    the target's PID counter past the tree's PIDs first: whatever the target's PID 1 started or reaped since
    the last attempt, CRIU and its helpers take none of them; after a failed one, `cleared` ends what it
    left in the target (a task of the tree still alive holds its PID), or says the target waits no more."""
    for number in range(1, RESTORE_ATTEMPTS + 1):
        if attempt(number):
            return number
        if not cleared():
            return None
        time.sleep(0.5)
    return None


def end_leftovers(init: int) -> None:
    """Kill every process in the PID namespace of `init` but `init` itself: while the target waits for a
    restore nothing else runs there, so anything found was left by a failed attempt; its PID 1 reaps it."""
    namespace = os.readlink(PROC / str(init) / "ns" / "pid")
    for entry in PROC.iterdir():
        try:
            if (
                entry.name.isdigit()
                and int(entry.name) != init
                and os.readlink(entry / "ns" / "pid") == namespace
            ):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def first_word(directory: int, name: str) -> str | None:
    text = read_small(directory, name)
    return text.split()[0] if text else None


def handshake_of(
    pod: dict[str, Any], inits: dict[str, int], handshake: str, key: str
) -> plan.PodHandshake | None:
    """The pod's engine_init as the agent finds it, or None: not signed by the operator for its namespace,
    service and cache key (trust.signed: labels are the pod author's), its engine container not running here,
    the pod going away, or names no snapshot can have."""
    metadata, labels = pod["metadata"], pod["metadata"].get("labels") or {}
    service, cache_key = labels.get(INSTANCE_LABEL, ""), labels.get(CACHE_KEY_LABEL, "")
    if metadata.get("deletionTimestamp") or not trust.signed(key, pod, service, cache_key, ENGINE_CONTAINER):
        return None
    statuses = pod.get("status", {}).get("containerStatuses") or []
    engine: dict[str, Any] = next((s for s in statuses if s.get("name") == ENGINE_CONTAINER), {})
    container = str(engine.get("containerID") or "").partition("://")[2]
    init = inits.get(container)
    if init is None or "running" not in (engine.get("state") or {}):
        return None
    names = (metadata["namespace"], service, cache_key)
    try:
        plan.image_directory(Path("/"), *names)
        with handshake_directory(init, handshake) as directory:
            return plan.PodHandshake(
                *names[:1], metadata["name"], *names[1:], container=container, init=init,
                decision=first_word(directory, engine_init.DECISION),
                offered=read_small(directory, engine_init.OFFER) == engine_init.OFFERED,
                dump=first_word(directory, engine_init.DUMP),
            )  # fmt: skip
    except (ValueError, SnapshotError):
        return None


def tell(pod: plan.PodHandshake, handshake: str, name: str, text: str) -> bool:
    """The agent's answer to the pod's engine_init, unless the file is there already."""
    with handshake_directory(pod.init, handshake) as directory:
        return engine_init.create_once(name, text, dir_fd=directory)


def completed_snapshots(base: Path) -> set[tuple[str, str, str]]:
    return {
        (manifest.parent.parent.parent.name, manifest.parent.parent.name, manifest.parent.name)
        for manifest in base.glob(f"*/*/*/{MANIFEST}")
    }


def act(
    action: plan.NodeAction, base: Path, criu: str, handshake: str, reserve_bytes: int
) -> Mapping[str, object]:
    """One of node_actions' steps; what it did."""
    pod = action.pod
    image = plan.image_directory(base, *pod.snapshot)
    if action.kind == "start":
        return {"told": tell(pod, handshake, engine_init.DECISION, f"{engine_init.START} {action.reason}")}
    if action.kind == "decline":
        return {"told": tell(pod, handshake, engine_init.DUMP, f"{engine_init.DECLINED} {action.reason}")}
    if action.kind == "restore":
        try:
            return restore_into_pod(image, pod.container, criu, handshake)
        except FAILURES:
            shutil.rmtree(image, ignore_errors=True)  # the next served replica of the key is dumped instead
            raise
    # One snapshot per service: another cache key's is stale (the service changed) and its disk is freed.
    for stale in image.parent.iterdir() if image.parent.is_dir() else []:
        if stale != image:
            shutil.rmtree(stale, ignore_errors=True)
    image.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(image.parent).free < reserve_bytes:
        tell(pod, handshake, engine_init.DUMP, f"{engine_init.DECLINED} the node's snapshot disk is full")
        raise SnapshotError(f"under {reserve_bytes} bytes free in {base}: not dumped")
    return dump_offered(image, pod.container, criu, handshake)


def serve(
    node: str, base: Path, criu: str, handshake: str, interval: float, reserve_bytes: int, key: str
) -> NoReturn:
    """Every `interval` seconds, the node's pods labelled for snapshots and signed with `key` (the operator's
    control key): each step of node_actions, one JSON line each."""
    # Only the serving agent talks to the API server (its client is slow to import: not for dump and restore).
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from stoker.controller.kube import Kube, load_config

    load_config()
    kube = Kube(field_manager="stoker-snapshot-agent", connections=1)
    while True:
        try:
            listed = kube.node_pods(node, f"{SNAPSHOT_LABEL}=true")
        except (ApiException, HTTPError, OSError) as unreachable:  # the API server away: the next round
            print(json.dumps({"error": f"listing the node's pods: {unreachable}"[:1000]}), flush=True)
            time.sleep(interval)
            continue
        inits = container_inits()
        found = [handshake_of(pod, inits, handshake, key) for pod in listed]
        pods = [pod for pod in found if pod is not None]
        for action in plan.node_actions(pods, completed_snapshots(base)):
            line: dict[str, object] = {
                "action": action.kind,
                "pod": f"{action.pod.namespace}/{action.pod.name}",
            }
            try:
                line.update(act(action, base, criu, handshake, reserve_bytes))
            except FAILURES as failed:
                line["error"] = told(failed)
            print(json.dumps(line), flush=True)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stoker.snapshot.agent", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["dump", "restore", "serve", "keep-link-remaps"])
    parser.add_argument("--base", type=Path, help="the agent's snapshot directory")
    parser.add_argument("--image", type=Path, help="keep-link-remaps (CRIU's post-dump action): the image")
    parser.add_argument("--namespace", help="dump, restore: the snapshot's namespace")
    parser.add_argument("--service", help="dump, restore: the snapshot's service")
    parser.add_argument("--cache-key", help="dump, restore: the snapshot's cache key")
    parser.add_argument("--container", help="dump, restore: the runtime's container ID")
    parser.add_argument("--node", help="serve: this node's name")
    parser.add_argument("--interval", type=float, default=2.0, help="serve: seconds between rounds")
    parser.add_argument(
        "--reserve-bytes",
        type=int,
        default=20 << 30,
        help="serve: no dump when the snapshot directory's disk has less free (default 20 GiB)",
    )
    parser.add_argument(
        "--criu", default=os.environ.get("CRIU", "criu"), help="CRIU's binary (default: $CRIU, criu)"
    )
    parser.add_argument(
        "--handshake",
        default=engine_init.HANDSHAKE_DIRECTORY,
        help="engine_init's directory in the container (default: %(default)s)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        help="serve: the operator's control key; only pods it signed are acted on (stoker.snapshot.trust)",
    )
    args = parser.parse_args(argv)
    wanted = {
        "serve": ["base", "node", "key_file"],
        "keep-link-remaps": ["image"],
    }.get(args.action, ["base", "namespace", "service", "cache_key", "container"])
    missing = [f"--{name.replace('_', '-')}" for name in wanted if getattr(args, name) is None]
    if missing:
        parser.error(f"{args.action} needs {', '.join(missing)}")
    if args.action == "keep-link-remaps":
        try:
            keep_link_remaps(args.image)
        except FAILURES as failed:
            print(f"stoker snapshot keep-link-remaps: {failed}", file=sys.stderr)
            return 1
        return 0
    if args.action == "serve":
        try:
            key = args.key_file.read_text().strip()
        except OSError as unreadable:
            parser.error(f"--key-file: {unreadable}")
        if len(key) < trust.MINIMUM_KEY_LENGTH:
            parser.error(
                f"--key-file: {args.key_file} holds no key of {trust.MINIMUM_KEY_LENGTH} characters or more"
            )
        serve(args.node, args.base, args.criu, args.handshake, args.interval, args.reserve_bytes, key)
    try:
        image = plan.image_directory(args.base, args.namespace, args.service, args.cache_key)
        container = args.container.removeprefix("containerd://")
        if args.action == "dump":
            print(json.dumps(dump_offered(image, container, args.criu, args.handshake)))
        else:
            print(json.dumps(restore_into_pod(image, container, args.criu, args.handshake)))
    except FAILURES as failed:
        print(f"stoker snapshot {args.action}: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
