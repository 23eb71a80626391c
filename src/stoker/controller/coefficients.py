"""The startup coefficients ConfigMap: the fleet's observed starts, per hardware class and namespace, in
the operator's namespace. What goes into it, and how a namespace's coefficients follow from it, is decided
in stoker.predict.fleet.

One ConfigMap for all namespaces, not one per namespace: the operator's Role then names the one object it
may read and write, and no tenant gets to create objects in the operator's namespace through it. Its
entries are bounded (stoker.predict.fleet) so that it stays under the API server's 1 MiB, and each write
merges only the writing namespace's entry (and the evictions), so a namespace whose start is refused
blocks no other namespace's writes.

Only the leader reconciles, so one process writes; still every write carries the resourceVersion it was
computed from and is recomputed on a 409, a bounded number of times. Reads for predictions come from a copy
refreshed every REFRESH_SECONDS, not from every reconcile.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from stoker.controller.kube import Kube, Manifest
from stoker.predict.fleet import namespace_coefficients, read_class, with_observation
from stoker.predict.model import CoefficientSet, HardwareClass, NamespaceStarts, Observation
from stoker.predict.shipped import NoShippedCoefficients, shipped_coefficients

log = logging.getLogger(__name__)

REFRESH_SECONDS = 30.0
CONFLICT_RETRIES = 5
CONFLICT_BACKOFF_SECONDS = 0.2


@dataclass(frozen=True)
class RecordOutcome:
    """What became of one observed start: the keys that did not parse and were replaced, and, when the
    start was not recorded (implausible, or the write was refused or failed), why, in words for its
    VLLMService's status."""

    garbled: list[str] = field(default_factory=list)
    refused: str | None = None


class CoefficientStore:
    def __init__(self, kube: Kube, namespace: str, name: str, starts_per_namespace: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.limit = starts_per_namespace
        self._guard = threading.Lock()
        self._data: dict[str, str] = {}
        self._read_at: float | None = None
        # From the data as read: each class's entries, parsed, and each (namespace, class)'s refit.
        self._classes: dict[str, dict[str, NamespaceStarts]] = {}
        self._fitted: dict[tuple[str, str], CoefficientSet | None] = {}

    def coefficients(self, namespace: str, hardware: HardwareClass) -> CoefficientSet | None:
        """What a start in `namespace` on `hardware` is predicted with: the shipped set nearest to it
        refitted with the namespace's own starts and scaled by the other namespaces' (within
        stoker.predict.fleet.FLEET_INFLUENCE); None with neither a shipped set nor starts of its own."""
        with self._guard:
            if self._read_at is None or time.monotonic() - self._read_at > REFRESH_SECONDS:
                self._read_at = time.monotonic()  # a failed read is not repeated before the next refresh
                try:
                    self._keep(self._read())
                except ApiException as error:
                    log.warning("Reading startup coefficients failed%s: %s", self._where(), error.status)
            fitted = (namespace, hardware.key)
            if fitted not in self._fitted:
                if hardware.key not in self._classes:
                    self._classes[hardware.key] = read_class(self._data, hardware)
                starts = self._classes[hardware.key]
                self._fitted[fitted] = namespace_coefficients(starts, hardware, namespace, shipped(hardware))
            return self._fitted[fitted]

    def record(self, namespace: str, hardware: HardwareClass, observation: Observation) -> RecordOutcome:
        """Keep one observed start of `namespace` on `hardware`, unless it is implausible for the
        namespace's own coefficients or the write fails; `refused` then says why, in words for the
        VLLMService it concerns."""
        prior = shipped(hardware)
        with self._guard:
            for attempt in range(CONFLICT_RETRIES):
                try:
                    configmap = self._read()
                    data = dict(configmap.get("data") or {})
                    write = with_observation(
                        data, hardware, namespace, observation, prior, self.limit, time.time()
                    )
                    if write.refused is not None:
                        return RecordOutcome(write.garbled, _not_learned(observation, write.refused))
                    if not write.changes:
                        return RecordOutcome(garbled=write.garbled)
                    patch = {
                        "metadata": {"resourceVersion": configmap["metadata"]["resourceVersion"]},
                        "data": write.changes,
                    }
                    written = self.kube.patch_merge("v1", "ConfigMap", self.namespace, self.name, patch)
                except ApiException as error:
                    if error.status != 409:
                        # The start stays in status; only the fleet's fit misses it.
                        log.warning("Recording a start failed%s: %s", self._where(), error.status)
                        refused = f"{self._what()} refused the write ({error.status})"
                        return RecordOutcome(refused=_not_learned(observation, refused))
                    time.sleep(CONFLICT_BACKOFF_SECONDS * (attempt + 1))
                    continue
                self._keep(written)
                return RecordOutcome(garbled=write.garbled)
        log.warning("Recording a start gave up after %d conflicts%s", CONFLICT_RETRIES, self._where())
        refused = f"{self._what()} kept changing: gave up after {CONFLICT_RETRIES} tries"
        return RecordOutcome(refused=_not_learned(observation, refused))

    def _keep(self, configmap: Manifest) -> None:
        self._data, self._read_at = dict(configmap.get("data") or {}), time.monotonic()
        self._classes.clear()
        self._fitted.clear()

    def _what(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def _where(self) -> str:
        return f" configmap={self.namespace}/{self.name}"

    def _read(self) -> Manifest:
        """The ConfigMap, created empty if absent (the chart creates it; `stoker run` alone does not)."""
        found = self.kube.get("v1", "ConfigMap", self.namespace, self.name)
        if found is not None:
            return found
        empty = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace},
        }
        try:
            return self.kube.create(empty)
        except ApiException as error:
            if error.status != 409:
                raise
        # Created meanwhile (a helm install): read what is there.
        return self.kube.get("v1", "ConfigMap", self.namespace, self.name) or self.kube.create(empty)


def _not_learned(observation: Observation, why: str) -> str:
    return f"Start {observation.label} not learned from: {why}"


def shipped(hardware: HardwareClass) -> CoefficientSet | None:
    """The shipped defaults nearest to `hardware`, or None (with a log line) when none is shipped or the
    shipped file does not parse: predictions then come from the fleet alone, reconciles go on."""
    try:
        return shipped_coefficients(hardware)
    except NoShippedCoefficients as error:
        log.info("No shipped startup coefficients hardware=%s: %s", hardware.key, error)
    except ValueError as error:  # pydantic's ValidationError is one
        log.warning("Shipped startup coefficients unreadable hardware=%s: %s", hardware.key, error)
    return None
