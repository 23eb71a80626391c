"""Operator settings: the endpoints without authentication listen on loopback unless told otherwise; the pods'
programs come from the operator's own image."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import stoker
from stoker.controller.main import main as run_main
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


def test_leader_election_is_off_outside_the_chart_with_timings_that_take_over_within_15_s() -> None:
    settings = OperatorSettings()
    assert settings.leader_election is False
    # Worst case after the leader's last renewal: the lease, plus two retries to notice and take it.
    assert settings.leader_election_lease_seconds + 2 * settings.leader_election_retry_seconds < 15


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [("6", "6", "2"), ("10", "2", "2"), ("8", "12", "2")],
)
def test_election_timings_must_nest(
    monkeypatch: pytest.MonkeyPatch, lease: str, renew: str, retry: str
) -> None:
    monkeypatch.setenv("STOKER_LEADER_ELECTION_LEASE_SECONDS", lease)
    monkeypatch.setenv("STOKER_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", renew)
    monkeypatch.setenv("STOKER_LEADER_ELECTION_RETRY_SECONDS", retry)
    with pytest.raises(ValidationError, match="STOKER_LEADER_ELECTION_LEASE_SECONDS >"):
        OperatorSettings()


def test_the_control_key_secret_name_must_be_a_kubernetes_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_CONTROL_KEY_SECRET", "Not A Name")
    with pytest.raises(ValidationError):
        OperatorSettings()


def test_the_pods_copy_their_programs_from_the_operators_image_of_this_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert OperatorSettings().programs_image == f"ghcr.io/stoker-dev/stoker:{stoker.__version__}"
    monkeypatch.setenv("STOKER_PROGRAMS_IMAGE", "registry.example/stoker:0.1.0")
    assert OperatorSettings().programs_image == "registry.example/stoker:0.1.0"
    monkeypatch.setenv("STOKER_PROGRAMS_IMAGE", "two words")
    with pytest.raises(ValidationError, match="programs_image"):
        OperatorSettings()


def test_stoker_run_help_lists_every_setting_with_its_default(capsys) -> None:
    with pytest.raises(SystemExit):
        run_main(["--help"])
    shown = capsys.readouterr().out
    for name, setting in OperatorSettings.model_fields.items():
        assert f"STOKER_{name.upper()} (default: " in shown, name
        if setting.description:
            assert " ".join(setting.description.split()[:4]) in " ".join(shown.split()), name
    assert "STOKER_WORKERS (default: 16)" in shown
    assert "STOKER_CONTROL_KEY (default: unset)" in shown
