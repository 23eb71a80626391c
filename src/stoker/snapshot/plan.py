"""What CRIU needs to move a served engine out of one pod and into another pod on the same node (issue 40),
worked out from the containers' mount tables and the files the engine holds: pure, so that the agent's host
code (stoker.snapshot.agent) only reads /proc, copies files and runs CRIU.

The shape, found on the real node (docs/benchmarks/snapshot.md, "Where a restore can land"): the engine is a
child of the container's PID 1 in a session of its own; its PID and network namespaces are external at the
dump and the target's are handed to the restore; the host's files bound into the container and the cgroup
hierarchies are external mounts, mapped at the restore to what the target container has at the same paths;
the rest of the mount tree is rebuilt on the target's root filesystem; and the files the engine holds on the
container's own filesystems (its root, /dev/shm) are copied from the source's root to the target's.

And what the agent does next on its node (node_actions), from the pods' engine_init handshakes and the
snapshots it completed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

# The engine's internal sockets listen on loopback, which every network namespace has (gloo would otherwise
# bind the source pod's IP, which the target does not have: "Can't bind inet socket").
LOOPBACK_ENVIRONMENT = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
# The engine's gloo connection (loopback, inside the tree) and multiprocessing's semaphores (created under a
# temporary name and renamed).
CRIU_FILE_OPTIONS = ["--tcp-established", "--link-remap"]
# What /proc/PID/fd and map_files name that is not a file on a filesystem.
NOT_A_PATH = re.compile(r"^(pipe|socket|anon_inode|memfd|/dev/(?!shm/)|/proc/|/sys/)|\(deleted\)$")
# The engine's standard output and error: the container's log, pipes to the runtime, which a restore connects
# to the target container's (CRIU dumps a pipe whose other end is outside the tree; `--inherit-fd` gives it
# one on restore).
LOG_DESCRIPTORS = (1, 2)
PIPE = re.compile(r"^pipe:\[[0-9]+\]$")
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"  # the writer's own PID namespace's counter
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CACHE_KEY = re.compile(r"^[0-9a-f]{8,64}$")


@dataclass(frozen=True)
class Mount:
    """A line of /proc/PID/mountinfo."""

    mount_point: str
    root: str  # the path, inside its filesystem, mounted there
    device: str  # major:minor
    fstype: str
    source: str
    options: str = ""  # the filesystem's own (an overlay's upperdir)


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        try:
            tail = fields.index("-")
            mounts.append(
                Mount(
                    mount_point=unescape(fields[4]),
                    root=unescape(fields[3]),
                    device=fields[2],
                    fstype=fields[tail + 1],
                    source=unescape(fields[tail + 2]),
                    options=unescape(fields[tail + 3]) if len(fields) > tail + 3 else "",
                )
            )
        except (ValueError, IndexError) as bad:
            raise ValueError(f"not a mountinfo line: {line!r}") from bad
    return mounts


def carried_mounts(engine: Iterable[Mount]) -> list[str]:
    """The mount points a dump marks external: the host's files bound into the container (a block device's
    filesystem: volumes, /etc/hosts, the termination log) and the cgroup hierarchies. CRIU rebuilds the rest
    (proc, sys, tmpfs, devpts, mqueue) on the target's root."""
    return [
        mount.mount_point
        for mount in engine
        if mount.mount_point != "/"
        and (mount.fstype in ("cgroup", "cgroup2") or mount.source.startswith("/dev/"))
    ]


def within(path: str, directory: str) -> bool:
    return directory == "/" or path == directory or path.startswith(directory.rstrip("/") + "/")


def host_path(mount: Mount, host: Iterable[Mount]) -> str:
    """Where the host has what `mount` shows: a host mount of the same filesystem whose root holds it."""
    for candidate in host:
        if candidate.device == mount.device and within(mount.root, candidate.root):
            rest = PurePosixPath(mount.root).relative_to(candidate.root)
            return str(PurePosixPath(candidate.mount_point) / rest)
    raise LookupError(
        f"the host has no mount of {mount.device} holding {mount.root} (for {mount.mount_point})"
    )


def mapped_mounts(carried: list[str], target: Iterable[Mount], host: Iterable[Mount]) -> list[str]:
    """For each carried mount point, in order, the host path the target container has there."""
    by_point = {mount.mount_point: mount for mount in target}
    missing = [point for point in carried if point not in by_point]
    if missing:
        raise LookupError(f"the target container has nothing mounted at {', '.join(missing)}")
    host = list(host)
    return [host_path(by_point[point], host) for point in carried]


def upper_directory(mounts: Iterable[Mount]) -> str:
    """Where the container's own changes to its root filesystem are (the overlay's upperdir, a host path)."""
    for mount in mounts:
        if mount.mount_point == "/" and mount.fstype == "overlay":
            for option in mount.options.split(","):
                if option.startswith("upperdir="):
                    return option.removeprefix("upperdir=")
    raise LookupError("the container's root is not an overlay with an upperdir")


def local_files(held: Iterable[str], mounts: Iterable[Mount], carried: list[str]) -> list[tuple[str, bool]]:
    """The files the engine holds open or mapped that live in the container itself, each with whether it is on
    the root filesystem (else a tmpfs: /dev/shm): a restore must find them in the target as they were at the
    dump. Files on carried mounts (volumes) are the target's own; of the root filesystem, only what the
    container changed differs from the target's (the caller checks the upper directory)."""
    points = sorted((mount.mount_point for mount in mounts), key=len, reverse=True)
    found = {}
    for path in held:
        if not path.startswith("/") or NOT_A_PATH.search(path):
            continue
        point = next(point for point in points if within(path, point))
        if point not in carried:
            found[path] = point == "/"
    return sorted(found.items())


DELETED = " (deleted)"
LINK_REMAP_PREFIX = "link_remap."


def remap_directories(held: Iterable[str]) -> list[str]:
    """Where CRIU may put a link remap for the engine: the directories of the files it holds that were
    unlinked by the name it holds them under but are linked by another (a named POSIX semaphore: glibc
    creates it under a temporary name and links it to its own). `--link-remap` links each back there for the
    dump and, when the tree runs on, deletes it again at the dump's end, though a restore needs it."""
    found = set()
    for path in held:
        name = path.removesuffix(DELETED)
        plain = name.startswith("/") and not name.startswith("/memfd:") and "/." not in name
        if name != path and plain and not NOT_A_PATH.search(name):
            found.add(str(PurePosixPath(name).parent))
    return sorted(found - {"/"})


def dump_arguments(
    criu: str,
    engine: int,
    image: Path,
    namespaces: dict[str, int],
    carried: list[str],
    log: str,
    action_script: str,
) -> list[str]:
    """`criu dump` of the engine's tree, left running, its namespaces and carried mounts external, with the
    agent's `action_script` (which keeps the link remaps at post-dump)."""
    external = [f"{kind}[{inode}]:{kind}ns" for kind, inode in sorted(namespaces.items())]
    external += [f"mnt[{point}]:m{index}" for index, point in enumerate(carried)]
    return [
        criu,
        "dump",
        "-t",
        str(engine),
        "-D",
        str(image),
        *CRIU_FILE_OPTIONS,
        "--leave-running",
        # The engine's connections frozen by nftables through the library CRIU links (the iptables way runs
        # iptables-restore, which the agent's image does not have).
        "--network-lock",
        "nftables",
        "--action-script",
        action_script,
        *(argument for entry in external for argument in ("--external", entry)),
        "-o",
        log,
    ]


def restore_arguments(
    criu: str,
    target_init: int,
    image: Path,
    namespace_fds: dict[str, int],
    pipe_fds: dict[str, int],
    root: str,
    sources: list[str],
    cgroup_root: str,
    log: str,
) -> list[str]:
    """`criu restore` into the target's namespaces (open as `namespace_fds` in CRIU), on its root, with the
    carried mounts mapped to `sources` (mapped_mounts' order) and the tree in its cgroup; each dumped pipe
    of `pipe_fds` ("pipe:[INODE]", the source container's log) becomes the target's pipe open there as that
    descriptor. CRIU itself runs in the target's PID namespace: an orphan goes to its dead parent's
    namespace's init, so the restored engine, once CRIU exits, is the child of the target's PID 1, which
    reaps it (run from the host's namespace, it would be the host's init's)."""
    inherited = [f"fd[{fd}]:{kind}ns" for kind, fd in sorted(namespace_fds.items())]
    inherited += [f"fd[{fd}]:{pipe}" for pipe, fd in sorted(pipe_fds.items())]
    mapped = [f"mnt[m{index}]:{source}" for index, source in enumerate(sources)]
    return [
        "nsenter",
        f"--target={target_init}",
        "--pid",
        "--",
        # CRIU reads /proc by the PIDs it sees: a /proc of that namespace, in a mount namespace of its own.
        "unshare",
        "--mount",
        "--mount-proc",
        "--",
        criu,
        "restore",
        "-d",
        "-D",
        str(image),
        *CRIU_FILE_OPTIONS,
        *(argument for entry in inherited for argument in ("--inherit-fd", entry)),
        "--root",
        root,
        *(argument for entry in mapped for argument in ("--external", entry)),
        "--cgroup-root",
        cgroup_root,
        "-o",
        log,
    ]


def pid_counter_arguments(target_init: int, highest: int) -> list[str]:
    """Moves the target PID namespace's PID counter past `highest`, the largest PID (or thread ID) of the
    dumped tree in its own namespace: CRIU, run in that namespace, then takes none of the PIDs the tree gets
    back (a thread whose ID is taken fails: "Unable to create a thread: -17"). The writer is gone before
    CRIU starts, and its PID with it."""
    return [
        "nsenter",
        f"--target={target_init}",
        "--pid",
        "--",
        "sh",
        "-c",
        f"echo {highest} > {NS_LAST_PID}",
    ]


def last_pid_arguments(target_init: int) -> list[str]:
    """Reads the target PID namespace's PID counter (the reader's own namespace's, as for the writer)."""
    return ["nsenter", f"--target={target_init}", "--pid", "--", "cat", NS_LAST_PID]


def image_directory(base: Path, namespace: str, service: str, cache_key: str) -> Path:
    """A snapshot's directory: one per namespace, service and cache key, so that two namespaces (or two
    services) that share a cache key never share a snapshot, and no name can lead out of `base`."""
    for what, value, pattern in (
        ("namespace", namespace, DNS_LABEL),
        ("service", service, DNS_LABEL),
        ("cache key", cache_key, CACHE_KEY),
    ):
        if not pattern.fullmatch(value):
            raise ValueError(f"{what} {value!r} is not a valid name for a snapshot")
    return base / namespace / service / cache_key


@dataclass(frozen=True)
class PodHandshake:
    """A pod on the node whose engine_init the agent may act on, as the agent found it: its snapshot's names
    (its namespace, and its service and cache key from its labels) and engine_init's files (the first word
    of `decision` and `dump`, None while absent)."""

    namespace: str
    name: str
    service: str
    cache_key: str
    container: str
    init: int  # the host PID of the container's PID 1
    decision: str | None
    offered: bool
    dump: str | None

    @property
    def snapshot(self) -> tuple[str, str, str]:
        return (self.namespace, self.service, self.cache_key)


@dataclass(frozen=True)
class NodeAction:
    kind: Literal["start", "decline", "restore", "dump"]
    pod: PodHandshake
    reason: str = ""


NO_SNAPSHOT = "no snapshot of this cache key on this node"
HAVE_SNAPSHOT = "this node has this cache key's snapshot"
DUMPING_ANOTHER = "another replica of this cache key is being dumped"


def node_actions(pods: list[PodHandshake], completed: set[tuple[str, str, str]]) -> list[NodeAction]:
    """What the agent does next on its node, given the snapshots it completed: a waiting pod is restored from
    its cache key's snapshot, or told to start at once when there is none; an offered engine is dumped when
    its key has no snapshot (one replica per key), or declined at once. The quick answers first, so that no
    pod waits behind a dump."""
    actions: list[NodeAction] = []
    dumping: set[tuple[str, str, str]] = set()
    for pod in sorted(pods, key=lambda pod: (pod.namespace, pod.name)):
        if pod.decision is None:
            restore = pod.snapshot in completed
            actions.append(NodeAction("restore", pod) if restore else NodeAction("start", pod, NO_SNAPSHOT))
        elif pod.offered and pod.dump is None:
            if pod.snapshot in completed:
                actions.append(NodeAction("decline", pod, HAVE_SNAPSHOT))
            elif pod.snapshot in dumping:
                actions.append(NodeAction("decline", pod, DUMPING_ANOTHER))
            else:
                dumping.add(pod.snapshot)
                actions.append(NodeAction("dump", pod))
    order = {"start": 0, "decline": 0, "restore": 1, "dump": 2}
    return sorted(actions, key=lambda action: order[action.kind])
