"""Operator settings, read from STOKER_* environment variables and validated at start."""

from __future__ import annotations

import json
import textwrap
from ipaddress import IPv4Address, IPv6Address
from typing import Annotated

from pydantic import Field, IPvAnyAddress, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from stoker.render.memory import GIB
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STOKER_", extra="ignore")

    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch (JSON list); empty watches the whole cluster."
    )
    drift_interval_seconds: float = Field(30.0, gt=0, description="How often every object is re-checked.")
    retry_initial_seconds: float = Field(
        1.0,
        gt=0,
        description="Wait before retrying a failed reconcile; it doubles with each failure in a row.",
    )
    retry_max_seconds: float = Field(
        300.0, gt=0, description="Longest wait before retrying a failed reconcile."
    )
    metrics_port: int = Field(8080, ge=1, le=65535)
    liveness_port: int = Field(8081, ge=1, le=65535)
    # Loopback unless told otherwise: neither endpoint authenticates. The chart binds liveness to the pod
    # IP (the kubelet probes it there) and metrics to the pod IP only when something scrapes them.
    metrics_bind_address: IPvAnyAddress = Field(IPv4Address("127.0.0.1"), description="Metrics listen here.")
    liveness_bind_address: IPvAnyAddress = Field(
        IPv4Address("127.0.0.1"), description="Liveness listens here."
    )
    field_manager: str = Field("stoker", min_length=1)
    programs_image: str = Field(
        DEFAULT_PROGRAMS_IMAGE,
        min_length=1,
        pattern=r"^\S+$",
        description="Image the seed and serving pods copy stoker's in-pod programs from (an init"
        " container runs `stoker programs DIR` in it): the operator's own, so that operator and programs"
        " are one version. The chart sets it to the operator's image.",
    )
    max_log_bytes: int = Field(8 * 1024 * 1024, ge=4096, description="Bound on one pod log read.")
    startup_history: int = Field(20, ge=1, le=100, description="Startup samples kept in status.")
    workers: int = Field(16, ge=1, le=256, description="Threads running reconciles at once.")
    control_key: SecretStr | None = Field(
        None,
        description="Key the standby control tokens are derived from; keep it across restarts. Unset, with"
        " control_key_secret: read from that Secret, which the operator creates once. Unset without it: a"
        " random key per process, so standby pods started before a restart fail their wake and are replaced.",
    )
    control_key_secret: str = Field(
        "",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
        description="Secret in operator_namespace holding the control key: created with a random key if"
        " absent, never overwritten, so re-applies, upgrades, restarts and a second replica keep the key.",
    )
    operator_namespace: str = Field(
        "default",
        min_length=1,
        description="The operator's own namespace: its control key, its Lease and its startup coefficients.",
    )
    coefficients_configmap: str = Field(
        "stoker-startup-coefficients",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="ConfigMap in operator_namespace holding the fleet's observed starts, per namespace and"
        " hardware class; created if absent.",
    )
    coefficients_observations: int = Field(
        10, ge=1, le=50, description="Observed starts kept per namespace and hardware class (the newest)."
    )
    leader_election: bool = Field(
        False, description="Reconcile only while holding the Lease, so that replicas can run side by side."
    )
    leader_election_lease_name: str = Field("stoker-leader", min_length=1)
    # A follower takes over at most lease + 2 retry periods after the leader's last renewal (12 s here).
    leader_election_lease_seconds: int = Field(8, ge=2)
    leader_election_renew_deadline_seconds: int = Field(
        6,
        ge=2,
        description="The leader's term: it writes only this long after its last renewal began, and exits"
        " (to be restarted) when the term passes without one. Shorter than the lease: the difference is the"
        " margin for clock rates and a write in flight.",
    )
    leader_election_retry_seconds: int = Field(2, ge=1)
    standby_drain_seconds: float = Field(
        5.0, ge=0, description="A demoted pod leaves the Service this long before it is put to sleep."
    )
    standby_sleep_timeout_seconds: float = Field(300.0, gt=0, description="Bound on one /sleep call.")
    shared_gpu_memory_gib: float = Field(
        80.0,
        gt=0,
        description="The memory of a GPU shared through coldStart.standby.sharedGpu, for the part sleeping"
        " engines keep (about 1.5 GiB each): a smaller figure than the device has is the safe side.",
    )
    node_warming_budget_gib: float = Field(
        32.0,
        gt=0,
        description="Host memory per node that coldStart.nodeWarming may keep in the page cache, shared"
        " fairly between the namespaces that warm: each gets the budget split evenly between them (or its"
        " quota), and what that leaves goes to the namespace holding least (controller/warming.py).",
    )
    node_warming_namespace_quotas_gib: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="Per-namespace caps on the node warming budget, GiB per node (JSON object, namespace to"
        " GiB): a namespace listed never holds more, whatever is left. Unlisted namespaces have no cap but"
        " the fair sharing of the budget.",
    )
    node_warming_reserve_gib: float = Field(
        4.0,
        ge=0,
        description="Memory a node warmer leaves free on its node: below it, the warmer lets its pages go"
        " rather than take memory a pod needs.",
    )
    scale_from_zero_period_seconds: float = Field(
        1.0,
        gt=0,
        le=300,
        description="How often the queue of the endpoint picker is read for each VLLMService that sets"
        " spec.inferencePool.scaleFromZero and runs zero replicas.",
    )
    snapshot_enabled: bool = Field(
        False,
        description="Snapshot and restore (docs/benchmarks/snapshot.md): serving pods start under"
        " engine_init, which a node agent (the chart's snapshot.enabled) restores an engine of the pod's"
        " cache key into, or dumps the first served one from. Needs the control key (STOKER_CONTROL_KEY or"
        " STOKER_CONTROL_KEY_SECRET), which signs the pods the agent may act on.",
    )
    snapshot_restore_wait_seconds: int = Field(
        10,
        ge=0,
        le=600,
        description="How long a snapshot pod waits for the agent to claim a restore before it starts its"
        " engine itself.",
    )
    snapshot_restore_bound_seconds: int = Field(
        120,
        ge=1,
        le=1800,
        description="How long a claimed restore may take before the pod starts its engine itself.",
    )
    snapshot_offer_bound_seconds: int = Field(
        300,
        ge=1,
        le=3600,
        description="How long a pod that started its engine stays out of its Service waiting for the agent's"
        " dump, if the agent neither dumps nor declines it.",
    )
    log_level: str = Field("INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")

    @model_validator(mode="after")
    def _election_timings_nest(self) -> OperatorSettings:
        # A leader must give up before its lease can be taken, and retry more than once before that.
        if not (
            self.leader_election_lease_seconds
            > self.leader_election_renew_deadline_seconds
            > 1.2 * self.leader_election_retry_seconds
        ):
            raise ValueError(
                "need STOKER_LEADER_ELECTION_LEASE_SECONDS > STOKER_LEADER_ELECTION_RENEW_DEADLINE_SECONDS"
                " > 1.2 * STOKER_LEADER_ELECTION_RETRY_SECONDS"
            )
        return self

    @model_validator(mode="after")
    def _retry_bounds_nest(self) -> OperatorSettings:
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ValueError("need STOKER_RETRY_MAX_SECONDS >= STOKER_RETRY_INITIAL_SECONDS")
        return self

    @model_validator(mode="after")
    def _snapshots_are_signed(self) -> OperatorSettings:
        if self.snapshot_enabled and self.control_key is None and not self.control_key_secret:
            raise ValueError(
                "STOKER_SNAPSHOT_ENABLED needs STOKER_CONTROL_KEY or STOKER_CONTROL_KEY_SECRET: the key signs"
                " the pods the snapshot agent may act on"
            )
        return self

    @property
    def node_warming_budget_bytes(self) -> int:
        return int(self.node_warming_budget_gib * GIB)

    @property
    def node_warming_namespace_quota_bytes(self) -> dict[str, int]:
        return {ns: int(gib * GIB) for ns, gib in self.node_warming_namespace_quotas_gib.items()}

    @property
    def node_warming_reserve_bytes(self) -> int:
        return int(self.node_warming_reserve_gib * GIB)

    @property
    def liveness_endpoint(self) -> str:
        host = self.liveness_bind_address
        return f"http://{f'[{host}]' if isinstance(host, IPv6Address) else host}:{self.liveness_port}/healthz"


def _shown_default(setting: FieldInfo) -> str:
    value = setting.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return json.dumps(value)
    return json.dumps(value) if value == "" else str(value)


def settings_help() -> str:
    """Every setting as `stoker run --help` lists it: its variable, default and description (from the model,
    so that the list cannot fall behind it)."""
    prefix = OperatorSettings.model_config.get("env_prefix", "")
    lines = ["settings (environment variables):"]
    for name, setting in OperatorSettings.model_fields.items():
        lines.append(f"  {prefix}{name.upper()} (default: {_shown_default(setting)})")
        if setting.description:
            lines += textwrap.wrap(
                setting.description, width=100, initial_indent="      ", subsequent_indent="      "
            )
    return "\n".join(lines)
