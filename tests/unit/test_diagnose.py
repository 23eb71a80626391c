import datetime as dt

import pytest

from stoker.controller.diagnose import (
    LOG_TAIL_CHARS,
    UNSCHEDULABLE_GRACE_SECONDS,
    ObservedChildren,
    Problem,
    child_problems,
    log_tail,
    worth_a_closer_look,
)
from stoker.inpod.seed import MODEL_PATH_MISSING_LINE


def meta(name: str, uid: str = "u") -> dict:
    return {"name": name, "namespace": "ns", "uid": uid}


def event(reason: str, message: str, at: str = "2026-11-23T10:00:00Z") -> dict:
    return {"reason": reason, "message": message, "lastTimestamp": at}


def test_a_pending_claim_with_a_provisioning_failure_names_its_cause():
    claim = {"metadata": meta("x-cache", "c1"), "status": {"phase": "Pending"}}
    observed = ObservedChildren(
        claims=[claim],
        claim_events={
            "c1": [
                event("ProvisioningFailed", "old", "2026-11-23T09:00:00Z"),
                event("ProvisioningFailed", 'storageclass.storage.k8s.io "nope" not found'),
                event("WaitForFirstConsumer", "waiting"),
            ]
        },
    )
    assert child_problems(observed) == [
        Problem(
            "VolumeProvisioningFailed",
            "PersistentVolumeClaim ns/x-cache",
            'storageclass.storage.k8s.io "nope" not found',
        )
    ]


def test_a_bound_claim_or_one_merely_waiting_is_no_problem():
    bound = {"metadata": meta("a", "1"), "status": {"phase": "Bound"}}
    waiting = {"metadata": meta("b", "2"), "status": {"phase": "Pending"}}
    observed = ObservedChildren(
        claims=[bound, waiting],
        claim_events={"1": [event("ProvisioningFailed", "x")], "2": [event("WaitForFirstConsumer", "y")]},
    )
    assert child_problems(observed) == []


def test_a_replicaset_that_cannot_create_pods_shows_through_the_deployment():
    deployment = {
        "metadata": meta("x"),
        "status": {
            "conditions": [
                {"type": "Available", "status": "False"},
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": 'pods "x-1" is forbidden: exceeded quota: gpus',
                },
            ]
        },
    }
    (problem,) = child_problems(ObservedChildren(deployment=deployment))
    assert problem.reason == "PodCreationFailed"
    assert problem.message == 'Deployment ns/x: pods "x-1" is forbidden: exceeded quota: gpus'


def test_a_job_without_pods_reports_its_failed_create_until_it_runs_or_ends():
    events = [event("FailedCreate", "violates PodSecurity restricted"), event("SuccessfulCreate", "ok")]
    job = {"metadata": meta("x-seed-1"), "status": {}}
    (problem,) = child_problems(ObservedChildren(job=job, job_events=events))
    assert problem == Problem(
        "PodCreationFailed", "Job ns/x-seed-1", "violates PodSecurity restricted", of_seed=True
    )
    running = {**job, "status": {"active": 1}}
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert child_problems(ObservedChildren(job=running, job_events=events)) == []
    assert child_problems(ObservedChildren(job=done, job_events=events)) == []


def waiting_pod(reason: str, message: str | None = None, init: bool = False) -> dict:
    state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": meta("x-abc"), "status": {key: [{"name": "vllm", "state": state}]}}


def test_each_stuck_container_reason_is_its_own_reason_with_the_kubelets_message():
    for reason in (
        "InvalidImageName",
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerConfigError",
        "CrashLoopBackOff",
    ):
        (problem,) = child_problems(ObservedChildren(pods=[waiting_pod(reason, f"{reason} because")]))
        assert problem.reason == reason
        assert problem.message == f"Pod ns/x-abc: container vllm: {reason} because"
    (problem,) = child_problems(ObservedChildren(pods=[waiting_pod("ErrImagePull", init=True)]))
    assert problem.message == "Pod ns/x-abc: container vllm: ErrImagePull"


def test_a_container_on_its_way_is_no_problem():
    assert child_problems(ObservedChildren(pods=[waiting_pod("ContainerCreating")])) == []
    assert child_problems(ObservedChildren(pods=[{"metadata": meta("p"), "status": {}}])) == []


def test_only_a_child_that_had_time_to_get_going_is_looked_at_closer():
    now = dt.datetime(2026, 11, 23, 10, 0, 30, tzinfo=dt.UTC)
    assert worth_a_closer_look({"metadata": {"creationTimestamp": "2026-11-23T10:00:00Z"}}, now)
    assert not worth_a_closer_look({"metadata": {"creationTimestamp": "2026-11-23T10:00:25Z"}}, now)
    assert not worth_a_closer_look({"metadata": {}}, now)


NOW = dt.datetime(2026, 11, 23, 10, 1, 0, tzinfo=dt.UTC)


def unschedulable_pod(message: str, since: str = "2026-11-23T10:00:30Z") -> dict:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": since,
    }
    return {"metadata": meta("x-abc"), "status": {"phase": "Pending", "conditions": [scheduled]}}


@pytest.mark.parametrize(
    "message",
    [
        '0/2 nodes are available: persistentvolumeclaim "models" not found.',
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
        "0/16 nodes are available: 16 Insufficient nvidia.com/gpu.",
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
        "0/1 nodes are available: 1 node(s) had untolerated taint {gpu: broken}.",
    ],
)
def test_a_pod_the_scheduler_cannot_place_carries_the_schedulers_message(message: str) -> None:
    (problem,) = child_problems(ObservedChildren(pods=[unschedulable_pod(message)]), NOW)
    assert problem.reason == "Unschedulable"
    assert problem.message == f"Pod ns/x-abc: {message}"
    # Progressing says so at once; Degraded once the grace a cluster autoscaler may need has passed.
    assert problem.degrades_in == UNSCHEDULABLE_GRACE_SECONDS - 30
    (late,) = child_problems(ObservedChildren(pods=[unschedulable_pod(message, "2026-11-23T09:00:00Z")]), NOW)
    assert late.degrades_in == 0


def test_a_pod_that_is_scheduled_or_gated_is_not_unschedulable() -> None:
    gated = unschedulable_pod("waiting")
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    scheduled = {
        "metadata": meta("p"),
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    assert child_problems(ObservedChildren(pods=[gated, scheduled]), NOW) == []


def crashed_pod(reason: str, exit_code: int, restarts: int = 3) -> dict:
    container = {
        "name": "vllm",
        "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed"}},
        "lastState": {"terminated": {"reason": reason, "exitCode": exit_code}},
    }
    return {"metadata": meta("x-abc"), "status": {"containerStatuses": [container]}}


def test_a_crash_loop_names_its_last_exit_and_an_oom_kill_is_its_own_reason() -> None:
    (crash,) = child_problems(ObservedChildren(pods=[crashed_pod("Error", 1)]))
    assert crash.reason == "CrashLoopBackOff"
    assert crash.detail == "container vllm: back-off 40s restarting failed (last exit code 1)"
    (oom,) = child_problems(ObservedChildren(pods=[crashed_pod("OOMKilled", 137)]))
    assert oom == Problem(
        "OOMKilled",
        "Pod ns/x-abc",
        "container vllm was killed for using more memory than its limit (OOMKilled), 3 restarts",
    )


def seed_pod(exit_code: int, log: str, reason: str = "Error") -> dict:
    terminated = {"reason": reason, "exitCode": exit_code, "message": log}
    return {
        "metadata": meta("x-seed-1-abc"),
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "command": ["python3", "-m", "stoker.inpod.seed"],
                    "args": [
                        "--pages",
                        "/cache/p",
                        "--",
                        "vllm",
                        "serve",
                        "/models/llama-8b",
                        "--port",
                        "8000",
                    ],
                    "volumeMounts": [
                        {"name": "cache", "mountPath": "/cache"},
                        {"name": "model-source", "mountPath": "/models", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "cache", "persistentVolumeClaim": {"claimName": "x-cache"}},
                {"name": "model-source", "persistentVolumeClaim": {"claimName": "models"}},
            ],
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "vllm", "state": {"terminated": terminated}}],
        },
    }


def test_a_failed_seed_says_why_with_the_last_lines_of_its_log() -> None:
    log = (
        "INFO starting\n"
        + "\n".join(f"line {n}" for n in range(10))
        + "\nValueError: bad \x1b[31mflag\x1b[0m\x07\n"
    )
    (problem,) = child_problems(ObservedChildren(seed_pods=[seed_pod(1, log)]))
    assert problem.reason == "SeedFailed" and problem.of_seed
    assert problem.message == (
        "Pod ns/x-seed-1-abc: container vllm exited with code 1; its log ends:"
        " line 6 | line 7 | line 8 | line 9 | ValueError: bad flag"
    )
    # A serving pod that ends runs again under its Deployment: only a crash loop is its problem.
    assert child_problems(ObservedChildren(pods=[seed_pod(1, log)])) == []
    assert child_problems(ObservedChildren(seed_pods=[seed_pod(0, "done")])) == []


def test_a_seed_killed_for_memory_is_an_oom_kill() -> None:
    (problem,) = child_problems(ObservedChildren(seed_pods=[seed_pod(137, "", reason="OOMKilled")]))
    assert problem.reason == "OOMKilled"


def test_a_seeds_second_pod_failing_as_its_first_adds_nothing() -> None:
    first, second = seed_pod(1, "boom"), seed_pod(1, "boom")
    second["metadata"] = meta("x-seed-1-def")
    assert len(child_problems(ObservedChildren(seed_pods=[first, second]))) == 1


def test_a_missing_model_path_names_the_path_and_the_claim_from_the_pods_spec() -> None:
    log = f"some line\n{MODEL_PATH_MISSING_LINE} /anything/the/pod/printed\n"
    (problem,) = child_problems(ObservedChildren(seed_pods=[seed_pod(66, log)]))
    assert problem.reason == "ModelPathMissing"
    assert problem.detail == (
        "the model path /models/llama-8b does not exist: PersistentVolumeClaim models (mounted at /models)"
        " has nothing at /llama-8b (spec.model.source.pvc.path)"
    )


def test_pod_output_in_a_condition_is_bounded_and_printable() -> None:
    assert log_tail("\n\n") == ""
    long = log_tail("x" * 5000 + "\u202e\x00")
    assert len(long) == LOG_TAIL_CHARS + 3 and long.startswith("...") and long.endswith("x")
