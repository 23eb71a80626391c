"""Keep a VLLMService's checkpoint and its seed's import pages in this node's page cache, within a budget.

The node agent of a VLLMService's node warming: every --interval seconds it lists the pages it wants (the
ranges of the seed's import-pages LISTING first, then the *.safetensors files under each PATH, as the
read-ahead reads them), counts how many of them are in the page cache (mincore) and reads the missing ones
again, in order and at nice 10, so that a replica that lands on the node finds them in memory. It only
reads: it never writes a file, and the memory it fills is page cache, which the kernel reclaims for pods.

- It reads no more than --budget-bytes of them (the first ranges in order; the state is then overBudget),
  and never so many that the node's MemAvailable would fall under --reserve-bytes.
- Under memory pressure (MemAvailable under --reserve-bytes, or /proc/pressure/memory `some avg10` at
  10 % or more) it reads nothing and drops the pages of its files (POSIX_FADV_DONTNEED) once, so that the
  memory goes to pods at once; the state is yielding until the pressure is gone.

- A checkpoint of no data (no *.safetensors regular file under any PATH: a missing directory, a FIFO,
  a link to a device or nowhere, each skipped with a line) is not warm: it says so in a line (state
  nothingFound) and exits with NOTHING_FOUND_EXIT, so that the pod is not Ready and the operator reports
  NodeWarming NothingFound; the kubelet starts it again later, when the files may be there.

It serves GET /ready (200 once everything wanted is resident, state warm; else 503) and GET /metrics
(Prometheus text) on --port, and prints one `stoker-node-warmer: {json}` line at start and at each change
of state. It opens regular files only, does not follow directory links and bounds its walks and the
listing, as the read-ahead does, saying once in a line why it skips anything. SIGTERM ends it (exit 0).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import chain

from stoker.inpod import options_and_command, program_parser
from stoker.inpod.pagecache import SkipLines, evict_pages, resident_pages
from stoker.inpod.read_ahead import checkpoint_ranges, listed_ranges, read_ranges

# Where /ready and /metrics listen unless --port says otherwise (the DaemonSet's probe uses it).
DEFAULT_PORT = 9401
LINE_PREFIX = "stoker-node-warmer: "
STATES = ("warm", "warming", "yielding", "overBudget", "nothingFound")
# The exit code of an agent that found no checkpoint data to keep (the operator reads it from the pod).
NOTHING_FOUND_EXIT = 3
# /proc/pressure/memory `some avg10` (the share of the last 10 s in which some task waited for memory, in
# percent) from which the agent yields.
PRESSURE_THRESHOLD = 10.0
# What the agent reads between two looks at the node's memory (and at SIGTERM): a few seconds of a disk.
BATCH_BYTES = 512 << 20
# The skip lines already printed, each once in the agent's life (its rounds see the same tree again).
MAX_REMEMBERED_SKIPS = 10_000
SERVICE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")

Range = tuple[str, int, int]


@dataclass(frozen=True)
class Decision:
    state: str  # one of STATES
    read_bytes: int  # how many of the missing bytes within the budget to read now, in order
    evict: bool  # drop the pages of the agent's files (memory pressure)


def under_pressure(available: int, reserve: int, pressure: float | None) -> bool:
    return available < reserve or (pressure is not None and pressure >= PRESSURE_THRESHOLD)


def decide(
    wanted: int, missing: int, budget: int, available: int, reserve: int, pressure: float | None
) -> Decision:
    """What a round does, from the bytes of all the ranges wanted, the bytes not resident of those within
    the budget (the prefix that fits), the budget, the node's MemAvailable, the reserve and the PSI
    `some avg10` (None where the kernel has no PSI). Nothing wanted is never warm."""
    if wanted == 0:
        return Decision("nothingFound", 0, False)
    if under_pressure(available, reserve, pressure):
        return Decision("yielding", 0, True)
    read = min(missing, available - reserve)
    if wanted > budget:
        # Over the budget the agent still warms the prefix that fits (the import pages first, then the
        # checkpoint's first files), never more: a part of the checkpoint still saves its reads from disk,
        # and the budget is what the node's owner allowed, so nothing past it is read.
        return Decision("overBudget", read, False)
    return Decision("warm" if missing == 0 else "warming", read, False)


def within(ranges: Iterable[Range], limit: int) -> list[Range]:
    """The first `ranges`, in order, that `limit` bytes hold, the last one cut to fit."""
    taken, total = [], 0
    for path, offset, length in ranges:
        if total >= limit:
            break
        length = min(length, limit - total)
        taken.append((path, offset, length))
        total += length
    return taken


def batches(ranges: list[Range], limit: int) -> Iterator[list[Range]]:
    """`ranges` in order, in lists of about `limit` bytes (each range whole)."""
    batch: list[Range] = []
    for taken in ranges:
        batch.append(taken)
        if size(batch) >= limit:
            yield batch
            batch = []
    if batch:
        yield batch


def missing_ranges(ranges: Iterable[Range], runs: list[Range]) -> Iterator[Range]:
    """The parts of `ranges` ((path, offset, length)) that the resident `runs` ((path, start, end), from
    resident_pages: sorted and apart within each file) do not cover."""
    by_path: dict[str, list[tuple[int, int]]] = {}
    for path, start, end in runs:
        by_path.setdefault(path, []).append((start, end))
    starts = {path: [start for start, _ in found] for path, found in by_path.items()}
    for path, offset, length in ranges:
        position, end = offset, offset + length
        found = by_path.get(path, [])
        index = max(bisect.bisect_right(starts.get(path, []), offset) - 1, 0)
        while position < end and index < len(found):
            start, stop = found[index]
            if start >= end:
                break
            if start > position:
                yield path, position, start - position
            position = max(position, stop)
            index += 1
        if position < end:
            yield path, position, end - position


def size(ranges: Iterable[Range]) -> int:
    return sum(length for _, _, length in ranges)


def memory_available(meminfo: str = "/proc/meminfo") -> int:
    """The node's MemAvailable in bytes (/proc/meminfo is the node's, also in a container)."""
    with open(meminfo, encoding="ascii") as lines:
        for line in lines:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{meminfo} has no MemAvailable")


def memory_pressure(pressure: str = "/proc/pressure/memory") -> float | None:
    """The node's PSI `some avg10` (percent), or None where the kernel has no PSI."""
    try:
        with open(pressure, encoding="ascii") as lines:
            for line in lines:
                if line.startswith("some "):
                    fields = dict(field.split("=", 1) for field in line.split()[1:] if "=" in field)
                    return float(fields["avg10"])
    except (OSError, ValueError, KeyError):
        return None
    return None


def skipped_once(lines: SkipLines) -> Callable[[str, str], None]:
    """`lines`, each (what, why) once: every round walks the same tree again."""
    seen: set[tuple[str, str]] = set()

    def skipped(what: str, why: str) -> None:
        if (what, why) not in seen:
            if len(seen) < MAX_REMEMBERED_SKIPS:
                seen.add((what, why))
            lines(what, why)

    return skipped


class Warmer:
    """The agent's rounds, and what its endpoints report of the last one."""

    def __init__(
        self,
        service: str,
        listing: str,
        paths: list[str],
        budget: int,
        reserve: int,
        skipped: Callable[[str, str], None],
    ) -> None:
        self.service, self.listing, self.paths = service, listing, paths
        self.budget, self.reserve, self.skipped = budget, reserve, skipped
        self.lock = threading.Lock()
        self.state: str | None = None
        self.resident = self.wanted = self.read_total = 0
        self.evicted = False  # the files' pages dropped since the agent began to yield
        self.stopped = threading.Event()

    def measure(self) -> tuple[list[Range], list[str], list[Range], int, int]:
        """The wanted ranges (listing first, then the checkpoint: the ranges the read-ahead reads), their
        files, the missing ranges within the budget, the resident bytes of them all and the checkpoint's
        bytes."""
        # A file in both the listing and the checkpoint (unlikely: the seed lists what the server read
        # before its engine loaded the weights) counts twice in the wanted bytes, as it is read twice.
        checkpoint = list(checkpoint_ranges(self.paths, skipped=self.skipped))
        wanted = list(chain(listed_ranges(self.listing, skipped=self.skipped), checkpoint))
        files = list(dict.fromkeys(path for path, _, _ in wanted))
        runs = resident_pages(files, self.skipped, max_file=1 << 50)
        resident = size(wanted) - size(missing_ranges(wanted, runs))
        missing = list(missing_ranges(within(wanted, self.budget), runs))
        return wanted, files, missing, resident, size(checkpoint)

    def round(self) -> bool:
        """One round; False where there is no checkpoint data to keep (state nothingFound)."""
        wanted, files, missing, resident, checkpoint = self.measure()
        if not checkpoint:
            self.publish("nothingFound", resident, size(wanted))
            return False
        decision = decide(
            size(wanted), size(missing), self.budget, memory_available(), self.reserve, memory_pressure()
        )
        if decision.evict and not self.evicted:
            # Once on entering the state: dropping pages again each round would also drop those that a
            # replica starting meanwhile reads. Before the state is published, so that its figures are
            # those after the drop.
            evict_pages(files)
            wanted, files, missing, resident, _ = self.measure()
        self.evicted = decision.evict
        if not decision.read_bytes or decision.read_bytes > BATCH_BYTES:
            # Before a read that may take minutes; not before a short one, which a few pages evicted by
            # the node's own reclaim call for: /ready and the line would flap for a second.
            self.publish(decision.state, resident, size(wanted))
        if decision.read_bytes:
            self.read(within(missing, decision.read_bytes))
            wanted, files, missing, resident, _ = self.measure()
            decision = decide(
                size(wanted), size(missing), self.budget, memory_available(), self.reserve, memory_pressure()
            )
        self.publish(decision.state, resident, size(wanted))
        return True

    def read(self, ranges: list[Range]) -> None:
        """Read `ranges` with the read-ahead's reader, about BATCH_BYTES at a time, stopping at SIGTERM or
        memory pressure. `exact`: no kernel read-ahead past them, so nothing past the budget is read."""
        for batch in batches(ranges, BATCH_BYTES):
            if self.stopped.is_set() or under_pressure(memory_available(), self.reserve, memory_pressure()):
                return
            done = read_ranges(batch, exact=True)
            with self.lock:
                self.read_total += done

    def publish(self, state: str, resident: int, wanted: int) -> None:
        with self.lock:
            changed = state != self.state
            self.state, self.resident, self.wanted = state, resident, wanted
        if changed:
            line = {
                "state": state,
                "residentBytes": resident,
                "wantedBytes": wanted,
                "budgetBytes": self.budget,
            }
            print(LINE_PREFIX + json.dumps(line), flush=True)

    def metrics(self) -> str:
        with self.lock:
            state, resident, wanted, read = self.state, self.resident, self.wanted, self.read_total
        label = f'service="{self.service}"'  # SERVICE's characters need no escaping
        lines = [
            "# TYPE stoker_node_warmer_resident_bytes gauge",
            f"stoker_node_warmer_resident_bytes{{{label}}} {resident}",
            "# TYPE stoker_node_warmer_wanted_bytes gauge",
            f"stoker_node_warmer_wanted_bytes{{{label}}} {wanted}",
            "# TYPE stoker_node_warmer_budget_bytes gauge",
            f"stoker_node_warmer_budget_bytes{{{label}}} {self.budget}",
            "# TYPE stoker_node_warmer_state gauge",
            *(f'stoker_node_warmer_state{{{label},state="{name}"}} {int(name == state)}' for name in STATES),
            "# TYPE stoker_node_warmer_rewarmed_bytes_total counter",
            f"stoker_node_warmer_rewarmed_bytes_total{{{label}}} {read}",
        ]
        return "\n".join(lines) + "\n"

    def ready(self) -> bool:
        with self.lock:
            return self.state == "warm"


def serve(warmer: Warmer, port: int) -> ThreadingHTTPServer:
    """GET /ready and GET /metrics on `port` of every address (IPv6 and IPv4 where the node has both), in a
    thread of their own."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/ready":
                code, body, kind = (200 if warmer.ready() else 503), b"", "text/plain"
                body = (warmer.state or "starting").encode()
            elif self.path == "/metrics":
                code, body, kind = 200, warmer.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
            else:
                code, body, kind = 404, b"not found", "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a probe every few seconds: no line each

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            if self.address_family == socket.AF_INET6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            # Not HTTPServer's: its getfqdn may wait on a DNS the pod cannot reach.
            socketserver.TCPServer.server_bind(self)

    class Server6(Server):
        address_family = socket.AF_INET6

    try:
        server: ThreadingHTTPServer = Server6(("::", port), Handler)
    except OSError:  # no IPv6 on this node
        server = Server(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def service_name(text: str) -> str:
    if not SERVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not NAMESPACE/NAME: {text[:300]!r}")
    return text


def bytes_count(text: str) -> int:
    if not text.isdigit() or len(text) > 20:
        raise argparse.ArgumentTypeError(f"not a number of bytes: {text[:300]!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"not a number of seconds over 0 and at most 86400: {text[:300]!r}")
    return value


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text[:300]!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    usage = "%(prog)s --service NAMESPACE/NAME --pages LISTING --budget-bytes N --reserve-bytes M"
    usage += " [--interval SECONDS] [--port PORT] -- PATH..."
    described = program_parser("stoker.inpod.node_warmer", __doc__, usage)
    described.add_argument(
        "--service", required=True, type=service_name, help="the VLLMService, NAMESPACE/NAME (metrics label)"
    )
    described.add_argument(
        "--pages",
        required=True,
        metavar="LISTING",
        help="the seed's import-pages listing (`path start end` lines), read first; absent: none",
    )
    described.add_argument(
        "--budget-bytes",
        required=True,
        type=bytes_count,
        metavar="N",
        help="the most bytes kept warm: what the operator admitted this service for (its pod's memory"
        " limit is just above it)",
    )
    described.add_argument(
        "--reserve-bytes",
        required=True,
        type=bytes_count,
        metavar="M",
        help="the node's MemAvailable that the agent leaves to pods: under it, it reads nothing and drops"
        " its pages",
    )
    described.add_argument("--interval", type=seconds, default=10.0, metavar="SECONDS", help="default 10")
    described.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help="of /ready and /metrics (default %(default)s)"
    )
    return described


def main(argv: list[str] | None = None) -> int:
    options, paths = options_and_command(sys.argv[1:] if argv is None else argv)
    described = parser()
    settings = described.parse_args(options)
    if not paths:
        described.error("no PATH after --")
    os.nice(10)
    skips = SkipLines(LINE_PREFIX)
    warmer = Warmer(
        settings.service,
        settings.pages,
        paths,
        settings.budget_bytes,
        settings.reserve_bytes,
        skipped_once(skips),
    )
    signal.signal(signal.SIGTERM, lambda *_: warmer.stopped.set())
    signal.signal(signal.SIGINT, lambda *_: warmer.stopped.set())
    server = serve(warmer, settings.port)
    found = True
    while found and not warmer.stopped.is_set():
        try:
            found = warmer.round()
        except Exception as error:  # a round that failed (a volume gone): said once, tried again
            warmer.skipped("a round", f"failed ({error!r:.300})")
        if found:
            warmer.stopped.wait(settings.interval)
    server.shutdown()
    skips.close()
    if not found:
        where = ascii(" ".join(paths)[:300])
        print(f"{LINE_PREFIX}found nothing to keep warm: no *.safetensors data under {where}", flush=True)
    return 0 if found else NOTHING_FOUND_EXIT


if __name__ == "__main__":
    sys.exit(main())
