import datetime as dt

from stoker.controller.diagnose import ObservedChildren, Problem, child_problems, worth_a_closer_look


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
    assert problem == Problem("PodCreationFailed", "Job ns/x-seed-1", "violates PodSecurity restricted")
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
