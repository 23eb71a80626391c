"""Where a start's weights came from with coldStart.peerWeights: ModelExpress's log lines (modelexpress 0.7.0,
copied onto vLLM's handlers, so they carry vLLM's header) read into a WeightsLoad.

A peer transfer is `[Worker W] [TIMING] RDMA transfer complete: N tensors, X GB, Ys, Z Gbps`, one per
tensor-parallel rank (load_strategy/rdma_strategy.py:680-684, GB = 1e9 bytes); a failed or sourceless peer
attempt is `Strategy rdma failed, trying next: <reason>` (load_strategy/__init__.py:132-135), after which
it loads from storage. Tenant output: every number is bounded, the reason cut and stripped of control
characters, the ranks counted at most MAX_RANKS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from stoker.untrusted import printable

WeightsSource = Literal["peer", "storage"]

LOADER_STARTING = "MxModelLoader starting"
TRANSFER_COMPLETE = "[TIMING] RDMA transfer complete: "
PEER_FAILED = "Strategy rdma failed, trying next: "
_TRANSFER = re.compile(
    r"(?:\[Worker (?P<worker>\d{1,4})\] )?\[TIMING\] RDMA transfer complete: (?P<tensors>\d{1,9}) tensors,"
    r" (?P<gb>\d{1,7}(?:\.\d{1,9})?) GB, (?P<seconds>\d{1,7}(?:\.\d{1,9})?)s,"
    r" (?P<gbps>\d{1,9}(?:\.\d{1,9})?) Gbps"
)
# One replica's ranks (runtime.tensorParallelSize is at most 64).
MAX_RANKS = 64
# Longer than any real checkpoint's transfer, and than ModelExpress's own receive bound allows.
MAX_TRANSFER_SECONDS = 86_400.0
MAX_GIGABYTES = 100_000.0
REASON_LIMIT = 256


@dataclass(frozen=True, slots=True)
class WeightsLoad:
    """peer: every rank that logged a transfer (`ranks`) read its shard from a peer, `transfer_seconds`
    the slowest, `gigabytes` their sum; storage: ModelExpress loaded from storage, `fallback_reason` why
    the peer path failed when it said."""

    source: WeightsSource
    transfer_seconds: float | None = None
    gigabytes: float | None = None
    ranks: int = 0
    fallback_reason: str | None = None

    @property
    def gigabytes_per_second(self) -> float | None:
        if not self.transfer_seconds or self.gigabytes is None:
            return None
        return round(self.gigabytes / self.transfer_seconds, 3)


@dataclass
class WeightsTracker:
    """Fed every vLLM log message of one process run; `result()` at any point."""

    loader_seen: bool = False
    transfers: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (GB, seconds)
    fallback_reason: str | None = None

    def feed(self, message: str) -> None:
        if LOADER_STARTING in message[:48]:  # after its `[Worker W] `
            self.loader_seen = True
        elif TRANSFER_COMPLETE in message:
            self._transfer(message)
        elif PEER_FAILED in message and self.fallback_reason is None:
            lines = message.split(PEER_FAILED, 1)[1].splitlines()
            reason = " ".join(printable(line) for line in lines).strip()
            self.fallback_reason = reason[:REASON_LIMIT] or "unknown"

    def _transfer(self, message: str) -> None:
        found = _TRANSFER.search(message)
        if found is None:
            return
        rank = int(found["worker"] or 0)
        gigabytes, seconds = float(found["gb"]), float(found["seconds"])
        if gigabytes > MAX_GIGABYTES or seconds > MAX_TRANSFER_SECONDS:
            return
        if rank in self.transfers or len(self.transfers) < MAX_RANKS:
            self.transfers[rank] = (gigabytes, seconds)

    def result(self) -> WeightsLoad | None:
        if self.transfers:
            return WeightsLoad(
                source="peer",
                transfer_seconds=round(max(seconds for _, seconds in self.transfers.values()), 3),
                gigabytes=round(sum(gigabytes for gigabytes, _ in self.transfers.values()), 3),
                ranks=len(self.transfers),
            )
        if self.loader_seen or self.fallback_reason is not None:
            return WeightsLoad(source="storage", fallback_reason=self.fallback_reason)
        return None
