"""The GPU results' `default` profile is what stoker renders now: every serving profile recorded in the
latest H100 runs is rendered again from the run's manifest by bench/gpu/profiles.py (stoker's builders) and
must give the very argv and environment that ran. A renderer change that moves away from the measured
start fails here until it is measured again. The wrappers ran as `python3 -c PROGRAM` then, and run as
`python3 -m stoker.inpod.NAME` now: the program's text is left out, as it changes without a new run where it
reads a good tree as it did (tests/unit/test_prefetch.py, test_hostile_trees.py). The wrappers' `--pin-ptxas`
(2026-11-27) is left out for runs before it: it sets which ptxas Triton keys the kernels vLLM compiles by,
and the default's serving starts of those runs compiled none (tests/unit/test_pin_ptxas.py). So is the
seed's `--empty CACHE` (2026-11-28), for runs before it: the GPU runs seeded into an empty directory anyway,
which is what it makes of the volume. So is the wrappers' `--bytecode DIR` (2026-11-28): it sets
anything only where the image has no bytecode for vLLM, and stoker's image, which these runs ran, has it.
So is `--import-fixes` (2026-11-28): the fixed modules build what the unfixed ones do
(tests/conformance/test_import_fixes_libraries.py), with less CPU (bench/results/import-fixes-cpu.txt);
no GPU run has measured it yet. Every run here
predates the mega AOT artifact as stoker's 0.26 default (2026-11-28), so each is rendered as stoker rendered
0.26 before it; the run that measured it (`coldstart-h200-run3`, as `stoker-mega-aot-warm`) is what the
default renders now on a warmed node."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stoker import engines
from stoker.engines.profiles import V0_26

REPO = Path(__file__).resolve().parents[2]
# Run 4 (`coldstart-h100`), its confirmation on another host (run 5), and the H200 runs with a warmed node.
RESULTS = [
    REPO / "bench" / "results" / f"{name}.json"
    for name in (
        "coldstart-h100",
        "coldstart-h100-run5",
        "coldstart-h200-run1",
        "coldstart-h200",
        "coldstart-h200-run3",
    )
]
MEGA_AOT_DEFAULT_RUN = REPO / "bench" / "results" / "coldstart-h200-run3.json"
MANIFEST = REPO / "bench" / "gpu" / "llama-8b.json"


PIN = "--pin-ptxas"
# Options the wrappers gained after runs that predate them, and how many arguments each takes.
LATER_OPTIONS = {PIN: 0, "--empty": 1, "--bytecode": 1, "--import-fixes": 0}


def without_program(argv: list[str]) -> list[str]:
    """`argv` with the wrapper program of `python3 -c PROGRAM` or `python3 -m MODULE` left out."""
    return [argv[0], "PROGRAM", *argv[3:]] if argv[1:2] in (["-c"], ["-m"]) else argv


def as_then(rendered: list[str], ran: list[str]) -> list[str]:
    """The rendered argv without the wrappers' LATER_OPTIONS that the run predates."""
    argv = list(rendered)
    for option, arguments in LATER_OPTIONS.items():
        if option in argv and option not in ran:
            at = argv.index(option)
            argv = argv[:at] + argv[at + 1 + arguments :]
    return argv


def bench_profiles(monkeypatch: pytest.MonkeyPatch) -> Any:
    # bench/gpu's modules import each other by their flat names, as the GPU host runs them.
    monkeypatch.syspath_prepend(str(REPO / "bench" / "gpu"))
    return importlib.import_module("profiles")


def without_the_mega_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Render 0.26 as stoker did before the mega AOT artifact became its default."""
    before = replace(V0_26, capabilities=replace(V0_26.capabilities, mega_aot_artifact="off"))
    monkeypatch.setattr(engines, "SUPPORTED", tuple(before if p is V0_26 else p for p in engines.SUPPORTED))


@pytest.mark.parametrize("results_file", RESULTS, ids=lambda path: path.stem)
def test_the_measured_default_and_levers_are_rendered_as_they_ran(monkeypatch, results_file: Path) -> None:
    profiles = bench_profiles(monkeypatch)
    without_the_mega_default(monkeypatch)
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


def test_the_default_on_a_warmed_node_is_the_measured_mega_aot_artifact(monkeypatch) -> None:
    """The 0.26 default since 2026-11-28 is what ran as `stoker-mega-aot-warm` (and its seed) in run 3."""
    profiles = bench_profiles(monkeypatch)
    results = json.loads(MEGA_AOT_DEFAULT_RUN.read_text())
    svc = profiles.load_service(str(MANIFEST))
    ran, seed = (
        results["profiles"]["stoker-mega-aot-warm"],
        results["profiles"]["stoker-seed-stoker-mega-aot-warm"],
    )
    rendered = profiles.serve_invocation(svc, "stoker-warm")
    assert (without_program(as_then(rendered.argv, ran["argv"])), rendered.env) == (
        without_program(ran["argv"]),
        ran["env"],
    )
    rendered_seed = profiles.seed_invocation(svc)
    assert "--start-again" in rendered_seed.argv
    assert (without_program(as_then(rendered_seed.argv, seed["argv"])), rendered_seed.env) == (
        without_program(seed["argv"]),
        seed["env"],
    )
