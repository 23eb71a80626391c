"""Predicting hardware left out of the fit (issue 26), on the recorded runs: the committed validation is what
bench/predictor/cross_hardware.py computes, meets the acceptance on the H200, and the fleet learns a new
class from three of its starts, robustly."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from bench.predictor import cross_hardware
from bench.predictor.validate import load_runs

from stoker.predict import Observation, predict
from stoker.predict.fleet import namespace_coefficients
from stoker.predict.model import HardwareClass, HostFacts, NamespaceStarts
from stoker.predict.shipped import shipped_coefficients

COMMITTED = cross_hardware.OUT
NEW_CLASS = "h200"


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("cross") / "predictor-cross-hardware.json"
    raw = out.with_suffix(".txt")
    assert cross_hardware.main(["--out", str(out), "--raw", str(raw)]) == 0
    return json.loads(out.read_text())


def test_the_committed_validation_is_what_the_script_computes(document: dict) -> None:
    committed = json.loads(COMMITTED.read_text())
    assert [e["summary"] for e in document["experiments"]] == [e["summary"] for e in committed["experiments"]]
    assert document["hosts"] == committed["hosts"]
    for host in document["hosts"]:  # every fact that was not measured on the host says how it was derived
        measured = {"gpuProduct", "gpuMemoryBytes", "gpuCount"} | set(host["how"])
        assert set(host["facts"]) <= measured | {"cpuSeconds", "diskBytesPerSecond"}


def test_each_gpu_is_predicted_from_the_others_facts_within_the_mae_bound(document: dict) -> None:
    # The MAE bound holds both ways; its 25 % bound on the largest error does not (29.5 % and
    # 36.3 %: the read-ahead's bootstrap, docs/prediction.md), which the committed figures above pin.
    for experiment in document["experiments"]:
        if NEW_CLASS not in experiment["heldOutHardware"] and NEW_CLASS not in experiment["fittedOn"]:
            continue
        total = experiment["summary"]["total"]
        assert experiment["summary"]["starts"] >= 6
        assert total["maePercent"] <= 12, experiment["fittedOn"]
        # ...and far better than the stand-in set without host facts.
        assert total["maePercent"] < experiment["unscaledSummary"]["maePercent"] / 3


def new_class_starts(document: dict) -> list[Observation]:
    host = next(h for h in document["hosts"] if h["name"] == NEW_CLASS)
    facts = HostFacts.model_validate(host["facts"])
    runs = sorted(load_runs(cross_hardware.REPO / host["runs"]), key=lambda run: (run.rep, run.profile))
    return [cross_hardware.on_host(run, facts).observation for run in runs]


def mae_percent(starts: list[Observation], namespace_starts: list[Observation]) -> float:
    hardware = HardwareClass.from_key(cross_hardware.H200)
    prior = shipped_coefficients(hardware)
    assert prior.hardware != hardware.key and prior.host is not None  # a stand-in, scaled by the facts
    entry = NamespaceStarts(updated_at=0.0, observations=namespace_starts)
    coefficients = namespace_coefficients({"team-a": entry}, hardware, "team-a", prior)
    assert coefficients is not None
    measured = [sum(start.phases.values()) for start in starts]
    predicted = [predict(s.facts, s.settings, coefficients).total_seconds for s in starts]
    errors = [abs(p - m) for p, m in zip(predicted, measured, strict=True)]
    return 100 * statistics.fmean(errors) / statistics.fmean(measured)


def test_after_three_starts_on_a_new_class_the_refit_predicts_the_next_ones(document: dict) -> None:
    starts = new_class_starts(document)
    observed, upcoming = starts[:3], starts[3:]
    assert len(upcoming) >= 3
    assert mae_percent(upcoming, observed) <= 10


def test_one_forged_start_among_them_does_not_move_it_out_of_the_bounds(document: dict) -> None:
    starts = new_class_starts(document)
    observed, upcoming = starts[:3], starts[3:]
    forged = observed[0].model_copy(
        update={"phases": {phase: 4 * seconds for phase, seconds in observed[0].phases.items()}, "label": "x"}
    )
    assert mae_percent(upcoming, [*observed, forged]) <= 10


def test_the_shipped_set_holds_for_its_hosts_facts(document: dict) -> None:
    hosts = {h["name"]: HostFacts.model_validate(h["facts"]) for h in document["hosts"]}
    shipped = shipped_coefficients(HardwareClass.from_key(cross_hardware.H100))
    assert shipped.host == cross_hardware.pooled([hosts[name] for name in cross_hardware.SHIPPED_HOSTS])


def test_the_raw_table_is_kept_with_the_json() -> None:
    assert Path(cross_hardware.RAW).read_text().startswith("fit on ")
