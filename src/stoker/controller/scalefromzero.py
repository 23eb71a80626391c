"""Scale from zero on requests waiting in the Gateway API Inference Extension's endpoint picker (EPP).

With flow control on, a request the EPP has no pod for waits in its queue, and the EPP's gauge
`inference_extension_flow_control_queue_size{inference_pool=NAME}` counts it (docs/gateway.md). For each
VLLMService with `spec.inferencePool.scaleFromZero` and `spec.runtime.replicas: 0`, one loop (a thread of
its own, never a reconcile worker, never kopf's event loop) reads that gauge every period from the ready
addresses of the EPP Service's EndpointSlices and, when a request waits, scales the VLLMService to 1
through its scale subresource, as an autoscaler would (with the Scale's resourceVersion: a change made
since the read wins). It never scales down: that stays the user's or an autoscaler's.

What an EPP answers is untrusted, and one tenant's EPP must not delay another's scale (docs/security.md):
- each EPP is read in a task of its own on a bounded pool of reader threads (a few per namespace at a
  time), and the loop never waits for one: a victim's EPP is read every period whatever other EPPs do;
- one deadline covers the whole read of an EPP (connect, request, headers, body, every address), checked
  on every receive, and the bytes read are bounded: a peer that trickles is cut at the deadline;
- only the lines of the one gauge for this pool are parsed, at most MAX_QUEUE_SAMPLES of them;
- an EPP that could not be read is skipped for a while (doubling, up to MAX_BACKOFF_SECONDS), and that is
  reported on the VLLMServices that name it (condition ScaleFromZero, a Warning Event), never elsewhere;
- the EPP must be what its author could address anyway: a Service of the namespace that is not stoker's,
  whose addresses are pods of that namespace (their own IPs), not stoker's pods.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from stoker.api import GROUP, VLLMService
from stoker.controller.conditions import (
    SCALE_FROM_ZERO,
    Condition,
    merge_conditions,
    now_rfc3339,
    scale_from_zero_condition,
)
from stoker.render.names import MANAGED_BY_LABEL

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

QUEUE_GAUGE = "inference_extension_flow_control_queue_size"
POOL_LABEL = "inference_pool"
PICKER_FIELD = "spec.inferencePool.endpointPicker.name"
# An EPP's /metrics is tens of KiB; what is over the bound is refused, not parsed.
MAX_METRICS_BYTES = 1024 * 1024  # one EPP's read, all its addresses together
MAX_QUEUE_SAMPLES = 256  # the gauge's samples in one answer: one per flow (fairness id, priority, model)
MAX_ADDRESSES = 8  # EPP replicas read; each holds its own queue
METRICS_TIMEOUT_SECONDS = 2.0  # the whole read of one EPP, connect to last byte of its last address
READERS = 32  # EPPs read at once
READS_PER_NAMESPACE = 4  # of them, one namespace's: the others always have readers left
BACKOFF_SECONDS = 5.0  # an EPP that could not be read is skipped this long, doubling on each failure
MAX_BACKOFF_SECONDS = 60.0  # an EPP that starts late, or restarts, is read again within a minute
CHECKED_SECONDS = 10.0  # a picker Service, or a pod's address, found acceptable is not asked again so soon
CHUNK = 64 * 1024
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# A sample line of the gauge: labels, value, optional timestamp (Prometheus text format 0.0.4).
_SAMPLE = re.compile(
    r'\{((?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*,?)*)\s*\}\s*(\S+)(?:\s+-?\d+)?\s*'
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsRefused(Exception):
    """An EPP's /metrics could not be read or was not acceptable (status, size, time, text)."""


def queued_by_pool(text: bytes) -> dict[str, int]:
    """Requests waiting in the EPP's queue, by InferencePool: the sums of the queue gauge's samples labelled
    with each pool (one sample per fairness id, priority and model). Only lines that start with the gauge's
    name are looked at (found with bytes.find, not split: a flood of other lines costs no parsing); more
    than MAX_QUEUE_SAMPLES of them, or a labelled one that is not a sample line, is refused. Values that are
    not finite and positive count nothing."""
    needle = b"\n" + QUEUE_GAUGE.encode()
    padded = b"\n" + text
    totals: dict[str, float] = {}
    samples, start = 0, padded.find(needle)
    while start >= 0:
        end = padded.find(b"\n", start + 1)
        line = padded[start + len(needle) : end if end >= 0 else len(padded)]
        start = padded.find(needle, start + 1)
        samples += 1
        if samples > MAX_QUEUE_SAMPLES:
            raise MetricsRefused(f"more than {MAX_QUEUE_SAMPLES} lines start with {QUEUE_GAUGE}")
        if not line.startswith(b"{"):
            continue  # no labels, or another family whose name starts with the gauge's
        match = _SAMPLE.fullmatch(line.decode("utf-8", errors="replace"))
        if match is None:
            raise MetricsRefused(f"not a sample line of {QUEUE_GAUGE}: {line[:200]!r}")
        pool = dict(_LABEL.findall(match.group(1))).get(POOL_LABEL)
        try:
            value = float(match.group(2))
        except ValueError as error:
            raise MetricsRefused(f"not a number: {match.group(2)[:50]!r}") from error
        if pool is not None and math.isfinite(value) and value > 0:
            totals[pool] = totals.get(pool, 0.0) + value
    return {pool: int(min(total, 1e9)) for pool, total in totals.items()}


def ready_endpoints(slices: Iterable[Manifest]) -> list[tuple[str, Manifest | None]]:
    """The addresses of the endpoints that are ready (a missing `ready` counts as ready, as the API says),
    each with its endpoint's targetRef, in a stable order, each once."""
    found: dict[str, Manifest | None] = {}
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
            continue  # FQDN: not an address of a pod
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            target = endpoint.get("targetRef")
            for address in endpoint.get("addresses") or []:
                if isinstance(address, str) and address not in found:
                    found[address] = target if isinstance(target, dict) else None
    return list(found.items())


def ready_addresses(slices: Iterable[Manifest]) -> list[str]:
    return [address for address, _ in ready_endpoints(slices)]


def picker_service_refusal(service: Manifest | None, name: str) -> str | None:
    """Why the Service named as the endpoint picker may not be read, or None: missing, or stoker's own
    (owned by a VLLMService, or carrying stoker's managed-by label)."""
    if service is None:
        return f"{PICKER_FIELD}: Service {name} not found in this namespace"
    meta = service.get("metadata") or {}
    owners = [
        ref.get("name")
        for ref in meta.get("ownerReferences") or []
        if str(ref.get("apiVersion", "")).startswith(f"{GROUP}/")
    ]
    if owners or (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == "stoker":
        whose = f" (of VLLMService {owners[0]})" if owners else ""
        return f"{PICKER_FIELD}: Service {name} is stoker's own{whose}; name the endpoint picker's Service"
    return None


def address_refusal(
    address: str, target: Manifest | None, pod: Manifest | None, namespace: str
) -> str | None:
    """Why an EndpointSlice address may not be read, or None: it must be the own IP of a pod of this
    namespace (what the VLLMService's author could reach from a pod of their own) that is not stoker's."""
    if not target or target.get("kind") != "Pod" or target.get("namespace", namespace) != namespace:
        return f"{address}: not the address of a pod of this namespace (no Pod targetRef)"
    if pod is None:
        return f"{address}: pod {target.get('name')} not found"
    ips = {entry.get("ip") for entry in (pod.get("status") or {}).get("podIPs") or []}
    ips.add((pod.get("status") or {}).get("podIP"))
    if address not in ips:
        return f"{address}: not an IP of pod {target.get('name')}"
    if ((pod.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == "stoker":
        return f"{address}: pod {target.get('name')} is stoker's own"
    return None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MetricsRefused("no whole answer within the deadline")
    return left


def read_metrics(address: str, port: int, deadline: float, limit: int) -> bytes:
    """GET http://address:port/metrics as HTTP/1.0 (no chunks: the answer ends when the peer closes),
    directly (no proxy, no redirect), done by `deadline` (time.monotonic) on every receive, connect and
    headers included, at most `limit` bytes with the headers. Returns the body of a 200."""
    host = f"[{address}]" if ":" in address else address
    request = f"GET /metrics HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n\r\n".encode()
    answer = bytearray()
    try:
        with socket.create_connection((address, port), timeout=_remaining(deadline)) as sock:
            sock.settimeout(_remaining(deadline))
            sock.sendall(request)
            while True:
                sock.settimeout(_remaining(deadline))
                chunk = sock.recv(min(CHUNK, limit + 1 - len(answer)))
                if not chunk:
                    break
                answer += chunk
                if len(answer) > limit:
                    raise MetricsRefused(f"more than {limit} bytes")
    except TimeoutError as error:
        raise MetricsRefused("no whole answer within the deadline") from error
    except OSError as error:
        raise MetricsRefused(f"{type(error).__name__}: {str(error)[:200]}") from error
    head, separator, body = bytes(answer).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if not separator or len(status) < 2 or not status[0].startswith(b"HTTP/1."):
        raise MetricsRefused("not an HTTP answer")
    if status[1] != b"200":
        raise MetricsRefused(f"HTTP {status[1][:3].decode(errors='replace')}")
    if b"\r\ntransfer-encoding:" in head.lower():
        raise MetricsRefused("a chunked answer to an HTTP/1.0 request")
    return body


@dataclass(frozen=True)
class Picker:
    """An EPP as a VLLMService names it: its Service in the VLLMService's namespace, and the metrics port."""

    namespace: str
    service: str
    metrics_port: int


@dataclass(frozen=True)
class Candidate:
    """A VLLMService at zero replicas whose pool's queue is to be read."""

    namespace: str
    name: str
    uid: str
    pool: str
    picker: Picker
    reported: Manifest | None = field(default=None, compare=False)  # its ScaleFromZero condition now


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
    namespace = str(svc.namespace)
    reported = next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == SCALE_FROM_ZERO),
        None,
    )
    return Candidate(
        namespace,
        svc.name,
        str(body["metadata"].get("uid", "")),
        svc.name,
        Picker(namespace, pool.endpoint_picker.name, pool.scale_from_zero.metrics_port),
        reported,
    )


Read = Callable[[str, int, float, int], bytes]


def says(reported: Manifest | None, condition: Condition) -> bool:
    """Whether a VLLMService's ScaleFromZero condition says what `condition` does."""
    before = reported or {}
    status = "True" if condition.status else "False"
    return (before.get("status"), before.get("reason"), before.get("message")) == (
        status,
        condition.reason,
        condition.message,
    )


class ScaleFromZero:
    """The loop. `services` lists the VLLMServices (the watch cache's) that set scaleFromZero; `kube` is
    the operator's Kube (its writes are fenced by the leader's term). Each pass starts a read of every EPP
    that is due (not being read, not backing off) on the reader pool and returns at once."""

    def __init__(
        self,
        kube: Any,
        services: Callable[[], list[Manifest]],
        period: float,
        read: Read = read_metrics,
        readers: int = READERS,
    ) -> None:
        self.kube = kube
        self.services = services
        self.period = period
        self.read = read
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="scale-from-zero-read")
        self._guard = threading.Lock()
        self._reading: set[Picker] = set()
        self._backoff: dict[Picker, tuple[int, float]] = {}  # failures in a row, monotonic time to retry
        self._reports: dict[Picker, Condition] = {}  # what the last read of each EPP said
        # (namespace, Service, "") or (namespace, pod, address) found acceptable, until (monotonic)
        self._checks: dict[tuple[str, str, str], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scale-from-zero", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._readers.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.once()
            except Exception:
                log.exception("Scale-from-zero pass failed")

    def once(self) -> list[Future[list[tuple[Candidate, int]]]]:
        """One pass: a read started for every EPP that is due, for the candidates that name it; each
        future gives the scales its read made."""
        by_picker: dict[Picker, list[Candidate]] = {}
        for cand in map(candidate, self.services()):
            if cand is not None:
                by_picker.setdefault(cand.picker, []).append(cand)
        now = time.monotonic()
        with self._guard:
            idle = [picker for picker in by_picker if picker not in self._reading]
            busy = Counter(picker.namespace for picker in self._reading)
            due = []
            for picker in idle:
                if (
                    self._backoff.get(picker, (0, 0.0))[1] <= now
                    and busy[picker.namespace] < READS_PER_NAMESPACE
                ):
                    busy[picker.namespace] += 1
                    due.append(picker)
            # A report a write of someone else's took away while the EPP is skipped: said again, no Event.
            unsaid = [
                picker
                for picker in idle
                if picker not in due
                and picker in self._reports
                and not all(says(cand.reported, self._reports[picker]) for cand in by_picker[picker])
            ]
            self._reading.update(due + unsaid)
        return [self._readers.submit(self._read_picker, picker, by_picker[picker]) for picker in due] + [
            self._readers.submit(self._report_again, picker, by_picker[picker]) for picker in unsaid
        ]

    def _report_again(self, picker: Picker, cands: list[Candidate]) -> list[tuple[Candidate, int]]:
        try:
            for cand in cands:
                self._report(cand, self._reports[picker], event=False)
        except Exception:
            log.exception("Scale-from-zero report failed service=%s/%s", picker.namespace, picker.service)
        finally:
            with self._guard:
                self._reading.discard(picker)
        return []

    def _read_picker(self, picker: Picker, cands: list[Candidate]) -> list[tuple[Candidate, int]]:
        try:
            texts, refusals = self._metrics_of(picker, time.monotonic() + METRICS_TIMEOUT_SECONDS)
            queued = {cand: 0 for cand in cands}
            for text in texts:
                try:
                    by_pool = queued_by_pool(text)
                except MetricsRefused as refused:
                    refusals.append(str(refused))
                    continue
                for cand in cands:
                    queued[cand] += by_pool.get(cand.pool, 0)
            self._outcome(picker, cands, refusals[0] if refusals else None)
            return [(cand, n) for cand, n in queued.items() if n > 0 and self._scale(cand, n)]
        except Exception:
            log.exception("Scale-from-zero read failed service=%s/%s", picker.namespace, picker.service)
            return []
        finally:
            with self._guard:
                self._reading.discard(picker)

    def _metrics_of(self, picker: Picker, deadline: float) -> tuple[list[bytes], list[str]]:
        """The /metrics of every ready address of the EPP Service that is a pod of the namespace (several
        EPP replicas: each holds its own queue), within one deadline and one byte bound; and why any
        could not be read."""
        try:
            if not self._still_checked((picker.namespace, picker.service, "")):
                service = self.kube.get("v1", "Service", picker.namespace, picker.service)
                refused = picker_service_refusal(service, picker.service)
                if refused:
                    return [], [refused]
                self._checked((picker.namespace, picker.service, ""))
            slices = self.kube.endpoint_slices(picker.namespace, f"{SERVICE_NAME_LABEL}={picker.service}")
        except ApiException as error:
            return [], [f"Service {picker.service} or its EndpointSlices not read (HTTP {error.status})"]
        texts: list[bytes] = []
        refusals: list[str] = []
        left = MAX_METRICS_BYTES
        for address, target in ready_endpoints(slices)[:MAX_ADDRESSES]:
            name = str((target or {}).get("name") or "")
            key = (picker.namespace, name, address)
            if not (name and (target or {}).get("kind") == "Pod" and self._still_checked(key)):
                try:
                    pod = self.kube.get("v1", "Pod", picker.namespace, name) if name else None
                except ApiException as error:
                    refusals.append(f"{address}: pod {name} not read (HTTP {error.status})")
                    continue
                refused = address_refusal(address, target, pod, picker.namespace)
                if refused:
                    refusals.append(refused)
                    continue
                self._checked(key)
            try:
                text = self.read(address, picker.metrics_port, deadline, left)
            except MetricsRefused as error:
                refusals.append(f"{address}:{picker.metrics_port}: {error}")
                continue
            left -= len(text)
            texts.append(text)
        return texts, refusals

    def _still_checked(self, key: tuple[str, str, str]) -> bool:
        with self._guard:
            return self._checks.get(key, 0.0) > time.monotonic()

    def _checked(self, key: tuple[str, str, str]) -> None:
        """A picker Service, or a pod's address, found acceptable: not asked again for CHECKED_SECONDS."""
        now = time.monotonic()
        with self._guard:
            if len(self._checks) > 4096:  # forget the expired ones
                self._checks = {k: until for k, until in self._checks.items() if until > now}
            self._checks[key] = now + CHECKED_SECONDS

    def _outcome(self, picker: Picker, cands: list[Candidate], refused: str | None) -> None:
        """Back off from an EPP that could not be read, or forget its failures; say so on the VLLMServices
        that name it, and only there."""
        wait = None
        with self._guard:
            failures = self._backoff.pop(picker, (0, 0.0))[0]
            if refused:
                failures += 1
                wait = min(BACKOFF_SECONDS * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
                self._backoff[picker] = (failures, time.monotonic() + wait)
        if refused:
            log.warning(
                "Endpoint picker metrics not read service=%s/%s: %s",
                picker.namespace,
                picker.service,
                refused,
            )
        condition = scale_from_zero_condition(picker.service, refused, wait)
        with self._guard:
            self._reports[picker] = condition
        for cand in cands:
            self._report(cand, condition, event=True)

    def _report(self, cand: Candidate, condition: Condition, *, event: bool) -> None:
        """The ScaleFromZero condition on the VLLMService when it changed, and a Warning Event (aggregated
        on repeats) when the EPP could not be read."""
        if says(cand.reported, condition):
            return
        before = cand.reported or {}
        if event and not condition.status:
            owner = {"metadata": {"namespace": cand.namespace, "name": cand.name, "uid": cand.uid}}
            self.kube.post_event(owner, condition.reason, condition.message, warning=True)
        (written,) = merge_conditions([before] if before else [], [condition], 0, now_rfc3339())
        written.pop("observedGeneration")
        try:
            self.kube.set_service_condition(cand.namespace, cand.name, written)
        except ApiException as error:
            if error.status not in (404, 409):  # deleted, or changed since: the next read says it again
                raise

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
            f"{queued} {noun} waited in endpoint picker {cand.picker.service} for InferencePool {cand.pool};"
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
