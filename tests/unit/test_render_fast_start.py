"""The serving pods' weight path: which loader the renderer picks, when it reads the checkpoint ahead, and
the seed's startup plan; none of them moves the compile-cache key."""

from __future__ import annotations

from typing import Any

import pytest

from stoker.api import VLLMService
from stoker.render import build_deployment, cache_key, engine_invocation, render_children
from stoker.render.cachekey import short_cache_key
from stoker.render.engine import load_format, reads_ahead
from stoker.render.prefetch import BYTECODE_DIRECTORY, GENTLE_BYTES, WIDE_REQUEST_BYTES, serving_invocation
from tests.unit.test_render import service_from

ON_A_VOLUME: dict[str, Any] = {
    "apiVersion": "stoker.dev/v1alpha1",
    "kind": "VLLMService",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {
        "model": {"name": "llama", "source": {"pvc": {"claimName": "models", "path": "/llama-8b"}}},
        "runtime": {"maxModelLen": 4096},
    },
}


def service(**changes: Any) -> VLLMService:
    """ON_A_VOLUME with dotted-path overrides under spec, e.g. service(**{"runtime.image": "x:0.26.0"})."""
    return service_from(ON_A_VOLUME, **changes)


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_weights_on_a_volume_in_stokers_image_load_with_instanttensor_read_ahead() -> None:
    svc = service()
    assert (load_format(svc), reads_ahead(svc)) == ("instanttensor", True)
    serving = serving_invocation(svc)
    gentle = ["--gentle", str(GENTLE_BYTES), "--request", str(WIDE_REQUEST_BYTES)]
    # First the pages the seed recorded (same cache key, so the same image), then the checkpoint.
    pages = ["--pages", f"/var/cache/vllm/stoker/import-pages-{short_cache_key(svc)}"]
    # vLLM runs in the wrapper's process, its garbage collector off until its imports are done, its imports
    # fixed (tests/conformance/test_import_fixes_libraries.py), with torch's ptxas as the seed's
    # (tests/unit/test_pin_ptxas.py).
    assert serving.command == [
        "python3",
        "-m",
        "stoker.inpod.read_ahead",
        *gentle,
        *pages,
        "--gc",
        "deferred",
        "--import-fixes",
        "--pin-ptxas",
        "--bytecode",
        BYTECODE_DIRECTORY,
        "/models/llama-8b",
        "--",
        "vllm",
        "serve",
    ]
    assert flag(serving.args, "--load-format") == "instanttensor"
    assert "--model-loader-extra-config" not in serving.args
    assert serving.env["INSTANTTENSOR_BACKEND"] == "BUFFERED"
    assert serving.env["VLLM_ENABLE_STARTUP_PLAN"] == "1"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # Another image of 0.26 may lack the package (an extra up to 0.32)...
        ({"runtime.image": "vllm/vllm-openai:v0.26.0"}, "runai_streamer"),
        ({"runtime.image": "registry:5000/ghcr.io/stoker-dev/stoker-vllm:0.26.0"}, "runai_streamer"),
        # ...which every image has from 0.33; stoker's image has it under any tag or digest.
        ({"runtime.image": "vllm/vllm-openai:v0.33.0"}, "instanttensor"),
        (
            {
                "runtime.image": "ghcr.io/stoker-dev/stoker-vllm@sha256:" + "a" * 64,
                "runtime.engineVersion": "0.26.0",
            },
            "instanttensor",
        ),
        # Streamer options ask for the streamer; an explicit format is kept.
        ({"coldStart.loader": {"concurrency": 16}}, "runai_streamer"),
        ({"coldStart.loader": {"format": "safetensors"}}, "safetensors"),
    ],
)
def test_the_loader_follows_the_image_and_the_spec(changes: dict[str, Any], expected: str) -> None:
    svc = service(**changes)
    assert load_format(svc) == expected
    assert flag(engine_invocation(svc, "serve").args, "--load-format") == expected


def test_weights_not_on_a_volume_keep_the_streamer_and_are_not_read_ahead() -> None:
    hub = service(**{"model.source": {"huggingFace": {}}, "model.name": "org/model"})
    s3 = service(**{"model.source": {"s3": {"uri": "s3://bucket/model"}}})
    for svc in (hub, s3):
        assert (load_format(svc), reads_ahead(svc)) == ("runai_streamer", False)
        assert serving_invocation(svc).command == ["vllm", "serve"]
    cached = service(
        **{
            "model.source": {"huggingFace": {}},
            "model.name": "org/model",
            "coldStart.modelCache": {"enabled": True},
        }
    )
    assert (load_format(cached), reads_ahead(cached)) == ("instanttensor", True)
    # The read-ahead looks a hub id up in HF_HOME, which is the model cache volume.
    assert serving_invocation(cached).command[-4:] == ["org/model", "--", "vllm", "serve"]


def test_read_ahead_can_be_switched_either_way() -> None:
    direct = service(**{"coldStart.loader": {"readAhead": False}})
    assert (load_format(direct), reads_ahead(direct)) == ("instanttensor", False)
    assert "INSTANTTENSOR_BACKEND" not in serving_invocation(direct).env
    assert serving_invocation(direct).command == ["vllm", "serve"]
    streamer = service(**{"coldStart.loader": {"format": "runai_streamer", "readAhead": True}})
    assert reads_ahead(streamer) and serving_invocation(streamer).command[0] == "python3"
    assert "INSTANTTENSOR_BACKEND" not in serving_invocation(streamer).env


def test_the_startup_plan_is_on_for_seed_and_serving_where_the_engine_has_it() -> None:
    for role in ("seed", "serve"):
        assert engine_invocation(service(), role).env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
        assert (
            "VLLM_ENABLE_STARTUP_PLAN"
            not in engine_invocation(service(**{"coldStart.startupPlan": False}), role).env
        )
        old = service(**{"runtime.image": "ghcr.io/stoker-dev/stoker-vllm:0.22.1"})
        assert "VLLM_ENABLE_STARTUP_PLAN" not in engine_invocation(old, role).env


def test_loader_read_ahead_and_plan_leave_the_cache_key_alone() -> None:
    key = cache_key(service())
    for changes in (
        {"coldStart.loader": {"format": "runai_streamer", "concurrency": 16}},
        {"coldStart.loader": {"readAhead": False}},
        {"coldStart.startupPlan": False},
    ):
        assert cache_key(service(**changes)) == key, changes


def test_the_deployment_runs_the_serving_invocation_and_the_seed_loads_dummy_weights() -> None:
    svc = service()
    container = build_deployment(svc)["spec"]["template"]["spec"]["containers"][0]
    serving = serving_invocation(svc)
    assert [container["command"], container["args"]] == [serving.command, serving.args]
    (seed_job,) = [c for c in render_children(svc) if c["kind"] == "Job"]
    seed_args = seed_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag(seed_args, "--load-format") == "dummy"
    assert "stoker.inpod.read_ahead" not in seed_args
    assert "INSTANTTENSOR_BACKEND" not in engine_invocation(svc, "seed").env


def test_streamer_options_with_another_format_are_refused() -> None:
    with pytest.raises(ValueError, match="apply only to format runai_streamer"):
        service(**{"coldStart.loader": {"format": "instanttensor", "concurrency": 8}})
    with pytest.raises(ValueError, match=r"model\.source\.s3 needs"):
        s3 = {"s3": {"uri": "s3://bucket/m"}}
        service(**{"model.source": s3, "coldStart.loader": {"format": "instanttensor"}})
