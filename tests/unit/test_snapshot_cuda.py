"""stoker.snapshot.cuda's pure side: which GPUs a container has (its /dev's NVIDIA device files and the
driver's information files), how a restore moves a process between GPUs, and the driver's restore
arguments as CUDA lays them out; where the node has no CUDA driver, no process holds a context."""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

import pytest

from stoker.snapshot import cuda

A = "GPU-8c8b1a2e-0d6f-4a51-9a57-3d8e6f0c1b21"
B = "GPU-1f2e3d4c-5b6a-4789-8abc-def012345678"
INFORMATION = """Model: \t\t NVIDIA H200
IRQ:   \t\t 17
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.a5.00.01
Bus Type: \t PCIe
Bus Location: \t 0000:18:00.0
Device Minor: \t {minor}
GPU Excluded:\t No
"""


def test_the_driver_information_names_each_minor_s_uuid(tmp_path: Path) -> None:
    for bus, minor, uuid in (("0000:18:00.0", 0, A), ("0000:2a:00.0", 1, B)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(INFORMATION.format(uuid=uuid, minor=minor))
    (tmp_path / "0000:3b:00.0").mkdir()
    (tmp_path / "0000:3b:00.0" / "information").write_text("Model: something else\n")
    assert cuda.node_gpus(tmp_path) == {0: A, 1: B}
    assert cuda.node_gpus(tmp_path / "absent") == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="device files need root to make")
def test_a_container_s_gpus_are_the_nvidia_device_files_in_its_dev(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia1", stat.S_IFCHR | 0o600, os.makedev(cuda.NVIDIA_MAJOR, 1))
    os.mknod(dev / "nvidiactl", stat.S_IFCHR | 0o600, os.makedev(cuda.NVIDIA_MAJOR, 255))
    # Not a GPU: another major, a minor that disagrees with the name, a regular file, a symlink.
    os.mknod(dev / "nvidia2", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(dev / "nvidia3", stat.S_IFCHR | 0o600, os.makedev(cuda.NVIDIA_MAJOR, 0))
    (dev / "nvidia4").write_text("")
    (dev / "nvidia0").symlink_to(dev / "nvidia1")
    gpus = {0: A, 1: B, 3: "GPU-00000000-0000-0000-0000-000000000000"}
    assert cuda.container_gpus(tmp_path, gpus) == [B]
    assert cuda.container_gpus(tmp_path / "absent", gpus) == []


def test_a_restore_onto_other_gpus_remaps_every_one_and_onto_the_same_none() -> None:
    assert cuda.remapping([A], [A]) == []
    assert cuda.remapping([A], [B]) == [(A, B)]
    assert cuda.remapping([], []) == []  # a CPU engine
    with pytest.raises(cuda.CudaCheckpointError, match="ran on 1 GPUs, the target container has 0"):
        cuda.remapping([A], [])


def test_the_restore_arguments_are_laid_out_as_cuda_declares_them() -> None:
    # CUcheckpointRestoreArgs: a pointer, an unsigned int, 52 - sizeof(pointer) reserved bytes, a uint64.
    assert ctypes.sizeof(cuda.RestoreArgs) == 64 and cuda.RestoreArgs.reserved1.offset == 56
    assert ctypes.sizeof(cuda.GpuPair) == 32
    assert cuda.uuid_bytes(A).bytes == bytes.fromhex("8c8b1a2e0d6f4a519a573d8e6f0c1b21")
    with pytest.raises(cuda.CudaCheckpointError, match="not a GPU UUID"):
        cuda.uuid_bytes("MIG-8c8b1a2e-0d6f-4a51-9a57-3d8e6f0c1b21")


@pytest.mark.skipif(cuda.driver() is not None, reason="this node has a CUDA driver")
def test_without_a_cuda_driver_no_process_holds_a_context_and_nothing_is_done() -> None:
    assert cuda.holding([os.getpid(), 1]) == []
    cuda.checkpoint([])
    cuda.resume([], [(A, B)])
