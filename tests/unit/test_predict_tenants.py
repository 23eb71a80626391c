"""What one namespace's starts can do to another's predictions: facts and phases within physical ranges,
implausible starts refused, every other namespace together moving a prediction by at most 10 %, and a
coefficients ConfigMap that stays bounded whatever one namespace writes (docs/prediction.md)."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from stoker.inpod.facts import MAX_FACTS_LINE_LENGTH
from stoker.predict import (
    FACTS_LOG_PREFIX,
    EngineSettings,
    HardwareClass,
    ModelFacts,
    Observation,
    parse_facts_line,
    predict,
    shipped_coefficients,
)
from stoker.predict.facts import with_logged_weights
from stoker.predict.fleet import (
    ENTRY_BYTES,
    FLEET_INFLUENCE,
    STORE_BYTES,
    namespace_coefficients,
    read_class,
    starts_key,
    with_observation,
)
from stoker.predict.model import MAX_CHECKPOINT_BYTES, MAX_PHASE_SECONDS, CoefficientSet
from stoker.predict.predictor import fit

H100 = HardwareClass(gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=1, engine_version="0.26")
PRIOR = shipped_coefficients(H100)
FACTS = PRIOR.observations[0].facts
HIT = EngineSettings(capture_sizes=51, cache_state="hit", engine_version="0.26.0")
FACTS_JSON = FACTS.to_json_dict()


def honest(label: str, scale: float = 1.0, settings: EngineSettings = HIT) -> Observation:
    """A start as the shipped set predicts it, `scale` times as long."""
    expected = predict(FACTS, settings, PRIOR).phases
    return Observation(
        facts=FACTS, settings=settings, phases={p: s * scale for p, s in expected.items()}, label=label
    )


class Store:
    """The ConfigMap's data as the operator's writes leave it."""

    def __init__(self, limit: int = 10) -> None:
        self.data: dict[str, str] = {}
        self.limit = limit
        self.clock = 1000.0

    def record(
        self,
        namespace: str,
        start: Observation,
        hardware: HardwareClass = H100,
        prior: CoefficientSet = PRIOR,
    ) -> str | None:
        self.clock += 1.0
        write = with_observation(self.data, hardware, namespace, start, prior, self.limit, self.clock)
        for key, text in write.changes.items():
            if text is None:
                self.data.pop(key, None)
            else:
                self.data[key] = text
        return write.refused

    def total(self, namespace: str, settings: EngineSettings = HIT, facts: ModelFacts = FACTS) -> float:
        coefficients = namespace_coefficients(read_class(self.data, H100), H100, namespace, PRIOR)
        assert coefficients is not None
        return predict(facts, settings, coefficients).total_seconds

    def size(self) -> int:
        return sum(len(key) + len(text.encode()) for key, text in self.data.items())


# ------------------------------------------------------------------ physical ranges


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layers", 2**63 - 1),
        ("layers", 10**30),
        ("layers", -1),
        ("hiddenSize", 10**9),
        ("vocabSize", 2**40),
        ("checkpointBytes", 10**20),
        ("attentionHeads", 10**6),
        ("experts", 10**9),
        ("tokenizerBytes", 10**12),
        ("dtype", "b" * 3000),
        ("dtype", "bfloat16\nInjected: line"),
        ("dtype", "x" * 33),
    ],
)
def test_facts_out_of_their_physical_range_are_refused_with_the_field_named(
    field: str, value: object
) -> None:
    with pytest.raises(ValidationError, match=field):
        ModelFacts.model_validate({**FACTS_JSON, field: value})
    with pytest.raises(ValueError, match=f"model facts out of range or malformed: {field}") as raised:
        parse_facts_line(FACTS_LOG_PREFIX + json.dumps({**FACTS_JSON, field: value}))
    assert len(str(raised.value)) < 1000  # what the pod printed is not repeated in full


def test_real_models_facts_are_in_range() -> None:
    for dtype in ("bfloat16", "float16", "float32", "float8_e4m3fn", "auto", "torch.bfloat16"):
        ModelFacts.model_validate({**FACTS_JSON, "dtype": dtype})
    # DeepSeek-V3: 61 layers, 256 experts, 129,280 tokens, ~690 GB of fp8 weights.
    big = {**FACTS_JSON, "layers": 61, "experts": 256, "moe": True, "vocabSize": 129280}
    assert ModelFacts.model_validate({**big, "checkpointBytes": 690 * 10**9}).layers == 61


def test_a_facts_line_longer_than_any_is_refused_before_it_is_parsed() -> None:
    line = FACTS_LOG_PREFIX + json.dumps({**FACTS_JSON, "dtype": "b" * 200_000})
    with pytest.raises(ValueError, match=f"longer than {MAX_FACTS_LINE_LENGTH}") as raised:
        parse_facts_line(line)
    assert len(str(raised.value)) < 300
    assert parse_facts_line(FACTS_LOG_PREFIX + json.dumps(FACTS_JSON)) == FACTS


def test_weights_a_seed_log_claims_beyond_any_checkpoint_are_not_taken() -> None:
    without = FACTS.model_copy(update={"checkpoint_bytes": 0})
    assert with_logged_weights(without, 16 << 30, 2).checkpoint_bytes == 32 << 30
    assert with_logged_weights(without, MAX_CHECKPOINT_BYTES, 2) == without
    assert with_logged_weights(without, 10**30, 1) == without


@pytest.mark.parametrize(
    ("phases", "problem"),
    [
        ({"weightLoad": 36_000.0}, "less than or equal to 21600"),  # a 10 h weight load
        ({"weightLoad": -1.0}, "greater than or equal to 0"),
        ({"weightLoad": float("nan")}, "finite number"),
        ({"weightLoad": float("inf")}, "finite number"),
        ({"weightLoad": 0.0}, "add up to 0.0 s"),
        ({"bootstrap": 12_000.0, "weightLoad": 12_000.0}, "add up to 24000.0 s"),
        ({"x" * 10_000: 1.0}, "are not engine phases"),
    ],
)
def test_a_start_s_phases_are_checked_before_it_is_observed(phases: dict[str, float], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Observation(facts=FACTS, settings=HIT, phases=phases, label="ns/pod#0")


def test_a_start_s_label_and_settings_are_bounded() -> None:
    with pytest.raises(ValidationError, match="label"):
        Observation(facts=FACTS, settings=HIT, phases={"bootstrap": 1.0}, label="x" * 100_000)
    with pytest.raises(ValidationError, match="loader"):
        EngineSettings(loader="x" * 100_000, capture_sizes=1, cache_state="hit")
    with pytest.raises(ValidationError, match=r"captureSizes|capture_sizes"):
        EngineSettings(capture_sizes=10**12, cache_state="hit")


# ------------------------------------------------------------------ implausible starts


@pytest.mark.parametrize(
    ("scale", "refused"),
    [(1.0, False), (5.0, False), (0.2, False), (25.0, True), (0.01, True)],
)
def test_a_start_far_off_its_namespace_s_prediction_is_refused(scale: float, refused: bool) -> None:
    store = Store()
    why = store.record("b", honest("b/pod#0", scale))
    assert (why is not None) is refused
    if refused:
        assert why is not None and "times off: taken for a forged or broken log" in why
        assert starts_key(H100, "b") not in store.data


def test_a_short_phase_far_off_in_ratio_but_not_in_seconds_is_kept() -> None:
    # Model inspection takes a hundredth of a second on a hit; a few seconds more is no forgery.
    start = honest("b/pod#0")
    assert start.phases["modelInfo"] < 0.1
    phases = {**start.phases, "modelInfo": 3.0}
    assert Store().record("b", Observation.model_validate({**start.to_json_dict(), "phases": phases})) is None


def test_one_odd_start_of_a_namespace_pulls_its_own_prediction_a_bounded_amount() -> None:
    usual = [honest(f"a/pod-{index}#0", 1.0) for index in range(7)]
    odd = honest("a/odd#0", 15.0)
    plain = predict(FACTS, HIT, fit([*usual, odd], PRIOR)).total_seconds
    robust = predict(FACTS, HIT, fit([*usual, odd], PRIOR, robust=True)).total_seconds
    alike = predict(FACTS, HIT, PRIOR).total_seconds
    assert robust < alike * 1.25 < plain


# ------------------------------------------------------------------ bounded influence between namespaces


def forged(rng: random.Random, label: str) -> Observation:
    """Any start a tenant's pod could make the operator parse: facts and phases anywhere in range."""
    facts = ModelFacts(
        checkpoint_bytes=rng.choice([0, 1, rng.randrange(1 << 46)]),
        layers=rng.randrange(4097),
        hidden_size=rng.randrange(1 << 20),
        intermediate_size=rng.randrange(1 << 20),
        attention_heads=rng.randrange(4097),
        kv_heads=rng.randrange(4097),
        vocab_size=rng.randrange(1 << 24),
        tokenizer_bytes=rng.randrange(1 << 30),
        moe=rng.random() < 0.5,
        experts=rng.randrange(1 << 16),
        dtype=rng.choice(["bfloat16", "x" * 32, None]),
    )
    facts = rng.choice([facts, FACTS])
    settings = rng.choice(
        [
            HIT,
            HIT.model_copy(update={"cache_state": "miss"}),
            EngineSettings(capture_sizes=0, cache_state="none", loader=rng.choice(["auto", "y" * 64])),
        ]
    )
    scale = rng.choice([0.05, 0.5, 1.0, 2.0, 19.0, rng.uniform(0.01, 50.0)])
    phases = {
        phase: min(seconds * scale * rng.uniform(0.5, 2.0), MAX_PHASE_SECONDS / 12)
        for phase, seconds in predict(FACTS, settings, PRIOR).phases.items()
    }
    if rng.random() < 0.2:
        phases = {"weightLoad": rng.uniform(0.001, MAX_PHASE_SECONDS)}
    return Observation(
        facts=facts, settings=settings, phases=phases, label=f"{label}{'z' * rng.randrange(300)}"
    )


@pytest.mark.parametrize("seed", range(40))
def test_no_namespace_moves_another_s_prediction_by_more_than_10_percent(seed: int) -> None:
    rng = random.Random(seed)
    store = Store()
    # Namespace a's own starts, and those of a few ordinary namespaces, some slower than shipped.
    for index in range(rng.randrange(4)):
        store.record("a", honest(f"a/pod-{index}#0", rng.uniform(0.8, 1.3)))
    for namespace in [f"ordinary-{n}" for n in range(rng.randrange(4))]:
        for index in range(rng.randrange(1, 4)):
            store.record(namespace, honest(f"{namespace}/pod-{index}#0", rng.uniform(0.7, 1.5)))
    a_settings = rng.choice([HIT, HIT.model_copy(update={"cache_state": "miss"})])
    before = store.total("a", a_settings)
    # Then namespace b forges 20 starts (and, in half of the cases, starts from several namespaces).
    attackers = ["b"] if seed % 2 else ["b", "c", "d"]
    for index in range(20):
        attacker = rng.choice(attackers)
        store.record(attacker, forged(rng, f"{attacker}/forged-{index}#0"))
        after = store.total("a", a_settings)
        assert before / FLEET_INFLUENCE - 0.01 <= after <= before * FLEET_INFLUENCE + 0.01, (
            index,
            before,
            after,
        )
    # And whatever they did, a's own next start is still kept.
    assert store.record("a", honest("a/next#0")) is None


@pytest.mark.parametrize("scale", [0.06, 19.0])
def test_twenty_forged_starts_of_one_namespace_move_another_by_at_most_10_percent(scale: float) -> None:
    """The issue's case: one namespace's starts all far slower (or faster) than any real one."""
    store = Store()
    store.record("a", honest("a/pod#0"))
    before = store.total("a")
    for index in range(20):
        store.record("b", honest(f"b/forged-{index}#0", scale if index else 1.0))
    after = store.total("a")
    assert after != before
    assert before / FLEET_INFLUENCE <= after <= before * FLEET_INFLUENCE
    # A namespace with no starts of its own gets the same bound.
    assert PRIOR_TOTAL / FLEET_INFLUENCE <= store.total("new") <= PRIOR_TOTAL * FLEET_INFLUENCE


PRIOR_TOTAL = predict(FACTS, HIT, PRIOR).total_seconds


def test_the_fleet_moves_everyone_when_many_namespaces_agree() -> None:
    store = Store()
    for namespace in ("c", "d", "e"):
        store.record(namespace, honest(f"{namespace}/pod#0", 1.3))
    assert store.total("a") == pytest.approx(PRIOR_TOTAL * FLEET_INFLUENCE**0.5, rel=0.002)
    # One namespace claiming the opposite is one vote of four: the median stays.
    for index in range(20):
        store.record("b", honest(f"b/pod-{index}#0", 0.3))
    assert store.total("a") == pytest.approx(PRIOR_TOTAL * FLEET_INFLUENCE**0.5, rel=0.002)


# ------------------------------------------------------------------ a bounded store


def test_one_namespace_cannot_fill_the_configmap_for_the_others() -> None:
    store = Store(limit=50)
    store.record("a", honest("a/pod#0"))
    a_entry = store.data[starts_key(H100, "a")]
    rng = random.Random(7)
    # b forges starts in 300 hardware classes (engine versions are the spec's), with the longest labels.
    for version in range(300):
        hardware = H100.model_copy(update={"engine_version": f"0.{version}"})
        for index in range(3):
            start = honest(f"b/{'p' * 250}-{index}#{rng.randrange(10**9)}")
            assert (
                store.record("b", start, hardware, PRIOR.model_copy(update={"hardware": hardware.key}))
                is None
            )
        assert store.size() <= STORE_BYTES
    assert all(len(text.encode()) <= ENTRY_BYTES for text in store.data.values())
    assert store.data[starts_key(H100, "a")] == a_entry  # a's starts were never evicted
    assert store.record("a", honest("a/pod#1")) is None  # and a's writes still go in
    assert [o.label for o in read_class(store.data, H100)["a"].observations] == [
        "a/pod#0",
        "a/pod#1",
    ]


def test_a_full_configmap_gives_up_the_entries_of_the_namespace_holding_most() -> None:
    store = Store(limit=10)
    namespaces = [f"n{index:03d}" for index in range(100)]
    for namespace in namespaces:
        for index in range(10):
            store.record(namespace, honest(f"{namespace}/{'x' * 250}-{index}#0"))
        assert store.size() <= STORE_BYTES
    kept = read_class(store.data, H100)
    # Everyone holds as much: the least recently written ones went first, and only as many as needed.
    assert set(kept) == set(namespaces[-len(kept) :]) and 50 < len(kept) < 100
    assert all(len(entry.observations) == 10 for entry in kept.values())
    # A namespace with one start is not evicted for the namespaces with more: they give up theirs first.
    store.record("small", honest("small/pod#0"))
    store.record(namespaces[-1], honest(f"{namespaces[-1]}/more#0"))
    assert "small" in read_class(store.data, H100)
