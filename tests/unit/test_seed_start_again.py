"""The seed's second start (stoker.inpod.seed --start-again): where the engine loads vLLM's mega AOT
artifact, a start that loads it JIT-compiles kernels of its own, so the seed runs that start too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.inpod.seed import MODEL_PATH_MISSING_EXIT, MODEL_PATH_MISSING_LINE, STOPPING_LINE, first_start
from stoker.phases.parser import parse_log
from stoker.render.engine import engine_invocation
from stoker.render.seed import seed_invocation
from tests.unit.test_render import service

MEGA = "VLLM_USE_MEGA_AOT_ARTIFACT"


@pytest.mark.parametrize(
    ("changes", "again"),
    [
        ({}, True),  # 0.26 on torch 2.11: vLLM leaves it off, stoker turns it on
        ({"runtime.env": [{"name": MEGA, "value": "0"}]}, False),
        ({"runtime.env": [{"name": MEGA, "value": "1"}]}, True),
        (
            {"runtime.env": [{"name": MEGA, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
            True,
        ),
        ({"runtime.engineVersion": "0.27.0"}, True),  # torch 2.13: on by default
        ({"runtime.engineVersion": "0.27.0", "runtime.env": [{"name": MEGA, "value": "0"}]}, False),
        ({"runtime.engineVersion": "0.22.1"}, False),  # no artifact
    ],
    ids=["0.26", "0.26-off", "0.26-on", "0.26-from-a-secret", "0.27", "0.27-off", "0.22"],
)
def test_the_seed_starts_again_where_the_engine_loads_the_mega_artifact(changes: dict, again: bool) -> None:
    svc = service(**changes)
    seed = seed_invocation(svc)
    wrapper = seed.args[: seed.args.index("--")]
    assert ("--start-again" in wrapper) is again
    # The server's own command is the seed's either way: the key does not move.
    assert seed.args[seed.args.index("--") + 1 :] == engine_invocation(svc, "seed").argv


@pytest.mark.parametrize(
    ("changes", "rendered"),
    [
        ({}, "1"),  # stoker turns it on where vLLM leaves it off
        ({"runtime.env": [{"name": MEGA, "value": "0"}]}, "0"),  # the user's value wins
        # The Secret's value reaches the pod by reference alone: no literal beside it.
        ({"runtime.env": [{"name": MEGA, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, None),
        ({"runtime.engineVersion": "0.27.0"}, None),  # vLLM's own default: nothing to render
        ({"runtime.engineVersion": "0.22.1"}, None),
    ],
    ids=["0.26", "0.26-off", "0.26-from-a-secret", "0.27", "0.22"],
)
def test_the_engine_env_turns_the_artifact_on_only_where_vllm_leaves_it_off(
    changes: dict, rendered: str | None
) -> None:
    svc = service(**changes)
    for role in ("seed", "serve"):
        assert engine_invocation(svc, role).env.get(MEGA) == rendered, role


# A stand-in for `vllm serve` (the wrapper's child): notes each start, answers /health and one completion,
# ends on SIGTERM.
SERVER = """
import http.server, signal, sys
with open(sys.argv[1], "a") as starts:
    starts.write("start\\n")
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with open(sys.argv[1], "a") as starts:
            starts.write("completion\\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Answer).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("again", [False, True], ids=["once", "again"])
def test_the_seed_program_runs_the_server_a_second_time_when_told(
    tmp_path: Path, programs: Path, again: bool
) -> None:
    starts, port = tmp_path / "starts", free_port()
    server = [sys.executable, "-c", SERVER, str(starts), str(port), "--port", str(port)]
    command = [*server, "--served-model-name", "m"]
    options = ["--pages", str(tmp_path / "listing"), *(["--start-again"] if again else [])]
    result = subprocess.run(
        [sys.executable, "-m", "stoker.inpod.seed", *options, "--", *command],
        env={**os.environ, "PYTHONPATH": str(programs)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert starts.read_text().split() == ["start", "completion"] * (2 if again else 1)
    assert ("stoker-seed: started again, healthy in " in result.stdout) is again


def test_the_seed_run_recorded_is_its_first_start() -> None:
    """A log of a seed that started again: the operator parses the compiling start, not the loading one."""
    log = (
        (Path(__file__).parent / "data" / "phases" / "vllm-0.26.0-h100" / "seed.log").read_text().splitlines()
    )
    stop = next(n for n, line in enumerate(log) if STOPPING_LINE in line)
    twice = [*log, *log[stop - 40 :]]  # a second server after the first stopped
    assert list(first_start(twice)) == log[: stop + 1]
    assert parse_log(first_start(twice)).phases == parse_log(log).phases
    assert parse_log(twice).phases != parse_log(log).phases


def test_the_seed_says_which_model_path_is_missing_before_any_server_starts(
    tmp_path: Path, programs: Path
) -> None:
    starts, missing = tmp_path / "starts", tmp_path / "models" / "llama-8b"
    server = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('start')", "serve", str(missing)]
    result = subprocess.run(
        [sys.executable, "-m", "stoker.inpod.seed", "--pages", str(tmp_path / "listing"), "--", *server],
        env={**os.environ, "PYTHONPATH": str(programs)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == MODEL_PATH_MISSING_EXIT
    assert result.stdout.splitlines()[-1] == f"{MODEL_PATH_MISSING_LINE} {missing}"
    assert not starts.exists()
