"""The builders: seed and serving pods share everything vLLM's compile-cache key covers."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from stoker.api import VLLMService
from stoker.render import (
    CACHE_MOUNT_PATH,
    build_seed_job,
    cache_key,
    engine_invocation,
    key_relevant_args,
    render_children,
    server_selector,
    short_cache_key,
)
from stoker.render.prefetch import import_pages_listing

BASE: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-token"}}},
        },
        "runtime": {
            "replicas": 2,
            "maxModelLen": 8192,
            "gpuMemoryUtilization": 0.9,
            "env": [
                {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"},
                {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
            ],
            "extraArgs": ["--max-num-seqs", "64"],
        },
        "coldStart": {"loader": {"concurrency": 32, "memoryLimitBytes": 5368709120}},
    },
}


def service(**changes: Any) -> VLLMService:
    """BASE with dotted-path overrides, e.g. service(**{"runtime.gpus": 2})."""
    return service_from(BASE, **changes)


def service_from(base: dict[str, Any], **changes: Any) -> VLLMService:
    """The manifest `base` with dotted-path overrides under its spec."""
    raw = copy.deepcopy(base)
    for path, value in changes.items():
        node = raw["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return VLLMService.model_validate(raw)


def engine_container(pod_template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod_template["spec"]["containers"] if c["name"] == "vllm"]
    return container


def by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in children}


# ----------------------------------------------------------------------------------- engine invocation


def test_serving_invocation_is_a_complete_vllm_serve() -> None:
    invocation = engine_invocation(service(), "serve")
    assert invocation.image == "ghcr.io/stoker-dev/stoker-vllm:0.26.0"
    assert invocation.command == ["vllm", "serve"]
    args = invocation.args
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert value("--port") == "8000"
    assert value("--served-model-name") == "meta-llama/Llama-3.1-8B-Instruct"
    assert value("--max-model-len") == "8192"
    assert value("--gpu-memory-utilization") == "0.9"
    assert value("--tensor-parallel-size") == "1"
    assert value("--load-format") == "runai_streamer"
    assert json.loads(value("--model-loader-extra-config")) == {"concurrency": 32, "memory_limit": 5368709120}
    start = args.index("--cudagraph-capture-sizes") + 1
    assert args[start : start + 7] == ["1", "2", "4", "8", "16", "32", "64"]
    assert args[-2:] == ["--max-num-seqs", "64"]
    assert invocation.env["VLLM_CACHE_ROOT"] == CACHE_MOUNT_PATH == invocation.cache_mount_path
    assert invocation.env["TRITON_CACHE_DIR"].startswith(CACHE_MOUNT_PATH + "/")
    assert invocation.env["TORCHINDUCTOR_CACHE_DIR"].startswith(CACHE_MOUNT_PATH + "/")
    assert invocation.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "VLLM_API_KEY" not in invocation.env  # secret-sourced: added by the pod builders
    assert "HF_HUB_OFFLINE" not in invocation.env


@pytest.mark.parametrize(
    ("changes", "expected", "absent"),
    [
        ({"coldStart.cudaGraphs": {"mode": "eager"}}, ["--enforce-eager"], "--cudagraph-capture-sizes"),
        (
            {"coldStart.cudaGraphs": {"maxCaptureSize": 16}},
            ["--max-cudagraph-capture-size", "16"],
            "--cudagraph-capture-sizes",
        ),
        ({"runtime.gpus": 2}, ["--tensor-parallel-size", "2"], "--enforce-eager"),
        (
            {"runtime.gpus": 4, "runtime.tensorParallelSize": 2},
            ["--tensor-parallel-size", "2"],
            "--enforce-eager",
        ),
        ({"model.revision": "abc123"}, ["--revision", "abc123"], "--enforce-eager"),
        ({"model.servedModelName": "llama"}, ["--served-model-name", "llama"], "--enforce-eager"),
        (
            {"coldStart.loader": {"format": "safetensors"}},
            ["--load-format", "safetensors"],
            "--model-loader-extra-config",
        ),
    ],
)
def test_invocation_follows_the_spec(changes: dict[str, Any], expected: list[str], absent: str) -> None:
    args = engine_invocation(service(**changes), "serve").args
    start = args.index(expected[0])
    assert args[start : start + len(expected)] == expected
    assert absent not in args


def test_pvc_source_uses_the_mounted_path_offline() -> None:
    svc = service(**{"model.source": {"pvc": {"claimName": "models", "path": "/llama-8b/"}}})
    invocation = engine_invocation(svc, "serve")
    assert invocation.args[0] == "/models/llama-8b"
    assert invocation.env["HF_HUB_OFFLINE"] == "1"
    assert "--served-model-name" in invocation.args
    pod = by_kind(render_children(svc))["Deployment"]["spec"]["template"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in engine_container(pod)[
        "volumeMounts"
    ]
    claim = {"claimName": "models", "readOnly": True}
    assert {"name": "model", "persistentVolumeClaim": claim} in pod["spec"]["volumes"]


def test_s3_source_streams_from_the_uri_with_credentials() -> None:
    svc = service(
        **{
            "model.source": {
                "s3": {
                    "uri": "s3://bucket/llama",
                    "credentialsSecretRef": {"name": "s3"},
                    "endpoint": "http://minio:9000",
                }
            }
        }
    )
    invocation = engine_invocation(svc, "serve")
    assert invocation.args[0] == "s3://bucket/llama"
    assert invocation.env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    for child in render_children(svc):
        if child["kind"] in ("Job", "Deployment"):
            assert engine_container(child["spec"]["template"])["envFrom"] == [{"secretRef": {"name": "s3"}}]


# ------------------------------------------------------------------------------------ seed vs serving


SPECS = {
    "base": {},
    "tp2": {"runtime.gpus": 2},
    "eager": {"coldStart.cudaGraphs": {"mode": "eager"}},
    "pvc": {"model.source": {"pvc": {"claimName": "models", "path": "llama"}}},
    "model cache": {"coldStart.modelCache": {"enabled": True}},
    "auto loader": {"coldStart.loader": {"format": "auto"}},
}


@pytest.mark.parametrize("changes", SPECS.values(), ids=SPECS.keys())
def test_seed_and_serving_invocations_share_the_key(changes: dict[str, Any]) -> None:
    svc = service(**changes)
    seed, serve = engine_invocation(svc, "seed"), engine_invocation(svc, "serve")
    assert seed.image == serve.image
    assert seed.command == serve.command
    assert seed.env == serve.env
    assert seed.cache_mount_path == serve.cache_mount_path
    assert key_relevant_args(seed.args, svc.spec.runtime.engine_profile) == key_relevant_args(
        serve.args, svc.spec.runtime.engine_profile
    )
    assert seed.args[seed.args.index("--load-format") + 1] == "dummy"
    assert "--model-loader-extra-config" not in seed.args


@pytest.mark.parametrize("changes", SPECS.values(), ids=SPECS.keys())
def test_seed_job_and_serving_pods_share_image_env_and_mounts(changes: dict[str, Any]) -> None:
    svc = service(**changes)
    children = by_kind(render_children(svc))
    seed_pod, serve_pod = children["Job"]["spec"]["template"], children["Deployment"]["spec"]["template"]
    seed, serve = engine_container(seed_pod), engine_container(serve_pod)
    for field in ("image", "env", "envFrom", "volumeMounts", "resources"):
        assert seed.get(field) == serve.get(field), field
    for field in ("volumes", "nodeSelector", "tolerations", "securityContext", "initContainers"):
        assert seed_pod["spec"].get(field) == serve_pod["spec"].get(field), field
    # The seed runs the very same command line, wrapped so that the Job ends once /health answers.
    # It records the pages its server read before the engine process, for the serving pods' read-ahead.
    assert seed["command"] == ["python3", "-m", "stoker.inpod.seed"]
    # It empties the cache volume first (what it holds may be another key's or another owner's), and on
    # 0.26 starts the server a second time, loading the mega AOT artifact (render.seed).
    end = seed["args"].index("--")
    assert seed["args"][:5] == [
        "--pages",
        import_pages_listing(svc),
        "--empty",
        CACHE_MOUNT_PATH,
        "--start-again",
    ]
    assert key_relevant_args(seed["args"][end + 1 :], svc.spec.runtime.engine_profile) == serve[
        "command"
    ] + key_relevant_args(serve["args"], svc.spec.runtime.engine_profile)
    assert seed_pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("version", ["0.22.1", "0.26.0", "0.29.0", "0.32.0", "0.33.0"])
def test_home_derived_key_paths_are_fixed_on_the_cache_volume_for_every_version(version: str) -> None:
    # vLLM before 0.28 hashes these into its key and defaults them from HOME: a seed pod and a serving pod
    # that differ in HOME (another user, another image) must still compute one key.
    svc = service(**{"runtime.engineVersion": version})
    for role in ("seed", "serve"):
        env = engine_invocation(svc, role).env
        assert env["VLLM_CONFIG_ROOT"] == f"{CACHE_MOUNT_PATH}/config"
        assert env["VLLM_XLA_CACHE_PATH"] == f"{CACHE_MOUNT_PATH}/xla"


# -------------------------------------------------------------------------------------------- cache key


def test_cache_key_is_stable_and_shaped() -> None:
    key = cache_key(service())
    assert key == cache_key(service())
    assert len(key) == 64 and int(key, 16) >= 0
    assert short_cache_key(service()) == key[:10]


KEY_CHANGES = {
    "model": {"model.name": "Qwen/Qwen3-8B"},
    "revision": {"model.revision": "v2"},
    "image": {"runtime.image": "example/vllm:0.22.2"},
    "tensor parallel": {"runtime.gpus": 2},
    "max model len": {"runtime.maxModelLen": 4096},
    "capture sizes": {"coldStart.cudaGraphs": {"captureSizes": [1, 2, 4]}},
    "eager": {"coldStart.cudaGraphs": {"mode": "eager"}},
    "extra args": {"runtime.extraArgs": ["--max-num-seqs", "128"]},
    "vllm env": {"runtime.env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}]},
    "secret env reference": {
        "runtime.env": [
            {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"},
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "other", "key": "key"}}},
        ]
    },
    "gpu model": {"runtime.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
    "offline model cache": {"coldStart.modelCache": {"enabled": True}},
}

KEY_KEEPS = {
    "replicas": {"runtime.replicas": 7},
    "gpu memory utilization": {"runtime.gpuMemoryUtilization": 0.5},
    "served model name": {"model.servedModelName": "llama"},
    "loader": {"coldStart.loader": {"format": "safetensors"}},
    "streamer concurrency": {"coldStart.loader": {"concurrency": 8}},
    "gpus beyond tp": {"runtime.gpus": 2, "runtime.tensorParallelSize": 1},
    "tolerations": {"runtime.tolerations": [{"key": "gpu", "operator": "Exists"}]},
    "resources": {"runtime.resources": {"cpu": "4", "memory": "32Gi"}},
    "logging env": {
        "runtime.env": [
            {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"},
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
            {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
            {"name": "OTHER", "value": "x"},
        ]
    },
    "seed gate": {"coldStart.seed": {"enabled": True, "gateRollout": False}},
    "cache size": {"coldStart.compileCache": {"size": "100Gi"}},
}


@pytest.mark.parametrize("changes", KEY_CHANGES.values(), ids=KEY_CHANGES.keys())
def test_cache_key_changes_with_compile_relevant_fields(changes: dict[str, Any]) -> None:
    assert cache_key(service(**changes)) != cache_key(service())


@pytest.mark.parametrize("changes", KEY_KEEPS.values(), ids=KEY_KEEPS.keys())
def test_cache_key_ignores_what_vllm_ignores(changes: dict[str, Any]) -> None:
    assert cache_key(service(**changes)) == cache_key(service())


def test_new_key_means_new_seed_job() -> None:
    old, new = service(), service(**{"runtime.maxModelLen": 4096})
    assert build_seed_job(old)["metadata"]["name"] == f"llama-seed-{short_cache_key(old)}"
    assert build_seed_job(new)["metadata"]["name"] != build_seed_job(old)["metadata"]["name"]


# --------------------------------------------------------------------------------------------- children


def test_children_in_apply_order() -> None:
    children = render_children(service(**{"coldStart.modelCache": {"enabled": True}}))
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    short = short_cache_key(service(**{"coldStart.modelCache": {"enabled": True}}))
    assert names == [
        ("PersistentVolumeClaim", "llama-cache"),
        ("PersistentVolumeClaim", "llama-model"),
        ("Job", f"llama-seed-{short}"),
        ("Deployment", "llama"),
        ("Service", "llama"),
    ]
    for child in children:
        assert child["metadata"]["namespace"] == "ml"
        assert "ownerReferences" not in child["metadata"]
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "vllm"
        assert labels["app.kubernetes.io/instance"] == "llama"
        assert labels["app.kubernetes.io/managed-by"] == "stoker"


def test_no_seed_without_compile_cache_or_when_disabled() -> None:
    kinds = [c["kind"] for c in render_children(service(**{"coldStart.seed": {"enabled": False}}))]
    assert kinds == ["PersistentVolumeClaim", "Deployment", "Service"]
    kinds = [c["kind"] for c in render_children(service(**{"coldStart.compileCache": {"enabled": False}}))]
    assert kinds == ["Deployment", "Service"]
    deployment = render_children(service(**{"coldStart.compileCache": {"enabled": False}}))[0]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "cache", "emptyDir": {}} in volumes


def test_serving_replicas_override() -> None:
    assert by_kind(render_children(service()))["Deployment"]["spec"]["replicas"] == 2
    assert by_kind(render_children(service(), serving_replicas=0))["Deployment"]["spec"]["replicas"] == 0


def test_deployment_and_service_select_serving_pods() -> None:
    children = by_kind(render_children(service()))
    deployment, svc = children["Deployment"], children["Service"]
    selector = {"app.kubernetes.io/instance": "llama", "app.kubernetes.io/component": "server"}
    assert deployment["spec"]["selector"]["matchLabels"] == selector == svc["spec"]["selector"]
    assert server_selector("llama") == "app.kubernetes.io/instance=llama,app.kubernetes.io/component=server"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["stoker.dev/cache-key"] == short_cache_key(service())
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    job_labels = children["Job"]["spec"]["template"]["metadata"]["labels"]
    assert job_labels["app.kubernetes.io/component"] == "seed"


def test_serving_container_probes_resources_and_secrets() -> None:
    svc = service(
        **{
            "runtime.gpus": 2,
            "runtime.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "runtime.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "runtime.resources": {"cpu": "8", "memory": "64Gi"},
        }
    )
    pod = by_kind(render_children(svc))["Deployment"]["spec"]["template"]
    container = engine_container(pod)
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    # Ready within a second of the engine, and still allowed the longest start.
    assert startup["periodSeconds"] == 1
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "api", "key": "key"}}
    assert env["VLLM_CACHE_ROOT"]["value"] == CACHE_MOUNT_PATH
    assert {"name": "cache", "mountPath": CACHE_MOUNT_PATH} in container["volumeMounts"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["spec"]["enableServiceLinks"] is False
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "llama-cache"}} in pod["spec"]["volumes"]


def test_single_gpu_has_no_shm_volume() -> None:
    pod = by_kind(render_children(service()))["Deployment"]["spec"]["template"]
    assert all(volume["name"] != "shm" for volume in pod["spec"]["volumes"])


def test_model_cache_downloads_once_and_serves_offline() -> None:
    svc = service(**{"coldStart.modelCache": {"enabled": True, "size": "80Gi"}, "model.revision": "main"})
    children = by_kind(render_children(svc))
    pod = children["Deployment"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in engine_container(pod)["env"]}
    assert env["HF_HOME"] == "/var/cache/huggingface" and env["HF_HUB_OFFLINE"] == "1"
    programs, download = pod["spec"]["initContainers"]
    assert programs["name"] == "stoker-programs"  # first: the download runs a program of the volume
    assert download["command"] == [
        *("python3", "-m", "stoker.inpod.download"),
        *("meta-llama/Llama-3.1-8B-Instruct", "main"),
    ]
    download_env = {e["name"] for e in download["env"]}
    assert download_env == {"HF_HOME", "HF_TOKEN", "PYTHONPATH"}  # online, unlike the engine
    assert download["volumeMounts"] == [
        {"name": "model-cache", "mountPath": "/var/cache/huggingface"},
        {"name": "stoker-programs", "mountPath": "/opt/stoker/programs", "readOnly": True},
    ]
    unpinned = by_kind(render_children(service(**{"coldStart.modelCache": {"enabled": True}})))
    (_, download) = unpinned["Deployment"]["spec"]["template"]["spec"]["initContainers"]
    assert download["command"][-2:] == ["stoker.inpod.download", "meta-llama/Llama-3.1-8B-Instruct"]
    claims = [c for c in render_children(svc) if c["kind"] == "PersistentVolumeClaim"]
    assert claims[1]["spec"]["resources"]["requests"]["storage"] == "80Gi"


def test_cache_pvc_follows_the_spec() -> None:
    svc = service(
        **{
            "coldStart.compileCache": {
                "size": "50Gi",
                "storageClassName": "fast",
                "accessMode": "ReadWriteOnce",
            }
        }
    )
    pvc = render_children(svc)[0]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "fast",
    }


def test_seed_job_terminates() -> None:
    job = build_seed_job(service())
    assert job["spec"]["backoffLimit"] <= 2
    assert job["spec"]["activeDeadlineSeconds"] >= 3600
    container = engine_container(job["spec"]["template"])
    assert "readinessProbe" not in container and "startupProbe" not in container
    assert job["metadata"]["annotations"]["stoker.dev/cache-key"] == cache_key(service())


def test_children_share_no_mutable_objects() -> None:
    children = render_children(service(**{"coldStart.modelCache": {"enabled": True}}))
    seen: dict[int, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, (dict, list)):
            assert id(node) not in seen, node
            seen[id(node)] = node
            for child in node.values() if isinstance(node, dict) else node:
                walk(child)

    walk(children)
