"""Engines sharing one GPU: who must sleep before another wakes, and the wake against engine doubles."""

from __future__ import annotations

import datetime as dt

import pytest

from fakevllm import FakeEngine, FakeEngineServer
from stoker.standby import EngineControl, EngineControlError
from stoker.standby.gpushare import (
    SLEEPING_ENGINE_GIB,
    SharedEngine,
    device_lock,
    plan_memory,
    wake_on_shared_gpu,
)

T0 = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
H200_GIB = 140.0


def engine(name: str, share: float, awake: bool, wanted: bool = False, minute: int = 0) -> SharedEngine:
    return SharedEngine(name, share, awake, wanted, T0 + dt.timedelta(minutes=minute))


def test_a_wake_that_fits_beside_the_awake_engines_sleeps_none() -> None:
    plan = plan_memory(
        [engine("a", 0.4, True, wanted=True), engine("b", 0.4, False)], engine("c", 0.4, False), 80
    )
    assert plan.fits and plan.sleep_first == ()


def test_an_unwanted_awake_engine_falls_asleep_first_the_longest_awake_first() -> None:
    engines = [
        engine("newer", 0.3, True, minute=5),
        engine("older", 0.3, True, minute=1),
        engine("serving", 0.3, True, wanted=True),
    ]
    plan = plan_memory(engines, engine("target", 0.3, False), H200_GIB)
    assert plan.fits
    assert [e.name for e in plan.sleep_first] == ["older"]


def test_a_wanted_engine_is_never_put_to_sleep_for_another() -> None:
    plan = plan_memory([engine("serving", 0.55, True, wanted=True)], engine("target", 0.55, False), H200_GIB)
    assert not plan.fits and plan.sleep_first == ()
    assert [e.name for e in plan.blocked_by] == ["serving"]
    assert "serving (0.55)" in plan.describe("target", H200_GIB)


def test_sleeping_engines_keep_a_residue_that_counts_against_the_rest() -> None:
    sleepers = [engine(f"s{i}", 0.5, False) for i in range(8)]
    # 8 sleepers at 1.5 GiB on an 80 GiB device leave 85 %: a 0.9 share no longer fits, a 0.85 one does.
    assert pytest.approx(0.85) == 1.0 - 8 * SLEEPING_ENGINE_GIB / 80
    assert not plan_memory(sleepers, engine("t", 0.9, False), 80).fits
    assert plan_memory(sleepers, engine("t", 0.85, False), 80).fits


@pytest.fixture
def engines_on_one_gpu() -> dict[str, FakeEngineServer]:
    servers = {
        "awake": FakeEngineServer(FakeEngine(token="t", sleeping=False)),
        "target": FakeEngineServer(FakeEngine(token="t", sleeping=True)),
        "asleep": FakeEngineServer(FakeEngine(token="t", sleeping=True)),
    }
    yield servers
    for server in servers.values():
        server.close()


def test_the_wake_asks_the_engines_sleeps_the_awake_one_then_serves(
    engines_on_one_gpu: dict[str, FakeEngineServer],
) -> None:
    servers = engines_on_one_gpu
    # The pods' view is stale: it says "awake" sleeps; the engine itself says otherwise and is asked.
    neighbours = [engine("awake", 0.55, False, minute=1), engine("asleep", 0.55, False)]
    slept: list[str] = []
    result = wake_on_shared_gpu(
        "ns/claim",
        H200_GIB,
        engine("target", 0.55, False, wanted=True),
        neighbours,
        lambda e: EngineControl(servers[e.name].url, "t"),
        "model",
        level=1,
        timeout=10,
        on_slept=lambda e, seconds: slept.append(e.name),
    )
    assert slept == ["awake"] and [name for name, _ in result.slept] == ["awake"]
    assert servers["awake"].engine.sleeping and not servers["target"].engine.sleeping
    assert servers["asleep"].engine.sleeping
    assert result.timing is not None and result.served_seconds is not None
    assert result.served_seconds >= result.timing.served_seconds
    paths = servers["awake"].engine.paths()
    assert paths.index(("GET", "/is_sleeping")) < paths.index(("POST", "/sleep"))


def test_a_caller_holding_the_devices_lock_may_wake_under_it(
    engines_on_one_gpu: dict[str, FakeEngineServer],
) -> None:
    # The operator reads the engines on the device under its lock, then wakes: the lock is taken again.
    servers = engines_on_one_gpu
    with device_lock("ns/held"):
        result = wake_on_shared_gpu(
            "ns/held",
            H200_GIB,
            engine("target", 0.3, False, wanted=True),
            [],
            lambda e: EngineControl(servers[e.name].url, "t"),
            "model",
            level=1,
            timeout=10,
        )
    assert result.timing is not None and not servers["target"].engine.sleeping


def test_no_wake_when_the_memory_is_held_by_engines_that_serve(
    engines_on_one_gpu: dict[str, FakeEngineServer],
) -> None:
    servers = engines_on_one_gpu
    result = wake_on_shared_gpu(
        "ns/claim",
        H200_GIB,
        engine("target", 0.55, False, wanted=True),
        [engine("awake", 0.55, True, wanted=True)],
        lambda e: EngineControl(servers[e.name].url, "t"),
        "model",
        level=1,
        timeout=10,
    )
    assert not result.plan.fits and result.timing is None
    assert servers["target"].engine.sleeping and not servers["awake"].engine.sleeping


def test_an_engine_that_cannot_be_asked_counts_as_awake_and_must_be_reachable_to_sleep() -> None:
    with pytest.raises(EngineControlError, match="no address"):
        wake_on_shared_gpu(
            "ns/claim",
            H200_GIB,
            engine("target", 0.55, False, wanted=True),
            [engine("starting", 0.55, False)],
            lambda e: None,
            "model",
            level=1,
            timeout=1,
        )
