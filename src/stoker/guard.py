"""An ASGI middleware for vLLM (`--middleware stoker.guard.ControlGuard`) that keeps its control endpoints
to the operator.

Sleep mode needs `VLLM_SERVER_DEV_MODE=1`, which also opens `/sleep`, `/wake_up`, `/collective_rpc`,
`/server_info` and more on the port the Service exposes. Paths a client of the Service needs pass as
they are; every other path needs the pod's control token in the CONTROL_TOKEN_HEADER header. An
allowlist fails closed: a dev-mode endpoint added by a later vLLM is guarded too.

This module runs inside the vLLM image: the standard library only, and nothing else of stoker imported.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

CONTROL_TOKEN_ENV = "STOKER_CONTROL_TOKEN"
CONTROL_TOKEN_HEADER = "x-stoker-control-token"
_HEADER_BYTES = CONTROL_TOKEN_HEADER.encode()  # ASGI header names arrive lower-cased

# Prefixes of what vLLM serves to its clients (the OpenAI and other APIs, health, metrics, tokenizers).
PUBLIC_PREFIXES = (
    "/v1/",
    "/v2/",
    "/inference/",
    "/health",
    "/ping",
    "/metrics",
    "/version",
    "/load",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def control_request_allowed(path: str, presented_token: str | None, token: str | None) -> bool:
    """Whether a request for `path` with `presented_token` may pass; without a configured token, no
    control request does."""
    if path.startswith(PUBLIC_PREFIXES):
        return True
    if not token or presented_token is None:
        return False
    return hmac.compare_digest(presented_token.encode(), token.encode())


class ControlGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.token = os.environ.get(CONTROL_TOKEN_ENV) or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        presented = next(
            (value.decode("latin-1") for name, value in scope.get("headers", ()) if name == _HEADER_BYTES),
            None,
        )
        if control_request_allowed(path, presented, self.token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "Forbidden: a stoker control endpoint"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
