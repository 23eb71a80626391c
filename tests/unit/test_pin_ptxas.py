"""Torch's ptxas pinned for vLLM (stoker.inpod.pin_ptxas): Triton keys a kernel by the ptxas version that
compiled it, so the seed and the serving pods that use its Triton cache pin it alike, or neither does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.inpod import PTXAS_ENV, pin_ptxas
from stoker.render.engine import reads_ahead
from stoker.render.prefetch import serving_invocation
from stoker.render.seed import seed_invocation
from tests.unit.test_prefetch import with_programs
from tests.unit.test_render import service

PIN = "--pin-ptxas"


@pytest.mark.parametrize(
    "changes",
    [
        {},  # the streamer's options: no read-ahead
        {"coldStart.loader": {}},  # InstantTensor from the model cache, read ahead
        {"coldStart.loader": {"readAhead": False}},
        {"coldStart.loader": {}, "coldStart.modelCache": {"enabled": False}},  # from the hub: nothing to read
    ],
    ids=["streamer", "read-ahead", "read-ahead-off", "no-volume"],
)
def test_the_seed_pins_exactly_where_the_serving_pods_do(changes: dict) -> None:
    svc = service(**changes)
    seed, serving = seed_invocation(svc), serving_invocation(svc)
    wrapper = seed.args[: seed.args.index("--")]
    assert (PIN in wrapper) is (PIN in serving.command) is reads_ahead(svc)


def fake_torch(root: Path, ptxas_mode: int = 0o755) -> Path:
    """A package named torch with a bin/ptxas, where pin_ptxas looks (it never imports torch)."""
    package = root / "torch"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('torch must not be imported')\n")
    ptxas = package / "bin" / "ptxas"
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(ptxas_mode)
    return ptxas


def run_pinned(programs: Path, site: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The read-ahead with --pin-ptxas in front of a server that prints what it was given."""
    server = [sys.executable, "-c", f"import os; print(os.environ.get({PTXAS_ENV!r}, ''))"]
    command = [sys.executable, "-m", "stoker.inpod.read_ahead", PIN, "--", *server]
    return subprocess.run(
        command,
        env=with_programs(programs, env, site),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_read_ahead_gives_the_server_torchs_ptxas(tmp_path: Path, programs: Path) -> None:
    ptxas = fake_torch(tmp_path / "site")
    env = {key: value for key, value in os.environ.items() if key != PTXAS_ENV}
    result = run_pinned(programs, tmp_path / "site", env)
    assert result.stdout.strip() == str(ptxas)
    assert f"stoker read-ahead: {PTXAS_ENV}={ptxas}" in result.stderr


def test_a_ptxas_the_user_set_wins(tmp_path: Path, programs: Path) -> None:
    fake_torch(tmp_path / "site")
    result = run_pinned(programs, tmp_path / "site", {**os.environ, PTXAS_ENV: "/opt/cuda/bin/ptxas"})
    assert result.stdout.strip() == "/opt/cuda/bin/ptxas"


def test_nothing_is_pinned_without_an_executable_ptxas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch(tmp_path, ptxas_mode=0o644)
    monkeypatch.syspath_prepend(str(tmp_path))
    environ: dict[str, str] = {}
    assert pin_ptxas(environ) == f"{PTXAS_ENV} not set: no executable torch/bin/ptxas"
    assert environ == {}
