"""What the operator does with predictions, as pure functions: the hardware class of a start, the
`status.startup.expected` document, the SlowStart decision, and the fleet's observed starts as they are
kept in the coefficients ConfigMap's data (one key per namespace and hardware class) with the
coefficients each namespace's predictions come from.

Tenants' pods print the logs the starts are parsed from, so every start is untrusted. What one namespace
observes bounds what it can do to another's predictions (docs/prediction.md):
- a namespace's coefficients are the shipped set refitted (robustly) with its own starts only;
- the other namespaces only scale them, by the median over namespaces (one vote each) of how much
  slower or faster than predicted their starts ran, clipped so that all of them together move a
  prediction by at most FLEET_INFLUENCE;
- a start far outside what its namespace's coefficients predict is not kept (`implausible`);
- every entry is bounded, and the ConfigMap as a whole: when full, the namespace holding the most bytes
  gives up its least recently written entry, so one namespace filling it evicts itself first.

The controller reads and writes the ConfigMap; everything it decides about its content is here.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stoker.phases import KUBERNETES_PHASES
from stoker.predict.model import (
    MAX_NAMESPACE_STARTS,
    CoefficientSet,
    HardwareClass,
    NamespaceStarts,
    Observation,
    Prediction,
)
from stoker.predict.predictor import fit, predict, scaled

# A start is slow when it overruns its prediction by more than both of these.
SLOW_START_FRACTION = 0.25
SLOW_START_SECONDS = 10.0

CPU_PRODUCT = "cpu"
UNKNOWN_PRODUCT = "unknown"

# All other namespaces together move a namespace's predictions by at most this factor (up or down).
FLEET_INFLUENCE = 1.10
# A namespace's vote on the others' predictions is the median of its newest starts: few enough that every
# prediction costs little however many namespaces there are, enough that one odd start is outvoted.
VOTE_STARTS = 3
# A start with a phase (or a total) this many times longer or shorter than predicted, and further off
# than IMPLAUSIBLE_SECONDS, is taken for a forged or broken log and not kept.
IMPLAUSIBLE_FACTOR = 20.0
IMPLAUSIBLE_SECONDS = 30.0
# One namespace's starts of one class at most, and all of stoker's entries together: the API server
# refuses a ConfigMap over 1 MiB, and the rest of it (metadata, anything else kept there) needs room.
ENTRY_BYTES = 32 * 1024
STORE_BYTES = 768 * 1024

_CONFIGMAP_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")
_STARTS_SUFFIX = ".starts.json"
# Earlier stoker versions kept one list and one refit per class, shared by all namespaces: dropped at the
# next write, since every namespace's starts counted in them without bound.
_SHARED_SUFFIXES = (".observations.json", ".coefficients.json")


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


def expected_status(
    prediction: Prediction,
    hardware: HardwareClass,
    cache_state: str,
    last_phases: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """`status.startup.expected`: the predicted phases and total, what they were predicted from, and the
    seconds until a new serving pod serves: the Kubernetes phases the last serving start took (`last_phases`:
    scheduling, image pull, container start, the readiness gap) around the predicted engine phases."""
    kubernetes_seconds = sum((last_phases or {}).get(phase, 0.0) for phase in KUBERNETES_PHASES)
    return {
        "phases": {phase: round(seconds, 2) for phase, seconds in prediction.phases.items()},
        "totalSeconds": round(prediction.total_seconds, 2),
        "untilServingSeconds": round(prediction.total_seconds + kubernetes_seconds, 2),
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


def starts_key(hardware: HardwareClass, namespace: str) -> str:
    """`<class>.<namespace>.starts.json`: a namespace is a DNS label, so the last dots separate."""
    return f"{_class_prefix(hardware)}{_CONFIGMAP_KEY_UNSAFE.sub('_', namespace)}{_STARTS_SUFFIX}"


def _class_prefix(hardware: HardwareClass) -> str:
    return f"{_CONFIGMAP_KEY_UNSAFE.sub('_', hardware.key)}."


def read_class(data: Mapping[str, str], hardware: HardwareClass) -> dict[str, NamespaceStarts]:
    """Each namespace's starts on `hardware`; an entry that does not parse counts as none (it is
    replaced at its namespace's next write, or evicted first when the ConfigMap is full)."""
    found: dict[str, NamespaceStarts] = {}
    prefix = _class_prefix(hardware)
    for key, text in data.items():
        if not key.startswith(prefix) or not key.endswith(_STARTS_SUFFIX):
            continue
        namespace = key[len(prefix) : -len(_STARTS_SUFFIX)]
        if "." in namespace:  # another class whose key extends this one's
            continue
        try:
            found[namespace] = NamespaceStarts.model_validate_json(text)
        except ValidationError:
            continue
    return found


def own_coefficients(
    own: NamespaceStarts | None, hardware: HardwareClass, prior: CoefficientSet | None
) -> CoefficientSet | None:
    """`prior` refitted with a namespace's `own` starts (robustly: one odd start pulls it a bounded
    amount), `prior` without any, None without either. Nothing another namespace wrote is in it."""
    if own is None or not own.observations:
        return prior
    return fit(own.observations, prior, hardware=hardware.key, source="fleet", robust=True)


def fleet_correction(base: CoefficientSet, others: Iterable[NamespaceStarts]) -> float:
    """How much slower (> 1) or faster than `base` predicts the other namespaces' starts ran: per
    namespace the median ratio of its newest VOTE_STARTS starts, then the median over namespaces (so one
    namespace is one vote however many starts it has), clipped to [1/sqrt(FLEET_INFLUENCE),
    sqrt(FLEET_INFLUENCE)]: any change of theirs moves a prediction by at most FLEET_INFLUENCE."""
    votes = []
    for entry in others:
        newest = entry.observations[-VOTE_STARTS:]
        ratios = [ratio for start in newest if (ratio := _ratio(start, base)) is not None]
        if ratios:
            votes.append(statistics.median(ratios))
    if not votes:
        return 1.0
    bound = math.sqrt(FLEET_INFLUENCE)
    return min(max(statistics.median(votes), 1.0 / bound), bound)


def _ratio(start: Observation, base: CoefficientSet) -> float | None:
    """Observed over predicted seconds of the phases both have, None when too little is predicted."""
    try:
        expected = predict(start.facts, start.settings, base).phases
    except ValueError:
        return None
    shared = set(expected) & set(start.phases)
    predicted = sum(expected[phase] for phase in shared)
    if predicted < 1.0:
        return None
    return sum(start.phases[phase] for phase in shared) / predicted


def namespace_coefficients(
    starts: Mapping[str, NamespaceStarts],
    hardware: HardwareClass,
    namespace: str,
    prior: CoefficientSet | None,
) -> CoefficientSet | None:
    """The coefficients `namespace`'s starts on `hardware` are predicted with, from each namespace's
    `starts` of the class (`read_class`): its own (`own_coefficients`) scaled by the other namespaces'
    `fleet_correction`."""
    base = own_coefficients(starts.get(namespace), hardware, prior)
    if base is None:
        return None
    others = [entry for name, entry in sorted(starts.items()) if name != namespace]
    correction = fleet_correction(base, others)
    if correction == 1.0:
        return base
    return scaled(base, correction).model_copy(
        update={
            "source": "fleet",
            "fitted_on": [*base.fitted_on, f"x{correction:.3f} by {len(others)} other namespaces' starts"],
        }
    )


def implausible(start: Observation, base: CoefficientSet | None) -> str | None:
    """Why `start` is too far from what `base` (its namespace's own coefficients) predicts to be kept,
    or None. Without coefficients nothing is predicted, and only the physical ranges apply."""
    if base is None:
        return None
    try:
        expected = predict(start.facts, start.settings, base).phases
    except ValueError:
        return None
    shared = sorted(set(expected) & set(start.phases))
    checked = [(phase, start.phases[phase], expected[phase]) for phase in shared]
    checked.append(("total", sum(start.phases[p] for p in shared), sum(expected[p] for p in shared)))
    for phase, seen, predicted in checked:
        off = seen > IMPLAUSIBLE_FACTOR * predicted or seen * IMPLAUSIBLE_FACTOR < predicted
        if off and abs(seen - predicted) > IMPLAUSIBLE_SECONDS:
            return (
                f"{phase} took {seen:.1f} s where {predicted:.1f} s was expected, more than"
                f" {IMPLAUSIBLE_FACTOR:g} times off: taken for a forged or broken log"
            )
    return None


@dataclass(frozen=True)
class FleetWrite:
    """What to merge into the ConfigMap's data for one start (None deletes a key), the garbled key it
    replaces, and why nothing is written when the start is refused."""

    changes: dict[str, str | None] = field(default_factory=dict)
    garbled: list[str] = field(default_factory=list)
    refused: str | None = None


def with_observation(
    data: Mapping[str, str],
    hardware: HardwareClass,
    namespace: str,
    start: Observation,
    prior: CoefficientSet | None,
    limit: int,
    now: float,
) -> FleetWrite:
    """The entries to write after `namespace` observed `start` on `hardware`: its newest `limit` starts
    (and at most ENTRY_BYTES of them), the shared keys of earlier versions dropped, and other entries
    evicted while stoker's entries exceed STORE_BYTES. A start already kept under its label (a reconcile
    that ran again after its status write failed) is not added again. An implausible start is refused."""
    key = starts_key(hardware, namespace)
    garbled: list[str] = []
    own = NamespaceStarts(updated_at=now, observations=[])
    if key in data:
        try:
            own = NamespaceStarts.model_validate_json(data[key])
        except ValidationError:
            garbled.append(key)
    if any(seen.label == start.label for seen in own.observations) and not garbled:
        return FleetWrite()
    why = implausible(start, own_coefficients(own, hardware, prior))
    if why is not None:
        return FleetWrite(garbled=garbled, refused=why)
    kept = [seen for seen in own.observations if seen.label != start.label]
    kept = [*kept, start][-min(limit, MAX_NAMESPACE_STARTS) :]
    entry = _entry(kept, now)
    while len(entry) > ENTRY_BYTES and len(kept) > 1:
        kept = kept[1:]
        entry = _entry(kept, now)
    changes: dict[str, str | None] = {name: None for name in data if name.endswith(_SHARED_SUFFIXES)}
    changes[key] = entry
    for evicted in _evictions({**data, **changes}, key):
        changes[evicted] = None
    if _size({**data, **changes}) > STORE_BYTES:
        return FleetWrite(garbled=garbled, refused="no room for it: the ConfigMap holds too much else")
    return FleetWrite(changes=changes, garbled=garbled)


def _entry(observations: list[Observation], now: float) -> str:
    return NamespaceStarts(updated_at=now, observations=observations).model_dump_json(by_alias=True)


def _size(data: Mapping[str, str | None]) -> int:
    return sum(len(key) + len(text.encode()) for key, text in data.items() if text is not None)


def _updated_at(entry: str) -> float:
    """An entry's `updatedAt`, -1 for one that does not say (garbled: the first to go). Read without
    validating the starts: every entry is read at each write to a full ConfigMap."""
    try:
        updated_at = json.loads(entry).get("updatedAt")
    except (ValueError, AttributeError):
        return -1.0
    return float(updated_at) if isinstance(updated_at, int | float) else -1.0


def _evictions(data: Mapping[str, str | None], keep: str) -> list[str]:
    """The entries to drop, first to last, until stoker's entries fit STORE_BYTES: each time the least
    recently written entry (a garbled one first) of the namespace holding the most bytes, never `keep`."""
    total, evicted = _size(data), list[str]()
    if total <= STORE_BYTES:
        return evicted
    entries: dict[str, tuple[str, float, int]] = {}  # key -> namespace, updated at, bytes
    for key, text in data.items():
        if text is None or not key.endswith(_STARTS_SUFFIX):
            continue
        namespace = key[: -len(_STARTS_SUFFIX)].rpartition(".")[2]
        entries[key] = (namespace, _updated_at(text), len(key) + len(text.encode()))
    while total > STORE_BYTES:
        held: dict[str, int] = {}
        for namespace, _, size in entries.values():
            held[namespace] = held.get(namespace, 0) + size
        candidates = [name for name in entries if name != keep]
        if not candidates:
            break
        victim = max(candidates, key=lambda name: (held[entries[name][0]], -entries[name][1], name))
        total -= entries.pop(victim)[2]
        evicted.append(victim)
    return evicted
