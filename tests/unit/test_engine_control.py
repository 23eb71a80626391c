"""EngineControl against a real local HTTP server that stands in for vLLM's sleep-mode endpoints."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from stoker.standby import EngineControl, EngineControlError, WakeTiming
from tests.fakevllm import FakeEngine, FakeEngineServer

TOKEN = "control-token"
MODEL = "llama"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(token=TOKEN)


@pytest.fixture
def base_url(engine: FakeEngine) -> Iterator[str]:
    server = FakeEngineServer(engine)
    try:
        yield server.url
    finally:
        server.close()


def paths(engine: FakeEngine) -> list[tuple[str, str]]:
    return engine.paths()


def test_sleep_then_is_sleeping(engine: FakeEngine, base_url: str) -> None:
    control = EngineControl(base_url + "/", TOKEN)  # a trailing slash is tolerated
    assert control.is_sleeping(2) is False
    seconds = control.sleep(1, 2)
    assert seconds >= 0
    assert engine.sleeping is True
    assert control.is_sleeping(2) is True
    assert paths(engine) == [("GET", "/is_sleeping"), ("POST", "/sleep"), ("GET", "/is_sleeping")]


def test_sleep_waits_for_running_requests_at_the_given_level(engine: FakeEngine, base_url: str) -> None:
    EngineControl(base_url, TOKEN).sleep(1, 2)
    ((method, path, query, body),) = engine.requests
    assert (method, path) == ("POST", "/sleep")
    assert query == {"level": ["1"], "mode": ["wait"]}
    assert body is None


def test_wake_serves_and_times_each_step(engine: FakeEngine, base_url: str) -> None:
    engine.sleeping = True
    engine.step_seconds = 0.02
    timing = EngineControl(base_url, TOKEN).wake(MODEL, 5)
    assert isinstance(timing, WakeTiming)
    assert 0 < timing.wake_seconds <= timing.health_seconds <= timing.served_seconds < 5
    assert timing.health_seconds - timing.wake_seconds >= 0.02
    assert timing.served_seconds - timing.health_seconds >= 0.02
    assert engine.sleeping is False
    assert paths(engine) == [("POST", "/wake_up"), ("GET", "/health"), ("POST", "/v1/completions")]
    completion = engine.requests[-1][3]
    assert completion is not None
    assert completion["model"] == MODEL
    assert completion["max_tokens"] == 1


def test_wrong_token_is_refused_with_http_403(engine: FakeEngine, base_url: str) -> None:
    control = EngineControl(base_url, "not-the-token")
    with pytest.raises(EngineControlError, match="HTTP 403") as error:
        control.sleep(1, 2)
    assert "POST /sleep" in str(error.value)
    with pytest.raises(EngineControlError, match="HTTP 403"):
        control.wake(MODEL, 2)
    with pytest.raises(EngineControlError, match="HTTP 403"):
        control.is_sleeping(2)
    assert engine.sleeping is False


def test_engine_without_a_token_refuses_every_control_call(engine: FakeEngine, base_url: str) -> None:
    engine.token = ""
    with pytest.raises(EngineControlError, match="HTTP 403"):
        EngineControl(base_url, "").sleep(1, 2)


def test_failed_completion_fails_the_wake(engine: FakeEngine, base_url: str) -> None:
    engine.answers["/v1/completions"] = (503, {"error": "overloaded"})
    with pytest.raises(EngineControlError, match=r"POST /v1/completions: HTTP 503"):
        EngineControl(base_url, TOKEN).wake(MODEL, 2)
    assert paths(engine)[-1] == ("POST", "/v1/completions")


@pytest.mark.parametrize("answer", [{"choices": []}, {"object": "error"}])
def test_completion_without_choices_fails_the_wake(engine: FakeEngine, base_url: str, answer: object) -> None:
    engine.answers["/v1/completions"] = (200, answer)
    with pytest.raises(EngineControlError, match="no choices"):
        EngineControl(base_url, TOKEN).wake(MODEL, 2)


def test_a_sleeping_engine_fails_the_wake_probe(engine: FakeEngine, base_url: str) -> None:
    # /wake_up answered but the engine still does not serve: the completion proves it.
    engine.sleeping = True
    engine.answers["/wake_up"] = (200, b"")
    with pytest.raises(EngineControlError, match=r"POST /v1/completions: HTTP 503"):
        EngineControl(base_url, TOKEN).wake(MODEL, 2)


@pytest.mark.parametrize("answer", [b"<html>proxy error</html>", ["x"]], ids=["html", "list"])
def test_completion_that_is_not_a_json_object_fails_the_wake(
    engine: FakeEngine, base_url: str, answer: object
) -> None:
    engine.answers["/v1/completions"] = (200, answer)
    with pytest.raises(EngineControlError):
        EngineControl(base_url, TOKEN).wake(MODEL, 2)


def test_is_sleeping_answer_that_is_not_json_raises_engine_control_error(
    engine: FakeEngine, base_url: str
) -> None:
    engine.answers["/is_sleeping"] = (200, b"")
    with pytest.raises(EngineControlError):
        EngineControl(base_url, TOKEN).is_sleeping(2)


def test_wake_that_hangs_fails_within_the_timeout(engine: FakeEngine, base_url: str) -> None:
    engine.sleeping = True
    engine.wake_delay = 3.0
    started = time.monotonic()
    with pytest.raises(EngineControlError, match="POST /wake_up"):
        EngineControl(base_url, TOKEN).wake(MODEL, 0.5)
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 2.0
    assert paths(engine) == [("POST", "/wake_up")]


def test_deadline_covers_all_steps(engine: FakeEngine, base_url: str) -> None:
    # Each step alone is well inside the timeout, all three together are not.
    engine.step_seconds = 0.3
    started = time.monotonic()
    with pytest.raises(EngineControlError):
        EngineControl(base_url, TOKEN).wake(MODEL, 0.5)
    assert time.monotonic() - started < 2.0
    assert ("POST", "/v1/completions") not in paths(engine)


def test_connection_refused_raises_engine_control_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens there now.
    control = EngineControl(f"http://127.0.0.1:{port}", TOKEN)
    started = time.monotonic()
    with pytest.raises(EngineControlError, match="POST /wake_up"):
        control.wake(MODEL, 2)
    with pytest.raises(EngineControlError, match="POST /sleep"):
        control.sleep(1, 2)
    with pytest.raises(EngineControlError, match="GET /is_sleeping"):
        control.is_sleeping(2)
    assert time.monotonic() - started < 2.0


def test_bad_url_raises_engine_control_error() -> None:
    with pytest.raises(EngineControlError):
        EngineControl("not-a-url", TOKEN).is_sleeping(1)
