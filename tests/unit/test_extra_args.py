"""extraArgs judged as `vllm serve` of the service's engine version would judge them, from the stored option
lists (tests/conformance/test_serve_options.py checks those lists and this reading against real vLLM)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService, user_message
from stoker.engines import SUPPORTED
from stoker.engines.serve_options import (
    ServeOption,
    check_extra_args,
    format_options,
    options_for,
    parse_options,
    stored_options,
)


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs", "64"],
        ["--max_num_seqs=64"],
        ["--max-num-se", "64"],  # a unique prefix
        ["--enable-prefix-caching"],
        ["--no-enable-prefix-caching"],
        ["-q", "fp8"],
        ["-qfp8"],
        ["-O0"],
        ["-O", "3"],
        ["--kv-cache-dtype=fp8", "--seed", "-1"],
        ["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens=2"],
        ["--allowed-origins", '["a"]', "--middleware", "a.b"],
    ],
)
def test_what_vllm_accepts_passes(args: list[str]) -> None:
    assert check_extra_args(args, "0.26.0") is None


@pytest.mark.parametrize(
    ("args", "index", "message"),
    [
        (["--max-batch-size", "8"], 0, "--max-batch-size is not an option of `vllm serve` in vLLM 0.26.0"),
        (["--seed", "1", "--max_batch_size=8"], 2, "--max_batch_size is not an option"),
        (
            ["--max", "8"],
            0,
            "--max is ambiguous in vLLM 0.26.0: it abbreviates --max-log-len, --max-model-len",
        ),
        (["--enable-prefix-caching=true"], 0, "--enable-prefix-caching takes no value"),
        (["--enable-prefix-caching", "yes"], 1, "'yes' is neither an option nor a value"),
        (["--seed", "1", "--max-num-seqs"], 2, "--max-num-seqs expects a value"),
        (["--max-num-seqs", "--seed", "1"], 0, "--max-num-seqs expects a value"),
        (["--seed", "1", "2"], 2, "'2' is neither an option nor a value"),
    ],
)
def test_what_vllm_refuses_is_named(args: list[str], index: int, message: str) -> None:
    refused = check_extra_args(args, "0.26.0")
    assert refused is not None
    assert refused.index == index
    assert refused.message.startswith(message)


def test_a_flag_is_judged_by_the_services_own_release() -> None:
    # --diffusion-config came with 0.24.
    assert check_extra_args(["--diffusion-config", "{}"], "0.33.0") is None
    refused = check_extra_args(["--diffusion-config", "{}"], "0.22.1")
    assert refused is not None and "vLLM 0.22.1" in refused.message
    # A patch release is judged by the stored release of its minor version.
    assert options_for("0.26.3") == options_for("0.26.0")


def test_every_supported_minor_version_has_a_stored_list() -> None:
    stored = {tuple(int(p) for p in release.split("."))[:2] for release in stored_options()}
    for profile in SUPPORTED:
        for minor in range(profile.first[1], profile.last[1] + 1):
            assert (profile.first[0], minor) in stored, profile.name


def test_the_file_reads_back_as_written() -> None:
    per_release = {
        "0.1.0": [ServeOption(("--a",), "1"), ServeOption(("--b", "-b"), "0")],
        "0.2.0": [ServeOption(("--a",), "+")],
        "0.3.0": [ServeOption(("--a",), "1"), ServeOption(("--b", "-b"), "0")],
    }
    text = format_options(per_release)
    assert "0.1.0,0.3.0 1 --a" in text
    assert parse_options(text) == {release: tuple(options) for release, options in per_release.items()}
    assert parse_options(format_options(stored_options())) == stored_options()


def test_the_api_names_the_field_and_the_flag() -> None:
    manifest = {
        "metadata": {"name": "x"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "runtime": {"engineVersion": "0.26.0", "extraArgs": ["--seed", "1", "--max-batch-size", "8"]},
        },
    }
    with pytest.raises(ValidationError) as refused:
        VLLMService.model_validate(manifest)
    assert user_message(refused.value) == (
        "spec.runtime.extraArgs[2]: --max-batch-size is not an option of `vllm serve` in vLLM 0.26.0"
    )
