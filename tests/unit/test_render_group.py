"""Parallel layouts and multi-node groups: the flags each engine version spells, the LeaderWorkerSet, and a
seed that runs the serving pods' layout."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.engines import SUPPORTED
from stoker.render import cache_key, engine_invocation, key_relevant_args, render_children
from stoker.render.group import LWS_KIND
from stoker.render.seed import seed_invocation
from tests.unit.test_render import service_from

GROUP: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "moe", "namespace": "ml"},
    "spec": {"model": {"name": "Qwen/Qwen3-235B-A22B"}, "runtime": {"gpus": 8, "replicas": 2}},
}
VERSIONS = [f"{profile.first[0]}.{profile.first[1]}.0" for profile in SUPPORTED]


def group(**changes: Any) -> VLLMService:
    return service_from(GROUP, **changes)


def by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in children}


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def engine_args(spec: dict[str, Any]) -> list[str]:
    return next(c for c in spec["containers"] if c["name"] == "vllm")["args"]


@pytest.mark.parametrize("version", VERSIONS)
def test_one_node_layouts_render_each_versions_flags(version: str) -> None:
    svc = group(
        **{
            "runtime.engineVersion": version,
            "runtime.tensorParallelSize": 2,
            "runtime.pipelineParallelSize": 2,
            "runtime.dataParallelSize": 2,
            "runtime.expertParallel": True,
        }
    )
    flags = svc.spec.runtime.engine_profile.flags
    for role in ("seed", "serve"):
        args = engine_invocation(svc, role).args
        assert flag_value(args, flags.tensor_parallel_size) == "2"
        assert flag_value(args, flags.pipeline_parallel_size) == "2"
        assert flag_value(args, flags.data_parallel_size) == "2"
        assert flags.expert_parallel in args
        assert flags.nnodes not in args  # one node: vLLM's default
    assert LWS_KIND not in by_kind(render_children(svc))


def test_defaults_render_no_layout_flags() -> None:
    args = engine_invocation(group(), "serve").args
    assert flag_value(args, "--tensor-parallel-size") == "8"
    for flag in ("--pipeline-parallel-size", "--data-parallel-size", "--enable-expert-parallel", "--nnodes"):
        assert flag not in args


def test_layout_sizes_enter_the_cache_key() -> None:
    base = cache_key(group(**{"runtime.tensorParallelSize": 4}))
    assert cache_key(group(**{"runtime.tensorParallelSize": 4, "runtime.pipelineParallelSize": 2})) != base
    assert cache_key(group(**{"runtime.tensorParallelSize": 4, "runtime.dataParallelSize": 2})) != base
    assert cache_key(group(**{"runtime.tensorParallelSize": 4, "runtime.expertParallel": True})) != base


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"gpus": 4, "tensorParallelSize": 4, "pipelineParallelSize": 2}, "runtime.gpus"),
        ({"nodesPerReplica": 2, "tensorParallelSize": 16}, "runtime.nodesPerReplica"),
        (
            {"nodesPerReplica": 2, "tensorParallelSize": 8, "pipelineParallelSize": 1},
            "runtime.nodesPerReplica",
        ),
        (
            {"nodesPerReplica": 2, "tensorParallelSize": 8, "pipelineParallelSize": 1, "dataParallelSize": 2},
            "runtime.dataParallelSize",
        ),
    ],
)
def test_layouts_that_leave_gpus_idle_or_split_a_rank_are_refused(
    runtime: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field.split(".")[-1]):
        group(**{f"runtime.{key}": value for key, value in runtime.items()})


@pytest.mark.parametrize(
    ("cold_start", "field"),
    [
        ({"standby": {"replicas": 1}}, "coldStart.standby"),
        ({"compileCache": {"accessMode": "ReadWriteOnce"}}, "coldStart.compileCache.accessMode"),
        (
            {"modelCache": {"enabled": True, "accessMode": "ReadWriteOncePod"}},
            "coldStart.modelCache.accessMode",
        ),
    ],
)
def test_cold_start_features_that_cannot_span_nodes_are_refused(
    cold_start: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        group(**{"runtime.nodesPerReplica": 2, **{f"coldStart.{k}": v for k, v in cold_start.items()}})


def test_a_multi_node_replica_is_a_leader_worker_set_group() -> None:
    svc = group(**{"runtime.nodesPerReplica": 2, "runtime.expertParallel": True})
    children = by_kind(render_children(svc))
    assert "Deployment" not in children
    lws = children[LWS_KIND]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"  # LeaderReady would wait forever
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    leader_args, worker_args = engine_args(leader["spec"]), engine_args(worker["spec"])
    # One layout for every rank: TP 8 within a node, PP 2 across the two, vLLM's own processes (no Ray).
    for args in (leader_args, worker_args):
        assert flag_value(args, "--tensor-parallel-size") == "8"
        assert flag_value(args, "--pipeline-parallel-size") == "2"
        assert flag_value(args, "--nnodes") == "2"
        assert "--enable-expert-parallel" in args
        assert flag_value(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert flag_value(args, "--master-port") == "29500"
        assert not any("ray" in arg for arg in args)
    assert flag_value(leader_args, "--node-rank") == "0" and "--headless" not in leader_args
    assert flag_value(worker_args, "--node-rank") == "$(LWS_WORKER_INDEX)" and worker_args[-1] == "--headless"
    # The leader serves and is probed; a headless rank answers no HTTP.
    leader_engine = next(c for c in leader["spec"]["containers"] if c["name"] == "vllm")
    worker_engine = next(c for c in worker["spec"]["containers"] if c["name"] == "vllm")
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader_engine)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker_engine)
    assert leader_engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker_engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # Only leaders are behind the Service.
    selector = children["Service"]["spec"]["selector"]
    assert all(leader["metadata"]["labels"][k] == v for k, v in selector.items())
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"


def test_the_seed_runs_the_groups_layout_one_pod_per_node() -> None:
    svc = group(**{"runtime.nodesPerReplica": 2, "runtime.expertParallel": True})
    children = render_children(svc)
    job = next(c for c in children if c["kind"] == "Job")
    lws = by_kind(children)[LWS_KIND]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    # Done when the leader has seeded; the Job then stops the other ranks.
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    seed_service = next(c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "moe-seed")
    assert seed_service["spec"]["clusterIP"] == "None"
    assert spec["template"]["spec"]["subdomain"] == "moe-seed"
    seed_args = engine_args(spec["template"]["spec"])
    assert flag_value(seed_args, "--node-rank") == "$(JOB_COMPLETION_INDEX)"
    assert flag_value(seed_args, "--master-addr") == f"{job['metadata']['name']}-0.moe-seed"
    at = seed_args.index("--group-worker")
    assert seed_args[at + 1 : at + 3] == ["JOB_COMPLETION_INDEX", "--worker-arg=--headless"]
    # One start: the headless ranks would not join a second one of the leader's.
    assert "--start-again" not in seed_args
    assert "--start-again" in seed_invocation(group()).args
    # The same layout as serving: the args vLLM hashes agree, apart from the weights loader.
    profile = svc.spec.runtime.engine_profile
    serve = key_relevant_args(engine_invocation(svc, "serve").args, profile)
    seed = key_relevant_args(engine_invocation(svc, "seed").args, profile)
    assert serve == seed
    serving_args = engine_args(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"])
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--nnodes"):
        assert flag_value(seed_args, flag) == flag_value(serving_args, flag)
    assert (
        seed_invocation(svc).args[-len(engine_invocation(svc, "seed").argv) :]
        == engine_invocation(svc, "seed").argv
    )


def test_a_one_node_service_has_no_seed_service() -> None:
    names = [(c["kind"], c["metadata"]["name"]) for c in render_children(group())]
    assert ("Service", "moe-seed") not in names
    assert ("Deployment", "moe") in names
