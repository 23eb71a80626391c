"""Operator settings: the endpoints without authentication listen on loopback unless told otherwise."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stoker.controller.settings import OperatorSettings


def test_endpoints_default_to_loopback() -> None:
    settings = OperatorSettings()
    assert str(settings.metrics_bind_address) == "127.0.0.1"
    assert settings.liveness_endpoint == "http://127.0.0.1:8081/healthz"


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [("10.244.1.7", "http://10.244.1.7:9000/healthz"), ("fd00::7", "http://[fd00::7]:9000/healthz")],
)
def test_liveness_endpoint_on_the_pod_ip(
    monkeypatch: pytest.MonkeyPatch, address: str, endpoint: str
) -> None:
    monkeypatch.setenv("STOKER_LIVENESS_BIND_ADDRESS", address)
    monkeypatch.setenv("STOKER_LIVENESS_PORT", "9000")
    assert OperatorSettings().liveness_endpoint == endpoint


def test_a_bind_address_must_be_an_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_METRICS_BIND_ADDRESS", "everywhere")
    with pytest.raises(ValidationError):
        OperatorSettings()
