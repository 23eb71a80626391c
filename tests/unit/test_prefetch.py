"""The read-ahead wrapper: it reads the checkpoint and then gets out of the way of the server it execs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stoker.render.prefetch import read_ahead, read_ahead_command


def checkpoint(root: Path) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3 << 20))
    (model / "model-00002-of-00002.safetensors").write_bytes(os.urandom(1 << 20) + b"x")
    (model / "config.json").write_text("{}")
    return model


def test_reads_every_safetensors_file_in_chunks_and_nothing_else(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    assert read_ahead([str(model)], False, [], readers=3, chunk=1 << 20) == (4 << 20) + 1


def test_a_hub_id_is_read_from_the_hugging_face_cache(tmp_path: Path, monkeypatch) -> None:
    blob = tmp_path / "hub" / "models--org--name" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"w" * 1000)
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blob)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read_ahead(["org/name"], False, []) == 1000
    assert read_ahead(["org/absent", "s3://bucket/model"], False, []) == 0


def test_libraries_come_from_this_interpreters_import_path(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(b"l" * 100)
    (site / "torch" / "__pycache__").mkdir()
    (site / "torch" / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"p" * 10)
    (site / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"c" * 7)
    (site / "nvidia" / "cudnn" / "lib" / "libcudnn_engines_precompiled.so.9").write_bytes(b"e" * 1000)
    (site / "unrelated").mkdir()
    (site / "unrelated" / "big.so").write_bytes(b"u" * 1000)
    monkeypatch.setattr(sys, "path", [str(site), str(site)])
    assert read_ahead([], True, []) == 117
    assert read_ahead([], False, []) == 0


def test_the_server_keeps_the_process_its_arguments_and_its_exit_code(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    program = "import os, sys; print(os.getpid(), sys.argv[1:]); sys.exit(7)"
    server = [sys.executable, "-c", program, "--a", "b"]
    process = subprocess.Popen(
        [sys.executable, *read_ahead_command([str(model)], True, (str(tmp_path),))[1:], *server],
        stdout=subprocess.PIPE,
        text=True,
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 7
    # exec, not a child: the server runs as the container's own process.
    assert output.split()[0] == str(process.pid)
    assert output.strip().endswith("['--a', 'b']")


def test_the_command_is_python3_with_the_program_and_ends_where_the_server_begins() -> None:
    command = read_ahead_command(["/models/m"], libraries=False)
    assert command[:2] == ["python3", "-c"]
    assert command[3:] == ["/models/m", "--"]
    assert read_ahead_command(["/models/m"], libraries=True)[3:] == ["--libraries", "/models/m", "--"]
    everything = read_ahead_command(["/models/m"], True, ("/var/cache/vllm",))
    assert everything[3:] == ["--libraries", "--cache", "/var/cache/vllm", "/models/m", "--"]


def test_a_cache_directory_is_read_whole_after_the_weights(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    cache = tmp_path / "cache" / "torch_compile_cache"
    cache.mkdir(parents=True)
    (cache / "artifact").write_bytes(b"a" * 300)
    assert read_ahead([str(model)], False, [str(tmp_path / "cache")]) == (4 << 20) + 1 + 300
