"""A VLLMService on the real node: real vLLM (CPU build) in containers, from the seed Job to a routed
completion, with the kubelet's probes, logs and cgroups.

The model is the conformance harness's tiny checkpoint (bench/conformance/tiny_model.py) on a hostPath
PersistentVolume, pre-bound to the claim the spec names; the compile cache is a second hostPath volume
pre-bound to `NAME-cache`, the claim stoker creates. The node has no GPU: its status advertises
`nvidia.com/gpu` as an extended resource (as a device plugin would), so the pods schedule as on a GPU node
and run vLLM's CPU platform. What the CPU build lacks is set in the spec as a user would: the loader
(`auto`: InstantTensor needs CUDA) and the KV-cache size (VLLM_CPU_KVCACHE_SPACE).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from bench.conformance import tiny_model
from bench.conformance.versions import default_version

from tests.conftest import Cluster, Kubectl, RealNode
from tests.e2e.helpers import condition, get_json, wait_for

pytestmark = pytest.mark.e2e

NAME = "real"
SERVED_NAME = "tiny"
VLLM_IMAGE = f"ghcr.io/stoker-dev/stoker-vllm:{default_version()}"
# A start of the tiny model takes about a minute on 2 quiet cores; the seed compiles too, and CI shares them.
START_SECONDS = 900
SERVER = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=server"
SEED = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=seed"


def host_path_volume(kubectl: Kubectl, namespace: str, claim: str, path: Path, size: str) -> None:
    """A hostPath PersistentVolume pre-bound to `namespace/claim`, and (for the model) that claim."""
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{namespace}-{claim}"},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        ),
    )


def vllm_service(replicas: int, max_model_len: int, placement: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                "name": SERVED_NAME,
                "servedModelName": SERVED_NAME,
                "source": {"pvc": {"claimName": "models", "path": "/tiny"}},
            },
            "runtime": {
                "image": VLLM_IMAGE,
                "replicas": replicas,
                "maxModelLen": max_model_len,
                "resources": {"memory": "4Gi"},
                "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
                **placement,
            },
            "coldStart": {
                "loader": {"format": "auto"},
                "compileCache": {"storageClassName": "", "size": "1Gi", "retentionPolicy": "Retain"},
            },
        },
    }


def ready_pods(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    pods = (get_json(kubectl, "-n", namespace, "pods", "-l", SERVER) or {}).get("items", [])
    return [
        p
        for p in pods
        if condition(p, "Ready").get("status") == "True" and not p["metadata"].get("deletionTimestamp")
    ]


def complete_through_service(kubectl: Kubectl, namespace: str) -> str:
    """A completion through the Service's ClusterIP (kube-proxy's rules on this machine route it)."""
    service = get_json(kubectl, "-n", namespace, "service", NAME) or {}
    ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    body = json.dumps({"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{ip}:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
        return str(json.loads(reply.read())["choices"][0]["text"])


@pytest.mark.timeout(4 * START_SECONDS)
def test_a_vllmservice_seeds_serves_scales_reseeds_and_goes_on_the_real_node(
    real_node: RealNode, cluster: Cluster, namespace: str, kubectl: Kubectl, operator: Any, engine_venv: Path
) -> None:
    volumes = cluster.work_dir / "volumes" / namespace
    model, cache = volumes / "models", volumes / "cache"
    subprocess.run([str(engine_venv / "bin" / "python"), tiny_model.__file__, model / "tiny"], check=True)
    cache.mkdir(parents=True)
    # The engine runs as uid 1000; hostPath volumes take no fsGroup.
    for directory in (volumes, model, model / "tiny"):
        directory.chmod(0o755)
    cache.chmod(0o777)
    host_path_volume(kubectl, namespace, "models", model, "1Gi")
    host_path_volume(kubectl, namespace, f"{NAME}-cache", cache, "1Gi")
    kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "models"},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        ),
    )
    real_node.advertise_gpus(kubectl, 4)
    placement = real_node.placement()

    # Created: the seed runs real vLLM in a container to completion and fills the claim.
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(vllm_service(1, 512, placement)))

    def seeded() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", NAME) or {}
        cache_status = (svc.get("status") or {}).get("cache") or {}
        return (
            svc
            if cache_status.get("seededKey") and cache_status.get("seededKey") == cache_status.get("key")
            else None
        )

    first = wait_for(seeded, START_SECONDS, "the seed Job to fill the cache")
    first_key = first["status"]["cache"]["key"]
    (seed_pod,) = (get_json(kubectl, "-n", namespace, "pods", "-l", SEED) or {})["items"]
    assert seed_pod["spec"]["nodeName"] == real_node.name
    assert seed_pod["status"]["phase"] == "Succeeded"
    assert any(path.is_file() for path in cache.rglob("*")), "the seed wrote nothing to the cache volume"

    # Served from that cache: Ready through the kubelet's probes, phases read through the kubelet's logs.
    (pod,) = wait_for(lambda: ready_pods(kubectl, namespace), START_SECONDS, "a Ready serving pod")
    assert pod["spec"]["nodeName"] == real_node.name
    assert complete_through_service(kubectl, namespace)

    def recorded() -> dict[str, Any] | None:
        svc = get_json(kubectl, "-n", namespace, "vllmservice", NAME) or {}
        last = ((svc.get("status") or {}).get("startup") or {}).get("last") or {}
        return (
            last
            if last.get("pod") == pod["metadata"]["name"] and last.get("readyGapSeconds") is not None
            else None
        )

    last = wait_for(recorded, 120, "the start's phases in status")
    assert last["compileCache"] == "hit", last
    assert 0 <= last["readyGapSeconds"] <= 1.5, last
    assert last["totalSeconds"] > 0 and last["phases"], last
    logs = kubectl("-n", namespace, "logs", pod["metadata"]["name"], "-c", "vllm").stdout
    assert "Starting vLLM" in logs

    # Scaled 1 -> 2: a second real pod becomes Ready beside the first.
    kubectl("-n", namespace, "scale", "vllmservice", NAME, "--replicas=2")
    wait_for(lambda: len(ready_pods(kubectl, namespace)) == 2, START_SECONDS, "two Ready serving pods")

    # A spec change that changes the cache key: a new seed runs while the old pods keep serving.
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(vllm_service(1, 1024, placement)))

    def reseeding() -> bool:
        seeds = (get_json(kubectl, "-n", namespace, "pods", "-l", SEED) or {}).get("items", [])
        return any(p["status"].get("phase") == "Running" for p in seeds)

    wait_for(reseeding, 300, "the new key's seed to run")
    serving = ready_pods(kubectl, namespace)
    assert serving and all(p["metadata"]["name"] != "" for p in serving)
    assert complete_through_service(kubectl, namespace)  # the old pods serve while the seed runs
    second = wait_for(
        lambda: (s := seeded()) and s["status"]["cache"]["key"] != first_key and s,
        START_SECONDS,
        "the reseed",
    )
    new_key = second["status"]["cache"]["key"]

    def rolled() -> list[dict[str, Any]] | None:
        pods = ready_pods(kubectl, namespace)
        all_pods = (get_json(kubectl, "-n", namespace, "pods", "-l", SERVER) or {}).get("items", [])
        return pods if len(pods) == 1 and len(all_pods) == 1 else None

    (new_pod,) = wait_for(rolled, START_SECONDS, "one Ready pod of the new key")
    assert new_pod["metadata"]["name"] != pod["metadata"]["name"]
    assert complete_through_service(kubectl, namespace)
    assert new_key != first_key

    # Deleted: the children go with it (garbage collection), the retained cache claim stays.
    kubectl("-n", namespace, "delete", "vllmservice", NAME, "--wait=true", timeout=300)
    wait_for(
        lambda: (
            not (
                get_json(kubectl, "-n", namespace, "pods", "-l", "app.kubernetes.io/instance=" + NAME) or {}
            ).get("items")
        ),
        300,
        "the pods to go",
    )
    assert get_json(kubectl, "-n", namespace, "deployment", NAME) is None
    assert get_json(kubectl, "-n", namespace, "pvc", f"{NAME}-cache") is not None
