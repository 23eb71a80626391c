"""Node warming against hostile tenants (issue 35, findings 3 and 7), without a cluster: a namespace's
forged facts take no more than its own fair share of the per-node budget, a claim is bounded by the
capacity of the volume it is on, a warmer holds no more than it was admitted for, and a warmer that finds
nothing (a missing directory, a FIFO, a link to /dev/zero, a dangling link) says so and never reports
warm."""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stoker.api import VLLMService
from stoker.controller.conditions import node_warming_condition
from stoker.controller.settings import OperatorSettings
from stoker.controller.warming import (
    IMPORT_PAGES_BYTES,
    Candidate,
    Node,
    candidate,
    claim_capacity,
    node_warmth,
    plan_warming,
    weights_claim,
)
from stoker.inpod.node_warmer import NOTHING_FOUND_EXIT, Decision, decide
from stoker.predict.model import MAX_CHECKPOINT_BYTES
from stoker.render import short_cache_key
from tests.unit.test_node_warmer import free_port, get
from tests.unit.test_render_memory import FACTS

GIB = 1 << 30
BUDGET, RESERVE = 32 * GIB, 4 * GIB
NODES = [Node("gpu-0", {"gpu": "h100"}, 1024 * GIB)]
# The honest tenant: the 8B checkpoint (16.06 GB) and vLLM 0.26's import pages (1.72 GB).
HONEST = 16_060_000_000 + 1_724_613_741


def warming(namespace: str, name: str, created: str, wanted: int | None) -> Candidate:
    return Candidate(namespace, name, created, True, wanted, 8 * GIB, {"gpu": "h100"}, None)


def admitted(verdicts: dict[tuple[str, str], Any]) -> set[str]:
    return {f"{ns}/{name}" for (ns, name), v in verdicts.items() if v.warming is not None}


@pytest.mark.parametrize("forged_first", [True, False])
def test_forged_facts_take_no_more_than_their_namespaces_share(forged_first: bool) -> None:
    # One namespace's two services claim 1 byte and 28 GiB - 1 (plus the import pages' estimate each):
    # all 32 GiB. Another tenant's honest 16 GB service, created later, still gets warm nodes.
    small = warming("mallory", "small", "2026-01-01T00:00:00Z", 1 + IMPORT_PAGES_BYTES)
    big = warming("mallory", "big", "2026-01-01T00:00:01Z", 28 * GIB - 1 + IMPORT_PAGES_BYTES)
    honest = warming("alice", "llama", "2026-01-02T00:00:00Z", HONEST)
    order = [big, small, honest] if forged_first else [honest, small, big]
    verdicts = plan_warming(order, NODES, BUDGET, RESERVE)
    assert admitted(verdicts) == {"alice/llama", "mallory/small"}
    assert verdicts[("mallory", "big")].reason == "OverBudget"
    # Whatever the forger names its services or when it makes them, its share stays bounded: every
    # admitted byte of the budget fits, and the honest service keeps its place.
    assert sum(v.warming.wanted_bytes for v in verdicts.values() if v.warming) <= BUDGET


def test_a_namespace_gets_its_fair_share_back_from_one_that_borrowed_it() -> None:
    hog = [warming("mallory", f"m{i}", f"2026-01-01T00:00:0{i}Z", 8 * GIB) for i in range(4)]
    alone = plan_warming(hog, NODES, BUDGET, RESERVE)
    assert len(admitted(alone)) == 4  # alone, a namespace may use the whole budget
    late = [warming("alice", "a", "2026-02-01T00:00:00Z", 8 * GIB)]
    late.append(warming("alice", "b", "2026-02-01T00:00:01Z", 8 * GIB))
    shared = plan_warming([*hog, *late], NODES, BUDGET, RESERVE)
    # Two namespaces: 16 GiB each, the oldest services of each first.
    assert admitted(shared) == {"mallory/m0", "mallory/m1", "alice/a", "alice/b"}
    message = shared[("mallory", "m2")].message
    assert "shared by 2 namespaces" in message and "16.0 GiB" in message and "alice" not in message


def test_an_admins_quota_caps_a_namespace_even_with_budget_left() -> None:
    services = [warming("team", f"s{i}", f"2026-01-01T00:00:0{i}Z", 4 * GIB) for i in range(3)]
    verdicts = plan_warming(services, NODES, BUDGET, RESERVE, {"team": 10 * GIB})
    assert admitted(verdicts) == {"team/s0", "team/s1"}
    assert "its quota 10.0 GiB" in verdicts[("team", "s2")].message
    settings = OperatorSettings(node_warming_namespace_quotas_gib={"team": 10, "other": 0.5})
    assert settings.node_warming_namespace_quota_bytes == {"team": 10 * GIB, "other": GIB // 2}
    assert OperatorSettings().node_warming_namespace_quota_bytes == {}  # the default: no caps, fair shares


def reported(checkpoint: int, source: dict[str, Any], import_pages: int | None = None) -> VLLMService:
    svc = VLLMService.model_validate(
        {
            "metadata": {
                "name": "llama",
                "namespace": "mallory",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {
                "model": {"name": "org/llama", **source},
                "coldStart": {
                    "nodeWarming": {"enabled": True},
                    "modelCache": {"enabled": "source" not in source},
                },
            },
        }
    )
    raw = svc.model_dump(mode="json", by_alias=True, exclude_none=True)
    facts = {**FACTS, "checkpointBytes": checkpoint}
    if import_pages is not None:
        facts["importPagesBytes"] = import_pages
    raw["status"] = {"startup": {"model": facts, "modelCacheKey": short_cache_key(svc)}}
    return VLLMService.model_validate(raw)


def test_a_claim_is_bounded_by_the_capacity_of_its_volume() -> None:
    # The facts' physical range allows 64 TiB; the volume the weights are on holds 40 GiB.
    forged = reported(MAX_CHECKPOINT_BYTES, {})
    assert weights_claim(forged) == "llama-model"
    bound = {"status": {"phase": "Bound", "capacity": {"storage": "40Gi"}}}
    assert candidate(forged, claim_capacity(bound)).wanted_bytes == 40 * GIB + IMPORT_PAGES_BYTES
    pvc = reported(MAX_CHECKPOINT_BYTES, {"source": {"pvc": {"claimName": "weights", "path": "/m"}}}, GIB)
    assert weights_claim(pvc) == "weights"
    assert candidate(pvc, 5 * GIB).wanted_bytes == 6 * GIB
    # A claim not bound (its capacity unknown, or only requested) bounds nothing yet: warming waits.
    for unbound in (
        {"status": {"phase": "Pending"}},
        {"spec": {"resources": {"requests": {"storage": "1Gi"}}}},
    ):
        assert claim_capacity(unbound) is None
    waiting = candidate(forged, None)
    (verdict,) = plan_warming([waiting], NODES, BUDGET, RESERVE).values()
    assert verdict.reason == "VolumeNotBound" and "llama-model" in verdict.message


def warmer_pod(node: str, exit_code: int | None, ready: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "node-warmer", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    if exit_code is not None:
        container["lastState"] = {"terminated": {"exitCode": exit_code}}
    return {
        "metadata": {"name": f"w-{node}"},
        "spec": {"nodeName": node},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container],
        },
    }


def test_a_warmer_that_found_nothing_makes_node_warming_say_so() -> None:
    (verdict,) = plan_warming([warming("ns", "x", "t", 20 * GIB)], NODES, BUDGET, RESERVE).values()
    daemonset = {
        "metadata": {"name": "x-node-warmer", "generation": 1},
        "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2},
    }
    pods = [warmer_pod("a", NOTHING_FOUND_EXIT), warmer_pod("b", 137)]
    condition = node_warming_condition(verdict, node_warmth(verdict, daemonset, pods))
    assert (condition.status, condition.reason) == (False, "NothingFound")
    assert "1 of 2 nodes (a)" in condition.message
    # A warmer that crashed otherwise is only not warm yet.
    other = node_warming_condition(verdict, node_warmth(verdict, daemonset, [warmer_pod("b", 137)]))
    assert other.reason == "Warming"


def test_nothing_wanted_is_never_warm() -> None:
    assert decide(0, 0, 10 * GIB, 100 * GIB, 0, 0.0) == Decision("nothingFound", 0, False)


def hostile_trees(root: Path) -> dict[str, Path]:
    """Model paths that hold no checkpoint data: each kind the issue found said warm."""
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "model.safetensors")
    zero = root / "zero"
    zero.mkdir()
    (zero / "model.safetensors").symlink_to("/dev/zero")
    dangling = root / "dangling"
    dangling.mkdir()
    (dangling / "model.safetensors").symlink_to(root / "nowhere")
    return {"missing": root / "missing", "fifo": fifo, "zero": zero, "dangling": dangling}


@pytest.mark.parametrize("kind", ["missing", "fifo", "zero", "dangling"])
def test_a_warmer_that_finds_nothing_exits_saying_so_and_never_answers_ready(
    programs: Path, tmp_path: Path, kind: str
) -> None:
    path = hostile_trees(tmp_path)[kind]
    port = free_port()
    command = [sys.executable, "-m", "stoker.inpod.node_warmer", "--service", "ns/llama"]
    command += ["--pages", str(tmp_path / "no-listing"), "--budget-bytes", str(GIB), "--reserve-bytes", "0"]
    command += ["--interval", "0.2", "--port", str(port), "--", str(path)]
    agent = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": str(programs)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    answers = []
    deadline = time.monotonic() + 10
    while agent.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):  # not listening yet, or shutting down
            answers.append(get(port, "/ready")[0])
        time.sleep(0.05)
    output, _ = agent.communicate(timeout=10)
    assert agent.returncode == NOTHING_FOUND_EXIT, output
    assert 200 not in answers
    assert '"state": "nothingFound"' in output
    assert "found nothing to keep warm: no *.safetensors data under" in output
