"""A multi-node group's ranks as each release's own `vllm serve` parser reads them (0.22.1 to 0.33.0): the
leader's, a worker's and a seed worker's rendered arguments, with the variables the kubelet expands set,
give the layout and ranks stoker means. Environments as in bench/conformance/serve_options.py; without one
the release is skipped, and with STOKER_REQUIRE_CONFORMANCE=1 that fails for a release of versions.py."""

from __future__ import annotations

import os

import pytest
from bench.conformance import serve_options as real
from bench.conformance.versions import CPU_VERSIONS, PARSE_ONLY_VERSIONS

from stoker.api import VLLMService
from stoker.render import render_children
from stoker.render.group import LWS_KIND
from tests.unit.test_render_group import group

MATRIX = (*CPU_VERSIONS, *PARSE_ONLY_VERSIONS)
# What the kubelet expands in a group's pods (LWS's webhook and the Job controller set the variables).
EXPANDED = {"$(LWS_LEADER_ADDRESS)": "10.0.0.1", "$(LWS_WORKER_INDEX)": "1", "$(JOB_COMPLETION_INDEX)": "1"}


def moe_group(version: str) -> VLLMService:
    return group(
        **{"runtime.engineVersion": version, "runtime.nodesPerReplica": 2, "runtime.expertParallel": True}
    )


def engine_args(spec: dict) -> list[str]:
    args = next(c for c in spec["containers"] if c["name"] == "vllm")["args"]
    return [EXPANDED.get(arg, arg) for arg in args]


def parsed(version: str, argvs: list[list[str]]) -> list[dict[str, str] | None]:
    request = {
        "argvs": [["serve", *argv] for argv in argvs],
        "json_flag_dest": "compilation_config",
        "json_keys": [],
    }
    try:
        return real.ask_vllm(version, request)
    except LookupError as missing:
        if os.environ.get("STOKER_REQUIRE_CONFORMANCE") and version in MATRIX:
            pytest.fail(str(missing))
        pytest.skip(str(missing))


@pytest.mark.parametrize("version", MATRIX)
def test_each_rank_of_a_group_parses_as_its_rank(version: str) -> None:
    children = render_children(moe_group(version))
    template = next(c for c in children if c["kind"] == LWS_KIND)["spec"]["leaderWorkerTemplate"]
    seed = next(c for c in children if c["kind"] == "Job")["spec"]["template"]["spec"]
    seed_args = engine_args(seed)
    # The seed program's COMMAND (after `--`, without `vllm serve`), as a worker index runs it.
    seed_worker = [*seed_args[seed_args.index("--") + 3 :], "--headless"]
    leader, worker, seeding = parsed(
        version,
        [
            engine_args(template["leaderTemplate"]["spec"]),
            engine_args(template["workerTemplate"]["spec"]),
            seed_worker,
        ],
    )
    for namespace in (leader, worker, seeding):
        assert namespace is not None, f"vLLM {version} refused a rank's arguments"
        assert namespace["tensor_parallel_size"] == "8"
        assert namespace["pipeline_parallel_size"] == "2"
        assert namespace["nnodes"] == "2"
        assert namespace["master_port"] == "29500"
        assert namespace["enable_expert_parallel"] == "True"
    assert (leader["node_rank"], leader["headless"], leader["master_addr"]) == ("0", "False", "'10.0.0.1'")
    assert (worker["node_rank"], worker["headless"], worker["master_addr"]) == ("1", "True", "'10.0.0.1'")
    assert (seeding["node_rank"], seeding["headless"]) == ("1", "True")
    assert (
        seeding["master_addr"]
        == f"'{next(c for c in children if c['kind'] == 'Job')['metadata']['name']}-0.moe-seed'"
    )
    # No Ray: the executor is left to vLLM, which takes `mp` for nnodes > 1.
    assert leader.get("distributed_executor_backend") in (None, "None")
