"""What the operator decides about predictions, without a cluster: hardware class, expected status,
SlowStart, and the coefficients ConfigMap's entries."""

from __future__ import annotations

import json

import pytest

from stoker.predict import EngineSettings, HardwareClass, ModelFacts, Observation, PhaseFit, predict
from stoker.predict.fleet import (
    coefficients_key,
    expected_status,
    observations_key,
    on_node,
    read_fleet,
    slow_start,
    with_observation,
)
from stoker.predict.model import CoefficientSet

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


def test_an_observation_is_kept_once_and_refits_toward_it() -> None:
    changes, garbled = with_observation({}, H100, start("ns/pod-a#0", 40.0), PRIOR, limit=200)
    assert garbled == []
    assert set(changes) == {observations_key(H100), coefficients_key(H100)}
    fleet = read_fleet(changes, H100)
    assert [o.label for o in fleet.observations] == ["ns/pod-a#0"]
    assert fleet.coefficients is not None and fleet.coefficients.source == "fleet"
    assert fleet.coefficients.hardware == H100.key
    before = predict(FACTS, SERVING, PRIOR).phases["weightLoad"]
    after = predict(FACTS, SERVING, fleet.coefficients).phases["weightLoad"]
    assert before < after < 40.0  # one start moves the prior part of the way
    # The same start again (a reconcile after a failed status write) changes nothing.
    assert with_observation(changes, H100, start("ns/pod-a#0", 40.0), PRIOR, limit=200) == ({}, [])


def test_the_newest_observations_are_kept() -> None:
    data: dict[str, str] = {}
    for index in range(5):
        changes, _ = with_observation(data, H100, start(f"ns/pod-{index}#0", 30.0), PRIOR, limit=3)
        data.update(changes)
    assert [o.label for o in read_fleet(data, H100).observations] == [
        "ns/pod-2#0",
        "ns/pod-3#0",
        "ns/pod-4#0",
    ]


def test_a_garbled_key_is_reported_and_replaced_and_the_others_are_left_alone() -> None:
    other = HardwareClass(gpu_product="NVIDIA-A100-SXM4-80GB", gpu_count=1, engine_version="0.26")
    data = {
        observations_key(H100): "[{not json",
        coefficients_key(H100): json.dumps({"hardware": H100.key}),
        observations_key(other): "kept as it is",
    }
    assert read_fleet(data, H100).garbled == [observations_key(H100), coefficients_key(H100)]
    changes, garbled = with_observation(data, H100, start("ns/pod-a#0", 40.0), PRIOR, limit=200)
    assert garbled == [observations_key(H100), coefficients_key(H100)]
    assert observations_key(other) not in changes
    repaired = read_fleet({**data, **changes}, H100)
    assert repaired.garbled == [] and [o.label for o in repaired.observations] == ["ns/pod-a#0"]
    # A start seen again with its class's coefficients garbled since: they are refitted, it is not re-added.
    again = {**data, **changes, coefficients_key(H100): "garbled"}
    changes, garbled = with_observation(again, H100, start("ns/pod-a#0", 40.0), PRIOR, limit=200)
    assert garbled == [coefficients_key(H100)]
    assert read_fleet({**again, **changes}, H100).coefficients is not None
    assert [o.label for o in read_fleet({**again, **changes}, H100).observations] == ["ns/pod-a#0"]


def test_without_a_prior_the_fleet_fits_its_own_observations() -> None:
    changes, _ = with_observation({}, H100, start("ns/pod-a#0", 40.0), None, limit=200)
    coefficients = read_fleet(changes, H100).coefficients
    assert coefficients is not None
    assert predict(FACTS, SERVING, coefficients).phases["weightLoad"] == pytest.approx(40.0, abs=0.01)
