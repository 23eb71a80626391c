"""stoker's serving pods behind the Gateway API Inference Extension, on the real control plane with the real
endpoint picker (EPP, built from the Go module proxy by hack/epp), called over ext_proc gRPC as Envoy calls
it (hack/extproc-client).

The InferencePool is stoker's own (render/inferencepool.py): it selects the active serving pods of a
VLLMService. Plain pods on the kwok nodes stand for the serving pods, each with the vLLM test double on its
IP:8000 (the EPP scrapes its /metrics and the client forwards the request to it, as the gateway would).

The EPP runs with flow control on (hack/epp config): a request that finds no endpoint is held in the EPP's
queue, shown as inference_extension_flow_control_queue_size{inference_pool=...}, and dispatched once a pod
joins the pool. Here the test plays the autoscaler: it sees the queued request in that metric and scales
from zero by making a pod active, as stoker does when it wakes a standby pod.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stoker.api import VLLMService
from stoker.render import PORT
from stoker.render.inferencepool import build_inference_pool
from tests.conftest import REPO, Cluster, Kubectl
from tests.e2e.fleet import Fleet, settled, standby_service
from tests.e2e.helpers import build_or_skip, get_json, wait_for
from tests.fakevllm import FakeEngine, FakeEngineServer

pytestmark = pytest.mark.e2e

HACK_EPP = REPO / "hack" / "epp"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ROLE = "stoker.dev/role"
QUEUE_METRIC = "inference_extension_flow_control_queue_size"
DRAIN_SECONDS = 5.0  # stoker's default standby_drain_seconds: a demoted pod sleeps this long after it left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def epp_bin(cluster: Cluster) -> Path:
    """hack/cluster's bin dir with epp and extproc-client: built by hack/epp build if go is here."""
    build_or_skip(HACK_EPP, cluster.env, [cluster.bin_dir / "epp", cluster.bin_dir / "extproc-client"])
    subprocess.run([str(HACK_EPP), "install-crds"], env=cluster.env, check=True, timeout=120)
    return cluster.bin_dir


@dataclass
class Pick:
    endpoint: str
    immediate_status: int
    pick_seconds: float
    forward_status: int
    error: str

    @property
    def ip(self) -> str:
        return self.endpoint.rsplit(":", 1)[0]


class Gateway:
    """One EPP for one InferencePool, and ext_proc requests to it."""

    def __init__(
        self,
        cluster: Cluster,
        bin_dir: Path,
        pool: str,
        namespace: str,
        log: Path,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self.bin_dir, self.pool, self.log = bin_dir, pool, log
        self.grpc_port, self.metrics_port = ports or (free_port(), free_port())
        env = dict(
            cluster.env,
            EPP_GRPC_PORT=str(self.grpc_port),
            EPP_HEALTH_PORT=str(free_port()),
            EPP_METRICS_PORT=str(self.metrics_port),
        )
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(HACK_EPP), "run", pool, namespace],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join([line[:400] for line in text if "Refreshed metrics" not in line][-lines:])

    def client(self, timeout: float) -> list[str]:
        return [
            str(self.bin_dir / "extproc-client"),
            f"-addr=127.0.0.1:{self.grpc_port}",
            f"-model={MODEL}",
            "-forward",
            f"-timeout={timeout}s",
        ]

    def pick(self, timeout: float = 10) -> Pick:
        assert self.process.poll() is None, f"the EPP exited:\n{self.log_tail()}"
        done = subprocess.run(self.client(timeout), capture_output=True, text=True, timeout=timeout + 10)
        return parse_pick(done.stdout)

    def metric(self, name: str) -> float | None:
        """The sum of `name` over this pool's series, None if the EPP exports none yet."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") and f'inference_pool="{self.pool}"' in line
        ]
        return sum(values) if values else None


def parse_pick(stdout: str) -> Pick:
    found = json.loads(stdout.strip().splitlines()[-1])
    return Pick(
        found.get("endpoint", ""),
        found.get("immediate_status", 0),
        found.get("pick_seconds", 0.0),
        found.get("forward_status", 0),
        found.get("error", ""),
    )


class Pods:
    """Plain pods standing for a VLLMService's serving pods, with the vLLM test double on each pod's IP."""

    def __init__(self, kubectl: Kubectl, namespace: str, service: str) -> None:
        self.kubectl, self.namespace, self.service = kubectl, namespace, service
        self.ips: dict[str, str] = {}
        self.engines: dict[str, FakeEngineServer] = {}

    def create(self, name: str, role: str, engine: FakeEngine) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    "app.kubernetes.io/instance": self.service,
                    "app.kubernetes.io/component": "server",
                    ROLE: role,
                },
            },
            "spec": {
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {"name": "vllm", "image": "vllm/vllm-openai", "ports": [{"containerPort": PORT}]}
                ],
            },
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(pod))

        def ready() -> str | None:
            found = get_json(self.kubectl, "-n", self.namespace, "pod", name) or {}
            status = found.get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return status.get("podIP") if conditions.get("Ready") == "True" else None

        self.ips[name] = wait_for(ready, timeout=30, what=f"pod {name} Ready with an IP")
        self.engines[name] = FakeEngineServer(engine, self.ips[name], PORT)

    def label(self, name: str, role: str) -> None:
        self.kubectl("-n", self.namespace, "label", "pod", name, f"{ROLE}={role}", "--overwrite")

    def name_of(self, ip: str) -> str:
        return next((name for name, known in self.ips.items() if known == ip), f"<unknown {ip}>")

    def close(self) -> None:
        for server in self.engines.values():
            server.close()


@pytest.fixture
def gateway_setup(
    cluster: Cluster, kubectl: Kubectl, namespace: str, epp_bin: Path, tmp_path: Path
) -> Iterator[tuple[Gateway, Pods]]:
    manifest = standby_service("llama", replicas=2)
    manifest["metadata"]["namespace"] = namespace
    pool = build_inference_pool(VLLMService.model_validate(manifest), "llama-epp", 9002)
    kubectl("apply", "-f", "-", input=json.dumps(pool))
    pods = Pods(kubectl, namespace, "llama")
    # The standby pod is asleep, as stoker leaves it; its metrics make it the most attractive endpoint
    # (an idle engine), so a picker that saw it as a candidate would pick it.
    # llama-b is less loaded than llama-a, so the picker prefers it while it is active.
    try:
        pods.create("llama-a", "active", FakeEngine(None, model=MODEL, waiting=2, kv_cache_usage=0.5))
        pods.create("llama-b", "active", FakeEngine(None, model=MODEL, waiting=0, kv_cache_usage=0.2))
        pods.create("llama-s", "standby", FakeEngine(None, sleeping=True, model=MODEL))
        gateway = Gateway(cluster, epp_bin, "llama", namespace, tmp_path / "epp.log")
        try:
            wait_for(lambda: gateway.pick(timeout=2).endpoint, timeout=30, what="the EPP's first pick")
            yield gateway, pods
            print(f"\nEPP log (tail):\n{gateway.log_tail()}")
        finally:
            gateway.close()
    finally:
        pods.close()


def test_picker_never_picks_a_standby_pod(gateway_setup: tuple[Gateway, Pods]) -> None:
    gateway, pods = gateway_setup
    active = {pods.ips["llama-a"], pods.ips["llama-b"]}

    picks = [gateway.pick() for _ in range(15)]
    names = [pods.name_of(p.ip) for p in picks]
    print(f"\npicks with llama-a, llama-b active and llama-s standby: {sorted(names)}")
    assert set(names) <= {"llama-a", "llama-b"}, picks
    assert "llama-b" in names  # the least loaded, until it is demoted
    assert all(p.ip in active and p.forward_status == 200 for p in picks), picks

    # Demote llama-b as stoker does: out of the pool (relabelled) first, asleep after the drain period.
    # The EPP must have stopped picking it well before the drain ends.
    pods.label("llama-b", "standby")
    demoted = time.monotonic()
    last_b = demoted
    while time.monotonic() - demoted < 1.5:
        pick = gateway.pick()
        assert pick.ip in active, pick
        if pick.ip == pods.ips["llama-b"]:
            last_b = time.monotonic()
    lag = last_b - demoted
    print(f"\nEPP still picked the demoted pod up to {lag:.3f} s after its relabelling")
    assert lag < DRAIN_SECONDS / 2
    pods.engines["llama-b"].engine.sleeping = True

    picks = [gateway.pick() for _ in range(15)]
    assert {pods.name_of(p.ip) for p in picks} == {"llama-a"}, picks
    assert all(p.forward_status == 200 for p in picks), picks  # a sleeping engine would answer 503


def test_request_held_at_zero_replicas_is_answered_after_scale_from_zero(
    gateway_setup: tuple[Gateway, Pods],
) -> None:
    gateway, pods = gateway_setup
    # Scale to zero: no active pod is left; both go to sleep.
    for name in ("llama-a", "llama-b"):
        pods.label(name, "standby")
    wait_for(lambda: gateway.metric("inference_extension_flow_control_pool_saturation") == 1.0, timeout=10)
    for name in ("llama-a", "llama-b"):
        pods.engines[name].engine.sleeping = True

    sent = time.monotonic()
    held = subprocess.Popen(gateway.client(timeout=40), stdout=subprocess.PIPE, text=True)
    try:
        # The autoscaler's signal: the EPP's queue for this pool holds the request.
        wait_for(lambda: (gateway.metric(QUEUE_METRIC) or 0) >= 1, timeout=10, what="a queued request")
        queued = time.monotonic() - sent
        time.sleep(2.0)
        assert held.poll() is None, f"the request was answered at zero replicas: {held.stdout}"
        assert gateway.metric(QUEUE_METRIC) == 1

        # Scale from zero: wake the standby pod, then make it active (stoker's order).
        pods.engines["llama-s"].engine.sleeping = False
        pods.label("llama-s", "active")
        woken = time.monotonic()
        out, _ = held.communicate(timeout=20)
        answered = time.monotonic()
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    pick = parse_pick(out)
    print(
        f"\nqueued after {queued:.3f} s; held {pick.pick_seconds:.3f} s in the EPP;"
        f" answered {answered - woken:.3f} s after the pod became active"
    )
    assert pick.ip == pods.ips["llama-s"], pick
    assert pick.forward_status == 200, pick
    assert pick.pick_seconds >= 2.0
    assert answered - woken < 3.0
    assert wait_for(lambda: gateway.metric(QUEUE_METRIC) == 0, timeout=5, what="an empty queue")
    assert held.returncode == 0


def scaled_from_zero_events(kubectl: Kubectl, namespace: str) -> list[str]:
    found = get_json(kubectl, "-n", namespace, "events", "--field-selector", "reason=ScaledFromZero")
    return [event["message"] for event in (found or {"items": []})["items"]]


def test_operator_keeps_the_pool_and_scales_from_zero_on_a_queued_request(
    cluster: Cluster, kubectl: Kubectl, namespace: str, epp_bin: Path, operator: object, tmp_path: Path
) -> None:
    """stoker's own trigger, end to end: a VLLMService at zero replicas with one standby asleep and
    spec.inferencePool; the operator creates the InferencePool; a request through the real EPP is held;
    the operator reads the EPP's queue gauge, scales to 1, the sleeper wakes and joins the pool, and the
    EPP dispatches the held request to it."""
    name = "pool0"
    grpc_port, metrics_port = free_port(), free_port()
    # The EPP as it runs in a cluster: a pod behind a Service, whose EndpointSlice the operator reads for
    # the EPP's address. Here the pod is a kwok pod whose IP is a local address, and the EPP process
    # listens on all addresses, so the pod IP reaches it as it would reach the EPP's container; the
    # Service's target ports are the process's.
    epp_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "epp-0", "namespace": namespace, "labels": {"app": "pool0-epp"}},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "epp", "image": "registry.k8s.io/gateway-api-inference-extension/epp"}],
        },
    }
    epp_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "pool0-epp", "namespace": namespace},
        "spec": {
            "selector": {"app": "pool0-epp"},
            "ports": [
                {"name": "grpc-ext-proc", "port": 9002, "targetPort": grpc_port},
                {"name": "metrics", "port": 9090, "targetPort": metrics_port},
            ],
        },
    }
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [epp_pod, epp_service]}),
    )
    manifest = standby_service(name, replicas=0)
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"]["inferencePool"] = {
        "endpointPicker": {"name": "pool0-epp", "port": 9002},
        "scaleFromZero": {"metricsPort": metrics_port},
    }
    kubectl("apply", "-f", "-", input=json.dumps(manifest))
    svc = wait_for(lambda: get_json(kubectl, "-n", namespace, "vllmservice", name), what="the VLLMService")
    pool = wait_for(
        lambda: get_json(kubectl, "-n", namespace, "inferencepool", name), what="the operator's InferencePool"
    )
    assert pool["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector[ROLE] == "active"
    assert pool["spec"]["endpointPickerRef"]["name"] == "pool0-epp"

    with Fleet(kubectl, namespace, name) as fleet:
        wait_for(
            lambda: settled(fleet, active=0, standby=1), timeout=60, what="0 active and 1 asleep standby"
        )
        (sleeper,) = fleet.by_role()["standby"]
        assert fleet.engine(sleeper).sleeping
        sleeper_ip = next(p["status"]["podIP"] for p in fleet.pods() if p["metadata"]["name"] == sleeper)
        # The pool selects no pod while the only one sleeps.
        matching = get_json(
            kubectl, "-n", namespace, "pods", "-l", ",".join(f"{k}={v}" for k, v in selector.items())
        )
        assert (matching or {"items": []})["items"] == []

        gateway = Gateway(cluster, epp_bin, name, namespace, tmp_path / "epp.log", (grpc_port, metrics_port))
        try:

            def serving() -> bool:
                try:
                    gateway.metric(QUEUE_METRIC)
                    return True
                except OSError:  # still starting
                    return False

            wait_for(serving, timeout=30, what="the EPP's metrics")
            time.sleep(1.0)  # its pool synced (the EPP's informers)
            sent = time.monotonic()
            held = subprocess.Popen(gateway.client(timeout=60), stdout=subprocess.PIPE, text=True)
            try:
                out, _ = held.communicate(timeout=70)
            finally:
                if held.poll() is None:
                    held.kill()
                    held.wait()
            answered = time.monotonic() - sent
            print(f"\nEPP log (tail):\n{gateway.log_tail()}")
        finally:
            gateway.close()
        pick = parse_pick(out)
        print(f"\nanswered {answered:.3f} s after it was sent, held {pick.pick_seconds:.3f} s in the EPP")
        assert pick.ip == sleeper_ip, pick
        assert pick.forward_status == 200, pick
        assert held.returncode == 0
        assert sleeper in fleet.by_role()["active"]
        assert not fleet.engine(sleeper).sleeping
    svc = get_json(kubectl, "-n", namespace, "vllmservice", name) or {}
    assert svc["spec"]["runtime"]["replicas"] == 1
    assert svc["status"].get("inferencePool") == name
    (message,) = scaled_from_zero_events(kubectl, namespace)
    assert message.startswith("1 request waited in endpoint picker pool0-epp for InferencePool pool0"), (
        message
    )
