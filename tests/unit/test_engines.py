"""Engine profiles: version resolution, per-version rendering, extra-config schemas and cache-key factors."""

import itertools
from typing import Any

import pytest
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.engines import (
    DEFAULT_ENGINE_VERSION,
    SUPPORTED,
    UnsupportedEngineVersion,
    detect_version_in_log,
    profile_for,
    resolve_engine_version,
    version_from_image,
)
from stoker.render import cache_key, cache_key_factors, engine_invocation, key_relevant_args


def service(**runtime: Any) -> VLLMService:
    spec = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "runtime": runtime}
    return VLLMService.model_validate({"metadata": {"name": "llama", "namespace": "ml"}, "spec": spec})


@pytest.mark.parametrize(
    ("version", "profile"),
    [
        ("0.22.1", "0.22-0.23"),
        ("0.23.0", "0.22-0.23"),
        ("0.25.1", "0.24-0.25"),
        ("0.26.0", "0.26"),
        ("0.27.0", "0.27-0.28"),
        ("0.28.0", "0.27-0.28"),
        ("0.29.0", "0.29"),
        ("0.30.0", "0.30"),
        ("0.32.0", "0.32"),
        ("0.33.0", "0.33"),
    ],
)
def test_every_supported_release_has_exactly_one_profile(version: str, profile: str) -> None:
    assert profile_for(version).name == profile
    assert sum(candidate.covers(tuple(map(int, version.split(".")[:2]))) for candidate in SUPPORTED) == 1


def test_profiles_are_ordered_and_contiguous() -> None:
    for older, newer in itertools.pairwise(SUPPORTED):
        assert newer.first == (older.last[0], older.last[1] + 1)
    assert profile_for(DEFAULT_ENGINE_VERSION) in SUPPORTED


@pytest.mark.parametrize("version", ["0.21.0", "0.34.0", "1.0.0", "latest", ""])
def test_unsupported_versions_raise_with_the_supported_ranges(version: str) -> None:
    with pytest.raises(UnsupportedEngineVersion) as raised:
        profile_for(version)
    assert isinstance(raised.value, ValueError)
    if version[:1].isdigit():
        assert "0.22-0.23" in str(raised.value) and "0.33" in str(raised.value)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("ghcr.io/stoker-dev/stoker-vllm:0.26.0", "0.26.0"),
        ("vllm/vllm-openai:v0.22.1", "0.22.1"),
        ("registry:5000/vllm:0.30.0-cu130", "0.30.0"),
        ("vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64, "0.33.0"),
        ("registry:5000/vllm", None),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None),
    ],
)
def test_version_from_image_tag(image: str, version: str | None) -> None:
    assert version_from_image(image) == version


def test_engine_version_wins_over_the_tag() -> None:
    assert resolve_engine_version("0.25.1", "registry/vllm:0.26.0") == "0.25.1"
    assert (
        service(image="registry/custom:latest", engineVersion="0.29.0").spec.runtime.engine_profile.name
        == "0.29"
    )


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"image": "registry/custom:latest"}, "spec.runtime.engineVersion"),
        ({"image": "vllm/vllm-openai:v0.40.0"}, "spec.runtime.image"),
        ({"engineVersion": "0.21.0"}, "spec.runtime.engineVersion"),
    ],
)
def test_an_unknown_or_unsupported_version_is_a_validation_error_naming_the_field(
    runtime: dict[str, str], field: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        service(**runtime)
    assert field in str(raised.value)


def test_engine_version_must_be_a_plain_release() -> None:
    with pytest.raises(ValidationError):
        service(engineVersion="v0.26")


@pytest.mark.parametrize(
    ("log_line", "version"),
    [
        (
            "(APIServer pid=1) INFO 11-22 04:45:37 [utils.py:344]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.22.1",
            "0.22.1",
        ),
        (
            "INFO 11-22 04:45:37 [utils.py:344]  ▄▄ ▄█ █ ▀▄▀ █\x1b[0m  version \x1b[97;1m0.26.0\x1b[0m",
            "0.26.0",
        ),
        (
            "INFO 11-23 10:00:00 [startup.py:18] vLLM server version 0.33.0, serving model m",
            "0.33.0",
        ),
        (
            "INFO 11-22 [core.py:113] Initializing a V1 LLM engine (v0.25.1+cpu) with config",
            "0.25.1",
        ),
        ('{"message": "vLLM server version 0.32.0, serving model m"}', "0.32.0"),
        ("INFO 06-02 00:50:00 [api_server.py:1043] vLLM API server version 0.9.2", "0.9.2"),
        ("(EngineCore pid=2) INFO 11-22 [flash_attn.py:636] Using FlashAttention version 3", None),
    ],
)
def test_detect_version_in_log(log_line: str, version: str | None) -> None:
    assert detect_version_in_log(log_line) == version


def test_strict_releases_reject_unknown_extra_config_keys_and_lenient_ones_are_caught_too() -> None:
    lenient, strict = profile_for("0.22.1").loader_config, profile_for("0.33.0").loader_config
    assert not lenient.strict and strict.strict
    for schema, verdict in ((lenient, "silently ignores"), (strict, "rejects")):
        schema.check({"concurrency": 16, "memory_limit": -1, "distributed": True})
        with pytest.raises(ValueError, match=verdict):
            schema.check({"concurrency": 16, "chunk_size": 1})
        with pytest.raises(ValueError, match="concurrency must be a JSON integer"):
            schema.check({"concurrency": "16"})
        with pytest.raises(ValueError, match="distributed must be a JSON boolean"):
            schema.check({"distributed": 1})


@pytest.mark.parametrize("version", ["0.22.1", "0.26.0", "0.32.0", "0.33.0"])
def test_flags_render_with_the_release_spelling(version: str) -> None:
    svc = service(engineVersion=version, image="registry/vllm:custom")
    args = engine_invocation(svc, "serve").args
    flags = profile_for(version).flags
    assert args[args.index(flags.load_format) + 1] == "runai_streamer"
    assert args[args.index(flags.capture_sizes) + 1 :][:2] == ["1", "2"]


def test_flashinfer_autotune_cache_is_on_the_volume_from_0_33_only() -> None:
    old = engine_invocation(service(engineVersion="0.32.0"), "serve").env
    new = engine_invocation(service(engineVersion="0.33.0"), "serve").env
    assert "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" not in old
    assert new["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == "/var/cache/vllm/flashinfer-autotune"


def test_kv_cache_memory_bytes_enters_the_key_on_0_22_only() -> None:
    args = ["m", "--kv-cache-memory-bytes", "1000", "--port", "8000"]
    assert key_relevant_args(args, profile_for("0.22.1")) == ["m", "--kv-cache-memory-bytes", "1000"]
    assert key_relevant_args(args, profile_for("0.26.0")) == ["m"]


def test_env_ignore_lists_differ_by_version() -> None:
    # VLLM_CONFIG_ROOT left the key in 0.27 (envs.py compile_factors).
    assert "VLLM_CONFIG_ROOT" not in profile_for("0.26.0").key_ignored_env
    assert "VLLM_CONFIG_ROOT" in profile_for("0.27.0").key_ignored_env
    env = [{"name": "VLLM_CONFIG_ROOT", "value": "/etc/vllm"}]
    assert "VLLM_CONFIG_ROOT" in cache_key_factors(service(engineVersion="0.26.0", env=env))["env"]
    assert "VLLM_CONFIG_ROOT" not in cache_key_factors(service(engineVersion="0.27.0", env=env))["env"]


def test_the_engine_version_is_a_cache_key_factor() -> None:
    same_image = [service(image="registry/vllm:custom", engineVersion=v) for v in ("0.26.0", "0.26.1")]
    assert cache_key_factors(same_image[0])["engineVersion"] == "0.26.0"
    assert cache_key(same_image[0]) != cache_key(same_image[1])


def test_capabilities_follow_the_source() -> None:
    assert profile_for("0.22.1").capabilities.jit_warmup == "none"
    assert profile_for("0.26.0").capabilities.jit_warmup == "silent"
    assert profile_for("0.29.0").capabilities.jit_warmup == "logged"
    assert not profile_for("0.29.0").capabilities.ipc_cache and profile_for("0.30.0").capabilities.ipc_cache
    assert (
        profile_for("0.31.0").capabilities.snapshot
        and profile_for("0.31.0").capabilities.keeps_triton_cache_dir
    )
    assert profile_for("0.31.0").capabilities.sleep_levels == {1, 2}
    assert profile_for("0.32.0").capabilities.sleep_levels == {0, 1, 2}
    assert (
        profile_for("0.26.0").capabilities.startup_plan
        and not profile_for("0.25.1").capabilities.startup_plan
    )
