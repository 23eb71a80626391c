"""The VLLMService models: defaults and the validation that mirrors the CRD's CEL rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import (
    API_VERSION,
    DEFAULT_CAPTURE_SIZES,
    DEFAULT_IMAGE,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    StartupRecord,
    VLLMService,
    VLLMServiceStatus,
)

MINIMAL: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
}


def manifest(**spec_overrides: Any) -> dict[str, Any]:
    result = copy.deepcopy(MINIMAL)
    result["spec"].update(spec_overrides)
    return result


def test_constants() -> None:
    assert (GROUP, VERSION, KIND, PLURAL) == ("stoker.dev", "v1alpha1", "VLLMService", "vllmservices")


def test_defaults_of_a_minimal_manifest() -> None:
    svc = VLLMService.model_validate(MINIMAL)
    spec = svc.spec
    assert spec.model.source.hugging_face is not None
    assert spec.model.source.pvc is None and spec.model.source.s3 is None
    assert spec.runtime.image == DEFAULT_IMAGE
    assert (spec.runtime.replicas, spec.runtime.gpus) == (1, 1)
    assert spec.runtime.effective_tensor_parallel_size == 1
    assert spec.cold_start.loader.format is None and spec.cold_start.loader.read_ahead is None
    assert spec.cold_start.startup_plan
    assert spec.cold_start.compile_cache.enabled
    assert spec.cold_start.compile_cache.access_mode == "ReadWriteMany"
    assert not spec.cold_start.model_cache.enabled
    assert spec.cold_start.cuda_graphs.capture_sizes == DEFAULT_CAPTURE_SIZES == [1, 2, 4, 8, 16, 32, 64]
    assert spec.cold_start.seed.enabled and spec.cold_start.seed.gate_rollout
    assert (svc.name, svc.namespace) == ("llama", "ml")


def test_camel_case_round_trip() -> None:
    raw = manifest(
        runtime={"tensorParallelSize": 2, "gpus": 2, "gpuMemoryUtilization": 0.85, "resources": {"cpu": 8}},
        coldStart={"cudaGraphs": {"maxCaptureSize": 32}, "loader": {"memoryLimitBytes": -1}},
    )
    svc = VLLMService.model_validate(raw)
    assert svc.spec.runtime.tensor_parallel_size == 2
    assert svc.spec.runtime.resources.cpu == "8"
    dumped = svc.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["runtime"]["gpuMemoryUtilization"] == 0.85
    assert dumped["spec"]["coldStart"]["cudaGraphs"] == {"maxCaptureSize": 32}
    assert VLLMService.model_validate(dumped) == svc


def test_status_shape() -> None:
    status = VLLMServiceStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Serving",
                    "lastTransitionTime": "2026-11-22T05:00:00Z",
                }
            ],
            "replicas": 2,
            "readyReplicas": 2,
            "selector": "app.kubernetes.io/instance=llama,app.kubernetes.io/component=server",
            "cache": {"key": "ab" * 32, "seededKey": "ab" * 32, "lastHit": True},
            "startup": {
                "last": {
                    "pod": "llama-1",
                    "totalSeconds": 63.2,
                    "compileCache": "hit",
                    "phases": {"imports": 21.0},
                },
                "recent": {"samples": 5, "p50TotalSeconds": 64.0, "maxTotalSeconds": 71.2},
            },
        }
    )
    assert status.startup is not None and isinstance(status.startup.last, StartupRecord)
    assert status.startup.last.phases == {"imports": 21.0}
    assert status.startup.recent is not None and status.startup.recent.p50_total_seconds == 64.0
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["conditions"][0]["lastTransitionTime"] == "2026-11-22T05:00:00Z"
    assert dumped["startup"]["last"]["compileCache"] == "hit"


INVALID = {
    "two sources": {"model": {"name": "m", "source": {"huggingFace": {}, "pvc": {"claimName": "c"}}}},
    "no source": {"model": {"name": "m", "source": {}}},
    "gpus zero": {"runtime": {"gpus": 0}},
    "tp does not divide gpus": {"runtime": {"gpus": 3, "tensorParallelSize": 2}},
    "unsorted sizes": {"coldStart": {"cudaGraphs": {"captureSizes": [1, 4, 2]}}},
    "duplicate sizes": {"coldStart": {"cudaGraphs": {"captureSizes": [1, 2, 2]}}},
    "zero size": {"coldStart": {"cudaGraphs": {"captureSizes": [0, 1]}}},
    "two graph settings": {"coldStart": {"cudaGraphs": {"captureSizes": [1], "mode": "eager"}}},
    "no graph setting": {"coldStart": {"cudaGraphs": {}}},
    "owned flag": {"runtime": {"extraArgs": ["--load-format", "dummy"]}},
    "owned flag with value": {"runtime": {"extraArgs": ["--port=9000"]}},
    "owned flag with underscores": {"runtime": {"extraArgs": ["--max_model_len", "10"]}},
    "owned env": {"runtime": {"env": [{"name": "VLLM_CACHE_ROOT", "value": "/x"}]}},
    "duplicate env": {"runtime": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
    "streamer options with another loader": {"coldStart": {"loader": {"format": "auto", "concurrency": 4}}},
    "model cache with pvc source": {
        "model": {"name": "m", "source": {"pvc": {"claimName": "c"}}},
        "coldStart": {"modelCache": {"enabled": True}},
    },
    "path escapes the claim": {
        "model": {"name": "m", "source": {"pvc": {"claimName": "c", "path": "a/../.."}}}
    },
    "bad quantity": {"coldStart": {"compileCache": {"size": "lots"}}},
    "unknown field": {"runtime": {"gpu": 1}},
}


@pytest.mark.parametrize("spec_overrides", INVALID.values(), ids=INVALID.keys())
def test_invalid_specs_are_rejected(spec_overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        VLLMService.model_validate(manifest(**spec_overrides))


@pytest.mark.parametrize("name", ["Upper", "1starts-with-digit", "x" * 48])
def test_invalid_names_are_rejected(name: str) -> None:
    raw = manifest()
    raw["metadata"]["name"] = name
    with pytest.raises(ValidationError):
        VLLMService.model_validate(raw)


@pytest.mark.parametrize(
    "args", [["--model-impl", "vllm"], ["--max-num-seqs", "64"], ["-O0"], ["--enable-prefix-caching"]]
)
def test_flags_stoker_does_not_own_pass(args: list[str]) -> None:
    svc = VLLMService.model_validate(manifest(runtime={"extraArgs": args}))
    assert svc.spec.runtime.extra_args == args


def _s3(endpoint: str) -> dict[str, Any]:
    return {"model": {"name": "m", "source": {"s3": {"uri": "s3://bucket/m", "endpoint": endpoint}}}}


# Every string stoker passes on as one line (vLLM's arguments, AWS_ENDPOINT_URL, the image): no control
# characters; free text (extraArgs, env values) only without NUL.
ONE_LINE = {
    "newline in model.name": {"model": {"name": "m\n--port=1"}},
    "carriage return in model.name": {"model": {"name": "m\r"}},
    "newline in revision": {"model": {"name": "m", "revision": "main\nx"}},
    "tab in servedModelName": {"model": {"name": "m", "servedModelName": "a\tb"}},
    "escape in the image": {"runtime": {"image": "ghcr.io/x/y:1\x1b[2J"}},
    "DEL in the claim path": {"model": {"name": "m", "source": {"pvc": {"claimName": "c", "path": "a\x7f"}}}},
    "NUL in the s3 uri": {"model": {"name": "m", "source": {"s3": {"uri": "s3://bucket/m\x00"}}}},
    "NUL in an extra argument": {"runtime": {"extraArgs": ["--seed", "1\x00"]}},
    "NUL in an env value": {"runtime": {"env": [{"name": "A", "value": "a\x00b"}]}},
    "file:// endpoint": _s3("file:///var/run/secrets/token"),
    "endpoint with a newline": _s3("https://minio.example.com\n"),
    "endpoint without a host": _s3("https:///bucket"),
    "endpoint with user info": _s3("https://key:secret@minio.example.com"),
    "endpoint with a space": _s3("https://minio.example.com/a b"),
    "endpoint without a scheme": _s3("minio.example.com:9000"),
}


@pytest.mark.parametrize("spec_overrides", ONE_LINE.values(), ids=ONE_LINE.keys())
def test_values_passed_on_are_one_printable_line(spec_overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        VLLMService.model_validate(manifest(**spec_overrides))


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://s3.eu-west-1.amazonaws.com",
        "http://minio.minio.svc:9000",
        "http://10.0.0.7:9000/",
        "https://[fd00::7]:443/s3",
    ],
)
def test_http_endpoints_pass(endpoint: str) -> None:
    svc = VLLMService.model_validate(manifest(**_s3(endpoint)))
    assert svc.spec.model.source.s3 is not None and svc.spec.model.source.s3.endpoint == endpoint


def test_free_text_may_span_lines() -> None:
    template = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}"
    runtime = {
        "extraArgs": ["--chat-template", template],
        "env": [{"name": "CA", "value": "-----BEGIN\nx\n"}],
    }
    svc = VLLMService.model_validate(manifest(runtime=runtime))
    assert svc.spec.runtime.extra_args[1] == template
