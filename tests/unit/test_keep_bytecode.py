"""stoker.inpod.keep_bytecode with real interpreters: a `vllm` package without bytecode gets it written under
the directory, by the program's own process (read_ahead --gc deferred) and by the server it starts (the seed),
and the next process loads it from there; an image with bytecode, or a prefix set already, is left alone."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """An image's site-packages with a `vllm` package and no bytecode."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "config.py").write_text("VALUE = 1\n")
    return site


def run(image: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    # PYTHONDONTWRITEBYTECODE as in an image whose engine cannot write beside its files.
    environ = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"},
        "PYTHONPATH": f"{SRC}:{image}",
        "PYTHONDONTWRITEBYTECODE": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )


def compiled(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.pyc"))


SERVER = "import vllm.config; print(vllm.config.__cached__)"


def test_a_server_started_after_it_writes_the_bytecode_and_the_next_loads_it(
    image: Path, tmp_path: Path
) -> None:
    bytecode = tmp_path / "cache" / "bytecode"
    seed = run(
        image,
        "import subprocess, sys\n"
        "from stoker.inpod import keep_bytecode\n"
        f"print(keep_bytecode({str(bytecode)!r}))\n"
        f"subprocess.run([sys.executable, '-c', {SERVER!r}], check=True)",
    )
    said, cached = seed.stdout.splitlines()
    assert said == f"bytecode: the image has none for vLLM, so PYTHONPYCACHEPREFIX={bytecode}"
    assert cached.startswith(str(bytecode))
    # Under the prefix, by the source's absolute path (the standard library's land there too).
    tag = sys.implementation.cache_tag
    assert {p.name for p in (bytecode / image.relative_to("/") / "vllm").iterdir()} == {
        f"__init__.{tag}.pyc",
        f"config.{tag}.pyc",
    }
    assert not list(image.rglob("__pycache__")), "written beside the image's files"

    # A serving pod: the server in the program's own process, loading what the seed wrote.
    before = {p: p.stat().st_mtime_ns for p in compiled(bytecode)}
    serving = run(
        image, f"from stoker.inpod import keep_bytecode\nkeep_bytecode({str(bytecode)!r})\n{SERVER}"
    )
    assert serving.stdout.strip() == cached
    assert {p: p.stat().st_mtime_ns for p in compiled(bytecode)} == before


def test_an_image_with_bytecode_is_left_alone(image: Path, tmp_path: Path) -> None:
    assert compileall.compile_dir(str(image), quiet=1)
    result = run(
        image, f"from stoker.inpod import keep_bytecode\nprint(keep_bytecode({str(tmp_path)!r}))\n{SERVER}"
    )
    said, cached = result.stdout.splitlines()
    assert said == "bytecode: the image has vLLM's"
    assert cached.startswith(str(image / "vllm" / "__pycache__"))


def test_a_prefix_the_user_set_wins(image: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    result = run(
        image,
        f"from stoker.inpod import keep_bytecode\nprint(keep_bytecode({str(tmp_path / 'ours')!r}))",
        PYTHONPYCACHEPREFIX=str(mine),
    )
    assert result.stdout.strip() == f"PYTHONPYCACHEPREFIX={mine} (set already)"


def test_no_vllm_sets_nothing(tmp_path: Path) -> None:
    result = run(tmp_path, f"from stoker.inpod import keep_bytecode\nprint(keep_bytecode({str(tmp_path)!r}))")
    assert result.stdout.strip() == "bytecode: no vllm package found, nothing set"
