"""The serving command stoker renders for weights on a volume, run as a real vLLM process (CPU build of the
default version): the read-ahead wrapper with `--gc deferred` runs vLLM's console script in its own process
(no "exec'd" fallback line) with both import fixes applied, and the server answers /health and a
completion, its log read by stoker's parser as `make conformance` checks it
(bench/conformance/matrix.run_role, the harness's swaps only: a tiny local checkpoint, a free port, local
cache dirs). The GPU runs measured this wrapper (bench/results/coldstart-h100.json); this keeps it working
on a real engine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from bench.conformance import tiny_model
from bench.conformance.matrix import START_TIMEOUT_SECONDS, run_role
from bench.conformance.process import free_port
from bench.conformance.swaps import LocalRun
from bench.conformance.versions import default_version, select_version

from stoker.api import KIND, VLLMService
from stoker.render import render_children

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pvc-weights.yaml"


def rendered_serving_container() -> dict:
    (document,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == KIND]
    del document["spec"]["runtime"]["maxModelLen"]  # the tiny checkpoint holds 2048 positions
    svc = VLLMService.model_validate(select_version(document, default_version()))
    (deployment,) = [child for child in render_children(svc) if child["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.timeout(START_TIMEOUT_SECONDS + 120)
def test_the_read_ahead_runs_vllm_in_its_own_process_with_the_collector_deferred(
    engine_venv: Path, tmp_path: Path
) -> None:
    container = rendered_serving_container()
    assert ["--gc", "deferred"] in [container["command"][i : i + 2] for i in range(len(container["command"]))]
    model = tmp_path / "model"
    subprocess.run([str(engine_venv / "bin" / "python"), tiny_model.__file__, str(model)], check=True)
    cache, hf_home, home, logs = (tmp_path / name for name in ("cache", "hf-home", "home", "logs"))
    for directory in (cache, hf_home, home, logs):
        directory.mkdir()
    run = LocalRun(engine_venv, model, cache, hf_home, home, free_port())
    verdicts, _ = run_role("serve", container, run, default_version(), tmp_path, logs)
    assert all(verdicts.values()), verdicts
    log = (tmp_path / "serve.log").read_text(encoding="utf-8")
    assert "stoker read-ahead:" in log
    assert "exec'd" not in log
    assert "import fixes applied: torch._library.utils, transformers.utils.import_utils" in log
