"""bench/predictor/validate.py on a small RUNS_DIR made of real H100 logs (vLLM 0.26.0, data/phases/)."""

import gzip
import json
from pathlib import Path

import pytest
from bench.predictor.shapes import H100_SHAPES, Shape
from bench.predictor.validate import main

from stoker.predict import CoefficientSet

LOGS = Path(__file__).parent / "data" / "phases" / "vllm-0.26.0-h100"
# profile -> (log, what the driver would have recorded; the cache state is taken from the log)
PROFILES = {
    "stock": ("stock.log", {"loader": "auto", "captureSizes": 51, "cacheState": "miss"}),
    "stoker-seed": (
        "seed.log",
        {"loader": "dummy", "captureSizes": 7, "cacheState": "miss", "forkedEngine": True},
    ),
    "stoker": (
        "seeded-serving.log",
        {"loader": "runai_streamer", "captureSizes": 7, "cacheState": "none", "forkedEngine": True},
    ),
}
HARDWARE = "NVIDIA-H100-80GB-HBM3_x1_v0.26"


def facts(shape: Shape) -> dict[str, object]:
    per_layer = 4 * shape.hidden * shape.hidden + 3 * shape.hidden * shape.intermediate
    return {
        "checkpointBytes": 2 * (shape.layers * per_layer + 2 * shape.vocab * shape.hidden),
        "layers": shape.layers,
        "hiddenSize": shape.hidden,
        "intermediateSize": shape.intermediate,
        "attentionHeads": shape.heads,
        "kvHeads": shape.kv_heads,
        "vocabSize": shape.vocab,
        "tokenizerBytes": 147_197,
        "moe": False,
        "experts": 0,
        "dtype": "bfloat16",
    }


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """Every H100 shape started with each profile (the same real logs for all: startup does not depend on
    weight values, and here not on the shape either), one log gzipped, one start cut off."""
    runs = []
    for shape in H100_SHAPES:
        for profile, (log, settings) in PROFILES.items():
            runs.append(
                {
                    "shape": shape.name,
                    "profile": profile,
                    "rep": 1,
                    "log": f"logs/{log}",
                    "facts": facts(shape),
                    "settings": settings,
                }
            )
    (tmp_path / "logs").mkdir()
    for log, _ in PROFILES.values():
        (tmp_path / "logs" / log).write_text((LOGS / log).read_text())
    with gzip.open(tmp_path / "logs" / "stock.log.gz", "wt") as packed:
        packed.write((LOGS / "stock.log").read_text())
    runs[0]["log"] = "logs/stock.log.gz"
    cut_off = (LOGS / "seed.log").read_text().split("Graph capturing finished")[0]
    (tmp_path / "logs" / "cut.log").write_text(cut_off)
    runs.append({**runs[1], "rep": 2, "log": "logs/cut.log"})
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs))
    return tmp_path


def test_validation_and_shipped_coefficients(
    runs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, shipped = tmp_path / "predictor-h100.json", tmp_path / "coefficients" / f"{HARDWARE}.json"
    command = [str(runs_dir), "--hardware", HARDWARE, "--out", str(out), "--coefficients-out", str(shipped)]
    assert main(command) == 0
    printed = capsys.readouterr()
    assert "left out l4-h4096/stoker-seed/r2" in printed.err
    document = json.loads(out.read_text())
    held_out = [shape.name for shape in H100_SHAPES if shape.held_out]
    assert document["fittedOn"] == sorted(shape.name for shape in H100_SHAPES if not shape.held_out)
    assert document["logs"] == str(runs_dir)
    assert sorted({row["shape"] for row in document["heldOut"]}) == sorted(held_out)
    assert len(document["heldOut"]) == len(held_out) * len(PROFILES)
    for row in document["heldOut"]:
        phases = row["phases"]
        # The parser's engine phases add up to its total; the predicted ones make the predicted total.
        assert sum(phase["measured"] for phase in phases.values()) == pytest.approx(
            row["measuredTotal"], abs=0.01
        )
        assert sum(phase["predicted"] for phase in phases.values()) == pytest.approx(
            row["predictedTotal"], abs=0.01
        )
        if row["profile"] == "stoker":
            assert "compileLoad" in phases  # the log's cache state (hit), not the recorded one
    summary = document["summary"]
    assert summary["starts"] == len(document["heldOut"])
    # Every shape started from the same logs, so each phase is predicted as its regime's mean over the
    # profiles that share it: bootstrap (one regime) the mean of all three.
    bootstraps = [row["phases"]["bootstrap"] for row in document["heldOut"] if row["shape"] == held_out[0]]
    mean = sum(phase["measured"] for phase in bootstraps) / len(bootstraps)
    assert all(phase["predicted"] == pytest.approx(mean, abs=0.01) for phase in bootstraps)
    assert summary["total"]["maePercent"] < 10 and summary["total"]["maxErrorPercent"] < 10
    assert set(summary["phases"]) >= {"bootstrap", "weightLoad", "compile", "compileLoad", "jitWarmup"}
    assert set(summary["totalByProfile"]) == set(PROFILES)
    assert CoefficientSet.model_validate(document["coefficients"]).fitted_on == document["fittedOn"]
    assert "total" in printed.out and "l8-h4096/stock/r1" in printed.out
    coefficients = CoefficientSet.model_validate_json(shipped.read_text())
    assert (coefficients.hardware, coefficients.source) == (HARDWARE, "shipped")
    assert len(coefficients.observations) == len(H100_SHAPES) * len(PROFILES)
    assert coefficients.fitted_on == sorted(shape.name for shape in H100_SHAPES)


def test_a_runs_dir_of_held_out_shapes_only_has_nothing_to_fit(runs_dir: Path, tmp_path: Path) -> None:
    lines = (runs_dir / "runs.jsonl").read_text().splitlines()
    held_out = {shape.name for shape in H100_SHAPES if shape.held_out}
    kept = [line for line in lines if json.loads(line)["shape"] in held_out]
    (runs_dir / "runs.jsonl").write_text("\n".join(kept) + "\n")
    with pytest.raises(SystemExit, match="nothing to fit on"):
        main([str(runs_dir), "--hardware", HARDWARE, "--out", str(tmp_path / "out.json")])


def test_usage_errors(runs_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([str(runs_dir), "--hardware", HARDWARE])
    assert "nothing to write" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(runs_dir), "--hardware", "h100", "--out", "x.json"])
    assert "hardware key 'h100'" in capsys.readouterr().err
