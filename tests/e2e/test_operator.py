"""The operator on the real control plane: children, seeding, drift, garbage collection, restarts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import apply, condition, get_json, owned_by, vllm_service, wait_for, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def service_manifests(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "VLLMService"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_converges_with_owned_children(example, namespace, kubectl, operator):
    kubectl("-n", namespace, "apply", "-f", str(example))
    for manifest in service_manifests(example):
        name = manifest["metadata"]["name"]
        svc = wait_ready(kubectl, namespace, name)
        replicas = manifest["spec"].get("runtime", {}).get("replicas", 1)
        deployment = get_json(kubectl, "-n", namespace, "deployment", name)
        assert deployment and owned_by(deployment, svc)
        assert deployment["status"].get("readyReplicas", 0) == replicas
        assert owned_by(get_json(kubectl, "-n", namespace, "service", name), svc)
        cold_start = manifest["spec"].get("coldStart", {})
        if cold_start.get("compileCache", {}).get("enabled", True):
            pvc = get_json(kubectl, "-n", namespace, "pvc", f"{name}-cache")
            # Retain (the default): no owner reference, stoker's annotation naming the VLLMService.
            assert pvc and pvc["status"]["phase"] == "Bound" and not pvc["metadata"].get("ownerReferences")
            assert pvc["metadata"]["annotations"]["stoker.dev/compile-cache-of"] == name
            if cold_start.get("seed", {}).get("enabled", True):
                job_name = f"{name}-seed-{svc['status']['cache']['key'][:10]}"
                job = get_json(kubectl, "-n", namespace, "job", job_name)
                assert job and owned_by(job, svc)
                assert any(c["type"] == "Complete" for c in job["status"].get("conditions", []))
                assert condition(svc, "CacheSeeded")["status"] == "True"
        assert svc["status"]["readyReplicas"] == replicas
        assert svc["status"]["observedGeneration"] == svc["metadata"]["generation"]
    table = kubectl("-n", namespace, "get", "vsvc").stdout
    header = table.splitlines()[0].split()
    assert header[:4] == ["NAME", "READY", "MODEL", "REPLICAS"], table
    # READY as a Deployment's: ready of desired, all of them once converged.
    assert all(re.fullmatch(r"(\d+)/\1", row.split()[1]) for row in table.splitlines()[1:]), table


def test_a_compile_relevant_change_seeds_again_and_replicas_do_not(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("rekey"))
    first = wait_ready(kubectl, namespace, "rekey")["status"]["cache"]["key"]

    kubectl(
        "-n", namespace, "patch", "vsvc", "rekey", "--type=merge", "-p", '{"spec":{"runtime":{"replicas":2}}}'
    )
    wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "deployment", "rekey") or {})
            .get("status", {})
            .get("readyReplicas")
            == 2
        )
    )
    assert wait_ready(kubectl, namespace, "rekey")["status"]["cache"]["key"] == first
    jobs = get_json(kubectl, "-n", namespace, "jobs", "-l", "app.kubernetes.io/instance=rekey")
    assert [j["metadata"]["name"] for j in jobs["items"]] == [f"rekey-seed-{first[:10]}"]

    patch = '{"spec":{"runtime":{"maxModelLen":2048}}}'
    kubectl("-n", namespace, "patch", "vsvc", "rekey", "--type=merge", "-p", patch)

    def rekeyed():
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "rekey")
        key = svc["status"].get("cache", {}).get("key")
        return key if key and key != first else None

    second = wait_for(rekeyed, what="a new cache key")
    wait_ready(kubectl, namespace, "rekey")

    def only_new_seed():
        jobs = get_json(kubectl, "-n", namespace, "jobs", "-l", "app.kubernetes.io/instance=rekey")["items"]
        return [j["metadata"]["name"] for j in jobs if not j["metadata"].get("deletionTimestamp")]

    wait_for(lambda: only_new_seed() == [f"rekey-seed-{second[:10]}"], what="superseded seed removed")


def test_hand_edits_and_deletions_are_undone(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("drift", replicas=2))
    wait_ready(kubectl, namespace, "drift")
    kubectl("-n", namespace, "scale", "deployment", "drift", "--replicas=5")
    kubectl("-n", namespace, "delete", "service", "drift")
    wait_for(
        lambda: get_json(kubectl, "-n", namespace, "service", "drift"), timeout=30, what="service recreated"
    )
    wait_for(
        lambda: (
            (get_json(kubectl, "-n", namespace, "deployment", "drift") or {}).get("spec", {}).get("replicas")
            == 2
        ),
        timeout=30,
        what="replicas restored",
    )


def test_deleting_the_service_garbage_collects_its_children(namespace, kubectl, operator):
    apply(kubectl, namespace, vllm_service("gone"))
    wait_ready(kubectl, namespace, "gone")
    kubectl("-n", namespace, "delete", "vsvc", "gone")

    def all_gone():
        # The compile-cache PVC is kept (retentionPolicy Retain): tests/e2e/test_cache_retention.py.
        left = kubectl(
            "-n",
            namespace,
            "get",
            "deployment,service,job",
            "-l",
            "app.kubernetes.io/instance=gone",
            "-o",
            "name",
        ).stdout.strip()
        return not left

    wait_for(all_gone, timeout=120, what="children garbage-collected")
    assert get_json(kubectl, "-n", namespace, "pvc", "gone-cache")


def test_an_operator_killed_mid_reconcile_converges_without_duplicates(namespace, kubectl, operator):
    names = [f"crash-{i}" for i in range(5)]
    for name in names:
        apply(kubectl, namespace, vllm_service(name))
    time.sleep(0.5)
    operator.kill()
    operator.start()
    for name in names:
        wait_ready(kubectl, namespace, name)
        for kind in ("deployments", "services", "jobs", "pvc"):
            found = get_json(kubectl, "-n", namespace, kind, "-l", f"app.kubernetes.io/instance={name}")[
                "items"
            ]
            assert len(found) == 1, (kind, [f["metadata"]["name"] for f in found])


def _without_rules(schema):
    if isinstance(schema, dict):
        return {k: _without_rules(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [_without_rules(item) for item in schema]
    return schema


def test_a_spec_only_the_operator_rejects_is_reported_and_nothing_crashes(namespace, kubectl, operator):
    # Objects stored before a stricter CRD (or while its rules were off) still reach the operator.
    crd = get_json(kubectl, "crd", "vllmservices.stoker.dev")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = _without_rules(schema["properties"]["spec"])
    kubectl("replace", "-f", "-", input=json.dumps(crd))
    try:
        bad = vllm_service("bad", gpus=2, tensorParallelSize=3)
        wait_for(lambda: kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(bad), check=False)
                 .returncode == 0, timeout=30, what="the loosened CRD accepts the object")  # fmt: skip
    finally:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))

    def rejected():
        svc = get_json(kubectl, "-n", namespace, "vllmservice", "bad")
        ready = condition(svc, "Ready")
        return ready if ready.get("reason") == "InvalidSpec" else None

    ready = wait_for(rejected, what="Ready=False reason InvalidSpec")
    assert ready["status"] == "False" and "tensorParallelSize" in ready["message"]
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.name=bad")
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in events["items"])
    assert get_json(kubectl, "-n", namespace, "deployment", "bad") is None  # nothing was rendered
    # The operator lives on and serves others.
    apply(kubectl, namespace, vllm_service("good"))
    wait_ready(kubectl, namespace, "good")
    assert operator.process.poll() is None


def test_a_flag_the_engine_version_lacks_is_refused_before_any_pod(namespace, kubectl, operator):
    # The API server cannot know which flags vLLM 0.26.0 has; the operator does, from the stored lists.
    apply(
        kubectl,
        namespace,
        vllm_service("noflag", engineVersion="0.26.0", extraArgs=["--seed", "1", "--max-batch-size", "8"]),
    )

    def refused():
        ready = condition(get_json(kubectl, "-n", namespace, "vllmservice", "noflag"), "Ready")
        return ready if ready.get("reason") == "InvalidSpec" else None

    ready = wait_for(refused, what="Ready=False reason InvalidSpec")
    assert ready["status"] == "False"
    assert (
        "spec.runtime.extraArgs[2]: --max-batch-size is not an option of `vllm serve` in vLLM 0.26.0"
        in (ready["message"])
    )
    for kind in ("jobs", "deployments", "pods"):
        found = get_json(kubectl, "-n", namespace, kind, "-l", "app.kubernetes.io/instance=noflag")["items"]
        assert found == [], kind
    # Fixed, the same object goes on.
    apply(
        kubectl, namespace, vllm_service("noflag", engineVersion="0.26.0", extraArgs=["--max-num-seqs", "8"])
    )
    wait_ready(kubectl, namespace, "noflag")


def test_a_failed_seed_does_not_block_serving(namespace, kubectl, operator):
    # kwok fails a Job's pod whose container asks for it (hack/kwok/stages.yaml); serving pods run normally.
    manifest = vllm_service("coldfail")
    manifest["spec"]["runtime"]["env"] = [{"name": "KWOK_SIMULATE_FAILURE", "value": "true"}]
    apply(kubectl, namespace, manifest)
    svc = wait_ready(kubectl, namespace, "coldfail")  # replicas rolled out cold
    assert condition(svc, "CacheSeeded")["status"] == "False"
    assert condition(svc, "CacheSeeded")["reason"] == "SeedFailed"
    assert condition(svc, "Degraded")["reason"] == "SeedFailed"
    (job,) = get_json(kubectl, "-n", namespace, "jobs", "-l", "app.kubernetes.io/instance=coldfail")["items"]
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    events = get_json(kubectl, "-n", namespace, "events", "--field-selector", "involvedObject.name=coldfail")
    assert any(e["reason"] == "SeedFailed" and e["type"] == "Warning" for e in events["items"])
