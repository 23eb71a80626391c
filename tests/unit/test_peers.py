"""coldStart.peerWeights: the API's refusals, the rendered pods, Services, EndpointSlices and NetworkPolicies,
which pods the EndpointSlices list, stale peer children deleted, and ModelExpress's log lines parsed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService, user_message
from stoker.api.crd import build_crd
from stoker.controller.decide import decide_children
from stoker.controller.peers import peer_sources
from stoker.phases import parse_log
from stoker.phases.timeline import summarize
from stoker.phases.weights import MAX_RANKS, REASON_LIMIT, WeightsTracker
from stoker.predict import Observation, PhaseFit, fit, predict, regime_of
from stoker.predict.model import CoefficientSet, HostFacts
from stoker.predict.predictor import LOADER_PEER
from stoker.predict.service import service_settings
from stoker.predict.settings import with_weights_source
from stoker.render import cache_key, render_children
from stoker.render.peers import PEER_LABEL, Peer
from tests.unit.test_decide import as_live, body, snapshot
from tests.unit.test_predict_host import model as llama_8b
from tests.unit.test_render import engine_container

SYNTHETIC = Path(__file__).parent / "data" / "phases" / "synthetic"
MANIFEST: dict[str, Any] = {
    "metadata": {"name": "llm", "namespace": "t1"},
    "spec": {
        "model": {"name": "org/model", "source": {"pvc": {"claimName": "weights", "path": "/m"}}},
        "runtime": {"gpus": 2},
        "coldStart": {"peerWeights": {"enabled": True}},
    },
}


def service(**spec: Any) -> VLLMService:
    manifest = copy.deepcopy(MANIFEST)
    for part, values in spec.items():
        manifest["spec"].setdefault(part, {}).update(values)
    return VLLMService.model_validate(manifest)


def kinds(svc: VLLMService, sources: list[Peer] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(svc, peer_sources=sources)}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


# ------------------------------------------------------------------------------------------------- API


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"coldStart": {"loader": {"format": "fastsafetensors"}}}, "spec.coldStart.loader.format"),
        ({"coldStart": {"standby": {"replicas": 1}}}, "spec.coldStart.standby"),
        ({"runtime": {"gpus": 2, "nodesPerReplica": 2}}, "spec.runtime.nodesPerReplica"),
        (
            {"runtime": {"gpus": 2, "tensorParallelSize": 1, "pipelineParallelSize": 2}},
            "spec.runtime.pipelineParallelSize",
        ),
        (
            {"runtime": {"gpus": 2, "tensorParallelSize": 1, "dataParallelSize": 2}},
            "spec.runtime.dataParallelSize",
        ),
        ({"runtime": {"engineVersion": "0.25.1"}}, "spec.coldStart.peerWeights.enabled"),
    ],
)
def test_where_peer_weights_cannot_work_the_refusal_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        service(**spec)
    message = user_message(refused.value)
    assert message.startswith(f"{field}: ") and "coldStart.peerWeights" in message, message


def test_the_same_specs_pass_with_peer_weights_off() -> None:
    manifest = copy.deepcopy(MANIFEST)
    manifest["spec"]["coldStart"] = {"loader": {"format": "fastsafetensors"}, "standby": {"replicas": 1}}
    assert not VLLMService.model_validate(manifest).spec.cold_start.peer_weights.enabled


def test_the_crd_refuses_each_with_a_rule_naming_the_field() -> None:
    rules = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    peers = {rule["fieldPath"] for rule in rules if "peerWeights" in rule["rule"]}
    assert peers == {
        ".coldStart.loader.format",
        ".coldStart.standby",
        ".runtime.nodesPerReplica",
        ".runtime.pipelineParallelSize",
        ".runtime.dataParallelSize",
    }


@pytest.mark.parametrize(
    ("version", "has_it"), [("0.22.1", False), ("0.25.1", False), ("0.26.0", True), ("0.33.0", True)]
)
def test_the_loader_is_known_per_engine_profile(version: str, has_it: bool) -> None:
    off = copy.deepcopy(MANIFEST)
    off["spec"]["coldStart"] = {}
    off["spec"]["runtime"]["engineVersion"] = version
    profile = VLLMService.model_validate(off).spec.runtime.engine_profile
    assert profile.capabilities.modelexpress_loader is has_it


def test_transfer_timeout_is_bounded() -> None:
    with pytest.raises(ValidationError):
        service(coldStart={"peerWeights": {"enabled": True, "transferTimeoutSeconds": 100000}})


# ------------------------------------------------------------------------------------------ rendering


def test_serving_pods_load_through_modelexpress_with_its_environment_and_ports() -> None:
    svc = service()
    deployment = kinds(svc)[("Deployment", "llm")]
    container = engine_container(deployment["spec"]["template"])
    args = container["args"]
    assert args[args.index("--load-format") + 1] == "modelexpress"
    env = env_of(container)
    assert env["MX_METADATA_BACKEND"] == "k8s-service"
    assert env["MX_K8S_SERVICE_PATTERN"] == "llm-peers-r{rank}.t1.svc:6555"
    assert env["MX_WORKER_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["MX_MODEL_REVISION"] == cache_key(svc)
    assert env["MX_TRANSFER_TIMEOUT"] == "120"
    assert env["UCX_TCP_PORT_RANGE"] == "20000-20099"
    # Weights on a volume in stoker's image: InstantTensor today, so ModelExpress's InstantTensor fallback.
    assert env["MX_INSTANT_TENSOR"] == "1"
    assert "MX_MODEL_URI" not in env
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "mx-grpc-0": 6555, "nixl-0": 5555, "mx-grpc-1": 6556, "nixl-1": 5556}
    assert deployment["spec"]["template"]["metadata"]["labels"][PEER_LABEL] == "true"


def test_the_seed_uses_no_peer_and_the_cache_key_does_not_change() -> None:
    svc = service()
    off = service(coldStart={"peerWeights": {"enabled": False}})
    (job,) = [c for c in render_children(svc) if c["kind"] == "Job"]
    container = engine_container(job["spec"]["template"])
    assert not [name for name in env_of(container) if name.startswith("MX_")]
    assert "dummy" in container["args"] or any("dummy" in arg for arg in container["args"])
    assert cache_key(svc) == cache_key(off)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"coldStart": {"loader": {"format": "safetensors"}}}, {"MX_INSTANT_TENSOR": "0"}),
        (
            {"coldStart": {"loader": {"format": "runai_streamer"}}},
            {"MX_INSTANT_TENSOR": "0", "MX_MODEL_URI": "/models/m"},
        ),
        (
            {"model": {"name": "org/model", "source": {"s3": {"uri": "s3://bucket/model"}}}},
            {"MX_INSTANT_TENSOR": "0", "MX_MODEL_URI": "s3://bucket/model"},
        ),
        ({"model": {"name": "org/model", "source": {"huggingFace": {}}}}, {"MX_INSTANT_TENSOR": "0"}),
    ],
)
def test_the_loader_of_today_is_modelexpress_s_fallback(
    spec: dict[str, Any], expected: dict[str, str]
) -> None:
    svc = service(**spec)
    container = engine_container(kinds(svc)[("Deployment", "llm")]["spec"]["template"])
    env = env_of(container)
    assert {name: env[name] for name in ("MX_INSTANT_TENSOR", "MX_MODEL_URI") if name in env} == expected


def test_without_peer_weights_nothing_changes() -> None:
    svc = service(coldStart={"peerWeights": {"enabled": False}})
    children = kinds(svc)
    assert not [key for key in children if key[0] in ("NetworkPolicy", "EndpointSlice")]
    container = engine_container(children[("Deployment", "llm")]["spec"]["template"])
    assert "modelexpress" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http"]


def test_one_selectorless_service_per_rank_and_its_endpoint_slice() -> None:
    source = Peer("llm-abc", "pod-uid", "10.1.2.3", "node-a")
    children = kinds(service(), [source])
    for rank in (0, 1):
        peer_service = children[("Service", f"llm-peers-r{rank}")]
        assert "selector" not in peer_service["spec"]
        assert peer_service["spec"]["ports"] == [
            {"name": "mx-grpc", "port": 6555, "targetPort": 6555 + rank, "protocol": "TCP"}
        ]
        endpoint_slice = children[("EndpointSlice", f"llm-peers-r{rank}")]
        labels = endpoint_slice["metadata"]["labels"]
        assert labels["kubernetes.io/service-name"] == f"llm-peers-r{rank}"
        assert labels["endpointslice.kubernetes.io/managed-by"] == "stoker.dev"
        assert endpoint_slice["ports"] == [{"name": "mx-grpc", "port": 6555 + rank, "protocol": "TCP"}]
        assert endpoint_slice["endpoints"] == [
            {
                "addresses": ["10.1.2.3"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "namespace": "t1", "name": "llm-abc", "uid": "pod-uid"},
                "nodeName": "node-a",
            }
        ]
    assert ("Service", "llm-peers-r2") not in children


def test_network_policies_admit_peer_ports_from_the_service_s_pods_only_and_keep_serving_open() -> None:
    children = kinds(service())
    pods = {"matchLabels": {"app.kubernetes.io/instance": "llm", "app.kubernetes.io/component": "server"}}
    peers = children[("NetworkPolicy", "llm-peers")]["spec"]
    assert peers["podSelector"] == pods
    assert peers["policyTypes"] == ["Ingress"]
    (rule,) = peers["ingress"]
    assert rule["from"] == [{"podSelector": pods}]  # no namespaceSelector: this namespace only
    assert rule["ports"] == [
        {"protocol": "TCP", "port": 6555, "endPort": 6556},
        {"protocol": "TCP", "port": 5555, "endPort": 5556},
        {"protocol": "TCP", "port": 20000, "endPort": 20099},
    ]
    serving = children[("NetworkPolicy", "llm-serving")]["spec"]
    assert serving["podSelector"] == pods
    assert serving["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8000}]}]


# ---------------------------------------------------------------------------------- EndpointSlice pods


def pod(name: str, svc: VLLMService, **changes: Any) -> dict[str, Any]:
    template = kinds(svc)[("Deployment", "llm")]["spec"]["template"]
    manifest: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "t1",
            "uid": f"{name}-uid",
            "labels": dict(template["metadata"]["labels"]),
            "annotations": dict(template["metadata"]["annotations"]),
        },
        "spec": {"containers": copy.deepcopy(template["spec"]["containers"]), "nodeName": "node-a"},
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for path, value in changes.items():
        node = manifest
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return manifest


def test_only_ready_pods_of_the_current_key_and_image_are_sources() -> None:
    svc = service()
    pods = [
        pod("ready", svc),
        pod("unready", svc, **{"status.conditions": [{"type": "Ready", "status": "False"}]}),
        pod("old-key", svc, **{"metadata.annotations": {"stoker.dev/cache-key": "0" * 64}}),
        pod("terminating", svc, **{"metadata.deletionTimestamp": "2026-11-28T10:00:00Z"}),
        pod("no-ip", svc, **{"status.podIP": ""}),
        pod("bad-ip", svc, **{"status.podIP": "10.0.0.1; evil"}),
        pod("elsewhere", svc, **{"metadata.namespace": "t2"}),
    ]
    other_image = pod("other-image", svc)
    other_image["spec"]["containers"][0]["image"] = "registry.example/vllm:other"
    assert peer_sources(svc, [*pods, other_image]) == [Peer("ready", "ready-uid", "10.0.0.7", "node-a")]


def test_stale_peer_children_are_deleted_when_peer_weights_are_turned_off() -> None:
    on = body()
    on["spec"] = copy.deepcopy(MANIFEST["spec"])
    live = {
        key: as_live(child, on, f"{key[0]}-{key[1]}")
        for key, child in kinds(VLLMService.model_validate(on)).items()
        if key[0] in ("NetworkPolicy", "EndpointSlice") or key[1].startswith("llm-peers")
    }
    off = copy.deepcopy(on)
    off["spec"]["coldStart"]["peerWeights"]["enabled"] = False
    foreign = copy.deepcopy(live[("Service", "llm-peers-r1")])
    foreign["metadata"]["ownerReferences"] = []
    snap = snapshot(off)
    snap = type(snap)(**{**snap.__dict__, "peer_objects": [*live.values(), foreign]})
    deleted = {(obj["kind"], obj["metadata"]["name"]) for obj in decide_children(snap).deletions}
    assert deleted == set(live)  # every peer child of this service, none that is not its own
    assert all(obj["metadata"]["ownerReferences"] for obj in decide_children(snap).deletions)


# ------------------------------------------------------------------------------------------ log lines


def test_a_start_from_a_peer_is_read_from_modelexpress_s_lines() -> None:
    with (SYNTHETIC / "vllm-0.26.0-modelexpress-peer.log").open() as lines:
        timeline = parse_log(lines)
    assert timeline.weights is not None
    assert timeline.weights.source == "peer"
    assert timeline.weights.transfer_seconds == 1.482
    assert timeline.weights.gigabytes == 16.06
    assert timeline.weights.gigabytes_per_second == pytest.approx(10.837)
    document = timeline.to_json_dict()
    assert document["weightsSource"] == "peer"
    assert document["peerTransferGigabytesPerSecond"] == pytest.approx(10.837)
    assert "from a peer: 16.06 GB in 1.482 s, 10.837 GB/s" in summarize(timeline)


def test_a_start_without_a_peer_is_from_storage_with_the_reason() -> None:
    with (SYNTHETIC / "vllm-0.26.0-modelexpress-fallback.log").open() as lines:
        timeline = parse_log(lines)
    assert timeline.weights is not None
    assert (timeline.weights.source, timeline.weights.fallback_reason) == (
        "storage",
        "No RDMA source available",
    )
    assert "from storage, the peer path failed: No RDMA source available" in summarize(timeline)


def test_a_start_without_modelexpress_says_nothing_of_it() -> None:
    with (SYNTHETIC / "vllm-0.26.0-v2-hit.log").open() as lines:
        timeline = parse_log(lines)
    assert timeline.weights is None
    assert "weightsSource" not in timeline.to_json_dict()


def transfer(worker: int, gigabytes: str, seconds: str) -> str:
    timing = f"100 tensors, {gigabytes} GB, {seconds}s, 1.0 Gbps"
    return f"[Worker {worker}] [TIMING] RDMA transfer complete: {timing}"


def test_ranks_add_up_and_the_slowest_is_the_transfer_s_time() -> None:
    tracker = WeightsTracker()
    for line in (transfer(0, "8.00", "1.000"), transfer(1, "8.00", "2.000"), transfer(1, "8.00", "2.000")):
        tracker.feed(line)
    weights = tracker.result()
    assert weights is not None
    assert (weights.gigabytes, weights.transfer_seconds, weights.ranks) == (16.0, 2.0, 2)


def test_what_a_tenant_prints_is_bounded() -> None:
    tracker = WeightsTracker()
    tracker.feed(transfer(0, "9999999", "1.0"))  # more than any checkpoint
    tracker.feed(transfer(0, "1.0", "9999999"))  # longer than a day
    tracker.feed("[Worker 0] [TIMING] RDMA transfer complete: lots of tensors, many GB")
    assert tracker.result() is None
    for rank in range(MAX_RANKS + 10):
        tracker.feed(transfer(rank, "1.0", "1.0"))
    weights = tracker.result()
    assert weights is not None and weights.ranks == MAX_RANKS
    failed = WeightsTracker()
    failed.feed("Strategy rdma failed, trying next: \x1b[31mbad\nline\x00" + "x" * 1000)
    result = failed.result()
    assert result is not None and result.fallback_reason is not None
    assert len(result.fallback_reason) == REASON_LIMIT
    assert not any(ord(ch) < 32 for ch in result.fallback_reason)


def test_peer_children_as_applied_are_not_written_again() -> None:
    on = body()
    on["spec"] = copy.deepcopy(MANIFEST["spec"])
    svc = VLLMService.model_validate(on)
    sources = [Peer("llm-abc", "pod-uid", "10.1.2.3", "node-a")]
    snap = snapshot(on)
    rendered = render_children(svc, programs_image=snap.programs_image, peer_sources=sources)
    live = {
        (c["kind"], c["metadata"]["name"]): as_live(c, on, f"{c['kind']}-uid")
        for c in rendered
        if c["kind"] in ("NetworkPolicy", "EndpointSlice") or c["metadata"]["name"].startswith("llm-peers")
    }
    children = {**snap.children, **live}
    snap = type(snap)(
        **{**snap.__dict__, "rendered": rendered, "children": children, "peer_sources": sources}
    )
    written = {(w.desired["kind"], w.desired["metadata"]["name"]) for w in decide_children(snap).writes}
    assert not written & set(live)
    # A source gone: the slices are written again, empty (the API server returns no list for none).
    emptied = type(snap)(
        **{
            **snap.__dict__,
            "rendered": render_children(svc, programs_image=snap.programs_image),
            "peer_sources": [],
        }
    )
    written = {(w.desired["kind"], w.desired["metadata"]["name"]) for w in decide_children(emptied).writes}
    assert written & set(live) == {("EndpointSlice", "llm-peers-r0"), ("EndpointSlice", "llm-peers-r1")}
    for key in written & set(live):
        live[key]["endpoints"] = None
    settled = type(snap)(**{**emptied.__dict__, "children": {**snap.children, **live}})
    written = {(w.desired["kind"], w.desired["metadata"]["name"]) for w in decide_children(settled).writes}
    assert not written & set(live)


def test_the_predictor_reads_a_peer_services_storage_fallback_as_its_loader_without_the_peer() -> None:
    with_peers = service()
    without = service(coldStart={"peerWeights": {"enabled": False}})
    from_storage = service_settings(with_peers, "hit")
    # ModelExpress with no source loads through its InstantTensor strategy: the regime of the same service
    # without peers, whose fits apply.
    assert from_storage.loader == service_settings(without, "hit").loader == "instanttensor"
    assert regime_of("weightLoad", from_storage) == regime_of("weightLoad", service_settings(without, "hit"))
    assert regime_of("weightLoad", with_weights_source(from_storage, "storage")) != LOADER_PEER
    from_peer = with_weights_source(from_storage, "peer")
    assert regime_of("weightLoad", from_peer) == LOADER_PEER
    assert regime_of("bootstrap", from_peer) == regime_of("bootstrap", from_storage)


def test_starts_from_a_peer_are_learnt_as_their_own_regime_and_not_bounded_by_the_disk() -> None:
    # A disk of 0.2 GB/s: 80 s for the checkpoint, which a peer's transfer never waits for.
    facts = llama_8b(HostFacts(cpu_seconds=0.2, disk_bytes_per_second=0.2e9))
    storage = service_settings(service(), "hit")
    peer = with_weights_source(storage, "peer")
    prior = CoefficientSet(
        hardware="NVIDIA-H200_x2_v0.26",
        source="shipped",
        phases={
            "bootstrap": {regime_of("bootstrap", storage): PhaseFit(intercept=10.0, samples=3)},
            "weightLoad": {regime_of("weightLoad", storage): PhaseFit(intercept=3.0, samples=3)},
        },
        host=HostFacts(cpu_seconds=0.1, disk_bytes_per_second=2e9),
    )
    # Before any start from a peer, the storage regime stands in, and the prediction says so.
    assert predict(facts, peer, prior).fallbacks["weightLoad"] == regime_of("weightLoad", storage)
    # Weights from a peer in 2.3 s (the two-GPU smoke test, bench/results/peer-smoke-h200x2.json), each start
    # as the operator records it: the log's weightsSource decides the regime.
    observed = [
        Observation(facts=facts, settings=peer, phases={"bootstrap": 10.0, "weightLoad": 2.3})
        for _ in range(3)
    ]
    refitted = fit(observed, prior, hardware=prior.hardware, source="fleet")
    prediction = predict(facts, peer, refitted)
    assert "weightLoad" not in prediction.fallbacks
    # Neither scaled by the host's disk nor bounded by what it has not read.
    assert prediction.phases["weightLoad"] == pytest.approx(2.3, abs=0.3)
    assert predict(facts, storage, refitted).phases["weightLoad"] > 50
