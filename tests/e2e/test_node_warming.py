"""coldStart.nodeWarming on the real control plane: a service whose seed reported its checkpoint gets a
node warmer DaemonSet on the nodes its replicas can land on (kwok marks the warmer pods Ready), NodeWarming
turns True and status.nodeWarming names the warm node; a second service whose checkpoint does not fit what
the first left of the per-node budget is skipped with OverBudget and gets no DaemonSet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hack.kwoklogs import print_recording

from stoker.api.owned import CACHE_VOLUME, MODEL_CACHE_VOLUME
from stoker.render import COMPONENT_NODE_WARMER, NODE_WARMER_PORT
from tests.e2e.helpers import (
    DATA,
    WARM_NODE,
    apply,
    condition,
    get_json,
    get_service,
    wait_for,
    warm_node,
    warming_service,
)

pytestmark = pytest.mark.e2e

GIB = 1 << 30
BUDGET = 32 * GIB  # the operator's default STOKER_NODE_WARMING_BUDGET_GIB
__all__ = ["warm_node"]  # the fixture, used by name


def seed_reports_facts(kubectl: Any, namespace: str, name: str, workdir: Path) -> None:
    """The seed's pod "prints" a recorded seed log with the model's facts line (~16 GB of weights)."""
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=seed"
    print_recording(kubectl, namespace, selector, DATA / "seed-with-facts.log", workdir)


def test_a_warming_service_gets_warm_nodes_and_one_over_budget_is_skipped(
    namespace: str, kubectl: Any, operator: Any, warm_node: dict[str, str], tmp_path: Path
) -> None:
    apply(kubectl, namespace, warming_service("first", warm_node))
    # Before the seed has reported the checkpoint's size there is nothing to size a warmer by.
    waiting = wait_for(
        lambda: (
            condition(get_service(kubectl, namespace, "first"), "NodeWarming").get("reason")
            == "WaitingForSeed"
        ),
        what="NodeWarming=False/WaitingForSeed",
    )
    assert waiting
    assert get_json(kubectl, "-n", namespace, "daemonset", "first-node-warmer") is None
    seed_reports_facts(kubectl, namespace, "first", tmp_path)

    daemonset = wait_for(
        lambda: get_json(kubectl, "-n", namespace, "daemonset", "first-node-warmer"),
        what="the node warmer DaemonSet",
    )
    deployment = get_json(kubectl, "-n", namespace, "deployment", "first")
    assert deployment is not None
    serving = deployment["spec"]["template"]["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/component"] == COMPONENT_NODE_WARMER
    assert daemonset["metadata"]["ownerReferences"][0]["kind"] == "VLLMService"
    # Where the replicas land, as the serving pods run: their image, selector and volumes, read-only.
    assert pod["nodeSelector"] == serving["nodeSelector"] == warm_node
    (warmer,) = pod["containers"]
    assert warmer["image"] == serving["containers"][0]["image"]
    assert warmer["volumeMounts"] and all(m["readOnly"] for m in warmer["volumeMounts"])
    assert {m["name"] for m in warmer["volumeMounts"]} >= {CACHE_VOLUME, MODEL_CACHE_VOLUME}
    assert warmer["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert warmer["ports"][0]["containerPort"] == NODE_WARMER_PORT
    assert "nvidia.com/gpu" not in json.dumps(warmer["resources"])
    assert pod["automountServiceAccountToken"] is False

    def warm() -> dict[str, Any] | None:
        obj = get_service(kubectl, namespace, "first")
        return obj if condition(obj, "NodeWarming").get("status") == "True" else None

    first = wait_for(warm, what="NodeWarming=True on the fake node")
    assert condition(first, "NodeWarming")["reason"] == "Warm"
    status = first["status"]["nodeWarming"]
    checkpoint = first["status"]["startup"]["model"]["checkpointBytes"]
    assert status["wantedBytes"] > checkpoint  # the import pages too
    assert status["budgetBytes"] == BUDGET
    assert status["desiredNodes"] == status["warmNodes"] == 1
    assert status["nodes"] == [{"node": WARM_NODE, "warm": True}]
    metrics = operator.metrics()
    assert f'stoker_node_warming_nodes{{namespace="{namespace}",service="first",state="warm"}} 1.0' in metrics
    assert f'stoker_node_warming_wanted_bytes{{namespace="{namespace}",service="first"}}' in metrics

    # A second service of the same model: two checkpoints and their import pages exceed 32 GiB per node.
    apply(kubectl, namespace, warming_service("second", warm_node))
    seed_reports_facts(kubectl, namespace, "second", tmp_path)

    def over_budget() -> dict[str, Any] | None:
        found = condition(get_service(kubectl, namespace, "second"), "NodeWarming")
        return found if found.get("reason") == "OverBudget" else None

    skipped = wait_for(over_budget, what="NodeWarming=False/OverBudget")
    assert skipped["status"] == "False"
    assert f"{namespace}/first" in skipped["message"] and "32.0 GiB" in skipped["message"]
    assert get_json(kubectl, "-n", namespace, "daemonset", "second-node-warmer") is None
    # The first keeps its warm node.
    assert condition(get_service(kubectl, namespace, "first"), "NodeWarming")["status"] == "True"

    # Turning warming off deletes the warmer and the status.
    kubectl(
        "-n", namespace, "patch", "vllmservice", "first", "--type=merge",
        "-p", json.dumps({"spec": {"coldStart": {"nodeWarming": {"enabled": False}}}}),
    )  # fmt: skip
    wait_for(
        lambda: get_json(kubectl, "-n", namespace, "daemonset", "first-node-warmer") is None,
        what="the warmer deleted",
    )
    # The budget it held goes to the second service.
    wait_for(
        lambda: (
            condition(get_service(kubectl, namespace, "second"), "NodeWarming").get("reason")
            in ("Warming", "Warm")
        ),
        timeout=60,
        what="the second service admitted once the first stopped warming",
    )
    assert "nodeWarming" not in get_service(kubectl, namespace, "first")["status"]
