"""The typed result of parsing a startup log, and its one-line summary for Kubernetes Events."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from stoker.phases.snapshot import SnapshotStart
from stoker.phases.weights import WeightsLoad

CompileCache = Literal["hit", "miss", "none"]
# Why a miss: a kept compile cache was there and could not be loaded, so the engine compiled again.
CompileCacheReason = Literal["loadFailed"]

COMPILE_PHASES = ("dynamo", "compileLoad", "compile")

# Kubernetes caps an Event message at 1024 characters.
_EVENT_MESSAGE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class StartupTimeline:
    """Phase durations in seconds, in phase order; phases whose end marker is absent are left out."""

    phases: dict[str, float] = field(default_factory=dict)
    total_seconds: float | None = None
    compile_cache: CompileCache = "none"
    compile_cache_reason: CompileCacheReason | None = None
    # The version the log announced, else the one the parser was told; None when neither.
    engine_version: str | None = None
    # Device memory one worker's weights took (`Model loading took X GiB`), when a GPU runner logged it.
    worker_weight_bytes: int | None = None
    # coldStart.peerWeights: from a peer or from storage, as ModelExpress logged it; None without it.
    weights: WeightsLoad | None = None
    # Snapshot and restore: restored, or started by itself, as the pod's engine_init said; None without it.
    snapshot: SnapshotStart | None = None
    failed: bool = False
    reason: str | None = None
    ready: bool = False
    # When the engine logged that it serves (`Starting vLLM server on`), on the log's clock; None when the
    # clock tells no date (the recorder's seconds since process start, without the start's date).
    ready_at: datetime | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The `stoker phases --json` document: `failed` and `reason` appear only when startup failed,
        `compileCacheReason` and `engineVersion` only when known."""
        document: dict[str, Any] = {
            "phases": dict(self.phases),
            "totalSeconds": self.total_seconds,
            "compileCache": self.compile_cache,
        }
        if self.compile_cache_reason is not None:
            document["compileCacheReason"] = self.compile_cache_reason
        if self.engine_version is not None:
            document["engineVersion"] = self.engine_version
        document.update(weights_document(self.weights))
        document.update(snapshot_document(self.snapshot))
        if self.failed:
            document["failed"] = True
            document["reason"] = self.reason
        return document


def summarize(timeline: StartupTimeline) -> str:
    """One line for an Event, e.g. `Started in 63.2 s (weights 10.7 s, compile 4.6 s, cache hit)`."""
    snapshot = timeline.snapshot
    if snapshot is not None and snapshot.outcome == "restored":
        message = f"Restored from the node's snapshot in {snapshot.restore_seconds:.1f} s"
    elif timeline.failed:
        message = f"Failed to start: {timeline.reason}"
    elif timeline.ready and timeline.total_seconds is not None:
        details = []
        if "weightLoad" in timeline.phases:
            details.append(
                f"weights {timeline.phases['weightLoad']:.1f} s{_weights_detail(timeline.weights)}"
            )
        if timeline.compile_cache == "none":
            details.append("no compile")
        else:
            # Dynamo tracing and compiling (or, on a cache hit, artifact loading) make torch.compile's total.
            compile_seconds = sum(timeline.phases.get(phase, 0.0) for phase in COMPILE_PHASES)
            details.append(f"compile {compile_seconds:.1f} s")
            cache = f"cache {timeline.compile_cache}"
            if timeline.compile_cache_reason == "loadFailed":
                cache += " (the kept cache failed to load)"
            details.append(cache)
        message = f"Started in {timeline.total_seconds:.1f} s ({', '.join(details)})"
        if snapshot is not None:
            message += f"; not restored: {snapshot.reason}"
    elif timeline.phases:
        last_phase = next(reversed(timeline.phases))
        message = f"Not ready after {sum(timeline.phases.values()):.1f} s (last phase done: {last_phase})"
    else:
        message = "Not ready (no startup phase finished yet)"
    return message[:_EVENT_MESSAGE_LIMIT]


def snapshot_document(start: SnapshotStart | None) -> dict[str, Any]:
    """The start record's snapshot fields (status.startup, `stoker phases --json`): none without
    engine_init."""
    if start is None:
        return {}
    document: dict[str, Any] = {"snapshot": start.outcome}
    if start.reason is not None:
        document["snapshotReason"] = start.reason
    if start.restore_seconds is not None:
        document["snapshotRestoreSeconds"] = start.restore_seconds
    return document


def weights_document(weights: WeightsLoad | None) -> dict[str, Any]:
    """The start record's weights fields (status.startup, `stoker phases --json`): none when ModelExpress
    said nothing."""
    if weights is None:
        return {}
    document: dict[str, Any] = {"weightsSource": weights.source}
    if weights.source == "peer":
        document.update(
            peerTransferSeconds=weights.transfer_seconds,
            peerTransferGigabytes=weights.gigabytes,
            peerTransferGigabytesPerSecond=weights.gigabytes_per_second,
        )
    elif weights.fallback_reason is not None:
        document["peerFallbackReason"] = weights.fallback_reason
    return document


def _weights_detail(weights: WeightsLoad | None) -> str:
    if weights is None:
        return ""
    if weights.source == "peer":
        rate = weights.gigabytes_per_second
        return f" from a peer: {weights.gigabytes} GB in {weights.transfer_seconds} s" + (
            f", {rate} GB/s" if rate is not None else ""
        )
    because = f", the peer path failed: {weights.fallback_reason}" if weights.fallback_reason else ""
    return f" from storage{because}"
