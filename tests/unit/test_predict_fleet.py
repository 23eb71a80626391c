"""What the operator decides about predictions, without a cluster: hardware class, expected status,
SlowStart, and the coefficients ConfigMap's entries (what one namespace's starts can do to another's
predictions: test_predict_tenants.py)."""

from __future__ import annotations

import pytest

from stoker.predict import EngineSettings, HardwareClass, ModelFacts, Observation, PhaseFit, predict
from stoker.predict.fleet import (
    expected_status,
    namespace_coefficients,
    on_node,
    read_class,
    slow_start,
    starts_key,
    with_observation,
)
from stoker.predict.model import MAX_NAMESPACE_STARTS, CoefficientSet

H100 = HardwareClass(gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=1, engine_version="0.26")
FACTS = ModelFacts(
    checkpoint_bytes=16_000_000_000,
    layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    attention_heads=32,
    kv_heads=8,
    vocab_size=128256,
    tokenizer_bytes=9_000_000,
    moe=False,
    experts=0,
    dtype="bfloat16",
)
SERVING = EngineSettings(loader="runai_streamer", capture_sizes=7, cache_state="hit")
PRIOR = CoefficientSet(
    hardware=H100.key,
    source="shipped",
    phases={
        "bootstrap": {"readahead=off": PhaseFit(intercept=20.0, samples=10)},
        "weightLoad": {
            "loader=runai_streamer": PhaseFit(intercept=1.0, weights={"checkpointGB": 0.5}, samples=10)
        },
    },
)


def start(label: str, weight_load: float) -> Observation:
    return Observation(
        facts=FACTS, settings=SERVING, phases={"bootstrap": 20.0, "weightLoad": weight_load}, label=label
    )


def test_a_start_runs_on_its_node_s_gpu_product_cpu_or_unknown() -> None:
    spec_class = HardwareClass(gpu_product="NVIDIA-A100-SXM4-80GB", gpu_count=1, engine_version="0.26.0")
    assert on_node(spec_class, "NVIDIA-H100-80GB-HBM3") == H100
    assert on_node(spec_class, None).key == "unknown_x1_v0.26"
    assert on_node(spec_class, "odd_label").key == "odd-label_x1_v0.26"
    cpu = spec_class.model_copy(update={"gpu_count": 0})
    assert on_node(cpu, "NVIDIA-H100-80GB-HBM3").key == "cpu_x0_v0.26"


def test_expected_status_carries_phases_total_and_the_set_used() -> None:
    prediction = predict(FACTS, SERVING, PRIOR)
    status = expected_status(prediction, H100, "hit")
    assert status["phases"] == {"bootstrap": 20.0, "weightLoad": 9.0}
    assert status["totalSeconds"] == 29.0
    assert (status["hardware"], status["coefficients"], status["source"]) == (H100.key, H100.key, "shipped")
    assert status["cacheState"] == "hit"


@pytest.mark.parametrize(
    ("observed_total", "expected_total", "slow"),
    [
        (39.0, 30.0, False),  # 9 s over: under the 10 s floor
        (41.0, 30.0, True),
        (124.0, 100.0, False),  # 24 % over: under 25 %
        (126.0, 100.0, True),
    ],
)
def test_slow_start_needs_more_than_25_percent_and_10_seconds(
    observed_total: float, expected_total: float, slow: bool
) -> None:
    found = slow_start(
        {"bootstrap": observed_total}, observed_total, {"bootstrap": expected_total}, expected_total
    )
    assert (found is not None) is slow


def test_slow_start_names_the_phase_that_overran_most() -> None:
    expected = {"bootstrap": 20.0, "weightLoad": 10.0, "compileLoad": 2.0}
    # An expected hit that compiled: compile was not predicted at all, so all of it is overrun.
    observed = {"bootstrap": 22.0, "weightLoad": 14.0, "compile": 30.0}
    found = slow_start(observed, 66.0, expected, 32.0)
    assert found is not None and found.phase == "compile" and found.overrun_seconds == 30.0
    assert "expected 32.0 s" in found.message("pod-1") and "compile overran most (+30.0 s)" in found.message(
        "pod-1"
    )


def recorded(data: dict[str, str], namespace: str, *starts: Observation, limit: int = 10) -> dict[str, str]:
    """`data` after `namespace` observed `starts`, each one written as the store writes it."""
    data = dict(data)
    for observation in starts:
        write = with_observation(data, H100, namespace, observation, PRIOR, limit, now=1000.0)
        assert write.refused is None, write.refused
        for key, text in write.changes.items():
            if text is None:
                data.pop(key, None)
            else:
                data[key] = text
    return data


def test_a_start_is_kept_once_under_its_namespace_and_refits_its_predictions() -> None:
    write = with_observation({}, H100, "ns", start("ns/pod-a#0", 40.0), PRIOR, limit=10, now=1000.0)
    assert (write.garbled, write.refused) == ([], None)
    assert (
        list(write.changes) == [starts_key(H100, "ns")] == ["NVIDIA-H100-80GB-HBM3_x1_v0.26.ns.starts.json"]
    )
    data = recorded({}, "ns", start("ns/pod-a#0", 40.0))
    assert [o.label for o in read_class(data, H100)["ns"].observations] == ["ns/pod-a#0"]
    coefficients = namespace_coefficients(read_class(data, H100), H100, "ns", PRIOR)
    assert coefficients is not None and coefficients.source == "fleet" and coefficients.hardware == H100.key
    before = predict(FACTS, SERVING, PRIOR).phases["weightLoad"]
    after = predict(FACTS, SERVING, coefficients).phases["weightLoad"]
    assert before < after < 40.0  # one start moves the prior part of the way
    # The same start again (a reconcile after a failed status write) changes nothing.
    assert with_observation(data, H100, "ns", start("ns/pod-a#0", 40.0), PRIOR, 10, now=2000.0).changes == {}


def test_the_newest_starts_of_a_namespace_are_kept() -> None:
    starts = [start(f"ns/pod-{index}#0", 30.0) for index in range(5)]
    data = recorded({}, "ns", *starts, limit=3)
    kept = read_class(data, H100)["ns"].observations
    assert [o.label for o in kept] == ["ns/pod-2#0", "ns/pod-3#0", "ns/pod-4#0"]


def test_a_garbled_entry_is_reported_and_replaced_and_the_others_are_left_alone() -> None:
    data = {
        starts_key(H100, "ns"): "[{not json",
        starts_key(H100, "other"): "garbled too, not ns's business",
        "someone-elses.json": "kept as it is",
    }
    assert read_class(data, H100) == {}
    write = with_observation(data, H100, "ns", start("ns/pod-a#0", 40.0), PRIOR, limit=10, now=1000.0)
    assert write.garbled == [starts_key(H100, "ns")]
    assert set(write.changes) == {starts_key(H100, "ns")}
    repaired = recorded(data, "ns", start("ns/pod-a#0", 40.0))
    assert repaired[starts_key(H100, "other")] == data[starts_key(H100, "other")]
    assert [o.label for o in read_class(repaired, H100)["ns"].observations] == ["ns/pod-a#0"]
    # Predictions go on without the garbled entries.
    assert namespace_coefficients(read_class(data, H100), H100, "ns", PRIOR) == PRIOR


def test_the_shared_keys_of_earlier_versions_are_dropped_at_the_next_write() -> None:
    data = {
        "NVIDIA-H100-80GB-HBM3_x1_v0.26.observations.json": "[]",
        "NVIDIA-H100-80GB-HBM3_x1_v0.26.coefficients.json": "{}",
        "someone-elses.json": "kept as it is",
    }
    write = with_observation(data, H100, "ns", start("ns/pod-a#0", 40.0), PRIOR, limit=10, now=1000.0)
    assert write.changes["NVIDIA-H100-80GB-HBM3_x1_v0.26.observations.json"] is None
    assert write.changes["NVIDIA-H100-80GB-HBM3_x1_v0.26.coefficients.json"] is None
    assert "someone-elses.json" not in write.changes


def test_without_a_prior_a_namespace_fits_its_own_starts_and_others_get_none() -> None:
    data: dict[str, str] = {}
    write = with_observation(data, H100, "ns", start("ns/pod-a#0", 40.0), None, limit=10, now=1000.0)
    data.update({key: text for key, text in write.changes.items() if text is not None})
    coefficients = namespace_coefficients(read_class(data, H100), H100, "ns", None)
    assert coefficients is not None
    assert predict(FACTS, SERVING, coefficients).phases["weightLoad"] == pytest.approx(40.0, abs=0.01)
    # Another namespace's starts alone are no prediction for a namespace: they would be all of it.
    assert namespace_coefficients(read_class(data, H100), H100, "elsewhere", None) is None


def test_a_limit_above_what_an_entry_holds_keeps_what_it_holds() -> None:
    starts = [start(f"ns/pod-{index}#0", 30.0) for index in range(MAX_NAMESPACE_STARTS + 3)]
    data = recorded({}, "ns", *starts, limit=1000)
    kept = read_class(data, H100)["ns"].observations
    assert len(kept) == MAX_NAMESPACE_STARTS and kept[-1].label == starts[-1].label
