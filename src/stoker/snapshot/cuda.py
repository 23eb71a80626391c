"""The CUDA driver's checkpoint API for other processes (driver r570+; what NVIDIA's `cuda-checkpoint` tool
and CRIU's CUDA plugin call), through ctypes, for the node agent (stoker.snapshot.agent) and the GPU bench:
lock a process tree's CUDA work, move its device memory into its own host memory and let go of the GPU (then
CRIU can dump it), and the way back, after a dump or after a restore onto the same or another GPU of the
node. Where the node has no CUDA driver, no process holds a context and every step is none.

Which GPUs a container has: the NVIDIA device files its runtime put in its /dev (character devices of major
195, minor N for /dev/nvidiaN), and the driver's /proc/driver/nvidia/gpus/*/information, which names each
minor's UUID.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
# How long a lock waits for the process's CUDA work in flight (the engine is idle when it is snapshotted).
LOCK_TIMEOUT_MS = 10_000
NVIDIA_MAJOR = 195
DEVICE_FILE = re.compile(r"^nvidia([0-9]+)$")
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$")
GPUS_INFORMATION = Path("/proc/driver/nvidia/gpus")


class CudaCheckpointError(RuntimeError):
    pass


class LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_char * 16)]


class GpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", Uuid), ("newUuid", Uuid)]


class RestoreArgs(ctypes.Structure):
    """CUcheckpointRestoreArgs (CUDA 12.9+): the GPUs a restore moves the process from and to."""

    _fields_ = [
        ("gpuPairs", ctypes.POINTER(GpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


@functools.cache
def driver() -> ctypes.CDLL | None:
    """The CUDA driver, initialised; None where the node has none."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    return cuda


def call(name: str, pid: int, args: object = None) -> None:
    cuda = driver()
    if cuda is None:
        raise CudaCheckpointError(f"{name}({pid}): no CUDA driver here")
    result = getattr(cuda, name)(ctypes.c_int(pid), args)
    if result != 0:
        raise CudaCheckpointError(f"{name}({pid}) returned CUresult {result}")


def state(pid: int) -> str | None:
    """The process's checkpoint state, or None if it holds no CUDA context (or there is no driver)."""
    cuda, value = driver(), ctypes.c_int(-1)
    if cuda is None or cuda.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(value)) != 0:
        return None
    return STATES.get(value.value, str(value.value))


def holding(pids: Iterable[int], wanted: str = "running") -> list[int]:
    """Those of `pids` whose CUDA context is in the state `wanted`."""
    return [pid for pid in pids if state(pid) == wanted]


def checkpoint(pids: Sequence[int]) -> None:
    """Lock every process's CUDA work, then move each one's device memory into its host memory: the GPU is
    let go and the processes can be dumped. All are locked before any is checkpointed (the engine's
    processes talk to each other through the GPU)."""
    for pid in pids:
        call("cuCheckpointProcessLock", pid, ctypes.byref(LockArgs(timeoutMs=LOCK_TIMEOUT_MS)))
    for pid in pids:
        call("cuCheckpointProcessCheckpoint", pid)


def resume(pids: Sequence[int], remap: Sequence[tuple[str, str]] = ()) -> None:
    """Each process back on the GPU and unlocked, from whatever step of checkpoint() it is at (so that a
    dump that failed half way leaves the source serving). `remap`: (old, new) GPU UUIDs, for a process
    restored into a container that has other GPUs than the one it was dumped from."""
    pairs = (GpuPair * len(remap))(*(GpuPair(uuid_bytes(old), uuid_bytes(new)) for old, new in remap))
    args = RestoreArgs(gpuPairs=pairs, gpuPairsCount=len(remap)) if remap else None
    for pid in pids:
        if state(pid) == "checkpointed":
            call("cuCheckpointProcessRestore", pid, ctypes.byref(args) if args else None)
    for pid in pids:
        if state(pid) == "locked":
            call("cuCheckpointProcessUnlock", pid)


def uuid_bytes(uuid: str) -> Uuid:
    if not GPU_UUID.fullmatch(uuid):
        raise CudaCheckpointError(f"{uuid!r} is not a GPU UUID")
    return Uuid(bytes.fromhex(uuid.removeprefix("GPU-").replace("-", "")))


def information_uuid(text: str) -> tuple[int, str] | None:
    """A GPU's device minor and UUID from the driver's information file, or None if it has not both."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    minor, uuid = fields.get("Device Minor", "").strip(), fields.get("GPU UUID", "").strip().lower()
    if not minor.isdigit() or not GPU_UUID.fullmatch(uuid.replace("gpu-", "GPU-", 1)):
        return None
    return int(minor), uuid.replace("gpu-", "GPU-", 1)


def node_gpus(information: Path = GPUS_INFORMATION) -> dict[int, str]:
    """The node's GPUs: device minor to UUID."""
    found = {}
    for entry in sorted(information.glob("*/information")) if information.is_dir() else []:
        named = information_uuid(entry.read_text())
        if named is not None:
            found[named[0]] = named[1]
    return found


def container_gpus(root: Path, gpus: dict[int, str]) -> list[str]:
    """The UUIDs of the GPUs whose device files the container (its root, /proc/PID/root) has in /dev,
    sorted; its /dev is the runtime's, and a file of another kind or major is not a GPU."""
    try:
        names = os.listdir(root / "dev")
    except OSError:
        return []
    found = []
    for name in names:
        match = DEVICE_FILE.fullmatch(name)
        if match is None:
            continue
        try:
            facts = os.stat(root / "dev" / name, follow_symlinks=False)
        except OSError:
            continue
        minor = int(match.group(1))
        rdev = facts.st_rdev
        device = stat.S_ISCHR(facts.st_mode) and (os.major(rdev), os.minor(rdev)) == (NVIDIA_MAJOR, minor)
        if device and minor in gpus:
            found.append(gpus[minor])
    return sorted(found)


def remapping(source: Sequence[str], target: Sequence[str]) -> list[tuple[str, str]]:
    """The (old, new) pairs that move a process dumped on the `source` GPUs onto the `target` GPUs (both
    sorted): every GPU's where any differs, none where they are the same."""
    if len(source) != len(target):
        raise CudaCheckpointError(
            f"the snapshot ran on {len(source)} GPUs, the target container has {len(target)}"
        )
    pairs = list(zip(source, target, strict=True))
    return pairs if any(old != new for old, new in pairs) else []
