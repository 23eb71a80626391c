"""A live engine behind a VLLMService: the serving pod's (kwok, fake) log is a real vLLM CPU process
started from that pod's own rendered command, so `status.startup.last` comes from a live engine.

The process runs the pod spec the API server holds (command, args, env), with the harness's swaps only
(bench/conformance/swaps.py: tiny local checkpoint, free port, local cache dirs, CPU KV-cache size). Its
recorded log is served through kwok as the pod's log, stamped from the pod's start (hack/kwoklogs.py).
The seed pod prints the recorded H100 seed log, so the serving run starts on an empty cache. The vLLM
version is stoker's default; `make test` installs its venv (hack/vllm-venv), and under CI a missing
venv fails the test instead of skipping it.
"""

from __future__ import annotations

import subprocess

import pytest
from bench.conformance import checks, tiny_model
from bench.conformance.process import RecordedProcess, complete, free_port, wait_healthy
from bench.conformance.swaps import LocalRun, container_argv, local_argv, local_env
from bench.conformance.versions import default_version
from hack.kwoklogs import print_recording, serve_log, started_at

from stoker.phases import KUBERNETES_PHASES, parse_log
from tests.e2e.helpers import RECORDED, apply, get_json, wait_for

pytestmark = pytest.mark.e2e

START_TIMEOUT_SECONDS = 1500
SERVED_NAME = "tiny"


@pytest.mark.timeout(START_TIMEOUT_SECONDS + 300)
def test_live_vllm_process_is_the_serving_pods_log_source(
    engine_venv, namespace, kubectl, operator, tmp_path
):
    svc = {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": "live"},
        "spec": {"model": {"name": "stoker-test/tiny-llama", "servedModelName": SERVED_NAME}},
    }
    apply(kubectl, namespace, svc)
    instance = "app.kubernetes.io/instance=live"
    print_recording(
        kubectl, namespace, f"{instance},app.kubernetes.io/component=seed", RECORDED / "seed.log", tmp_path
    )

    def started_server_pod():
        pods = get_json(
            kubectl, "-n", namespace, "pods", "-l", f"{instance},app.kubernetes.io/component=server"
        )
        started = [p for p in (pods or {}).get("items", []) if p["status"].get("containerStatuses")]
        return started[0] if started else None

    pod = wait_for(started_server_pod, timeout=180, what="a started serving pod")
    container = pod["spec"]["containers"][0]
    # kwok has no log for the pod until the engine below has run and the test serves its recording, and the
    # operator stops asking for an unreadable log after about 3 minutes (LOG_READ_ATTEMPTS), less than a CPU
    # start takes on a busy machine. A kubelet serves a log from the container's start; here the operator
    # waits, and starts again once the log is there.
    operator.stop()
    try:
        model_dir = tmp_path / "model"
        subprocess.run([str(engine_venv / "bin" / "python"), tiny_model.__file__, model_dir], check=True)
        dirs = {name: tmp_path / name for name in ("cache", "hf-home", "home")}
        for directory in dirs.values():
            directory.mkdir()
        run = LocalRun(engine_venv, model_dir, dirs["cache"], dirs["hf-home"], dirs["home"], free_port())
        engine = RecordedProcess(
            local_argv(container_argv(container), run), local_env(container, run), tmp_path / "serve.log"
        )
        try:
            assert wait_healthy(engine, run.port, START_TIMEOUT_SECONDS), engine.log_path.read_text()[-4000:]
            assert complete(run.port, SERVED_NAME)
        finally:
            engine.stop()
        recording = engine.log_path.read_text(encoding="utf-8")
        serve_log(kubectl, namespace, pod["metadata"]["name"], engine.log_path, started_at(pod), tmp_path)
    finally:
        operator.start()

    def recorded():
        status = (get_json(kubectl, "-n", namespace, "vllmservice", "live") or {}).get("status") or {}
        last = (status.get("startup") or {}).get("last") or {}
        return last if last.get("pod") == pod["metadata"]["name"] and last.get("totalSeconds") else None

    last = wait_for(recorded, what="the live engine's startup in status")
    # What the log itself says, by plain search: the server line's time since the process started.
    server_at = next(at for at, text in checks.recorded_lines(recording) if checks.SERVER_LINE in text)
    assert last["totalSeconds"] == pytest.approx(server_at, abs=checks.TOLERANCE_SECONDS)
    engine_phases = {
        name: seconds for name, seconds in last["phases"].items() if name not in KUBERNETES_PHASES
    }
    assert sum(engine_phases.values()) == pytest.approx(last["totalSeconds"], abs=0.05)
    expected = parse_log(recording.splitlines(keepends=True))
    assert engine_phases == pytest.approx(expected.phases, abs=0.01)
    assert last["compileCache"] == expected.compile_cache
    assert last["engineVersion"] == default_version()
    # An empty cache dir the engine filled: a plain miss (nothing kept, so no loadFailed), which is what
    # status must say.
    evidence = checks.CacheEvidence(frozenset(), checks.compile_artifacts(dirs["cache"]))
    assert last["compileCache"] == evidence.observed_state() == "miss"
    assert "compileCacheReason" not in last
    # The conformance checks of that reading against the log's own lines: compile work inside a compile
    # phase, the cache state and its reason, the total and the sum.
    verdicts = checks.log_checks("serve", checks.recorded_lines(recording), expected, evidence)
    assert all(verdicts.values()), verdicts
