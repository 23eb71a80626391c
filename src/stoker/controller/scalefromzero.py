"""Scale from zero on requests waiting in the Gateway API Inference Extension's endpoint picker (EPP).

With flow control on, a request the EPP has no pod for waits in its queue, and the EPP's gauge
`inference_extension_flow_control_queue_size{inference_pool=NAME}` counts it (docs/gateway.md). For each
VLLMService with `spec.inferencePool.scaleFromZero` and `spec.runtime.replicas: 0`, one loop (a thread of
its own, never a reconcile worker, never kopf's event loop) reads that gauge every period from the ready
addresses of the EPP Service's EndpointSlices and, when a request waits, scales the VLLMService to 1
through its scale subresource, as an autoscaler would (with the Scale's resourceVersion: a change made
since the read wins). It never scales down: that stays the user's or an autoscaler's.

What an EPP answers is untrusted: the read is bounded in size and time, goes to the address itself (no
proxy, no redirect), and only finite, non-negative samples of the one gauge for this pool count.
"""

from __future__ import annotations

import http.client
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from stoker.api import VLLMService

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

QUEUE_GAUGE = "inference_extension_flow_control_queue_size"
POOL_LABEL = "inference_pool"
MAX_METRICS_BYTES = 4 * 1024 * 1024  # an EPP's /metrics is tens of KiB; more is refused, not parsed
METRICS_TIMEOUT_SECONDS = 2.0  # the whole read of one address, connect to last byte
CHUNK = 64 * 1024
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class MetricsRefused(Exception):
    """An EPP's /metrics could not be read or was not acceptable (status, size, time, text)."""


def queued_requests(text: str, pool: str) -> int:
    """Requests waiting in the EPP's queue for InferencePool `pool`: the sum of the queue gauge's samples
    labelled with it (one per fairness id, priority and model). Raises MetricsRefused on text the parser
    refuses; ignores other families, other pools, and samples that are not finite and non-negative."""
    total = 0.0
    try:
        for family in text_string_to_metric_families(text):
            if family.name != QUEUE_GAUGE:
                continue
            for sample in family.samples:
                if sample.name != QUEUE_GAUGE or sample.labels.get(POOL_LABEL) != pool:
                    continue
                value = float(sample.value)
                if math.isfinite(value) and value > 0:
                    total += value
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise MetricsRefused(f"unparsable metrics: {str(error)[:200]}") from error
    return int(min(total, 1e9))


def ready_addresses(slices: Iterable[Manifest]) -> list[str]:
    """The addresses of the endpoints that are ready (a missing `ready` counts as ready, as the API says),
    in a stable order, each once."""
    found: list[str] = []
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
            continue  # FQDN: not an address of a pod
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                if isinstance(address, str) and address not in found:
                    found.append(address)
    return found


def read_metrics(
    address: str, port: int, *, timeout: float = METRICS_TIMEOUT_SECONDS, limit: int = MAX_METRICS_BYTES
) -> str:
    """GET http://address:port/metrics, directly (no proxy, no redirect), within `timeout` seconds and
    `limit` bytes in all."""
    deadline = time.monotonic() + timeout
    connection = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        connection.request("GET", "/metrics", headers={"Accept": "text/plain"})
        response = connection.getresponse()
        if response.status != 200:
            raise MetricsRefused(f"HTTP {response.status}")
        body = bytearray()
        while chunk := response.read(CHUNK):
            body += chunk
            if len(body) > limit:
                raise MetricsRefused(f"more than {limit} bytes")
            if time.monotonic() > deadline:
                raise MetricsRefused(f"slower than {timeout:g} s")
        return body.decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException) as error:
        raise MetricsRefused(f"{type(error).__name__}: {str(error)[:200]}") from error
    finally:
        connection.close()


@dataclass(frozen=True)
class Candidate:
    """A VLLMService at zero replicas whose pool's queue is to be read."""

    namespace: str
    name: str
    pool: str
    picker: str  # the EPP's Service
    metrics_port: int


def candidate(body: Manifest) -> Candidate | None:
    """The VLLMService as a candidate, if it sets scaleFromZero and runs zero replicas (and is valid)."""
    spec = body.get("spec") or {}
    pool_spec = spec.get("inferencePool") or {}
    if not isinstance(pool_spec, dict) or pool_spec.get("scaleFromZero") is None:
        return None
    if body["metadata"].get("deletionTimestamp"):
        return None
    try:
        svc = VLLMService.model_validate(body)
    except ValueError:
        return None  # the reconcile reports it
    pool = svc.spec.inference_pool
    if pool is None or pool.scale_from_zero is None or svc.spec.runtime.replicas != 0:
        return None
    return Candidate(
        str(svc.namespace), svc.name, svc.name, pool.endpoint_picker.name, pool.scale_from_zero.metrics_port
    )


class ScaleFromZero:
    """The loop. `services` lists the VLLMServices (the watch cache's) that set scaleFromZero; `kube` is
    the operator's Kube (its writes are fenced by the leader's term)."""

    def __init__(
        self,
        kube: Any,
        services: Callable[[], list[Manifest]],
        period: float,
        read: Callable[[str, int], str] = read_metrics,
    ) -> None:
        self.kube = kube
        self.services = services
        self.period = period
        self.read = read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refusals: dict[tuple[str, str], str] = {}  # logged once per EPP while it stays the same

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scale-from-zero", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.once()
            except Exception:
                log.exception("Scale-from-zero pass failed")

    def once(self) -> list[tuple[Candidate, int]]:
        """One pass: every candidate's queue read (each EPP once), and the scales made."""
        candidates = [c for c in map(candidate, self.services()) if c is not None]
        texts: dict[tuple[str, str, int], list[str]] = {}
        scaled: list[tuple[Candidate, int]] = []
        for cand in candidates:
            picker = (cand.namespace, cand.picker, cand.metrics_port)
            if picker not in texts:
                texts[picker] = self._metrics_of(*picker)
            queued = 0
            for text in texts[picker]:
                try:
                    queued += queued_requests(text, cand.pool)
                except MetricsRefused as refused:
                    self._refused(cand.namespace, cand.picker, str(refused))
            if queued > 0 and self._scale(cand, queued):
                scaled.append((cand, queued))
        return scaled

    def _metrics_of(self, namespace: str, picker: str, port: int) -> list[str]:
        """The /metrics text of every ready address of the EPP Service (several EPP replicas: each holds
        its own queue)."""
        try:
            slices = self.kube.endpoint_slices(namespace, f"{SERVICE_NAME_LABEL}={picker}")
        except ApiException as error:
            self._refused(namespace, picker, f"EndpointSlices not listed (HTTP {error.status})")
            return []
        texts = []
        for address in ready_addresses(slices):
            try:
                texts.append(self.read(address, port))
            except MetricsRefused as refused:
                self._refused(namespace, picker, f"{address}:{port}: {refused}")
        return texts

    def _refused(self, namespace: str, picker: str, why: str) -> None:
        if self._refusals.get((namespace, picker)) != why:
            self._refusals[(namespace, picker)] = why
            log.warning("Endpoint picker metrics not read service=%s/%s: %s", namespace, picker, why)

    def _scale(self, cand: Candidate, queued: int) -> bool:
        """Replicas 0 -> 1 through the scale subresource, only if still 0; an Event on the VLLMService."""
        try:
            body = self.kube.scale_service_from_zero(cand.namespace, cand.name)
        except ApiException as error:
            if error.status in (404, 409):
                return False  # deleted, or scaled since: nothing to do
            raise
        if body is None:
            return False
        noun = "request" if queued == 1 else "requests"
        message = (
            f"{queued} {noun} waited in endpoint picker {cand.picker} for InferencePool {cand.pool};"
            " scaled from 0 to 1 replica"
        )
        log.info("Scaled from zero vllmservice=%s/%s queued=%d", cand.namespace, cand.name, queued)
        self.kube.post_event(body, "ScaledFromZero", message)
        return True


class Watched:
    """The keys of the VLLMServices that set scaleFromZero, from kopf's watch (cheap to test each event),
    so that a pass reads only those from the watch cache."""

    def __init__(self, get: Callable[[str, str], Manifest | None]) -> None:
        self.get = get
        self._keys: set[tuple[str, str]] = set()
        self._guard = threading.Lock()

    def observe(self, body: Manifest, deleted: bool) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        pool = (body.get("spec") or {}).get("inferencePool")
        with self._guard:
            if not deleted and isinstance(pool, dict) and pool.get("scaleFromZero") is not None:
                self._keys.add(key)
            else:
                self._keys.discard(key)

    def services(self) -> list[Manifest]:
        with self._guard:
            keys = sorted(self._keys)
        return [body for body in (self.get(*key) for key in keys) if body is not None]


def register(watched: Watched) -> None:
    import kopf

    from stoker.api import GROUP, PLURAL, VERSION

    @kopf.on.event(GROUP, VERSION, PLURAL, id="scale-from-zero")
    async def noted(type: str | None, body: kopf.Body, **_: Any) -> None:
        watched.observe(dict(body), deleted=type == "DELETED")
