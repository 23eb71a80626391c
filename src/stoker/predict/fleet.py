"""What the operator does with predictions, as pure functions: the hardware class of a start, the
`status.startup.expected` document, the SlowStart decision, and the fleet's observations and refitted
coefficients as they are kept in the coefficients ConfigMap's data (two keys per hardware class).

The controller reads and writes the ConfigMap; everything it decides about its content is here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from stoker.predict.model import CoefficientSet, HardwareClass, Observation, Prediction
from stoker.predict.predictor import fit

# A start is slow when it overruns its prediction by more than both of these.
SLOW_START_FRACTION = 0.25
SLOW_START_SECONDS = 10.0

CPU_PRODUCT = "cpu"
UNKNOWN_PRODUCT = "unknown"

_CONFIGMAP_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")
_OBSERVATIONS = TypeAdapter(list[Observation])


def on_node(service_class: HardwareClass, node_product: str | None) -> HardwareClass:
    """The class a service's start runs on: its GPU count and engine version (stoker.predict.service) with
    the GPU product of the node (`nvidia.com/gpu.product`), `cpu` for no GPU, `unknown` if the node does
    not say."""
    if service_class.gpu_count == 0:
        product = CPU_PRODUCT
    else:
        product = (node_product or UNKNOWN_PRODUCT).replace("_", "-")  # `_` separates a key's parts
    return HardwareClass(
        gpu_product=product, gpu_count=service_class.gpu_count, engine_version=service_class.engine_version
    )


def expected_status(prediction: Prediction, hardware: HardwareClass, cache_state: str) -> dict[str, Any]:
    """`status.startup.expected`: the predicted phases and total, and what they were predicted from."""
    return {
        "phases": {phase: round(seconds, 2) for phase, seconds in prediction.phases.items()},
        "totalSeconds": round(prediction.total_seconds, 2),
        "cacheState": cache_state,
        "hardware": hardware.key,
        "coefficients": prediction.coefficient_set,
        "source": prediction.source,
    }


@dataclass(frozen=True)
class SlowStart:
    """A start that overran its prediction, and the phase that overran most."""

    phase: str
    overrun_seconds: float
    observed_total: float
    expected_total: float

    def message(self, pod: str) -> str:
        return (
            f"Started in {self.observed_total:.1f} s, expected {self.expected_total:.1f} s;"
            f" {self.phase} overran most (+{self.overrun_seconds:.1f} s); pod {pod}"
        )


def slow_start(
    observed: Mapping[str, float],
    observed_total: float,
    expected: Mapping[str, float],
    expected_total: float,
) -> SlowStart | None:
    """A SlowStart when the total exceeds the expected one by more than max(25 %, 10 s)."""
    allowed = max(SLOW_START_FRACTION * expected_total, SLOW_START_SECONDS)
    if observed_total - expected_total <= allowed:
        return None
    # A phase the prediction did not have (compile on an expected hit) overran by all of it.
    overruns = {
        phase: observed.get(phase, 0.0) - expected.get(phase, 0.0) for phase in {*observed, *expected}
    }
    phase = max(sorted(overruns), key=lambda name: overruns[name])
    return SlowStart(phase, overruns[phase], observed_total, expected_total)


# ------------------------------------------------------------------ the coefficients ConfigMap's data


def observations_key(hardware: HardwareClass) -> str:
    return f"{_CONFIGMAP_KEY_UNSAFE.sub('_', hardware.key)}.observations.json"


def coefficients_key(hardware: HardwareClass) -> str:
    return f"{_CONFIGMAP_KEY_UNSAFE.sub('_', hardware.key)}.coefficients.json"


@dataclass
class FleetRecord:
    """One hardware class's entries: observed starts (oldest first, each labelled with its start), the
    refitted coefficients, and the keys that did not parse (each is replaced at the next write; the other
    keys are left as they are)."""

    observations: list[Observation] = field(default_factory=list)
    coefficients: CoefficientSet | None = None
    garbled: list[str] = field(default_factory=list)


def read_fleet(data: Mapping[str, str], hardware: HardwareClass) -> FleetRecord:
    record = FleetRecord()
    observations_text = data.get(observations_key(hardware))
    if observations_text is not None:
        try:
            record.observations = _OBSERVATIONS.validate_json(observations_text)
        except ValidationError:
            record.garbled.append(observations_key(hardware))
    coefficients_text = data.get(coefficients_key(hardware))
    if coefficients_text is not None:
        try:
            record.coefficients = CoefficientSet.model_validate_json(coefficients_text)
        except ValidationError:
            record.garbled.append(coefficients_key(hardware))
    return record


def with_observation(
    data: Mapping[str, str],
    hardware: HardwareClass,
    observation: Observation,
    prior: CoefficientSet | None,
    limit: int,
) -> tuple[dict[str, str], list[str]]:
    """The ConfigMap entries to write after one more observed start (the newest `limit` kept, the
    coefficients refitted from them toward `prior`), and the garbled keys they replace. A start already
    recorded under its label (a reconcile that ran again after its status write failed) is not added again:
    nothing to write unless a key needs replacing."""
    record = read_fleet(data, hardware)
    known = any(seen.label == observation.label for seen in record.observations)
    if known and not record.garbled:
        return {}, []
    kept = (record.observations if known else [*record.observations, observation])[-limit:]
    coefficients = fit(kept, prior, hardware=hardware.key, source="fleet")
    changes = {
        observations_key(hardware): _OBSERVATIONS.dump_json(kept, by_alias=True).decode(),
        coefficients_key(hardware): coefficients.model_dump_json(by_alias=True),
    }
    return changes, record.garbled
