"""A replica across nodes on the real control plane with the real LeaderWorkerSet controller (sigs.k8s.io/lws,
built from the Go module proxy by hack/lws, its webhooks called by the API server): the objects stoker
renders, the seed of the group's topology, the group's status, and a rank's pod killed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hack.kwoklogs import print_recording

from tests.e2e.helpers import condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


def group_service(name: str, nodes: int, **cold_start: object) -> dict:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen3-30B-A3B"},
            # Every fake node has 8 GPUs: one pod of a group per node.
            "runtime": {"replicas": 1, "gpus": 8, "nodesPerReplica": nodes, "expertParallel": True},
            "coldStart": cold_start,
        },
    }


def apply(kubectl, namespace: str, manifest: dict) -> None:
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))


def owned_by(obj: dict, owner: dict) -> bool:
    return any(ref["uid"] == owner["metadata"]["uid"] for ref in obj["metadata"].get("ownerReferences") or [])


def group_pods(kubectl, namespace: str, name: str) -> list[dict]:
    pods = get_json(kubectl, "-n", namespace, "pods", "-l", f"{LWS_NAME}={name}")["items"]
    return sorted(
        (pod for pod in pods if not pod["metadata"].get("deletionTimestamp")),
        key=lambda pod: pod["metadata"]["name"],
    )


def engine_args(pod: dict) -> list[str]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")["args"]


def test_a_group_is_seeded_in_its_topology_served_and_recreated_whole(namespace, kubectl, operator, lws):
    apply(kubectl, namespace, group_service("group", nodes=2))
    svc = wait_ready(kubectl, namespace, "group", timeout=180)
    key = svc["status"]["cache"]["key"][:10]

    # The seed: one pod per node of the group, each its node rank, the leader's address in DNS.
    job = get_json(kubectl, "-n", namespace, "job", f"group-seed-{key}")
    assert job and owned_by(job, svc)
    assert job["spec"]["completionMode"] == "Indexed"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert any(c["type"] in ("Complete", "SuccessCriteriaMet") for c in job["status"]["conditions"])
    assert condition(svc, "CacheSeeded")["status"] == "True"
    seed_args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    at = seed_args.index("--group-worker")
    assert seed_args[at + 1 : at + 3] == ["JOB_COMPLETION_INDEX", "--worker-arg=--headless"]
    assert seed_args[-6:] == [
        "--node-rank",
        "$(JOB_COMPLETION_INDEX)",
        "--master-addr",
        f"group-seed-{key}-0.group-seed",
        "--master-port",
        "29500",
    ]
    seed_service = get_json(kubectl, "-n", namespace, "service", "group-seed")
    assert seed_service["spec"]["clusterIP"] == "None" and owned_by(seed_service, svc)
    assert job["spec"]["template"]["spec"]["subdomain"] == "group-seed"

    # The group: a LeaderWorkerSet of stoker's, no Deployment.
    lws_obj = get_json(kubectl, "-n", namespace, "leaderworkerset", "group")
    assert lws_obj and owned_by(lws_obj, svc)
    template = lws_obj["spec"]["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    assert lws_obj["spec"]["startupPolicy"] == "LeaderCreated"
    assert kubectl("-n", namespace, "get", "deployment", "group", check=False).returncode != 0
    assert lws_obj["status"]["readyReplicas"] == 1
    assert svc["status"]["readyReplicas"] == 1 and svc["status"]["ready"] == "1/1"

    leader, worker = group_pods(kubectl, namespace, "group")
    assert (leader["metadata"]["labels"][WORKER_INDEX], worker["metadata"]["labels"][WORKER_INDEX]) == (
        "0",
        "1",
    )
    assert leader["spec"]["nodeName"] != worker["spec"]["nodeName"]
    # LWS's pod webhook ran: the variables the ranks' flags name are there.
    worker_env = {e["name"] for e in worker["spec"]["containers"][0]["env"]}
    assert {"LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE"} <= worker_env
    for pod in (leader, worker):
        args = engine_args(pod)
        assert args[args.index("--nnodes") + 1] == "2" and "--enable-expert-parallel" in args
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert engine_args(leader)[engine_args(leader).index("--node-rank") + 1] == "0"
    assert engine_args(worker)[-1] == "--headless" and "$(LWS_WORKER_INDEX)" in engine_args(worker)
    assert "readinessProbe" in leader["spec"]["containers"][0]
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    # Only the leader serves: the Service selects it, not the headless rank.
    selector = get_json(kubectl, "-n", namespace, "service", "group")["spec"]["selector"]
    assert all(leader["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert not all(worker["metadata"]["labels"].get(k) == v for k, v in selector.items())

    # A rank's pod killed: LWS recreates the whole group (RecreateGroupOnPodRestart), the leader too.
    kubectl("-n", namespace, "delete", "pod", worker["metadata"]["name"], "--wait=false")

    def recreated() -> bool:
        pods = group_pods(kubectl, namespace, "group")
        return len(pods) == 2 and pods[0]["metadata"]["uid"] != leader["metadata"]["uid"]

    wait_for(recreated, timeout=120, what="the group's leader recreated after a worker was deleted")
    wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "leaderworkerset", "group")["status"].get("readyReplicas"))
            == 1
        ),
        timeout=120,
        what="the recreated group ready",
    )
    svc = wait_ready(kubectl, namespace, "group", timeout=120)
    assert svc["status"]["readyReplicas"] == 1


def test_a_group_with_a_rank_that_cannot_run_is_not_ready(namespace, kubectl, operator, lws):
    # Three pods of 8 GPUs on two fake nodes of 8: the leader and one worker run (kwok makes them Ready),
    # the third rank stays Pending, so the group is not ready, and neither is the service.
    apply(kubectl, namespace, group_service("stuck", nodes=3, seed={"enabled": False}))

    def pending_rank() -> dict | None:
        pods = group_pods(kubectl, namespace, "stuck")
        pending = [pod for pod in pods if pod["status"].get("phase") == "Pending"]
        ready = [pod for pod in pods if condition(pod, "Ready").get("status") == "True"]
        return pods[0] if len(pods) == 3 and len(pending) == 1 and len(ready) == 2 else None

    leader = wait_for(pending_rank, timeout=120, what="two ranks Ready and one Pending")
    assert leader["metadata"]["labels"][WORKER_INDEX] == "0"

    def reported() -> dict | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "stuck")
        degraded = condition(svc, "Degraded")
        return svc if degraded.get("reason") == "Unschedulable" else None

    svc = wait_for(reported, timeout=120, what="Degraded=Unschedulable")
    assert condition(svc, "Ready")["status"] == "False"
    assert svc["status"]["readyReplicas"] == 0 and svc["status"]["ready"] == "0/1"
    assert not get_json(kubectl, "-n", namespace, "leaderworkerset", "stuck")["status"].get("readyReplicas")


def test_hand_edits_of_the_group_are_undone_and_a_deleted_one_comes_back(namespace, kubectl, operator, lws):
    apply(kubectl, namespace, group_service("drift", nodes=2, seed={"enabled": False}))
    svc = wait_ready(kubectl, namespace, "drift", timeout=180)
    patch = {
        "spec": {
            "replicas": 3,
            "leaderWorkerTemplate": {"workerTemplate": {"metadata": {"labels": {"hand": "edit"}}}},
        }
    }
    kubectl("-n", namespace, "patch", "leaderworkerset", "drift", "--type=merge", "-p", json.dumps(patch))

    def undone() -> bool:
        spec = get_json(kubectl, "-n", namespace, "leaderworkerset", "drift")["spec"]
        labels = spec["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
        return spec["replicas"] == 1 and "hand" not in labels

    wait_for(undone, timeout=60, what="replicas and the worker template as rendered again")
    # A group does not turn into a Deployment in place: the API server refuses the edit, naming the field.
    one_node = json.dumps({"spec": {"runtime": {"nodesPerReplica": 1}}})
    refused = kubectl("-n", namespace, "patch", "vsvc", "drift", "--type=merge", "-p", one_node, check=False)
    assert refused.returncode != 0 and "spec.runtime.nodesPerReplica" in refused.stderr, refused.stderr

    first_uid = get_json(kubectl, "-n", namespace, "leaderworkerset", "drift")["metadata"]["uid"]
    kubectl("-n", namespace, "delete", "leaderworkerset", "drift", "--wait=false")

    def recreated() -> dict | None:
        lws_obj = get_json(kubectl, "-n", namespace, "leaderworkerset", "drift")
        return lws_obj if lws_obj and lws_obj["metadata"]["uid"] != first_uid else None

    assert owned_by(wait_for(recreated, timeout=60, what="the LeaderWorkerSet recreated"), svc)
    wait_ready(kubectl, namespace, "drift", timeout=120)


def test_a_groups_start_is_its_leaders_and_its_seed_run_index_zeros(
    namespace, kubectl, operator, lws, tmp_path
):
    apply(kubectl, namespace, group_service("timed", nodes=2))
    seed = "app.kubernetes.io/instance=timed,app.kubernetes.io/component=seed"
    recordings = REPO / "tests" / "unit" / "data" / "phases" / "vllm-0.22.1-h100"
    seed_leader = print_recording(
        kubectl, namespace, f"{seed},{JOB_INDEX}=0", recordings / "seed.log", tmp_path
    )
    # Index 1 gets no log: the Job may have stopped it already, once index 0 succeeded.
    group = f"{LWS_NAME}=timed"
    leader = print_recording(
        kubectl, namespace, f"{group},{WORKER_INDEX}=0", recordings / "seeded-serving.log", tmp_path
    )
    print_recording(
        kubectl, namespace, f"{group},{WORKER_INDEX}=1", recordings / "streamer-cold-cache.log", tmp_path
    )

    def recorded() -> dict | None:
        startup = (
            (get_json(kubectl, "-n", namespace, "vllmservice", "timed") or {}).get("status") or {}
        ).get("startup") or {}
        return (
            startup
            if (startup.get("last") or {}).get("pod") and (startup.get("seed") or {}).get("pod")
            else None
        )

    startup = wait_for(recorded, timeout=180, what="the group's start and its seed's in status")
    assert startup["seed"]["pod"] == seed_leader
    assert startup["last"]["pod"] == leader and startup["last"]["compileCache"] == "hit"
    assert [sample["uid"] for sample in startup["history"]] == [
        get_json(kubectl, "-n", namespace, "pod", leader)["metadata"]["uid"]
    ]
