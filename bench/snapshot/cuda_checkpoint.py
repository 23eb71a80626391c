"""The CUDA driver's checkpoint API for another process (driver r570+; what NVIDIA's `cuda-checkpoint` tool
and CRIU's CUDA plugin call), through ctypes: lock a process's CUDA work, move its device memory into its own
host memory and let go of the GPU (then CRIU can dump it), and the way back after a restore.
"""

from __future__ import annotations

import ctypes
import functools

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
# How long a lock waits for the process's CUDA work in flight (the server is idle when it is snapshotted).
LOCK_TIMEOUT_MS = 10_000


class LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class CudaCheckpointError(RuntimeError):
    pass


@functools.cache
def driver() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) != 0:
        raise CudaCheckpointError("cuInit failed")
    return cuda


def call(name: str, pid: int, args: object = None) -> None:
    result = getattr(driver(), name)(ctypes.c_int(pid), args)
    if result != 0:
        raise CudaCheckpointError(f"{name}({pid}) returned CUresult {result}")


def state(pid: int) -> str | None:
    """The process's checkpoint state, or None if it holds no CUDA context."""
    value = ctypes.c_int(-1)
    if driver().cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(value)) != 0:
        return None
    return STATES.get(value.value, str(value.value))


def lock(pid: int) -> None:
    call("cuCheckpointProcessLock", pid, ctypes.byref(LockArgs(timeoutMs=LOCK_TIMEOUT_MS)))


def checkpoint(pid: int) -> None:
    call("cuCheckpointProcessCheckpoint", pid)


def restore(pid: int) -> None:
    call("cuCheckpointProcessRestore", pid)


def unlock(pid: int) -> None:
    call("cuCheckpointProcessUnlock", pid)
