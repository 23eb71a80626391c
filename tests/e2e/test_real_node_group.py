"""A replica across two real pods: a VLLMService with nodesPerReplica 2 on the real node, as the real
LeaderWorkerSet controller runs it, with vLLM's own multi-node processes (CPU build, pipeline parallel 2) in
two containers, each in its own network namespace, the worker finding its leader by name through the
cluster's DNS (hack/node's CoreDNS). The seed Job runs the same topology first, and every rank's compiled
graphs land in the one cache volume. Both pods share the one real node; on kwok, tests/e2e/test_multinode.py
checks one pod per node and what a killed rank does to the group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.realnode import (
    SERVICE,
    START_TIMEOUT_SECONDS,
    advertise_gpus,
    complete_through_service,
    model_and_cache_volumes,
    vllm_service,
)

from tests.conftest import Cluster, Kubectl, RealNode
from tests.e2e.helpers import condition, get_json, seeded_service, wait_for

pytestmark = pytest.mark.e2e

GROUP = f"leaderworkerset.sigs.k8s.io/name={SERVICE}"
SEED = f"app.kubernetes.io/instance={SERVICE},app.kubernetes.io/component=seed"


def group_service() -> dict[str, Any]:
    svc = vllm_service(1)
    # One rank per pod: pipeline parallel 2 (nodesPerReplica's default) of one "GPU" each.
    svc["spec"]["runtime"]["nodesPerReplica"] = 2
    return svc


@pytest.mark.timeout(3 * START_TIMEOUT_SECONDS)
def test_a_group_across_two_pods_is_seeded_and_serves_through_the_cluster_dns(
    real_node: RealNode,
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    operator: Any,
    engine_venv: Path,
    lws: None,
) -> None:
    python = engine_venv / "bin" / "python"
    _, cache = model_and_cache_volumes(kubectl, namespace, cluster.work_dir / "volumes" / namespace, python)
    advertise_gpus(kubectl, 4)
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(group_service()))

    # The seed: two pods of an Indexed Job; index 1 joins index 0 by its name in the seed's headless Service.
    wait_for(
        lambda: seeded_service(kubectl, namespace, SERVICE),
        START_TIMEOUT_SECONDS,
        "the group's seed to fill the cache",
    )
    seeds = (get_json(kubectl, "-n", namespace, "pods", "-l", SEED) or {})["items"]
    assert seeds and all(p["spec"]["nodeName"] == real_node.name for p in seeds)
    # Each pipeline stage compiled its own layers, the worker's too (the Job ends its pod once index 0 has
    # seeded): vLLM keeps them per rank in the one cache.
    ranks = {path.name for path in cache.rglob("rank_*") if path.is_dir()}
    assert {"rank_0_0", "rank_1_0"} <= ranks, ranks

    # The group: the leader serves (the Service selects it), the worker runs the second stage headless.
    def group_ready() -> dict[str, Any] | None:
        group = get_json(kubectl, "-n", namespace, "leaderworkerset", SERVICE) or {}
        return group if (group.get("status") or {}).get("readyReplicas") == 1 else None

    wait_for(group_ready, START_TIMEOUT_SECONDS, "the group Ready")
    pods = (get_json(kubectl, "-n", namespace, "pods", "-l", GROUP) or {})["items"]
    assert len(pods) == 2 and all(p["spec"]["nodeName"] == real_node.name for p in pods)
    assert len({p["status"]["podIP"] for p in pods}) == 2, "the ranks share a network namespace"
    assert wait_for(
        lambda: complete_through_service(kubectl, namespace, SERVICE), 60, "a completion via the Service"
    )

    def recorded() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", SERVICE) or {}
        last = ((svc.get("status") or {}).get("startup") or {}).get("last") or {}
        return svc if last.get("totalSeconds") else None

    svc = wait_for(recorded, 120, "the group's start in status")
    assert condition(svc, "Ready")["status"] == "True"
    leader = next(
        p for p in pods if p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    )
    assert svc["status"]["startup"]["last"]["pod"] == leader["metadata"]["name"]
    worker = next(p for p in pods if p is not leader)
    log = kubectl("-n", namespace, "logs", worker["metadata"]["name"], "-c", "vllm").stdout
    assert "PP1" in log, log[-2000:]
