"""Engine settings read from what stoker renders (the examples, seed and serving) and from stock argv."""

import json
from pathlib import Path

import pytest
import yaml

from stoker.api import VLLMService
from stoker.engines import DEFAULT_ENGINE_VERSION, profile_for
from stoker.predict import EngineSettings, engine_settings, regime_of
from stoker.predict.service import hardware_class, service_settings
from stoker.render import build_deployment
from stoker.render.engine import load_format
from stoker.render.prefetch import read_ahead_command
from stoker.render.seed import seed_invocation
from tests.unit.test_render import service
from tests.unit.test_render_fast_start import service as on_a_volume

EXAMPLES = Path(__file__).parents[2] / "examples"
RESULTS = Path(__file__).parents[2] / "bench" / "results"


def example(name: str) -> VLLMService:
    return VLLMService.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))


def rendered(svc: VLLMService) -> EngineSettings:
    return service_settings(svc, "hit")


def test_a_services_hardware_class() -> None:
    assert (
        hardware_class(example("minimal.yaml")).key
        == f"NVIDIA-H100-80GB-HBM3_x1_v{DEFAULT_ENGINE_VERSION[:4]}"
    )
    l4 = service(**{"runtime.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}, "runtime.gpus": 4})
    assert hardware_class(l4).key == f"NVIDIA-L4_x4_v{DEFAULT_ENGINE_VERSION[:4]}"
    assert service_settings(l4, "miss").tensor_parallel == 4


def test_the_minimal_example_as_rendered() -> None:
    svc = example("minimal.yaml")
    sizes = svc.spec.cold_start.cuda_graphs.capture_sizes
    assert rendered(svc) == EngineSettings(
        loader=load_format(svc),
        compiled=True,
        capture_sizes=len(sizes or []),
        tensor_parallel=1,
        sleep_mode=False,
        cache_state="hit",
        kept_cache=True,
        forked_engine=True,
        mega_aot_artifact=True,
        engine_version=DEFAULT_ENGINE_VERSION,
    )


@pytest.mark.parametrize(
    ("version", "value", "loaded"),
    [
        ("0.26.0", None, False),  # vLLM's default off with torch 2.11; stoker renders it on (above)
        ("0.26.0", "1", True),
        ("0.26.0", "0", False),
        ("0.27.0", None, True),  # vLLM's own default from torch 2.12
        ("0.27.0", "0", False),
        ("0.22.1", "1", True),
    ],
)
def test_the_mega_aot_artifact_reads_from_the_variable_else_the_releases_default(
    version: str, value: str | None, loaded: bool
) -> None:
    env = {} if value is None else {"VLLM_USE_MEGA_AOT_ARTIFACT": value}
    assert engine_settings(["vllm", "serve", "m"], env, "hit", version).mega_aot_artifact is loaded


def test_the_seed_job_wrapper_argv_reads_as_its_vllm_serve() -> None:
    invocation = seed_invocation(example("minimal.yaml"))
    settings = engine_settings(
        [*invocation.command, *invocation.args], invocation.env, "miss", DEFAULT_ENGINE_VERSION
    )
    assert (settings.loader, settings.cache_state, settings.compiled) == ("dummy", "miss", True)
    assert not settings.read_ahead


def test_serving_pods_under_the_read_ahead_read_as_their_deployment_runs_them() -> None:
    svc = on_a_volume()
    container = build_deployment(svc)["spec"]["template"]["spec"]["containers"][0]
    env = {variable["name"]: variable["value"] for variable in container["env"] if "value" in variable}
    from_pod = engine_settings(
        [*container["command"], *container["args"]], env, "hit", DEFAULT_ENGINE_VERSION
    )
    assert container["command"][:3] == ["python3", "-m", "stoker.inpod.read_ahead"]
    assert rendered(svc) == from_pod
    assert (from_pod.loader, from_pod.read_ahead, from_pod.forked_engine) == ("instanttensor", True, True)
    # The seed Job runs vLLM without the read-ahead.
    assert not service_settings(svc, "miss", "seed").read_ahead


def test_a_recorded_runs_read_ahead_of_an_earlier_revision_still_reads_as_one() -> None:
    serve = ["vllm", "serve", "/models/m", "--load-format", "instanttensor"]
    today = engine_settings([*read_ahead_command(["/models/m"]), *serve], {}, "hit", "0.26.0")
    eager = engine_settings([*read_ahead_command(["/models/m"], gentle=0), *serve], {}, "hit", "0.26.0")
    # Runs recorded before the read-ahead was a module ran `python3 -c PROGRAM`, the program holding the
    # reader's source; the revision before the gentle phase took no options (all readers from the start).
    ran = json.loads((RESULTS / "coldstart-h100.json").read_text())["profiles"]["stoker"]
    recorded = engine_settings(ran["argv"], ran["env"], "hit", "0.26.0")
    program = ran["argv"][2]
    earlier = engine_settings(["python3", "-c", program, "/models/m", "--", *serve], {}, "hit", "0.26.0")
    assert today.read_ahead and eager.read_ahead and recorded.read_ahead and earlier.read_ahead
    assert today.gentle_read_ahead and not eager.gentle_read_ahead and not earlier.gentle_read_ahead
    assert (recorded.gentle_read_ahead, recorded.import_pages, recorded.deferred_gc) == (True, True, True)
    other = engine_settings(["python3", "-c", "import os", "--", *serve], {}, "hit", "0.26.0")
    assert not other.read_ahead


def test_the_import_pages_are_a_regime_of_the_bootstrap_and_the_engine_start() -> None:
    serve = ["vllm", "serve", "/models/m", "--load-format", "instanttensor"]
    command = read_ahead_command(["/models/m"], pages="/var/cache/vllm/stoker/import-pages-0123456789")
    pages = engine_settings([*command, *serve], {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}, "hit", "0.26.0")
    without = engine_settings([*read_ahead_command(["/models/m"]), *serve], {}, "hit", "0.26.0")
    assert pages.import_pages and not without.import_pages
    assert regime_of("bootstrap", pages) == "readahead=gentle,pages"
    assert regime_of("engineStart", pages) == "engine=fork,pages"
    assert regime_of("bootstrap", without) == "readahead=gentle"
    # The default serving pods read them (a path on the cache volume in the argv, not the model's).
    assert service_settings(on_a_volume(), "hit", "serve").import_pages


def test_the_deferred_collector_is_a_regime_of_the_bootstrap_and_the_engine_start() -> None:
    serve = ["vllm", "serve", "/models/m", "--load-format", "instanttensor"]
    pages = "/var/cache/vllm/stoker/import-pages-0123456789"
    deferred = read_ahead_command(["/models/m"], pages=pages, defer_gc=True)
    fork = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    settings = engine_settings([*deferred, *serve], fork, "hit", "0.26.0")
    collected = read_ahead_command(["/models/m"], pages=pages)
    without = engine_settings([*collected, *serve], fork, "hit", "0.26.0")
    assert settings.deferred_gc and not without.deferred_gc
    assert regime_of("bootstrap", settings) == "readahead=gentle,pages,nogc"
    assert regime_of("engineStart", settings) == "engine=fork,pages,nogc"
    assert regime_of("engineStart", without) == "engine=fork,pages"
    assert service_settings(on_a_volume(), "hit", "serve").deferred_gc


@pytest.mark.parametrize(
    ("loader", "read_ahead", "bootstrap", "weight_load"),
    [
        ({}, True, "readahead=gentle,pages,nogc", "loader=instanttensor,readahead,gentle"),
        ({"readAhead": False}, False, "readahead=off", "loader=instanttensor"),
        (
            {"format": "runai_streamer", "readAhead": True},
            True,
            "readahead=gentle,pages,nogc",
            "loader=runai_streamer,readahead,gentle",
        ),
        ({"format": "runai_streamer"}, False, "readahead=off", "loader=runai_streamer"),
    ],
)
def test_the_read_ahead_is_a_regime_of_bootstrap_and_weight_loading(
    loader: dict[str, object], read_ahead: bool, bootstrap: str, weight_load: str
) -> None:
    settings = rendered(on_a_volume(**{"coldStart.loader": loader}))
    assert settings.read_ahead == read_ahead
    assert (regime_of("bootstrap", settings), regime_of("weightLoad", settings)) == (bootstrap, weight_load)


def test_eager_tensor_parallel_and_standby_examples() -> None:
    eager = rendered(example("eager.yaml"))
    assert (eager.compiled, eager.capture_sizes, eager.cache_state) == (False, 0, "none")
    assert rendered(example("tensor-parallel.yaml")).tensor_parallel == 2
    standby = rendered(service(**{"coldStart.standby": {"replicas": 1}, "runtime.env": []}))
    assert standby.sleep_mode
    maximum = rendered(service(**{"coldStart.cudaGraphs": {"maxCaptureSize": 64}}))
    assert maximum.capture_sizes == 11  # 1, 2, 4, 8, 16, ..., 64


def test_a_stock_vllm_serve_takes_the_engines_defaults() -> None:
    stock = engine_settings(["vllm", "serve", "/models/m", "--max-model-len", "4096"], {}, "miss", "0.26.0")
    # The default capture sizes that the stock H100 logs show: "Capturing CUDA graphs ... 51/51".
    assert stock == EngineSettings(capture_sizes=51, cache_state="miss", engine_version="0.26.0")
    assert profile_for("0.26.0").capture_sizes.count() == 51
    assert engine_settings(["m", "--max-num-seqs", "16"], {}, "miss", "0.26.0").capture_sizes == 7  # up to 32


@pytest.mark.parametrize(
    ("args", "compiled", "capture_sizes"),
    [
        (["m", "--enforce-eager"], False, 0),
        (["m", "-O0"], False, 0),
        (["m", "-O", "0"], False, 0),
        (["m", "-O3"], True, 51),
        (["m", "-cc", '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'], False, 51),
        (["m", "--compilation-config.mode=0"], False, 51),
        (["m", "-cc.cudagraph_mode", "NONE"], True, 0),
        (["m", "--compilation_config", '{"cudagraph_capture_sizes": [1, 2, 4, 4]}'], True, 3),
        (["m", "-cc.max_cudagraph_capture_size=16"], True, 5),
        (["m", "--cudagraph-capture-sizes", "1", "2", "--load_format=runai_streamer"], True, 2),
        (["m", "-cc.pass_config.fuse_norm_quant=true"], True, 51),
        (["m", "--enforce-eager", "--no-enforce-eager"], True, 51),
    ],
)
def test_vllms_spellings(args: list[str], compiled: bool, capture_sizes: int) -> None:
    settings = engine_settings(args, {}, "hit", "0.26.0")
    assert (settings.compiled, settings.capture_sizes) == (compiled, capture_sizes)


def test_short_flags_and_env() -> None:
    settings = engine_settings(
        ["m", "-tp=4", "--enable-sleep-mode"], {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}, "hit", "0.26.0"
    )
    assert (settings.tensor_parallel, settings.sleep_mode, settings.forked_engine) == (4, True, True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["m", "--tensor-parallel-size", "two"], "--tensor-parallel-size takes an integer"),
        (["m", "--compilation-config", "{mode"], "--compilation-config is not JSON"),
        (["m", "-cc", "[1]"], "must be a JSON object"),
    ],
)
def test_what_vllm_would_refuse_is_a_clear_error(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine_settings(args, {}, "hit", "0.26.0")
