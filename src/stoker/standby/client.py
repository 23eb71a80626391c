"""HTTP calls to one vLLM engine's sleep-mode endpoints, with the pod's control token.

The operator and the GPU benchmark both wake engines through `EngineControl.wake`, so what the benchmark
measures is what the operator does.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from stoker.guard import CONTROL_TOKEN_HEADER

PROBE_PROMPT = "Hello"


class EngineControlError(Exception):
    """A call failed or the deadline passed; the message says which step."""


@dataclass(frozen=True)
class WakeTiming:
    """Seconds from sending POST /wake_up until it returned, /health answered and a completion was served."""

    wake_seconds: float
    health_seconds: float
    served_seconds: float


class EngineControl:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, timeout: float, body: object | None = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        headers = {CONTROL_TOKEN_HEADER: self.token}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
            with urllib.request.urlopen(request, timeout=max(timeout, 0.001)) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise EngineControlError(f"{method} {path}: HTTP {error.code}") from error
        except (OSError, ValueError) as error:  # refused, reset, timed out, bad URL
            raise EngineControlError(f"{method} {path}: {error}") from error

    def _call_json(
        self, method: str, path: str, timeout: float, body: object | None = None
    ) -> dict[str, Any]:
        answer = self._call(method, path, timeout, body)
        try:
            document = json.loads(answer)
        except ValueError as error:
            raise EngineControlError(f"{method} {path}: not JSON: {answer[:80]!r}") from error
        if not isinstance(document, dict):
            raise EngineControlError(f"{method} {path}: not a JSON object: {answer[:80]!r}")
        return document

    def sleep(self, level: int, timeout: float) -> float:
        """Put the engine to sleep once running requests finished (`mode=wait`); returns seconds taken."""
        started = time.monotonic()
        self._call("POST", f"/sleep?level={level}&mode=wait", timeout)
        return time.monotonic() - started

    def is_sleeping(self, timeout: float) -> bool:
        return bool(self._call_json("GET", "/is_sleeping", timeout).get("is_sleeping"))

    def wake(self, model: str, timeout: float) -> WakeTiming:
        """Wake the engine and prove it serves: /wake_up, then /health, then one completion, all within
        `timeout` seconds of the first call."""
        started = time.monotonic()

        def left() -> float:
            remaining = timeout - (time.monotonic() - started)
            if remaining <= 0:
                raise EngineControlError(f"not served within {timeout:g} s")
            return remaining

        self._call("POST", "/wake_up", left())
        woke = time.monotonic() - started
        self._call("GET", "/health", left())
        healthy = time.monotonic() - started
        probe = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1}
        completion = self._call_json("POST", "/v1/completions", left(), probe)
        if not completion.get("choices"):
            raise EngineControlError("POST /v1/completions: no choices in the answer")
        return WakeTiming(woke, healthy, time.monotonic() - started)
