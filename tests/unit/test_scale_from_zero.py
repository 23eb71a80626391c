"""Scale from zero's loop against hostile endpoint pickers: the queue gauge's parsing and its bounds, the
read's one deadline (a trickling peer is cut), the picker and its addresses checked, one tenant's picker
never delaying another's, backoff and the report on the picker's own VLLMService only."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from stoker.controller.conditions import merge_conditions, scale_from_zero_condition
from stoker.controller.decide import blocked_status
from stoker.controller.scalefromzero import (
    MAX_QUEUE_SAMPLES,
    PICKER_FIELD,
    READS_PER_NAMESPACE,
    MetricsRefused,
    ScaleFromZero,
    address_refusal,
    candidate,
    picker_service_refusal,
    queued_by_pool,
    read_metrics,
    ready_addresses,
)
from tests.unit.test_inference_pool import POOL, pool_body


def gauge(fairness: str, pool: str, value: str) -> str:
    labels = (
        f'fairness_id="{fairness}",inference_pool="{pool}",model_name="m",priority="0",target_model_name=""'
    )
    return f"inference_extension_flow_control_queue_size{{{labels}}} {value}\n"


EPP_METRICS = (
    "# HELP inference_extension_flow_control_queue_size Current number of requests in the queue.\n"
    "# TYPE inference_extension_flow_control_queue_size gauge\n"
    + gauge("a", "llm", "2")
    + gauge("b", "llm", "1")
    + gauge("a", "other", "7")
    + gauge("c", "llm", "NaN")
    + gauge("d", "llm", "-4")
    + gauge('x,inference_pool=\\"llm\\"', "z", "5")
    + "# TYPE inference_extension_flow_control_pool_saturation gauge\n"
    + 'inference_extension_flow_control_pool_saturation{inference_pool="llm"} 1\n'
).encode()


def test_queued_requests_are_summed_by_pool() -> None:
    # NaN and -4 count nothing; a label value that looks like a label is a value
    assert queued_by_pool(EPP_METRICS) == {"llm": 3, "other": 7, "z": 5}
    assert queued_by_pool(b"") == {}
    assert queued_by_pool(gauge("a", "llm", "1e300").encode()) == {"llm": int(1e9)}


@pytest.mark.parametrize(
    "text",
    [
        b'inference_extension_flow_control_queue_size{inference_pool="llm" 1\n',
        b'inference_extension_flow_control_queue_size{inference_pool="llm"} notanumber\n',
        "".join(gauge(str(i), "llm", "1") for i in range(MAX_QUEUE_SAMPLES + 1)).encode(),
    ],
)
def test_queued_requests_refuses_what_does_not_parse_or_is_too_much(text: bytes) -> None:
    with pytest.raises(MetricsRefused):
        queued_by_pool(text)


def test_a_flood_of_other_lines_costs_no_parsing() -> None:
    flood = b"".join(b'go_gc_duration_seconds{quantile="%d"} 1\n' % i for i in range(25_000))
    started = time.process_time()
    for _ in range(10):
        assert queued_by_pool(flood + gauge("a", "llm", "1").encode()) == {"llm": 1}
    assert time.process_time() - started < 0.5  # 10 MiB looked at; measured about 0.02 s


def test_ready_addresses_skip_unready_endpoints_and_fqdns() -> None:
    slices = [
        {
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"]},  # ready unknown counts as ready
                {"addresses": ["10.0.0.1"]},
            ],
        },
        {"addressType": "FQDN", "endpoints": [{"addresses": ["epp.example"]}]},
    ]
    assert ready_addresses(slices) == ["10.0.0.1", "10.0.0.3"]


# ------------------------------------------------------------------------------------------ the read


def serve(answer: bytes, *, delay: float = 0.0, trickle: float = 0.0) -> Iterator[int]:
    """A TCP server on loopback that answers each connection with `answer` after `delay`, one byte per
    `trickle` seconds if set."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(4096)
                if stop.wait(delay):
                    return
                if trickle:
                    for byte in answer:
                        conn.sendall(bytes([byte]))
                        if stop.wait(trickle):
                            return
                else:
                    conn.sendall(answer)
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


@pytest.fixture
def ok_server() -> Iterator[int]:
    yield from serve(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 5000)


def test_read_metrics_is_bounded_and_direct(ok_server: int) -> None:
    deadline = time.monotonic() + 2
    assert len(read_metrics("127.0.0.1", ok_server, deadline, 1 << 20)) == 5000
    with pytest.raises(MetricsRefused, match="more than 1000 bytes"):
        read_metrics("127.0.0.1", ok_server, deadline, 1000)
    with pytest.raises(MetricsRefused, match="deadline"):
        read_metrics("127.0.0.1", ok_server, time.monotonic() - 1, 1 << 20)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 500 Oops\r\n\r\n", "HTTP 500"),
        (b"HTTP/1.1 302 Found\r\nLocation: http://10.0.0.1/\r\n\r\n", "HTTP 302"),
        (b"SSH-2.0-OpenSSH\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello", "chunked"),
    ],
)
def test_read_metrics_refuses_other_answers(answer: bytes, why: str) -> None:
    for port in serve(answer):
        with pytest.raises(MetricsRefused, match=why):
            read_metrics("127.0.0.1", port, time.monotonic() + 2, 1 << 20)


@pytest.mark.parametrize("head_only", [True, False])
def test_a_trickling_peer_is_cut_at_the_deadline_headers_included(head_only: bool) -> None:
    answer = b"HTTP/1.0 200 OK\r\n" + (b"X-Slow: " + b"y" * 100 if head_only else b"\r\n" + b"z" * 100)
    for port in serve(answer, trickle=0.05):
        started = time.monotonic()
        with pytest.raises(MetricsRefused, match="deadline"):
            read_metrics("127.0.0.1", port, started + 1.0, 1 << 20)
        assert time.monotonic() - started < 1.3


def test_a_peer_that_never_answers_is_cut_at_the_deadline() -> None:
    for port in serve(b"", delay=60):
        started = time.monotonic()
        with pytest.raises(MetricsRefused, match="deadline"):
            read_metrics("127.0.0.1", port, started + 0.5, 1 << 20)
        assert time.monotonic() - started < 0.8


# ------------------------------------------------------------------------ what may be read at all


def test_a_picker_service_of_stokers_own_is_refused_naming_the_field() -> None:
    assert picker_service_refusal({"metadata": {"name": "epp"}}, "epp") is None
    missing = picker_service_refusal(None, "epp")
    assert missing is not None and missing.startswith(PICKER_FIELD)
    owned = {"metadata": {"ownerReferences": [{"apiVersion": "stoker.dev/v1alpha1", "name": "victim"}]}}
    why = picker_service_refusal(owned, "victim")
    assert why is not None and PICKER_FIELD in why and "VLLMService victim" in why
    labelled = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "stoker"}}}
    assert picker_service_refusal(labelled, "x") is not None


def test_an_address_must_be_a_pod_of_the_namespace_by_its_own_ip() -> None:
    pod = {"metadata": {"labels": {}}, "status": {"podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}]}}
    target = {"kind": "Pod", "name": "epp-0", "namespace": "t1"}
    assert address_refusal("10.1.0.5", target, pod, "t1") is None
    assert address_refusal("10.1.0.5", None, pod, "t1") is not None  # a hand-made slice: any address
    assert address_refusal("10.1.0.5", {**target, "namespace": "t2"}, pod, "t1") is not None
    assert address_refusal("169.254.169.254", target, pod, "t1") is not None
    assert address_refusal("10.1.0.5", target, None, "t1") is not None
    stokers = {**pod, "metadata": {"labels": {"app.kubernetes.io/managed-by": "stoker"}}}
    assert address_refusal("10.1.0.5", target, stokers, "t1") is not None


# ---------------------------------------------------------------------------------------- the loop


class FakeKube:
    """The API server as the loop sees it: one EPP Service per namespace, whose slice points at the pod
    `epp-0` with the address 10.<n>.0.5."""

    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str], int] = {}
        self.events: list[tuple[str, str, str]] = []
        self.conditions: dict[tuple[str, str], dict] = {}
        self.gets: list[str] = []
        self.guard = threading.Lock()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        self.gets.append(kind)
        ip = f"10.{namespace[1:]}.0.5"
        if kind == "Pod":
            return {"metadata": {"name": name}, "status": {"podIP": ip}}
        return {"metadata": {"name": name, "namespace": namespace}}

    def endpoint_slices(self, namespace: str, selector: str) -> list[dict]:
        ip = f"10.{namespace[1:]}.0.5"
        target = {"kind": "Pod", "name": "epp-0", "namespace": namespace}
        return [{"addressType": "IPv4", "endpoints": [{"addresses": [ip], "targetRef": target}]}]

    def scale_service_from_zero(self, namespace: str, name: str) -> dict | None:
        with self.guard:
            if self.replicas.get((namespace, name), 0) != 0:
                return None
            self.replicas[(namespace, name)] = 1
        return {"metadata": {"namespace": namespace, "name": name, "uid": f"{name}-uid"}}

    def post_event(self, owner: dict, reason: str, message: str, *, warning: bool = False) -> None:
        with self.guard:
            self.events.append((owner["metadata"]["namespace"], reason, message))

    def set_service_condition(self, namespace: str, name: str, condition: dict) -> None:
        with self.guard:
            self.conditions[(namespace, name)] = condition


def tenant(namespace: str, name: str = "llm") -> dict:
    obj = pool_body({**POOL, "scaleFromZero": {"metricsPort": 9091}}, replicas=0)
    obj["metadata"].update(namespace=namespace, name=name, uid=f"{namespace}-uid")
    return obj


def scaled(loop: ScaleFromZero) -> list[tuple[str, int]]:
    return [(cand.namespace, n) for future in loop.once() for cand, n in future.result(timeout=10)]


def test_a_pass_scales_a_service_at_zero_with_queued_requests_once() -> None:
    kube = FakeKube()
    reads: list[tuple[str, int]] = []

    def read(address: str, port: int, deadline: float, limit: int) -> bytes:
        reads.append((address, port))
        return EPP_METRICS

    loop = ScaleFromZero(kube, lambda: [tenant("t1")], period=1.0, read=read)
    assert scaled(loop) == [("t1", 3)]
    assert reads == [("10.1.0.5", 9091)]
    assert (
        "t1",
        "ScaledFromZero",
        "3 requests waited in endpoint picker llm-epp for InferencePool llm; scaled from 0 to 1 replica",
    ) in kube.events
    assert kube.conditions[("t1", "llm")]["reason"] == "EndpointPickerRead"
    assert scaled(loop) == []  # the scale read 1 since: nothing more (the watch cache still says 0)
    assert kube.gets == ["Service", "Pod"]  # checked once, not again within CHECKED_SECONDS


def test_only_services_at_zero_with_scale_from_zero_are_candidates() -> None:
    assert candidate(pool_body({**POOL, "scaleFromZero": {}}, replicas=0)) is not None
    assert candidate(pool_body({**POOL, "scaleFromZero": {}}, replicas=1)) is None
    assert candidate(pool_body(POOL, replicas=0)) is None
    assert candidate(pool_body({**POOL, "scaleFromZero": {"metricsPort": 0}}, replicas=0)) is None


def test_a_hostile_picker_never_delays_another_tenants_scale_and_is_reported_on_its_own_service() -> None:
    """Ten tenants' pickers hang; the victim's answers. The victim scales while they still hang, each hostile
    one is reported on its own VLLMService and skipped in the next passes, the victim gets no report of
    theirs."""
    kube = FakeKube()
    release = threading.Event()
    hostile_reads: list[str] = []

    def read(address: str, port: int, deadline: float, limit: int) -> bytes:
        if address == "10.99.0.5":
            return EPP_METRICS
        hostile_reads.append(address)
        release.wait(max(0.0, deadline - time.monotonic()))
        raise MetricsRefused("no whole answer within the deadline")

    services = [tenant(f"t{i}") for i in range(1, 11)] + [tenant("t99")]
    loop = ScaleFromZero(kube, lambda: services, period=1.0, read=read)
    started = time.monotonic()
    futures = loop.once()
    (victim,) = futures[-1].result(timeout=1.5)  # the victim's, submitted last behind ten that hang
    assert victim[0].namespace == "t99" and time.monotonic() - started < 1.0
    for future in futures:
        future.result(timeout=10)
    assert len(hostile_reads) == 10
    assert all(f.result(timeout=5) == [] for f in loop.once())
    assert len(hostile_reads) == 10  # the others back off: only the victim's is read again
    reports = {key: c for key, c in kube.conditions.items() if c["status"] == "False"}
    assert sorted(reports) == sorted((f"t{i}", "llm") for i in range(1, 11))
    assert all(c["reason"] == "EndpointPickerUnreadable" for c in reports.values())
    assert "not read again for 5 s" in reports[("t1", "llm")]["message"]
    assert all(ns != "t99" for ns, reason, _ in kube.events if reason == "EndpointPickerUnreadable")
    assert sum(1 for _, reason, _ in kube.events if reason == "EndpointPickerUnreadable") == 10
    release.set()
    loop.stop()


def test_a_picker_is_read_once_at_a_time_and_backs_off_doubling() -> None:
    kube = FakeKube()
    calls: list[float] = []

    def refuse(address: str, port: int, deadline: float, limit: int) -> bytes:
        calls.append(time.monotonic())
        raise MetricsRefused("HTTP 500")

    loop = ScaleFromZero(kube, lambda: [tenant("t1")], 1.0, read=refuse)
    assert scaled(loop) == [] and scaled(loop) == [] and len(calls) == 1
    picker = candidate(tenant("t1")).picker  # type: ignore[union-attr]
    failures, retry_at = loop._backoff[picker]
    assert failures == 1 and 4 < retry_at - time.monotonic() <= 5
    loop._backoff[picker] = (failures, 0.0)
    assert scaled(loop) == [] and len(calls) == 2
    failures, retry_at = loop._backoff[picker]
    assert failures == 2 and 9 < retry_at - time.monotonic() <= 10
    assert kube.replicas == {} and "not read again for 10 s" in kube.conditions[("t1", "llm")]["message"]


def test_a_stokers_own_service_as_picker_is_never_read() -> None:
    kube = FakeKube()
    kube.get = lambda api_version, kind, namespace, name: {  # type: ignore[method-assign]
        "metadata": {"ownerReferences": [{"apiVersion": "stoker.dev/v1alpha1", "name": "other"}]}
    }

    def read(address: str, port: int, deadline: float, limit: int) -> bytes:
        raise AssertionError("read")

    assert scaled(ScaleFromZero(kube, lambda: [tenant("t1")], 1.0, read=read)) == []
    message = kube.conditions[("t1", "llm")]["message"]
    assert PICKER_FIELD in message and "stoker's own (of VLLMService other)" in message


def test_a_reconcile_keeps_the_loops_condition_while_scale_from_zero_is_asked_for() -> None:
    loop_condition = merge_conditions(
        [], [scale_from_zero_condition("epp", "HTTP 500", 10.0)], 0, "2026-01-01T00:00:00Z"
    )
    obj = tenant("t1")
    obj["status"] = {"conditions": loop_condition}
    kept = blocked_status(obj, "ChildConflict", "x", "2026-01-01T00:00:01Z").status["conditions"]
    assert [c["type"] for c in kept if c["type"] == "ScaleFromZero"] == ["ScaleFromZero"]
    del obj["spec"]["inferencePool"]["scaleFromZero"]
    dropped = blocked_status(obj, "ChildConflict", "x", "2026-01-01T00:00:01Z").status["conditions"]
    assert all(c["type"] != "ScaleFromZero" for c in dropped)


def test_the_api_refuses_its_own_service_as_picker_and_a_privileged_metrics_port() -> None:
    from pydantic import ValidationError

    from stoker.api import VLLMService

    own = pool_body({"endpointPicker": {"name": "llm"}})
    own["metadata"]["name"] = "llm"
    with pytest.raises(ValidationError, match=PICKER_FIELD.replace(".", r"\.")):
        VLLMService.model_validate(own)
    with pytest.raises(ValidationError, match=r"metricsPort|metrics_port"):
        VLLMService.model_validate(pool_body({**POOL, "scaleFromZero": {"metricsPort": 22}}))


def test_a_report_taken_away_while_backing_off_is_said_again_without_an_event() -> None:
    kube = FakeKube()

    def refuse(address: str, port: int, deadline: float, limit: int) -> bytes:
        raise MetricsRefused("HTTP 500")

    obj = tenant("t1")
    loop = ScaleFromZero(kube, lambda: [obj], 1.0, read=refuse)
    scaled(loop)
    said = kube.conditions.pop(("t1", "llm"))
    events = len(kube.events)
    obj["status"] = {"conditions": [said]}
    assert loop.once() == []  # said, backing off: nothing to do
    obj["status"] = {"conditions": []}  # a reconcile's write took it away
    scaled(loop)
    assert kube.conditions[("t1", "llm")]["message"] == said["message"] and len(kube.events) == events


def test_one_namespace_holds_only_a_few_readers_at_once() -> None:
    kube = FakeKube()
    release = threading.Event()
    reads: list[str] = []

    def hang(address: str, port: int, deadline: float, limit: int) -> bytes:
        reads.append(address)
        release.wait(5)
        raise MetricsRefused("no whole answer within the deadline")

    services = [tenant("t1", f"s{i}") for i in range(10)]
    for i, obj in enumerate(services):
        obj["spec"]["inferencePool"]["endpointPicker"] = {"name": f"epp-{i}"}
    loop = ScaleFromZero(kube, lambda: services, 1.0, read=hang)
    first = loop.once()
    assert len(first) == READS_PER_NAMESPACE and loop.once() == []
    release.set()
    for future in first:
        future.result(timeout=5)
    for future in loop.once():  # the next ones (those read back off), and their reports said again
        future.result(timeout=5)
    assert len(reads) == 2 * READS_PER_NAMESPACE
    loop.stop()
