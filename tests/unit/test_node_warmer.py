"""The node warmer (stoker.inpod.node_warmer): its decision, table-driven, and the program itself as a real
process from the programs' copy, against real files and this machine's page cache."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stoker.inpod.node_warmer import (
    Decision,
    batches,
    decide,
    main,
    memory_available,
    memory_pressure,
    missing_ranges,
    within,
)
from stoker.inpod.pagecache import evict_pages, resident_pages

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    ("wanted", "missing", "budget", "available", "reserve", "pressure", "expected"),
    [
        # All resident, plenty of memory: warm, nothing read.
        (8 * GiB, 0, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("warm", 0, False)),
        # Some missing: read them all.
        (8 * GiB, 3 * GiB, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("warming", 3 * GiB, False)),
        # No PSI on this kernel: the same.
        (8 * GiB, 3 * GiB, 10 * GiB, 100 * GiB, 4 * GiB, None, Decision("warming", 3 * GiB, False)),
        # Reading all would take MemAvailable under the reserve: only what keeps it above.
        (8 * GiB, 3 * GiB, 10 * GiB, 5 * GiB, 4 * GiB, 0.0, Decision("warming", 1 * GiB, False)),
        # At the reserve exactly: nothing to read, not yet pressure.
        (8 * GiB, 3 * GiB, 10 * GiB, 4 * GiB, 4 * GiB, 0.0, Decision("warming", 0, False)),
        # Under the reserve: yield, drop the pages, even when all is resident.
        (8 * GiB, 0, 10 * GiB, 4 * GiB - 1, 4 * GiB, 0.0, Decision("yielding", 0, True)),
        # PSI at the threshold: yield whatever MemAvailable says.
        (8 * GiB, 3 * GiB, 10 * GiB, 100 * GiB, 4 * GiB, 10.0, Decision("yielding", 0, True)),
        (8 * GiB, 3 * GiB, 10 * GiB, 100 * GiB, 4 * GiB, 9.99, Decision("warming", 3 * GiB, False)),
        # Over budget: the prefix that fits is still warmed (missing counts within the budget only).
        (20 * GiB, 2 * GiB, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("overBudget", 2 * GiB, False)),
        (20 * GiB, 0, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("overBudget", 0, False)),
        # Over budget under pressure: yielding wins.
        (20 * GiB, 2 * GiB, 10 * GiB, 1 * GiB, 4 * GiB, 0.0, Decision("yielding", 0, True)),
        # Exactly the budget: not over it.
        (10 * GiB, 0, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("warm", 0, False)),
        # Nothing wanted (no checkpoint there): never warm, whatever the memory.
        (0, 0, 10 * GiB, 100 * GiB, 4 * GiB, 0.0, Decision("nothingFound", 0, False)),
        (0, 0, 10 * GiB, 1 * GiB, 4 * GiB, 0.0, Decision("nothingFound", 0, False)),
    ],
)
def test_the_decision(
    wanted: int,
    missing: int,
    budget: int,
    available: int,
    reserve: int,
    pressure: float | None,
    expected: Decision,
) -> None:
    assert decide(wanted, missing, budget, available, reserve, pressure) == expected


def test_the_budget_takes_the_first_ranges_in_order_and_cuts_the_last() -> None:
    ranges = [("/l", 0, 4), ("/a", 0, 16), ("/a", 16, 16)]
    assert within(ranges, 0) == []
    assert within(ranges, 4) == [("/l", 0, 4)]
    assert within(ranges, 10) == [("/l", 0, 4), ("/a", 0, 6)]
    assert within(ranges, 100) == ranges
    assert list(batches(ranges, 16)) == [[("/l", 0, 4), ("/a", 0, 16)], [("/a", 16, 16)]]


def test_missing_ranges_are_what_the_resident_runs_leave() -> None:
    ranges = [("/l", 0, 100), ("/a", 0, 50), ("/a", 50, 50), ("/b", 0, 10)]
    runs = [("/l", 10, 20), ("/l", 30, 200), ("/a", 40, 60), ("/c", 0, 10)]
    assert list(missing_ranges(ranges, runs)) == [
        ("/l", 0, 10),
        ("/l", 20, 10),
        ("/a", 0, 40),
        ("/a", 60, 40),
        ("/b", 0, 10),
    ]
    assert list(missing_ranges(ranges, [])) == ranges


def test_memory_is_read_from_meminfo_and_psi(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       100 kB\nMemFree:         10 kB\nMemAvailable:    50 kB\n")
    assert memory_available(str(meminfo)) == 50 * 1024
    pressure = tmp_path / "memory"
    pressure.write_text(
        "some avg10=12.50 avg60=1.00 avg300=0.10 total=123\nfull avg10=1.00 avg60=0 a=0 total=1\n"
    )
    assert memory_pressure(str(pressure)) == 12.5
    assert memory_pressure(str(tmp_path / "absent")) is None
    assert memory_available() > 0  # this machine's


@pytest.mark.parametrize(
    "arguments",
    [
        ["--service", "no-slash", "--pages", "/l", "--budget-bytes", "1", "--reserve-bytes", "1", "--", "/m"],
        ["--service", "ns/m", "--pages", "/l", "--budget-bytes", "-1", "--reserve-bytes", "1", "--", "/m"],
        [
            "--service",
            "ns/m",
            "--pages",
            "/l",
            "--budget-bytes",
            "1",
            "--reserve-bytes",
            "1",
            "--",
        ],
        ["--service", "ns/m", "--budget-bytes", "1", "--reserve-bytes", "1", "--", "/m"],
        ["--service", "ns/m", "--pages", "/l", "--budget-bytes", "1", "--reserve-bytes", "1", "--port", "0"],
        ["--service", 'ns/m"}', "--pages", "/l", "--budget-bytes", "1", "--reserve-bytes", "1", "--", "/m"],
        [
            "--service",
            "ns/m",
            "--pages",
            "/l",
            "--budget-bytes",
            "1",
            "--reserve-bytes",
            "1",
            "--interval",
            "0",
        ],
    ],
)
def test_bad_arguments_are_an_argparse_error(arguments: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2


def evictable(directory: Path) -> bool:
    """Whether the page cache of files in `directory` can be dropped (not on tmpfs)."""
    probe = directory / "probe"
    probe.write_bytes(os.urandom(MiB))
    with open(probe, "rb+") as opened:
        os.fsync(opened.fileno())
    evict_pages([str(probe)])
    dropped = resident_pages([str(probe)]) == []
    probe.unlink()
    return dropped


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a file system whose pages can be dropped: tmp_path, or one under .artifacts."""
    if evictable(tmp_path):
        yield tmp_path
        return
    (REPO / ".artifacts").mkdir(exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=REPO / ".artifacts", prefix="node-warmer-"))
    try:
        if not evictable(directory):
            pytest.skip("no file system here whose page cache can be dropped")
        yield directory
    finally:
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metrics(port: int) -> dict[str, float]:
    """The samples of /metrics by name, the state's by state."""
    samples = {}
    for line in get(port, "/metrics")[1].splitlines():
        if line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        if 'state="' in name:
            name = "state:" + name.split('state="')[1].rstrip('"}')
        else:
            assert name.endswith('{service="ns/llama"}'), name
            name = name.split("{")[0].removeprefix("stoker_node_warmer_")
        samples[name] = float(value)
    return samples


def until(condition: Callable[[], bool], seconds: float = 8.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.1)


def resident_bytes(files: list[str]) -> int:
    return sum(end - start for _, start, end in resident_pages(files))


@pytest.fixture
def model(disk_dir: Path) -> tuple[Path, Path, list[str]]:
    """A checkpoint directory (two shards, a FIFO shard, a link to a directory elsewhere) and an import-pages
    listing of a library; the files written to disk and out of the page cache."""
    checkpoint = disk_dir / "model"
    checkpoint.mkdir()
    outside = disk_dir / "elsewhere"
    outside.mkdir()
    files = [
        checkpoint / "model-00001-of-00002.safetensors",
        checkpoint / "model-00002-of-00002.safetensors",
        disk_dir / "libtorch.so",
        outside / "not-ours.safetensors",
    ]
    for path, size in zip(files, [3 * MiB, 2 * MiB, 2 * MiB, MiB], strict=True):
        path.write_bytes(os.urandom(size))
        with open(path, "rb+") as opened:
            os.fsync(opened.fileno())
    os.mkfifo(checkpoint / "fifo.safetensors")
    (checkpoint / "link").symlink_to(outside)
    listing = disk_dir / "import-pages"
    listing.write_text(f"{files[2]} 0 {MiB}\n{files[2]} {MiB + MiB // 2} {2 * MiB}\n")
    names = [str(path) for path in files]
    evict_pages(names)
    assert resident_bytes(names) == 0
    return checkpoint, listing, names


def start(programs: Path, checkpoint: Path, listing: Path, port: int, reserve: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "stoker.inpod.node_warmer", "--service", "ns/llama"]
    command += ["--pages", str(listing), "--budget-bytes", str(GiB), "--reserve-bytes", str(reserve)]
    command += ["--interval", "0.2", "--port", str(port), "--", str(checkpoint)]
    environment = {**os.environ, "PYTHONPATH": str(programs)}
    agent = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def serving() -> bool:
        assert agent.poll() is None, agent.communicate()[0]
        try:
            get(port, "/metrics")
        except OSError:
            return False
        return True

    until(serving)
    return agent


def stop(agent: subprocess.Popen[str]) -> list[str]:
    agent.send_signal(signal.SIGTERM)
    output, _ = agent.communicate(timeout=10)
    assert agent.returncode == 0, output
    return output.splitlines()


def test_the_agent_warms_rewarms_after_an_eviction_and_yields_under_pressure(
    programs: Path, model: tuple[Path, Path, list[str]]
) -> None:
    checkpoint, listing, files = model
    ours = files[:3]
    wanted = 3 * MiB + 2 * MiB + MiB + MiB // 2
    port = free_port()
    agent = start(programs, checkpoint, listing, port, reserve=0)
    try:
        until(lambda: get(port, "/ready") == (200, "warm"))
        samples = metrics(port)
        assert samples["wanted_bytes"] == wanted
        assert samples["resident_bytes"] == wanted
        assert samples["budget_bytes"] == GiB
        assert samples["state:warm"] == 1 and samples["state:warming"] == 0
        assert resident_bytes(ours) >= wanted
        assert resident_bytes(files[3:]) == 0  # behind a directory link: not followed
        first = samples["rewarmed_bytes_total"]
        assert first >= wanted - (MiB // 2)  # a page or so may have been resident already

        evict_pages(ours)
        until(lambda: metrics(port)["rewarmed_bytes_total"] >= first + wanted)
        until(lambda: get(port, "/ready") == (200, "warm"))
        assert metrics(port)["resident_bytes"] == wanted
    finally:
        lines = stop(agent)
    states = [
        json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("stoker-node-warmer: {")
    ]
    # A first read of less than 512 MiB is done before the first line: warm at once.
    assert states[0] == {"state": "warm", "residentBytes": wanted, "wantedBytes": wanted, "budgetBytes": GiB}
    skips = [line for line in lines if not line.startswith("stoker-node-warmer: {")]
    assert sorted(skips) == [
        f"stoker-node-warmer: skipped {checkpoint}/fifo.safetensors: a FIFO, not a regular file",
        f"stoker-node-warmer: skipped {checkpoint}/link: a link to a directory, not followed",
    ]  # each once, though every round walks the tree again

    # A reserve over the node's MemAvailable: yield at once, pages dropped, nothing read.
    agent = start(programs, checkpoint, listing, port, reserve=1 << 60)
    try:
        until(lambda: get(port, "/ready") == (503, "yielding"))
        samples = metrics(port)
        assert samples["state:yielding"] == 1 and samples["state:warm"] == 0
        assert samples["rewarmed_bytes_total"] == 0
        assert samples["resident_bytes"] == 0
        assert resident_bytes(ours) == 0
    finally:
        lines = stop(agent)
    assert json.loads(lines[-1].split(": ", 1)[1])["state"] == "yielding"


def test_over_budget_it_warms_the_first_ranges_that_fit_and_no_more(
    programs: Path, model: tuple[Path, Path, list[str]]
) -> None:
    checkpoint, listing, files = model
    port = free_port()
    command = [sys.executable, "-m", "stoker.inpod.node_warmer", "--service", "ns/llama", "--pages"]
    command += [str(listing), "--budget-bytes", str(2 * MiB), "--reserve-bytes", "0", "--interval", "0.2"]
    command += ["--port", str(port), "--", str(checkpoint)]
    agent = subprocess.Popen(
        command, env={**os.environ, "PYTHONPATH": str(programs)}, stdout=subprocess.PIPE, text=True
    )
    try:
        until(
            lambda: agent.poll() is None and "overBudget" in (agent.stdout.readline() if agent.stdout else "")
        )
        until(lambda: metrics(port)["resident_bytes"] >= 2 * MiB)
        assert get(port, "/ready")[0] == 503
        # The listing's 1.5 MiB, then the first half MiB of the first shard, in order.
        assert resident_bytes(files[:1]) == MiB // 2
        assert resident_bytes(files[1:2]) == 0
        assert metrics(port)["rewarmed_bytes_total"] <= 2 * MiB
    finally:
        stop(agent)
