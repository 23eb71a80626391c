"""Engines that share one GPU (the pods naming one DRA ResourceClaim): which of them must fall asleep before
another wakes or starts (pure), and the one sequence of engine calls that does it, one at a time per GPU.

Measured on an H200 (vLLM 0.26, issue 25): waking a second engine while another is awake on the same GPU
fails with HTTP 500 (`CUDA Error: out of memory` in the cumem allocator), so whoever wakes engines must know
which share a device, ask them whether they sleep, and make room first. An awake engine holds its
`--gpu-memory-utilization` share of the device; a sleeping one about 1.1 GB (8B, level 1).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stoker.standby.client import EngineControl, EngineControlError, WakeTiming

# What a sleeping engine keeps on its GPU: 1.1 GB measured (H200, 8B, level 1), CUDA context included.
SLEEPING_ENGINE_GIB = 1.5
# Asking one engine whether it sleeps, just before deciding: the engines, not a cache, say what is awake.
IS_SLEEPING_TIMEOUT_SECONDS = 2.0


class MakingRoomFailed(EngineControlError):
    """An engine that had to fall asleep for another did not: the target was not woken."""


@dataclass(frozen=True)
class SharedEngine:
    name: str  # the pod
    share: float  # its --gpu-memory-utilization: the fraction of the device it holds awake
    holds_memory: bool  # awake or starting; False once asleep
    wanted: bool  # its service wants it serving (role active); an unwanted one may be put to sleep
    since: dt.datetime  # when it last woke or started: the longest awake falls asleep first


@dataclass(frozen=True)
class MemoryPlan:
    fits: bool
    sleep_first: tuple[SharedEngine, ...] = ()
    blocked_by: tuple[SharedEngine, ...] = ()  # wanted engines holding the memory when it does not fit

    def describe(self, target: str, device_gib: float) -> str:
        if self.fits:
            slept = ", ".join(engine.name for engine in self.sleep_first)
            return f"{target} fits on its GPU" + (f" once {slept} sleeps" if slept else "")
        holders = ", ".join(f"{engine.name} ({engine.share:g})" for engine in self.blocked_by)
        return (
            f"{target} does not fit on its GPU ({device_gib:g} GiB): engines serving their services hold"
            f" the memory: {holders}"
        )


def plan_memory(engines: Iterable[SharedEngine], target: SharedEngine, device_gib: float) -> MemoryPlan:
    """Whether `target` may wake (or start) on a device shared with `engines`, and which unwanted awake
    engines must fall asleep first (the longest awake first, as few as it takes). A wanted engine is never
    put to sleep for another: two services that want more than the GPU holds wait, and say so."""
    others = [engine for engine in engines if engine.name != target.name]
    residue = SLEEPING_ENGINE_GIB / device_gib
    held = sum(engine.share for engine in others if engine.holds_memory)
    usable = 1.0 - residue * sum(not engine.holds_memory for engine in others)
    if held + target.share <= usable:
        return MemoryPlan(fits=True)
    chosen: list[SharedEngine] = []
    for engine in sorted((e for e in others if e.holds_memory and not e.wanted), key=lambda e: e.since):
        chosen.append(engine)
        held -= engine.share
        usable -= residue
        if held + target.share <= usable:
            return MemoryPlan(fits=True, sleep_first=tuple(chosen))
    return MemoryPlan(fits=False, blocked_by=tuple(e for e in others if e.holds_memory and e.wanted))


_device_locks: dict[str, threading.RLock] = {}
_device_locks_guard = threading.Lock()


def device_lock(device: str) -> threading.RLock:
    """One lock per shared GPU: wakes, sleeps that make room, and starts on it happen one at a time. The
    same caller may hold it again, to read the engines on the device before deciding."""
    with _device_locks_guard:
        return _device_locks.setdefault(device, threading.RLock())


def ask_engines(
    engines: Iterable[SharedEngine], control: Callable[[SharedEngine], EngineControl | None]
) -> list[SharedEngine]:
    """`engines` with `holds_memory` as each engine says now (GET /is_sleeping). One that cannot be asked (no
    address yet, not answering) is taken to hold its share: a starting engine does."""
    answered: list[SharedEngine] = []
    for engine in engines:
        engine_control = control(engine)
        try:
            holds = engine_control is None or not engine_control.is_sleeping(IS_SLEEPING_TIMEOUT_SECONDS)
        except EngineControlError:
            holds = True
        answered.append(SharedEngine(engine.name, engine.share, holds, engine.wanted, engine.since))
    return answered


@dataclass(frozen=True)
class SharedWake:
    plan: MemoryPlan
    slept: tuple[tuple[str, float], ...] = ()  # (pod, seconds its sleep took), in order
    timing: WakeTiming | None = None  # None when it did not fit
    served_seconds: float | None = None  # from the decision to the served completion, sleeps included


def wake_on_shared_gpu(
    device: str,
    device_gib: float,
    target: SharedEngine,
    neighbours: Iterable[SharedEngine],
    control: Callable[[SharedEngine], EngineControl | None],
    model: str,
    level: int,
    timeout: float,
    on_slept: Callable[[SharedEngine, float], None] = lambda engine, seconds: None,
) -> SharedWake:
    """Under the device's lock: ask the neighbours whether they sleep, put to sleep those the plan names
    (`on_slept` records each at once, so a failure later leaves no engine marked wrongly), then wake
    `target` and prove it serves. Raises MakingRoomFailed when a neighbour's sleep fails, EngineControlError
    when the wake does."""
    with device_lock(device):
        started = time.monotonic()
        plan = plan_memory(ask_engines(neighbours, control), target, device_gib)
        if not plan.fits:
            return SharedWake(plan)
        slept: list[tuple[str, float]] = []
        for engine in plan.sleep_first:
            engine_control = control(engine)
            if engine_control is None:
                raise EngineControlError(
                    f"{engine.name} holds GPU memory and has no address to put it to sleep"
                )
            seconds = engine_control.sleep(level, timeout)
            on_slept(engine, seconds)
            slept.append((engine.name, seconds))
        target_control = control(target)
        if target_control is None:
            raise EngineControlError(f"{target.name} has no address")
        left = max(timeout - (time.monotonic() - started), 0.001)
        timing = target_control.wake(model, left)
        return SharedWake(plan, tuple(slept), timing, time.monotonic() - started)
