"""The startup coefficients ConfigMap: the fleet's observed starts and the coefficients refitted from them,
per hardware class, in the operator's namespace. What goes into it is decided in stoker.predict.fleet.

Only the leader reconciles, so one process writes; still every write carries the resourceVersion it was
computed from (a merge patch of the class's two keys only) and is recomputed on a 409, a bounded number of
times. Reads for predictions come from a copy refreshed every REFRESH_SECONDS, not from every reconcile.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from stoker.controller.kube import Kube, Manifest
from stoker.predict.fleet import read_fleet, with_observation
from stoker.predict.model import CoefficientSet, HardwareClass, Observation
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
    def __init__(self, kube: Kube, namespace: str, name: str, observations_per_class: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.limit = observations_per_class
        self._guard = threading.Lock()
        self._data: dict[str, str] = {}
        self._read_at: float | None = None

    def coefficients(self, namespace: str, hardware: HardwareClass) -> CoefficientSet | None:
        """For a start in `namespace`: the fleet's refitted set for `hardware`, else the shipped one
        nearest to it, else None."""
        with self._guard:
            if self._read_at is None or time.monotonic() - self._read_at > REFRESH_SECONDS:
                self._read_at = time.monotonic()  # a failed read is not repeated before the next refresh
                try:
                    self._data = dict(self._read().get("data") or {})
                except ApiException as error:
                    log.warning("Reading startup coefficients failed%s: %s", self._where(), error.status)
            fleet = read_fleet(self._data, hardware)
        return fleet.coefficients or shipped(hardware)

    def record(self, namespace: str, hardware: HardwareClass, observation: Observation) -> RecordOutcome:
        """Add one observed start of `namespace` and refit `hardware`'s coefficients from the shipped set
        as prior."""
        prior = shipped(hardware)
        with self._guard:
            for attempt in range(CONFLICT_RETRIES):
                try:
                    configmap = self._read()
                    data = dict(configmap.get("data") or {})
                    changes, garbled = with_observation(data, hardware, observation, prior, self.limit)
                    if not changes:
                        return RecordOutcome()
                    patch = {
                        "metadata": {"resourceVersion": configmap["metadata"]["resourceVersion"]},
                        "data": changes,
                    }
                    written = self.kube.patch_merge("v1", "ConfigMap", self.namespace, self.name, patch)
                except ApiException as error:
                    if error.status != 409:
                        # The start stays in status; only the fleet's fit misses it.
                        log.warning("Recording a start failed%s: %s", self._where(), error.status)
                        return RecordOutcome(refused=f"{self._what()} refused the write ({error.status})")
                    time.sleep(CONFLICT_BACKOFF_SECONDS * (attempt + 1))
                    continue
                self._data, self._read_at = dict(written.get("data") or {}), time.monotonic()
                return RecordOutcome(garbled=garbled)
        log.warning("Recording a start gave up after %d conflicts%s", CONFLICT_RETRIES, self._where())
        return RecordOutcome(refused=f"{self._what()} kept changing: gave up after {CONFLICT_RETRIES} tries")

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
