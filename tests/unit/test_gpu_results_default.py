"""The GPU results' `default` profile is what stoker renders now: every serving profile recorded in the
latest H100 runs is rendered again from the run's manifest by bench/gpu/profiles.py (stoker's builders) and
must give the very argv and environment that ran. A renderer change that moves away from the measured
start fails here until it is measured again. The wrappers ran as `python3 -c PROGRAM` then, and run as
`python3 -m stoker.inpod.NAME` now: the program's text is left out, as it changes without a new run where it
reads a good tree as it did (tests/unit/test_prefetch.py, test_hostile_trees.py). The wrappers' `--pin-ptxas`
(2026-11-27) is left out for runs before it: it sets which ptxas Triton keys the kernels vLLM compiles by,
and the default's serving starts of those runs compiled none (tests/unit/test_pin_ptxas.py)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Run 4 (`coldstart-h100`), its confirmation on another host (run 5), and the H200 run with a warmed node.
RESULTS = [
    REPO / "bench" / "results" / f"{name}.json"
    for name in ("coldstart-h100", "coldstart-h100-run5", "coldstart-h200-run1", "coldstart-h200")
]
MANIFEST = REPO / "bench" / "gpu" / "llama-8b.json"


PIN = "--pin-ptxas"


def without_program(argv: list[str]) -> list[str]:
    """`argv` with the wrapper program of `python3 -c PROGRAM` or `python3 -m MODULE` left out."""
    return [argv[0], "PROGRAM", *argv[3:]] if argv[1:2] in (["-c"], ["-m"]) else argv


def as_then(rendered: list[str], ran: list[str]) -> list[str]:
    """The rendered argv without the wrappers' ptxas pin where the run predates it."""
    return rendered if PIN in ran else [arg for arg in rendered if arg != PIN]


@pytest.mark.parametrize("results_file", RESULTS, ids=lambda path: path.stem)
def test_the_measured_default_and_levers_are_rendered_as_they_ran(monkeypatch, results_file: Path) -> None:
    # bench/gpu's modules import each other by their flat names, as the GPU host runs them.
    monkeypatch.syspath_prepend(str(REPO / "bench" / "gpu"))
    profiles = importlib.import_module("profiles")
    results = json.loads(results_file.read_text())
    assert results["default"] == profiles.DEFAULT_PROFILE == "stoker"
    svc = profiles.load_service(str(MANIFEST))
    # stock and stock-warm are plain `vllm serve`, not stoker's rendering.
    serving = {
        name: ran
        for name, ran in results["profiles"].items()
        if not name.startswith(("stock-", "stoker-seed")) and name != "stock"
    }
    assert "stoker" in serving
    for name, ran in serving.items():
        rendered = profiles.serve_invocation(svc, name)
        measured = (without_program(ran["argv"]), ran["env"])
        assert (without_program(as_then(rendered.argv, ran["argv"])), rendered.env) == measured, name
    # The default's seed, and a lever's own where its spec moved the cache key (stoker-seed-<lever>).
    seeds = {name: ran for name, ran in results["profiles"].items() if name.startswith("stoker-seed")}
    assert "stoker-seed" in seeds
    for name, ran in seeds.items():
        seed = profiles.seed_invocation(
            svc, name.removeprefix("stoker-seed-") if name != "stoker-seed" else "stoker"
        )
        rendered_seed = without_program(as_then(seed.argv, ran["argv"]))
        assert (rendered_seed, seed.env) == (without_program(ran["argv"]), ran["env"]), name
