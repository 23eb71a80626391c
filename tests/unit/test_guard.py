"""The ASGI guard in front of vLLM's dev-mode endpoints, driven directly as an ASGI app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stoker.guard import CONTROL_TOKEN_ENV, CONTROL_TOKEN_HEADER, ControlGuard, control_request_allowed

TOKEN = "s3cret-token"
PUBLIC_PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"]
CONTROL_PATHS = ["/sleep", "/wake_up", "/collective_rpc", "/server_info", "/is_sleeping"]


class InnerApp:
    """Stands in for vLLM: records each scope it sees and answers 200."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(dict(scope))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.accept"})


def drive(guard: ControlGuard, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs one ASGI call and returns the messages sent back."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(guard(scope, receive, send))
    return sent


def http(path: str, token: str | None = None, root_path: str = "", kind: str = "http") -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if token is not None:
        headers.append((CONTROL_TOKEN_HEADER.encode(), token.encode()))
    return {"type": kind, "path": path, "root_path": root_path, "headers": headers, "method": "POST"}


@pytest.fixture
def app() -> InnerApp:
    return InnerApp()


@pytest.fixture
def guard(app: InnerApp, monkeypatch: pytest.MonkeyPatch) -> ControlGuard:
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    return ControlGuard(app)


def status(sent: list[dict[str, Any]]) -> int:
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return int(start["status"])


def assert_forbidden(sent: list[dict[str, Any]]) -> None:
    assert status(sent) == 403
    start, body = sent
    assert (b"content-type", b"application/json") in start["headers"]
    assert (b"content-length", str(len(body["body"])).encode()) in start["headers"]
    assert "Forbidden" in json.loads(body["body"])["error"]


# ------------------------------------------------------------------------------ control_request_allowed


@pytest.mark.parametrize("path", PUBLIC_PATHS)
def test_public_paths_are_allowed_without_any_token(path: str) -> None:
    assert control_request_allowed(path, None, TOKEN)
    assert control_request_allowed(path, None, None)
    assert control_request_allowed(path, "wrong", TOKEN)


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_control_paths_need_the_right_token(path: str) -> None:
    assert control_request_allowed(path, TOKEN, TOKEN)
    assert not control_request_allowed(path, None, TOKEN)
    assert not control_request_allowed(path, "wrong", TOKEN)
    assert not control_request_allowed(path, "", TOKEN)
    assert not control_request_allowed(path, TOKEN + "x", TOKEN)


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_without_a_configured_token_no_control_request_passes(path: str) -> None:
    assert not control_request_allowed(path, None, None)
    assert not control_request_allowed(path, "", None)
    assert not control_request_allowed(path, "", "")
    assert not control_request_allowed(path, "anything", "")


def test_unknown_paths_fail_closed() -> None:
    for path in ["/", "/reset_prefix_cache", "/some_future_dev_endpoint", "/v1", "/sleepy"]:
        assert not control_request_allowed(path, None, TOKEN), path


# ------------------------------------------------------------------------------------------ ControlGuard


@pytest.mark.parametrize("path", PUBLIC_PATHS)
def test_guard_passes_public_paths_without_token(guard: ControlGuard, app: InnerApp, path: str) -> None:
    sent = drive(guard, http(path))
    assert status(sent) == 200
    assert [scope["path"] for scope in app.scopes] == [path]


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_guard_passes_control_paths_with_the_token(guard: ControlGuard, app: InnerApp, path: str) -> None:
    sent = drive(guard, http(path, token=TOKEN))
    assert status(sent) == 200
    assert [scope["path"] for scope in app.scopes] == [path]


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_guard_refuses_control_paths_without_the_token(guard: ControlGuard, app: InnerApp, path: str) -> None:
    assert_forbidden(drive(guard, http(path)))
    assert app.scopes == []


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_guard_refuses_a_wrong_token_with_a_json_403(guard: ControlGuard, app: InnerApp, path: str) -> None:
    assert_forbidden(drive(guard, http(path, token="not-" + TOKEN)))
    assert app.scopes == []


def test_the_token_in_another_header_does_not_count(guard: ControlGuard, app: InnerApp) -> None:
    scope = http("/sleep")
    scope["headers"].append((b"authorization", f"Bearer {TOKEN}".encode()))
    assert_forbidden(drive(guard, scope))
    assert app.scopes == []


@pytest.mark.parametrize("env_value", [None, ""])
def test_without_token_env_control_paths_are_always_refused(
    app: InnerApp, monkeypatch: pytest.MonkeyPatch, env_value: str | None
) -> None:
    if env_value is None:
        monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(CONTROL_TOKEN_ENV, env_value)
    guard = ControlGuard(app)
    for token in [None, "", TOKEN]:
        assert_forbidden(drive(guard, http("/sleep", token=token)))
    assert app.scopes == []
    assert status(drive(guard, http("/v1/completions"))) == 200
    assert len(app.scopes) == 1


def test_token_is_read_when_the_guard_is_built(app: InnerApp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    guard = ControlGuard(app)
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "rotated")
    assert status(drive(guard, http("/wake_up", token=TOKEN))) == 200
    assert_forbidden(drive(guard, http("/wake_up", token="rotated")))


def test_root_path_is_stripped_before_matching(guard: ControlGuard, app: InnerApp) -> None:
    # ASGI `path` includes `root_path`: behind a prefix, /llm/sleep is /sleep to vLLM's router.
    assert_forbidden(drive(guard, http("/llm/sleep", root_path="/llm")))
    assert status(drive(guard, http("/llm/v1/completions", root_path="/llm"))) == 200
    assert status(drive(guard, http("/llm/sleep", token=TOKEN, root_path="/llm"))) == 200
    # A root_path that itself looks public does not make a control path public.
    assert_forbidden(drive(guard, http("/v1/sleep", root_path="/v1")))
    assert [scope["path"] for scope in app.scopes] == ["/llm/v1/completions", "/llm/sleep"]


def test_lifespan_passes_through(guard: ControlGuard, app: InnerApp) -> None:
    sent = drive(guard, {"type": "lifespan", "asgi": {"version": "3.0"}})
    assert sent == []
    assert [scope["type"] for scope in app.scopes] == ["lifespan"]


def test_websocket_to_a_control_path_without_token_is_closed_with_1008(
    guard: ControlGuard, app: InnerApp
) -> None:
    sent = drive(guard, http("/collective_rpc", kind="websocket"))
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert app.scopes == []


def test_websocket_with_token_or_to_a_public_path_passes(guard: ControlGuard, app: InnerApp) -> None:
    sent = drive(guard, http("/collective_rpc", token=TOKEN, kind="websocket"))
    assert sent == [{"type": "websocket.accept"}]
    assert drive(guard, http("/v1/realtime", kind="websocket")) == [{"type": "websocket.accept"}]
    assert [scope["path"] for scope in app.scopes] == ["/collective_rpc", "/v1/realtime"]
