"""The GPU results' `default` profile is what stoker renders now: every serving profile recorded in the
latest H100 runs is rendered again from the run's manifest by bench/gpu/profiles.py (stoker's builders) and
must give the very argv and environment that ran. A renderer change that moves away from the measured
start fails here until it is measured again."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Run 4 (`coldstart-h100`, the README's) and its confirmation on another host (run 5).
RESULTS = [REPO / "bench" / "results" / f"{name}.json" for name in ("coldstart-h100", "coldstart-h100-run5")]
MANIFEST = REPO / "bench" / "gpu" / "llama-8b.json"


@pytest.mark.parametrize("results_file", RESULTS, ids=lambda path: path.stem)
def test_the_measured_default_and_levers_are_rendered_as_they_ran(monkeypatch, results_file: Path) -> None:
    # bench/gpu's modules import each other by their flat names, as the GPU host runs them.
    monkeypatch.syspath_prepend(str(REPO / "bench" / "gpu"))
    profiles = importlib.import_module("profiles")
    results = json.loads(results_file.read_text())
    assert results["default"] == profiles.DEFAULT_PROFILE == "stoker"
    svc = profiles.load_service(str(MANIFEST))
    serving = {name: ran for name, ran in results["profiles"].items() if name not in ("stock", "stoker-seed")}
    assert {"stoker", "stoker-gc"} <= set(serving)
    for name, ran in serving.items():
        rendered = profiles.serve_invocation(svc, name)
        assert (rendered.argv, rendered.env) == (ran["argv"], ran["env"]), name
    seed = profiles.seed_invocation(svc)
    assert (seed.argv, seed.env) == (
        results["profiles"]["stoker-seed"]["argv"],
        results["profiles"]["stoker-seed"]["env"],
    )
