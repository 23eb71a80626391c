"""A test double of the vLLM HTTP endpoints stoker calls: /health, /sleep, /wake_up, /is_sleeping and
/v1/completions, guarded by the same rule as stoker.guard (so a caller without the control token is refused).

It is a real HTTP server on a real address: in e2e tests, on a fake pod's own IP (hack/cluster makes the
pod range local), where the operator dials it exactly as it would dial a vLLM pod.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stoker.guard import CONTROL_TOKEN_HEADER, control_request_allowed


class FakeEngine:
    """One engine's state; `wake_delay` makes /wake_up hang, `serve_fails` makes completions fail."""

    def __init__(self, host: str, port: int, token: str | None) -> None:
        self.token = token
        self.asleep = False
        self.wake_delay = 0.0
        self.serve_fails = False
        self.calls: list[str] = []  # "METHOD /path?query" of every request, refused ones too
        self.lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _answer(self, status: int, body: object | None = None) -> None:
                data = json.dumps(body if body is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                url = urllib.parse.urlsplit(self.path)
                with engine.lock:
                    engine.calls.append(f"{method} {self.path}")
                if not control_request_allowed(
                    url.path, self.headers.get(CONTROL_TOKEN_HEADER), engine.token
                ):
                    self._answer(403, {"error": "Forbidden"})
                    return
                route = (method, url.path)
                if route == ("GET", "/health"):
                    self._answer(200)
                elif route == ("POST", "/sleep"):
                    engine.asleep = True
                    self._answer(200)
                elif route == ("POST", "/wake_up"):
                    time.sleep(engine.wake_delay)
                    engine.asleep = False
                    self._answer(200)
                elif route == ("GET", "/is_sleeping"):
                    self._answer(200, {"is_sleeping": engine.asleep})
                elif route == ("POST", "/v1/completions"):
                    if engine.asleep or engine.serve_fails:
                        self._answer(503, {"error": "not serving"})
                    else:
                        self._answer(200, {"choices": [{"text": "!"}]})
                else:
                    self._answer(404)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.address = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def called(self, prefix: str) -> list[str]:
        with self.lock:
            return [call for call in self.calls if call.startswith(prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
