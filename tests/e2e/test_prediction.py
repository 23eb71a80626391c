"""Startup prediction end to end: a seed log with the model's facts gives `status.startup.expected` before
any serving pod is Ready, a serving start slower than expected raises SlowStart, and observed starts refit
the coefficients kept in the operator's ConfigMap. Fake pods "print" recorded H100 logs through kwok."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hack.kwoklogs import SECONDS_PREFIX, print_recording

from stoker.api import VLLMService
from stoker.phases import KUBERNETES_PHASES, parse_log
from stoker.predict.fleet import (
    SLOW_START_FRACTION,
    SLOW_START_SECONDS,
    namespace_coefficients,
    read_class,
    starts_key,
)
from stoker.predict.model import CoefficientSet, HardwareClass, ModelFacts, Observation
from stoker.predict.predictor import predict
from stoker.predict.service import service_settings
from stoker.predict.shipped import shipped_coefficients
from stoker.render import MODEL_FACTS_ANNOTATION
from tests.e2e.helpers import (
    CONFIGMAP,
    CONFIGMAP_NAMESPACE,
    DATA,
    RECORDED,
    apply,
    fleet,
    get_json,
    llama,
    wait_for,
)

pytestmark = pytest.mark.e2e

HARDWARE = HardwareClass(gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=1, engine_version="0.22")
WEIGHTS_LOADED = "Model loading took"


def stretched(recording: Path, from_marker: str, seconds: float, target: Path) -> Path:
    """`recording` with every line from the first one containing `from_marker` on `seconds` later: the
    phase that marker ends takes that much longer, the others are unchanged."""
    lines, shifting = [], False
    for line in recording.read_text().splitlines():
        shifting = shifting or from_marker in line
        match = SECONDS_PREFIX.match(line)
        if shifting and match:
            line = f"[{float(match.group(1)) + seconds:9.3f}] {line[match.end() :]}"
        lines.append(line)
    target.write_text("\n".join(lines) + "\n")
    return target


def coefficients_of(kubectl, namespace: str, hardware: HardwareClass) -> CoefficientSet | None:
    """What the operator predicts `namespace`'s starts on `hardware` with, from the ConfigMap as it is."""
    starts = read_class(fleet(kubectl), hardware)
    return namespace_coefficients(starts, hardware, namespace, shipped_coefficients(hardware))


def events(kubectl, namespace: str) -> list[dict]:
    about = "involvedObject.name=predicted"
    return list(
        (get_json(kubectl, "-n", namespace, "events", "--field-selector", about) or {}).get("items", [])
    )


def test_expected_before_serving_then_slow_start_and_refit(namespace, kubectl, operator, tmp_path):
    # Nothing serves until the test scales it up, so "before the first serving pod" is certain.
    svc = llama("predicted", replicas=0)
    apply(kubectl, namespace, svc)
    seed_selector = "app.kubernetes.io/instance=predicted,app.kubernetes.io/component=seed"
    print_recording(kubectl, namespace, seed_selector, DATA / "seed-with-facts.log", tmp_path)

    def startup():
        obj = get_json(kubectl, "-n", namespace, "vllmservice", "predicted") or {}
        return (obj.get("status") or {}).get("startup") or {}

    expected = wait_for(lambda: startup().get("expected", {}).get("totalSeconds"), what="a prediction")
    status = startup()
    assert status["model"]["layers"] == 32 and status["model"]["tokenizerBytes"] == 9085657
    before = status["expected"]
    assert before["cacheState"] == "hit"  # the seed filled the cache: serving pods load it
    assert before["hardware"] == HARDWARE.key
    assert before["totalSeconds"] == pytest.approx(sum(before["phases"].values()), abs=0.05)
    assert before["untilServingSeconds"] == before["totalSeconds"]  # no serving start's pod phases yet
    server_selector = "app.kubernetes.io/instance=predicted,app.kubernetes.io/component=server"
    pods = get_json(kubectl, "-n", namespace, "pods", "-l", server_selector) or {}
    assert pods["items"] == []  # the prediction came before any serving pod existed
    table = kubectl("-n", namespace, "get", "vsvc", "predicted").stdout  # the Expected(s) column
    assert "EXPECTED(S)" in table and f"{expected:.2f}".rstrip("0").rstrip(".") in table, table
    # The seed's own start is the first observation of this hardware class.
    seed_pod = status["seed"]["pod"]
    observed = read_class(fleet(kubectl), HARDWARE)[namespace].observations
    assert any(seed_pod in (entry.label or "") for entry in observed)
    # A hand edit garbles this namespace's starts of the class (predictions go on from the shipped set
    # meanwhile); a key of another kind is not stoker's business here.
    garbled = {starts_key(HARDWARE, namespace): "[{not json", "someone-elses.json": "left as it is"}
    kubectl(
        "-n", CONFIGMAP_NAMESPACE, "patch", *CONFIGMAP, "--type=merge", "-p", json.dumps({"data": garbled})
    )

    # A serving start whose weight load takes far longer than predicted: the recorded hit, stretched.
    with open(RECORDED / "seeded-serving.log", newline="") as recording:
        recorded = parse_log(recording)
    overruns = {
        phase: recorded.phases.get(phase, 0.0) - before["phases"].get(phase, 0.0)
        for phase in {*recorded.phases, *before["phases"]}
    }
    allowed = max(SLOW_START_FRACTION * before["totalSeconds"], SLOW_START_SECONDS)
    delay = 20 + max(
        before["totalSeconds"] + allowed - recorded.total_seconds,  # slow enough to warn
        max(overruns.values()) - overruns["weightLoad"],  # and weightLoad overran most
    )
    slow_log = stretched(RECORDED / "seeded-serving.log", WEIGHTS_LOADED, delay, tmp_path / "slow.log")
    kubectl("-n", namespace, "scale", "vsvc", "predicted", "--replicas=1")
    pod = print_recording(kubectl, namespace, server_selector, slow_log, tmp_path)

    def slow_start_events():
        events = get_json(
            kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.name=predicted"
        )
        return [e for e in (events or {}).get("items", []) if e["reason"] == "SlowStart"]

    (event,) = wait_for(slow_start_events, what="a SlowStart Event")
    assert event["type"] == "Warning"
    assert "weightLoad overran most" in event["message"] and pod in event["message"], event["message"]
    last = wait_for(lambda: startup().get("last"), what="the serving start in status")
    assert last["pod"] == pod and last["totalSeconds"] == pytest.approx(
        recorded.total_seconds + delay, abs=0.05
    )

    # The serving start was observed and refitted this namespace's coefficients from the shipped prior
    # (the garbled starts were replaced by it alone): its weight load is now predicted closer to what was
    # observed than by the prior.
    def refitted() -> tuple[Observation, CoefficientSet] | None:
        entry = read_class(fleet(kubectl), HARDWARE).get(namespace)
        mine = [o for o in (entry.observations if entry else []) if pod in (o.label or "")]
        coefficients = coefficients_of(kubectl, namespace, HARDWARE)
        return (mine[0], coefficients) if mine and coefficients else None

    observation, coefficients_after = wait_for(refitted, what="the serving start in the ConfigMap")
    assert coefficients_after.source == "fleet"
    kept = read_class(fleet(kubectl), HARDWARE)[namespace].observations
    assert [o.label for o in kept] == [observation.label]
    seen = observation.phases["weightLoad"]
    prior = shipped_coefficients(HARDWARE)
    old = predict(observation.facts, observation.settings, prior).phases["weightLoad"]
    new = predict(observation.facts, observation.settings, coefficients_after).phases["weightLoad"]
    assert abs(new - seen) < abs(old - seen), (old, new, seen)

    # And the next serving start is expected from the refitted coefficients.
    def predicted_from_refit():
        expected = startup().get("expected") or {}
        weight_load = expected.get("phases", {}).get("weightLoad")
        return expected if weight_load == pytest.approx(new, abs=0.01) else None

    after = wait_for(predicted_from_refit, what="a prediction from the refitted coefficients")
    assert after["source"] == "fleet"
    # Until serving: the predicted engine plus the Kubernetes phases of that serving start.
    last_phases = startup()["last"]["phases"]
    kubernetes_seconds = sum(last_phases.get(phase, 0.0) for phase in KUBERNETES_PHASES)
    assert after["untilServingSeconds"] == pytest.approx(after["totalSeconds"] + kubernetes_seconds, abs=0.05)
    # The garbled key was reported and replaced; the other key is as it was.
    garbling = [e for e in events(kubectl, namespace) if e["reason"] == "StartupCoefficientsGarbled"]
    assert garbling and all(starts_key(HARDWARE, namespace) in e["message"] for e in garbling)
    assert fleet(kubectl)["someone-elses.json"] == "left as it is"

    metrics = operator.metrics()
    series = rf'name="predicted",namespace="{namespace}",phase="total"'
    assert re.search(r"stoker_startup_expected_seconds\{" + series + r"\} \d", metrics)
    assert re.search(r"stoker_startup_observed_seconds\{" + series + r"\} \d", metrics)
    until = rf'stoker_startup_until_serving_seconds\{{name="predicted",namespace="{namespace}"\}} ([\d.]+)'
    assert float(re.search(until, metrics).group(1)) == pytest.approx(after["untilServingSeconds"])  # type: ignore[union-attr]

    # A restart keeps what was learned: the new process predicts the same from the kept ConfigMap (its
    # gauge is set by its own first reconcile of the object).
    operator.stop()
    operator.start()
    total = re.escape(f"stoker_startup_expected_seconds{{{series}}} {float(after['totalSeconds'])}")
    wait_for(lambda: re.search(total, operator.metrics()), what="the restarted operator's prediction")
    assert coefficients_of(kubectl, namespace, HARDWARE) == coefficients_after
    assert startup()["expected"] == after


def test_the_cache_claim_keeps_the_model_facts_of_its_seed(namespace, kubectl, operator, tmp_path):
    """The facts are signed on the claim with the seed's record: an operator that restarts (nothing in its
    memory) restores them to status from there, whatever status was made to say meanwhile."""
    svc = llama("reused")
    apply(kubectl, namespace, svc)
    seed_selector = "app.kubernetes.io/instance=reused,app.kubernetes.io/component=seed"
    print_recording(kubectl, namespace, seed_selector, DATA / "seed-with-facts.log", tmp_path)

    def claim_facts():
        claim = get_json(kubectl, "-n", namespace, "pvc", "reused-cache") or {}
        return (claim.get("metadata", {}).get("annotations") or {}).get(MODEL_FACTS_ANNOTATION)

    facts = json.loads(wait_for(claim_facts, what="the model facts on the cache claim"))
    assert facts["layers"] == 32

    operator.stop()
    wiped = {"status": {"startup": {"model": None, "modelCacheKey": None}}}
    kubectl(
        "-n", namespace, "patch", "vsvc", "reused", "--subresource=status", "--type=merge",
        "-p", json.dumps(wiped),
    )  # fmt: skip
    operator.start()

    def restored():
        obj = get_json(kubectl, "-n", namespace, "vllmservice", "reused") or {}
        startup = (obj.get("status") or {}).get("startup") or {}
        return startup if startup.get("model") else None

    assert wait_for(restored, what="the facts back in status")["model"] == facts


def test_a_hub_snapshot_without_weights_takes_them_from_the_seed_log(namespace, kubectl, operator, tmp_path):
    """The seed loads dummy weights, so a hub model's snapshot holds none and its facts line says
    checkpointBytes 0; the recorded seed's `Model loading took 14.96 GiB memory` stands in."""
    svc = llama("hub-weights", replicas=0)
    apply(kubectl, namespace, svc)
    recording = (DATA / "seed-with-facts.log").read_text()
    without_weights = re.sub(r'"checkpointBytes": \d+', '"checkpointBytes": 0', recording)
    assert without_weights != recording and WEIGHTS_LOADED in without_weights
    (tmp_path / "seed.log").write_text(without_weights)
    seed_selector = "app.kubernetes.io/instance=hub-weights,app.kubernetes.io/component=seed"
    print_recording(kubectl, namespace, seed_selector, tmp_path / "seed.log", tmp_path)

    def startup():
        obj = get_json(kubectl, "-n", namespace, "vllmservice", "hub-weights") or {}
        startup = (obj.get("status") or {}).get("startup") or {}
        return startup if (startup.get("expected") or {}).get("totalSeconds") else None

    status = wait_for(startup, what="a prediction")
    assert status["model"]["checkpointBytes"] == round(14.96 * (1 << 30))
    assert status["model"]["checkpointBytesSource"] == "seedLog"
    assert status["model"]["layers"] == 32  # the rest of the facts line is kept as printed

    # Predicted from the log's bytes: weight loading costs more than the loader's intercept alone.
    expected = status["expected"]
    coefficients = coefficients_of(kubectl, namespace, HardwareClass.from_key(expected["hardware"]))
    assert coefficients is not None
    settings = service_settings(VLLMService.model_validate(svc), expected["cacheState"])
    facts = ModelFacts.model_validate(status["model"])
    intercept_alone = predict(facts.model_copy(update={"checkpoint_bytes": 0}), settings, coefficients)
    from_the_log = predict(facts, settings, coefficients)
    assert expected["phases"]["weightLoad"] == pytest.approx(from_the_log.phases["weightLoad"], abs=0.01)
    assert expected["phases"]["weightLoad"] > intercept_alone.phases["weightLoad"] + 0.5
