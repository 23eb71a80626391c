"""A test double of the vLLM HTTP endpoints stoker calls: /health, /sleep, /wake_up, /is_sleeping and
/v1/completions, and /metrics in vLLM's Prometheus text format (what a gateway's endpoint picker scrapes),
behind the same rule as stoker.guard (a caller without the control token is refused).

It is a real HTTP server on a real address: in unit tests on 127.0.0.1, in e2e tests on a fake pod's own
IP (hack/cluster makes the pod range local), where the operator dials it as it would dial a vLLM pod.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stoker.guard import CONTROL_TOKEN_HEADER, control_request_allowed

# method, path, query, JSON body
Request = tuple[str, str, dict[str, list[str]], object]


@dataclass
class FakeEngine:
    """The double's state and the failures it is told to produce."""

    token: str | None
    sleeping: bool = False
    requests: list[Request] = field(default_factory=list)
    answers: dict[str, tuple[int, object]] = field(default_factory=dict)  # path -> forced status and body
    wake_delay: float = 0.0  # /wake_up takes this long
    step_seconds: float = 0.0  # every endpoint takes this long, so timed steps are apart
    model: str = "fake-model"  # the model_name label of /metrics
    waiting: int = 0  # vllm:num_requests_waiting
    running: int = 0  # vllm:num_requests_running
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc (a fraction, as vLLM reports it)

    def paths(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _, _ in list(self.requests)]

    def _route(self, method: str, path: str) -> tuple[int, object]:
        time.sleep(self.step_seconds)
        if path in self.answers:
            return self.answers[path]
        if (method, path) == ("POST", "/sleep"):
            self.sleeping = True
        elif (method, path) == ("POST", "/wake_up"):
            time.sleep(self.wake_delay)
            self.sleeping = False
        elif (method, path) == ("GET", "/is_sleeping"):
            return 200, {"is_sleeping": self.sleeping}
        elif (method, path) == ("GET", "/metrics"):
            return 200, self.metrics().encode()
        elif (method, path) == ("POST", "/v1/completions"):
            return (503, {"error": "asleep"}) if self.sleeping else (200, {"choices": [{"text": "x"}]})
        elif (method, path) != ("GET", "/health"):
            return 404, {"error": "not found"}
        return 200, b""

    def metrics(self) -> str:
        """The gauges vLLM exports that the Gateway API Inference Extension's endpoint picker reads."""
        labels = f'engine="0",model_name="{self.model}"'
        gauges = [
            ("vllm:num_requests_running", "Number of requests in model execution batches.", self.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage),
        ]
        lines: list[str] = []
        for name, help_text, value in gauges:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines.append(f"{name}{{{labels}}} {float(value)}")
        info = 'block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"'
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{info}}} 1.0",
        ]
        return "\n".join(lines) + "\n"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that timed out and left makes the reply fail: expected here


class FakeEngineServer:
    """Serves `engine` on (host, port) until closed; `url` is where it listens."""

    def __init__(self, engine: FakeEngine, host: str = "127.0.0.1", port: int = 0) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                engine.requests.append((method, url.path, urllib.parse.parse_qs(url.query), body))
                if control_request_allowed(url.path, self.headers.get(CONTROL_TOKEN_HEADER), engine.token):
                    status, answer = engine._route(method, url.path)
                else:
                    status, answer = 403, {"error": "Forbidden"}
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                text = url.path == "/metrics" and isinstance(answer, bytes)
                self.send_header("Content-Type", "text/plain; version=0.0.4" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.engine = engine
        self.server = _QuietServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
