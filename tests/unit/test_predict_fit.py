"""Fitting and predicting: known coefficients recovered from synthetic starts, the prior's pull, phase
names."""

import itertools

import pytest

from stoker.engines import SUPPORTED
from stoker.phases import ENGINE_PHASES
from stoker.predict import (
    PHASE_MODELS,
    CoefficientSet,
    EngineSettings,
    ModelFacts,
    Observation,
    PhaseFit,
    expected_phases,
    fit,
    logged_settings,
    predict,
    regime_of,
)

HARDWARE = "NVIDIA-H100-80GB-HBM3_x1_v0.26"
SERVING = EngineSettings(loader="runai_streamer", capture_sizes=7, cache_state="hit", forked_engine=True)
# The truth the synthetic starts are made from: seconds = intercept + weight x feature.
TRUE_WEIGHT_LOAD = PhaseFit(intercept=1.5, weights={"checkpointGB": 0.7}, samples=0)
TRUE_GRAPH_CAPTURE = PhaseFit(
    intercept=0.4, weights={"captureSizes": 0.01, "captureLayers": 0.002}, samples=0
)


def facts(layers: int, hidden: int) -> ModelFacts:
    parameters = layers * 12 * hidden * hidden + 2 * 32000 * hidden
    return ModelFacts(
        checkpoint_bytes=2 * parameters,
        layers=layers,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        attention_heads=hidden // 128,
        kv_heads=8,
        vocab_size=32000,
        tokenizer_bytes=2_000_000,
        moe=False,
        experts=0,
        dtype="bfloat16",
    )


def observe(model: ModelFacts, settings: EngineSettings, *, scale: float = 1.0) -> Observation:
    gigabytes = model.checkpoint_bytes / 1e9
    capture = settings.capture_sizes
    graph_capture = TRUE_GRAPH_CAPTURE.weights
    phases = {
        "bootstrap": 17.0 * scale,
        "weightLoad": (TRUE_WEIGHT_LOAD.intercept + TRUE_WEIGHT_LOAD.weights["checkpointGB"] * gigabytes)
        * scale,
        "graphCapture": TRUE_GRAPH_CAPTURE.intercept
        + graph_capture["captureSizes"] * capture
        + graph_capture["captureLayers"] * capture * model.layers,
    }
    return Observation(facts=model, settings=settings, phases=phases)


SHAPES = [facts(layers, hidden) for layers, hidden in itertools.product((4, 12, 28), (2048, 4096))]
STARTS = [
    observe(model, SERVING.model_copy(update={"capture_sizes": n})) for model in SHAPES for n in (7, 51)
]


def test_fit_recovers_the_coefficients_it_was_made_from() -> None:
    coefficients = fit(STARTS, hardware=HARDWARE, source="shipped")
    weight_load = coefficients.phases["weightLoad"]["loader=runai_streamer"]
    assert weight_load.intercept == pytest.approx(1.5, abs=1e-3)
    assert weight_load.weights["checkpointGB"] == pytest.approx(0.7, abs=1e-4)
    assert weight_load.samples == len(STARTS)
    graph_capture = coefficients.phases["graphCapture"]["all"]
    for name, weight in TRUE_GRAPH_CAPTURE.weights.items():
        assert graph_capture.weights[name] == pytest.approx(weight, abs=1e-5)
    assert coefficients.phases["bootstrap"]["readahead=off"].intercept == pytest.approx(17.0)
    # A shape it never saw is predicted exactly: the phases are linear in the features.
    unseen = facts(20, 3072)
    settings = SERVING.model_copy(update={"capture_sizes": 11})
    expected = observe(unseen, settings).phases
    prediction = predict(unseen, settings, coefficients)
    for phase, seconds in expected.items():
        assert prediction.phases[phase] == pytest.approx(seconds, abs=1e-3)
    assert prediction.total_seconds == pytest.approx(sum(prediction.phases.values()), abs=1e-6)
    assert (prediction.coefficient_set, prediction.source, prediction.fallbacks) == (HARDWARE, "shipped", {})


def test_a_feature_that_never_varies_stays_at_zero() -> None:
    one_shape = [observe(SHAPES[0], SERVING)] * 3
    weight_load = fit(one_shape, hardware=HARDWARE).phases["weightLoad"]["loader=runai_streamer"]
    assert weight_load.weights["checkpointGB"] == 0.0
    assert weight_load.intercept == pytest.approx(one_shape[0].phases["weightLoad"])


def test_few_fleet_starts_move_toward_them_and_many_dominate() -> None:
    prior = fit(STARTS, hardware=HARDWARE, source="shipped")
    # The fleet's storage is twice as slow, and its bootstrap takes twice as long.
    slow = [observe(model, SERVING, scale=2.0) for model in SHAPES]
    model = SHAPES[3]
    truth = observe(model, SERVING, scale=2.0).phases["weightLoad"]
    before = predict(model, SERVING, prior).phases["weightLoad"]

    def after(starts: int) -> float:
        refit = fit(slow * (starts // len(slow)) + slow[: starts % len(slow)], prior)
        assert refit.source == "fleet" and refit.hardware == HARDWARE
        return predict(model, SERVING, refit).phases["weightLoad"]

    one, six, sixty = after(1), after(6), after(60)
    assert before < one < six < sixty < truth
    assert one - before < 0.3 * (truth - before)  # one start moves the prediction, but not far
    assert truth - sixty < 0.1 * (truth - before)  # sixty outweigh the prior
    refit = fit(slow[:1], prior)
    assert refit.phases["weightLoad"]["loader=runai_streamer"].samples == len(STARTS) + 1
    # A class without a set of its own refits from the nearest shipped one and keeps its own key.
    assert fit(slow[:1], prior, hardware="NVIDIA-L4_x1_v0.26").hardware == "NVIDIA-L4_x1_v0.26"
    # What the fleet did not show (another loader's fit) is the prior's, untouched.
    prior_with_auto = prior.model_copy(
        update={
            "phases": {
                **prior.phases,
                "weightLoad": {**prior.phases["weightLoad"], "loader=auto": TRUE_WEIGHT_LOAD},
            }
        }
    )
    assert fit(slow, prior_with_auto).phases["weightLoad"]["loader=auto"] == TRUE_WEIGHT_LOAD


def test_a_missing_regime_falls_back_to_the_best_supported_one_and_says_so() -> None:
    coefficients = fit(STARTS, hardware=HARDWARE)
    prediction = predict(SHAPES[0], SERVING.model_copy(update={"loader": "safetensors"}), coefficients)
    assert prediction.fallbacks == {"weightLoad": "loader=runai_streamer"}


def test_predicted_phases_are_the_engine_profiles_in_its_order() -> None:
    everything = CoefficientSet(
        hardware=HARDWARE,
        source="shipped",
        phases={phase: {"all": PhaseFit(intercept=1.0, samples=1)} for phase in PHASE_MODELS},
    )
    assert set(PHASE_MODELS) == set(ENGINE_PHASES)
    profile = SUPPORTED[2]  # 0.26: the silent JIT warm-up after graph capture
    for cache_state in ("hit", "miss", "none"):
        settings = SERVING.model_copy(update={"cache_state": cache_state})
        prediction = predict(SHAPES[0], settings, everything)
        assert list(prediction.phases) == expected_phases(profile, settings)
        names = [name for name, _ in profile.phase_ends]
        if cache_state == "none":
            names = [name for name in names if name not in ("dynamo", "compile")]
        elif cache_state == "hit":
            names = [("compileLoad" if name == "compile" else name) for name in names]
        assert list(prediction.phases) == names
        assert prediction.total_seconds == len(names)


def test_the_starts_engine_version_names_the_phases_whichever_set_is_used() -> None:
    coefficients = fit(STARTS, hardware=HARDWARE)
    coefficients.phases["jitWarmup"] = {"cache=hit": PhaseFit(intercept=0.6, samples=1)}
    assert "jitWarmup" in predict(SHAPES[0], SERVING, coefficients).phases
    older = SERVING.model_copy(update={"engine_version": "0.22.1"})  # no kernel warm-up phase
    assert "jitWarmup" not in predict(SHAPES[0], older, coefficients).phases


def test_a_phase_the_set_never_saw_is_not_predicted() -> None:
    cpu = CoefficientSet(
        hardware="cpu_x0_v0.26",
        source="shipped",
        phases={"bootstrap": {"readahead=off": PhaseFit(intercept=30.0, samples=2)}},
    )
    assert predict(SHAPES[0], SERVING, cpu).phases == {"bootstrap": 30.0}


def test_fit_without_hardware_or_prior_is_refused() -> None:
    with pytest.raises(ValueError, match="hardware key"):
        fit(STARTS)


def test_a_kept_cache_that_failed_to_load_is_its_own_regime() -> None:
    # vLLM's CPU runner never loads a kept compile cache (the log says miss, loadFailed), yet the kept
    # volume's other caches spare part of the work: such a start is not a miss on an empty volume.
    served = logged_settings(SERVING, "miss", "loadFailed")
    assert (served.cache_state, served.kept_cache) == ("miss", True)
    assert regime_of("compile", served) == "cache=miss,kept"
    empty = logged_settings(SERVING, "miss", None)
    assert (empty.kept_cache, regime_of("compile", empty)) == (False, "cache=miss")
    assert logged_settings(SERVING, "hit", None).kept_cache


def test_an_expected_hit_where_kept_caches_never_load_is_predicted_as_they_run_there() -> None:
    cpu = CoefficientSet(
        hardware="cpu_x0_v0.26",
        source="shipped",
        phases={
            "compile": {
                "cache=miss": PhaseFit(intercept=60.0, samples=4),
                "cache=miss,kept": PhaseFit(intercept=29.0, samples=4),
            },
            "bootstrap": {"readahead=off": PhaseFit(intercept=20.0, samples=8)},
        },
    )
    prediction = predict(SHAPES[0], SERVING, cpu)
    assert prediction.phases == {"bootstrap": 20.0, "compile": 29.0}
    assert prediction.fallbacks == {"compile": "cache=miss,kept"}
    # Where hits were seen, a hit is predicted as one.
    cpu.phases["compileLoad"] = {"cache=hit": PhaseFit(intercept=0.5, samples=1)}
    assert predict(SHAPES[0], SERVING, cpu).phases == {"bootstrap": 20.0, "compileLoad": 0.5}
