"""The H100 predictor sweep as committed (bench/results/predictor-h100-logs/, vLLM 0.26.0): turned into a
RUNS_DIR by bench/predictor/coldstart_runs.py and judged by validate.py, as docs/benchmarks/gpu-coldstart.md
says it was, with the read-ahead regimes from the later 8B profile run on another host: its raw records,
each with the log it ran under the results' names (bench/results/coldstart-h100-v0.26.0-fast-logs/), and
its facts are in bench/results/predictor-h100-fast-logs/, and the gentle read-ahead's regimes from the
default's starts in a third run (bench/results/predictor-h100-gentle-logs/). Guards the shipped numbers: a
predictor change that breaks the issue's acceptance on the real data, or a converter change that loses a
start, fails here."""

import json
from pathlib import Path

import pytest
from bench.predictor.coldstart_runs import main as coldstart_runs
from bench.predictor.shapes import H100_SHAPES
from bench.predictor.validate import main as validate

from stoker.predict import CoefficientSet

SWEEP = Path(__file__).parents[2] / "bench" / "results" / "predictor-h100-logs"
HARDWARE = "NVIDIA-H100-80GB-HBM3_x1_v0.26"
PROFILES = "stock,stoker-seed,stoker"
FAST_RUN = SWEEP.parent / "predictor-h100-fast-logs"
# Its starts whose settings the predictor tells apart (stoker-fast is today's default); not the levers it
# does not model (the startup plan alone, fastsafetensors once, the libraries and cache read ahead too).
FAST_PROFILES = "stock,stoker-seed,stoker,stoker-fast,stoker-readahead,stoker-instanttensor"
GENTLE_RUN = SWEEP.parent / "predictor-h100-gentle-logs"
# The default's starts with the import pages (its logs are the GPU run's own; the 8B facts are the same).
PAGES_RUN = SWEEP.parent / "coldstart-h100-v0.26.0-pages-logs"
# ...and with vLLM's imports off the garbage collector (the two runs whose `stoker` is today's default).
GC_RUNS = [SWEEP.parent / "coldstart-h100-logs", SWEEP.parent / "coldstart-h100-run5-logs"]


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    command = [str(SWEEP), "--engine-version", "0.26.0", "--profiles", PROFILES, "--out", str(out)]
    assert coldstart_runs(command) == 0
    return out


@pytest.fixture
def fast_runs_dir(tmp_path: Path) -> Path:
    out = tmp_path / "fast-runs"
    command = [str(FAST_RUN), "--facts", str(FAST_RUN / "facts.json"), "--shape", "l32-h4096"]
    command += ["--engine-version", "0.26.0", "--profiles", FAST_PROFILES, "--out", str(out)]
    assert coldstart_runs(command) == 0
    return out


def default_runs(logs: Path, out: Path) -> Path:
    """The default's (`stoker`) starts of an 8B profile run, as a RUNS_DIR."""
    command = [str(logs), "--facts", str(GENTLE_RUN / "facts.json"), "--shape", "l32-h4096"]
    command += ["--engine-version", "0.26.0", "--profiles", "stoker", "--out", str(out)]
    assert coldstart_runs(command) == 0
    return out


@pytest.fixture
def gentle_runs_dir(tmp_path: Path) -> Path:
    return default_runs(GENTLE_RUN, tmp_path / "gentle-runs")


@pytest.fixture
def pages_runs_dir(tmp_path: Path) -> Path:
    return default_runs(PAGES_RUN, tmp_path / "pages-runs")


@pytest.fixture
def gc_runs_dirs(tmp_path: Path) -> list[Path]:
    return [default_runs(logs, tmp_path / f"gc-runs-{logs.name}") for logs in GC_RUNS]


def test_the_fast_runs_settings_come_from_each_starts_argv(fast_runs_dir: Path) -> None:
    runs = [json.loads(line) for line in (fast_runs_dir / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 14
    expected = {
        "stock": ("auto", False),
        "stoker-seed": ("dummy", False),
        "stoker": ("runai_streamer", False),
        "stoker-fast": ("instanttensor", True),
        "stoker-readahead": ("runai_streamer", True),
        "stoker-instanttensor": ("instanttensor", False),
    }
    for run in runs:
        settings = run["settings"]
        assert (settings["loader"], settings["readAhead"]) == expected[run["profile"]], run["profile"]


def test_every_start_of_the_sweep_with_its_shapes_facts_and_settings(runs_dir: Path) -> None:
    runs = [json.loads(line) for line in (runs_dir / "runs.jsonl").read_text().splitlines()]
    driver = [json.loads(line) for line in (SWEEP / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == len(driver) == 21
    models = json.loads((SWEEP / "models.json").read_text())
    for run in runs:
        shape = next(shape for shape in H100_SHAPES if shape.name == run["shape"])
        facts = run["facts"]
        # Read from the host's config.json and file sizes: the shape as written, the bytes as on disk.
        assert (facts["layers"], facts["hiddenSize"], facts["vocabSize"]) == (
            shape.layers,
            shape.hidden,
            shape.vocab,
        )
        files = models[shape.name]["files"]
        assert facts["checkpointBytes"] == sum(
            size for name, size in files.items() if name.endswith(".safetensors")
        )
        assert facts["tokenizerBytes"] == files["tokenizer.json"]
        assert (runs_dir / run["log"]).exists()
        loader = {"stock": "auto", "stoker-seed": "dummy", "stoker": "runai_streamer"}[run["profile"]]
        assert run["settings"]["loader"] == loader
        assert run["settings"]["cacheState"] == ("hit" if run["profile"] == "stoker" else "miss")


def test_held_out_shapes_meet_the_acceptance_and_the_shipped_set_is_this_fit(
    runs_dir: Path,
    fast_runs_dir: Path,
    gentle_runs_dir: Path,
    pages_runs_dir: Path,
    gc_runs_dirs: list[Path],
    tmp_path: Path,
) -> None:
    out, shipped = tmp_path / "predictor-h100.json", tmp_path / f"{HARDWARE}.json"
    command = [str(runs_dir), "--hardware", HARDWARE]
    command += ["--other-host", str(fast_runs_dir), "--other-host", str(gentle_runs_dir)]
    command += ["--other-host", str(pages_runs_dir)]
    command += [argument for runs in gc_runs_dirs for argument in ("--other-host", str(runs))]
    command += ["--out", str(out), "--coefficients-out", str(shipped)]
    assert validate(command) == 0
    document = json.loads(out.read_text())
    assert {row["shape"] for row in document["heldOut"]} == {s.name for s in H100_SHAPES if s.held_out}
    total = document["summary"]["total"]
    assert total["maePercent"] <= 10 and total["maxErrorPercent"] <= 20
    committed = SWEEP.parent / "predictor-h100.json"
    assert document["summary"] == json.loads(committed.read_text())["summary"]
    package = Path(__file__).parents[2] / "src" / "stoker" / "predict" / "coefficients" / f"{HARDWARE}.json"
    fitted = CoefficientSet.model_validate_json(shipped.read_text())
    committed_set = CoefficientSet.model_validate_json(package.read_text())
    # The set's notes (fittedOn's last entry) are words given on the command line.
    assert (fitted.phases, fitted.observations) == (committed_set.phases, committed_set.observations)
    assert fitted.fitted_on == committed_set.fitted_on[:-1]
    # The other hosts' starts add only the regimes the sweep never ran: the read-ahead (gentle or not, with
    # the import pages or not, with the collector deferred or not) and InstantTensor.
    other_host = [o for o in fitted.observations if o.label and o.label.startswith("l32-h4096/")]
    assert {o.label.split("/")[1] for o in other_host if o.label} == {
        "stoker-fast",
        "stoker-readahead",
        "stoker-instanttensor",
        "stoker",
    }
    assert all(set(o.phases) <= {"bootstrap", "weightLoad", "engineStart"} for o in other_host)
