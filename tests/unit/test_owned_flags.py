"""The owned-flag rule alone (stoker.api.flags) and through the model; tests/conformance checks it against
vLLM's own parser."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.api.flags import LAYOUT_FLAG_REGEX, OWNED_FLAG_REGEX, sets_api_key, sets_owned_flag

OWNED_SPELLINGS = [
    # The parallel layout and a group's ranks (runtime.pipelineParallelSize, nodesPerReplica, ...).
    "-dp",
    "-pp=2",
    "--pipeline-parallel-size=2",
    "--data_parallel_size",
    "--enable-expert-parallel",
    "-ep",
    "--nnodes=2",
    "-n2",
    "-n",
    "-r1",
    "--node-rank",
    "--master-addr=10.0.0.1",
    "--master-port",
    "--headless",
    "--headl",
    "--port",
    "--port=9000",
    "--por=9000",
    "--po",
    "--p",
    "--load-form=dummy",
    "--load_format",
    "--served-model=x",
    "--served_model_name=x",
    "--tensor-par=2",
    "--device-memory-utilization=0.5",
    "--device_memory_util",
    "--max_model",
    "--enforce-eager",
    "--no-enforce-eager",
    "--no-enable-sleep-mode",
    "--disable-sleep-mode",
    "--model",
    "--model=other",
    "--revision=main",
    "--host=0.0.0.0",
    "--uds=/tmp/s",
    "--model-loader-extra-config={}",
    "--cudagraph-capture-sizes",
    "--max-cudagraph-capture-size=8",
    "--config",
    "--config=/etc/vllm.yaml",
    "--conf",
    "--port.x=1",
    "--",
    "--=x",
    "-tp",
    "-t",
    "-tp=2",
    "-t=2",
    "-tp.x=2",
    "--compilation-config",
    '--compilation-config={"cudagraph_mode": "NONE"}',
    "--compilation_config",
    "--comp",
    "-cc",
    "-c",
    '-cc={"cudagraph_capture_sizes": [1]}',
    "-cc.cudagraph_mode=NONE",
    "-cc.cudagraph_capture_sizes+=8,16",
    "-cc.cudagraph-capture-sizes",
    "-c.max_cudagraph_capture_size=8",
    "--compilation-config.cudagraph_mode",
    "--compilation_config.max_cudagraph_capture_size=8",
    "--compil.cudagraph_capture_sizes=[8]",
    "--port=9000\n",
    "--served-model-name=a\nb",
    # Older vLLM's capture sizes flag, and its prefixes.
    "--cuda-graph-sizes",
    "--cuda-graph-sizes=1,2,4",
    "--cuda_graph",
    "--cuda",
    # `-O` other than a level: vLLM turns it into `--optimization-level <rest>`.
    '-O{"cudagraph_capture_sizes": [8]}',
    '-O={"mode": 3}',
    "-O.cudagraph_mode=NONE",
    "-O4",
    "-O33",
    "-O=",
    "-Odecode",
    # An owned compilation key anywhere: in another flag's JSON value, after a bare `-O`, in any case.
    '{"cudagraph_capture_sizes": [1, 2]}',
    '--speculative-config={"compilation_config": {"cudagraph_mode": "NONE"}}',
    '--additional-config={"CUDAGRAPH_CAPTURE_SIZES": [8]}',
    "-cc.pass_config.max-cudagraph-capture-size=8",
]

USER_SPELLINGS = [
    "--max-num-seqs",
    "--max-num-seqs=64",
    "--max_num_seqs",
    "--enable-prefix-caching",
    "--enable-sleep-mode",
    "--model-impl=vllm",
    "--kv-cache-dtype=fp8",
    "--disable-log-requests",
    "--trust-remote-code",
    "--api-key=x",
    "-O0",
    "-O3",
    "-O",
    "-O=2",
    "--optimization-level=3",
    "--cudagraph-metrics",
    "--device-ids=0,1",
    "-cc.compile_sizes+=8",
    '--speculative-config={"method": "ngram", "num_speculative_tokens": 4}',
    "-q",
    # Not a layout flag's prefix: --data-parallel-size-local (no multi-node data parallel yet).
    "-dpl",
    "--data-parallel-size-local=2",
    "-cc.pass_config.fuse_norm_quant=true",
    "-cc.mode=0",
    "--compilation-config.compile_sizes+=8",
    "64",
    "fp8",
    "-1",
    "--port-of-call",
]


@pytest.mark.parametrize("arg", OWNED_SPELLINGS)
def test_owned_spellings_are_owned(arg: str) -> None:
    assert sets_owned_flag(arg)


@pytest.mark.parametrize("arg", USER_SPELLINGS)
def test_user_flags_and_values_are_not_owned(arg: str) -> None:
    assert not sets_owned_flag(arg)


def test_the_regex_fits_in_a_cel_string_literal() -> None:
    for regex in (OWNED_FLAG_REGEX, LAYOUT_FLAG_REGEX):
        assert "\\" not in regex and "'" not in regex


@pytest.mark.parametrize("arg", ["--api-key", "--api-key=x", "--api_key", "--api", "--a=x", "--api-k.x=1"])
def test_api_key_spellings(arg: str) -> None:
    assert sets_api_key(arg)


@pytest.mark.parametrize("arg", ["--port", "--attention-backend=x", "-a"])
def test_not_api_key(arg: str) -> None:
    assert not sets_api_key(arg)


def manifest(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "svc"}, "spec": {"model": {"name": "m/m"}, **spec}}


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as error:
        VLLMService.model_validate(raw)
    return str(error.value)


@pytest.mark.parametrize("arg", OWNED_SPELLINGS)
def test_the_model_refuses_owned_spellings(arg: str) -> None:
    message = refusal(manifest(runtime={"extraArgs": ["--max-num-seqs", "4", arg]}))
    assert "extraArgs must not set flags stoker owns" in message


@pytest.mark.parametrize("first", ["128", "-1", " --port"])
def test_extra_args_start_with_a_flag(first: str) -> None:
    # After stoker's `--cudagraph-capture-sizes 1 2 ...`, a bare 128 would be one more capture size.
    message = refusal(manifest(runtime={"extraArgs": [first]}))
    assert "extraArgs must start with a flag" in message


def test_user_flags_pass_the_model() -> None:
    args = ["--max-num-seqs", "64", "-O3", "-cc.pass_config.fuse_norm_quant=true", "--api-key", "k"]
    svc = VLLMService.model_validate(manifest(runtime={"extraArgs": args}))
    assert svc.spec.runtime.extra_args == args


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"name": "--port=1"}, "model.name must not start with '-'"),
        ({"name": "-tp"}, "model.name must not start with '-'"),
        ({"name": "m/m", "servedModelName": "--served-model-name"}, "model.servedModelName must not start"),
        ({"name": "m/m", "revision": "--port=1"}, "model.revision must not start"),
    ],
)
def test_model_and_served_names_are_not_flags(model: dict[str, str], message: str) -> None:
    raw = manifest()
    raw["spec"]["model"] = model
    assert message in refusal(raw)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"extraArgs": ["--api-key", "k"]}, "remove --api-key from runtime.extraArgs"),
        ({"extraArgs": ["--api_key=k"]}, "remove --api-key from runtime.extraArgs"),
        ({"extraArgs": ["--api-k=k"]}, "remove --api-key from runtime.extraArgs"),
        ({"env": [{"name": "VLLM_API_KEY", "value": "k"}]}, "remove VLLM_API_KEY from runtime.env"),
        (
            {"env": [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "remove VLLM_API_KEY from runtime.env",
        ),
    ],
)
def test_an_api_key_is_refused_with_standby(runtime: dict[str, Any], message: str) -> None:
    assert message in refusal(manifest(runtime=runtime, coldStart={"standby": {}}))
    VLLMService.model_validate(manifest(runtime=runtime))  # fine without standby
