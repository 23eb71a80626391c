"""coldStart.nodeWarming without a cluster: the warmer DaemonSet as rendered, the per-node budget planner,
node matching, the NodeWarming condition and status.nodeWarming."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.controller.conditions import node_warming_condition
from stoker.controller.warming import (
    IMPORT_PAGES_BYTES,
    Candidate,
    Node,
    Taint,
    candidate,
    node_matches,
    node_of,
    node_warmth,
    plan_warming,
)
from stoker.render import NODE_WARMER_PORT, Warming, build_deployment, render_children, short_cache_key
from stoker.render.nodewarmer import WARMER_OVERHEAD_BYTES
from stoker.render.prefetch import read_ahead_paths, serving_invocation
from tests.unit.test_render_memory import FACTS

GIB = 1 << 30
BUDGET, RESERVE = 32 * GIB, 4 * GIB


def service(gpus: int = 2, runtime: dict[str, Any] | None = None, **cold_start: Any) -> VLLMService:
    return VLLMService.model_validate(
        {
            "metadata": {"name": "llama", "namespace": "team", "creationTimestamp": "2026-11-27T00:00:00Z"},
            "spec": {
                "model": {"name": "org/llama", "source": {"pvc": {"claimName": "weights", "path": "/llama"}}},
                "runtime": {"nodeSelector": {"gpu": "h100"}, "gpus": gpus, **(runtime or {})},
                "pod": {
                    "serviceAccountName": "inference",
                    "imagePullSecrets": [{"name": "registry"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
                    "priorityClassName": "high",
                },
                "coldStart": {"nodeWarming": {"enabled": True}, **cold_start},
            },
        }
    )


def warmer(svc: VLLMService, wanted: int = 16 * GIB) -> dict[str, Any]:
    children = render_children(svc, warming=Warming(wanted, RESERVE))
    return next(c for c in children if c["kind"] == "DaemonSet")


def test_node_warming_is_off_by_default_and_refuses_non_booleans() -> None:
    svc = VLLMService.model_validate({"metadata": {"name": "x"}, "spec": {"model": {"name": "m"}}})
    assert svc.spec.cold_start.node_warming.enabled is False
    assert all(c["kind"] != "DaemonSet" for c in render_children(svc))
    with pytest.raises(ValidationError, match="nodeWarming"):
        VLLMService.model_validate(
            {
                "metadata": {"name": "x"},
                "spec": {"model": {"name": "m"}, "coldStart": {"nodeWarming": {"on": 1}}},
            }
        )


def test_the_warmer_runs_where_serving_pods_run_with_their_image_and_read_only_volumes() -> None:
    svc = service()
    daemonset = warmer(svc)
    serving = build_deployment(svc)["spec"]["template"]["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["name"] == "llama-node-warmer"
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/component"] == "node-warmer"
    for same in ("nodeSelector", "affinity", "serviceAccountName", "imagePullSecrets", "securityContext"):
        assert pod[same] == serving[same], same
    assert pod["automountServiceAccountToken"] is False
    assert "priorityClassName" not in pod  # a warmer never preempts anything
    assert [c["name"] for c in pod["initContainers"]] == [c["name"] for c in serving["initContainers"]][:1]
    (container,) = pod["containers"]
    assert container["image"] == serving["containers"][0]["image"]
    assert all(mount["readOnly"] for mount in container["volumeMounts"])
    assert {v["name"] for v in pod["volumes"]} == {m["name"] for m in container["volumeMounts"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "warmer"}
    assert container["ports"][0]["containerPort"] == NODE_WARMER_PORT
    assert container["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"memory": str(16 * GIB + (256 << 20))},
    }
    assert not any(env.get("valueFrom") for env in container["env"])


def test_the_warmer_reads_what_the_read_ahead_reads() -> None:
    svc = service()
    command = warmer(svc)["spec"]["template"]["spec"]["containers"][0]["command"]
    read_ahead = serving_invocation(svc).command
    pages = read_ahead[read_ahead.index("--pages") + 1]
    assert command == [
        "python3",
        "-m",
        "stoker.inpod.node_warmer",
        "--service",
        "team/llama",
        "--pages",
        pages,
        "--budget-bytes",
        str(16 * GIB),  # what this warmer was admitted for, not the whole per-node budget
        "--reserve-bytes",
        str(RESERVE),
        "--",
        *read_ahead_paths(svc),
    ]
    assert read_ahead_paths(svc) == ["/models/llama"]
    limit = warmer(svc)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert int(limit) == 16 * GIB + WARMER_OVERHEAD_BYTES  # it cannot hold more than it was admitted for


def test_a_shared_gpu_claim_and_gate_stay_off_the_warmer() -> None:
    svc = service(gpus=1, standby={"replicas": 2, "sharedGpu": {"resourceClaimName": "gpu"}})
    pod = warmer(svc)["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod and "schedulingGates" not in pod
    assert "claims" not in pod["containers"][0]["resources"]


def node(name: str, memory_gib: int, **labels: str) -> Node:
    return Node(name, labels, memory_gib * GIB)


def test_node_matching_reads_the_selector_and_required_affinity() -> None:
    h100 = node("a", 512, gpu="h100", zone="z1")
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": "NotIn", "values": ["z3"]},
                        {"key": "gpu", "operator": "Exists"},
                        {"key": "spot", "operator": "DoesNotExist"},
                    ]
                },
            ]
        }
    }
    assert node_matches(h100, {"gpu": "h100"}, affinity)
    assert not node_matches(h100, {"gpu": "a100"}, None)
    assert not node_matches(node("b", 512, gpu="h100", zone="z1", spot="yes"), {}, affinity)
    assert not node_matches(node("c", 512, zone="z3"), {}, affinity)
    by_name = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
    ]}}  # fmt: skip
    assert node_matches(h100, {}, by_name) and not node_matches(node("b", 1), {}, by_name)
    assert node_of(
        {"metadata": {"name": "n", "labels": {"x": "y"}}, "status": {"allocatable": {"memory": "2Gi"}}}
    ) == (Node("n", {"x": "y"}, 2 * GIB))


def cand(
    name: str, created: str, wanted: int | None, on_volume: bool = True, request: int = 8 * GIB
) -> Candidate:
    return Candidate("ns", name, created, on_volume, wanted, request, {"gpu": "h100"}, None)


def test_the_budget_goes_in_creation_order_and_skipped_services_take_none() -> None:
    nodes = [node("big", 512, gpu="h100"), node("other", 4096, gpu="a100")]
    verdicts = plan_warming(
        [
            cand("late", "2026-01-03T00:00:00Z", 10 * GIB),
            cand("first", "2026-01-01T00:00:00Z", 20 * GIB),
            cand("huge", "2026-01-02T00:00:00Z", 100 * GIB),  # over the budget alone
            cand("seedless", "2026-01-02T00:00:00Z", None),
            cand("hub", "2026-01-02T00:00:00Z", 5 * GIB, on_volume=False),
            cand("second", "2026-01-02T00:00:00Z", 12 * GIB),
        ],
        nodes,
        BUDGET,
        RESERVE,
    )
    reasons = {key[1]: v.reason or "admitted" for key, v in verdicts.items()}
    assert reasons == {
        "first": "admitted",
        "huge": "OverBudget",
        "seedless": "WaitingForSeed",
        "hub": "WeightsNotOnVolume",
        "second": "admitted",  # 20 + 12 = 32 GiB: exactly the budget
        "late": "OverBudget",
    }
    assert verdicts[("ns", "first")].warming == Warming(20 * GIB, RESERVE)
    message = verdicts[("ns", "late")].message
    assert "(ns/first, ns/second)" in message and "32.0 GiB" in message and "0.0 GiB is left" in message


def test_an_over_budget_message_names_no_service_of_another_namespace() -> None:
    # A condition is read by its namespace's users: the budget's other holders are counted, not named.
    nodes = [node("big", 512, gpu="h100")]
    other = replace(cand("payments-model", "2026-01-01T00:00:00Z", 16 * GIB), namespace="payments")
    verdicts = plan_warming([other, cand("mine", "2026-01-02T00:00:00Z", 20 * GIB)], nodes, BUDGET, RESERVE)
    message = verdicts[("ns", "mine")].message
    assert verdicts[("ns", "mine")].reason == "OverBudget"
    assert "shared by 2 namespaces: this one's fair share is 16.0 GiB" in message
    assert "0 warming services of this namespace take 0.0 GiB and 16.0 GiB is left" in message
    assert "payments" not in message


def test_a_node_must_hold_the_pages_beside_a_serving_pod() -> None:
    small = [node("small", 24, gpu="h100"), node("roomy", 4096, gpu="a100")]
    (verdict,) = plan_warming([cand("x", "t", 20 * GIB)], small, BUDGET, RESERVE).values()
    assert verdict.reason == "NodeMemoryTooSmall" and verdict.warming is None
    assert "small" in verdict.message and "24.0 GiB" in verdict.message and "28.0 GiB" in verdict.message
    (none,) = plan_warming([cand("x", "t", 20 * GIB)], [node("roomy", 4096, gpu="a100")], BUDGET, 0).values()
    assert none.reason == "NodeMemoryTooSmall" and "no node matches" in none.message


def test_a_node_whose_taints_the_replicas_do_not_tolerate_is_not_one_they_land_on() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    tainted = node_of(
        {
            "metadata": {"name": "big", "labels": {"gpu": "h100"}},
            "spec": {
                "taints": [
                    gpu_taint,
                    {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"},  # comes and goes
                    {"key": "soft", "effect": "PreferNoSchedule"},  # does not keep pods off
                ]
            },
            "status": {"allocatable": {"memory": "512Gi"}},
        }
    )
    assert tainted.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert not node_matches(tainted, {"gpu": "h100"}, None)
    for tolerations in (
        [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        [{"operator": "Exists"}],
    ):
        assert node_matches(tainted, {"gpu": "h100"}, None, tolerations), tolerations
    for tolerations in (
        [{"key": "nvidia.com/gpu", "value": "absent"}],
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
    ):
        assert not node_matches(tainted, {"gpu": "h100"}, None, tolerations), tolerations
    refused = Candidate("ns", "x", "t", True, 20 * GIB, 8 * GIB, {"gpu": "h100"}, None)
    (verdict,) = plan_warming([refused], [tainted], BUDGET, RESERVE).values()
    assert verdict.reason == "NodeMemoryTooSmall" and "tolerations" in verdict.message
    tolerating = Candidate(
        "ns", "x", "t", True, 20 * GIB, 8 * GIB, {"gpu": "h100"}, None, ({"operator": "Exists"},)
    )
    (verdict,) = plan_warming([tolerating], [tainted], BUDGET, RESERVE).values()
    assert verdict.warming is not None
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert candidate(service(runtime={"tolerations": [toleration]})).tolerations == (toleration,)


def test_a_candidate_counts_the_seeds_checkpoint_and_import_pages() -> None:
    svc = service()
    assert candidate(svc).wanted_bytes is None  # the seed has not reported
    facts = {**FACTS, "checkpointBytes": 16 * GIB}
    raw = svc.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["status"] = {"startup": {"model": facts, "modelCacheKey": short_cache_key(svc)}}
    reported = VLLMService.model_validate(raw)
    seen = candidate(reported)
    assert seen.wanted_bytes == 16 * GIB + IMPORT_PAGES_BYTES  # a seed that did not say: the estimate
    assert seen.node_selector == {"gpu": "h100"} and seen.created == "2026-11-27T00:00:00Z"
    raw["status"]["startup"]["model"]["importPagesBytes"] = 1724613741  # what vLLM 0.26's seed recorded
    assert candidate(VLLMService.model_validate(raw)).wanted_bytes == 16 * GIB + 1724613741


def ready_pod(node_name: str, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": f"w-{node_name}"},
        "spec": {"nodeName": node_name},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_condition_and_status_follow_the_daemonset() -> None:
    (verdict,) = plan_warming(
        [cand("x", "t", 20 * GIB)], [node("n", 512, gpu="h100")], BUDGET, RESERVE
    ).values()
    daemonset = {
        "metadata": {"name": "x-node-warmer", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": 2,
            "updatedNumberScheduled": 2,
            "numberReady": 1,
        },
    }
    pods = [ready_pod("b", True), ready_pod("a", False)]
    warming = node_warmth(verdict, daemonset, pods)
    assert warming.document == {
        "budgetBytes": BUDGET,
        "wantedBytes": 20 * GIB,
        "desiredNodes": 2,
        "warmNodes": 1,
        "nodes": [{"node": "a", "warm": False}, {"node": "b", "warm": True}],
    }
    cold = node_warming_condition(verdict, warming)
    assert (cold.status, cold.reason) == (False, "Warming") and "1/2 nodes warm" in cold.message
    daemonset["status"]["numberReady"] = 2
    warm = node_warming_condition(verdict, node_warmth(verdict, daemonset, [ready_pod("a", True)]))
    assert (warm.status, warm.reason) == (True, "Warm") and "all 2 nodes" in warm.message
    assert "20.0 GiB" in warm.message and "32.0 GiB" in warm.message
    (skipped,) = plan_warming([cand("x", "t", None)], [], BUDGET, RESERVE).values()
    condition = node_warming_condition(skipped, node_warmth(skipped, None, []))
    assert (condition.status, condition.reason) == (False, "WaitingForSeed")
