"""A work queue of objects to reconcile, as controller-runtime has: deduplicated, delayed, never concurrent.

kopf handlers only put keys here and return at once; a fixed pool of threads reconciles. A key is in
the queue at most once, however many events name it; a key is never reconciled by two threads at once;
an event that names a key under reconcile makes it run once more afterwards. Bursts of child events
(a rollout changes a Deployment and its pods many times) thus cost a reconcile or two, not one each.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]  # (namespace, name)
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # after failed runs of one key, in turn


class WorkQueue:
    def __init__(self, handle: Callable[[ObjectKey, bool], float | None], workers: int) -> None:
        """`handle(key, resync)` reconciles; it may return seconds after which to reconcile that key again."""
        self._handle = handle
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, ObjectKey]] = []  # heap of (due time, tie-breaker, key)
        self._order = itertools.count()
        self._queued: dict[ObjectKey, bool] = {}  # key -> resync wanted; keys waiting in the heap
        self._due_at: dict[ObjectKey, float] = {}  # key -> when its live heap entry is due
        # Keys whose spec changed (or that are new) go before everything in the heap: a user's edit
        # should not wait behind a storm of child events.
        self._urgent: deque[ObjectKey] = deque()
        self._active: set[ObjectKey] = set()
        self._again: dict[ObjectKey, bool] = {}  # keys named while under reconcile -> resync wanted
        self._failures: dict[ObjectKey, int] = {}
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True) for i in range(workers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def add(self, key: ObjectKey, *, resync: bool, delay: float = 0.0, urgent: bool = False) -> None:
        """Reconcile `key` after `delay` seconds (`urgent`: now, first), or sooner if it is already due;
        `resync` is sticky."""
        due = time.monotonic() + delay
        with self._cond:
            if key in self._active:
                self._again[key] = self._again.get(key, False) or resync
                return
            self._queued[key] = self._queued.get(key, False) or resync
            if urgent:
                if key not in self._urgent:
                    self._urgent.append(key)
                    self._cond.notify()
                return
            if key in self._due_at and self._due_at[key] <= due:
                return  # already due no later than that
            self._due_at[key] = due
            heapq.heappush(self._due, (due, next(self._order), key))
            self._cond.notify()

    def _next(self) -> tuple[ObjectKey, bool] | None:
        with self._cond:
            while not self._stopped:
                while self._urgent:
                    key = self._urgent.popleft()
                    if key in self._queued:  # not taken from the heap meanwhile
                        self._due_at.pop(key, None)  # its heap entry, if any, is stale now
                        self._active.add(key)
                        return key, self._queued.pop(key)
                now = time.monotonic()
                while self._due and (self._due[0][0] <= now or self._is_stale(self._due[0])):
                    due, _, key = heapq.heappop(self._due)
                    if self._due_at.get(key) == due:  # not an entry an earlier one replaced
                        del self._due_at[key]
                        self._active.add(key)
                        return key, self._queued.pop(key)
                self._cond.wait(timeout=self._due[0][0] - now if self._due else None)
            return None

    def _is_stale(self, entry: tuple[float, int, ObjectKey]) -> bool:
        return self._due_at.get(entry[2]) != entry[0]

    def _work(self) -> None:
        while (item := self._next()) is not None:
            key, resync = item
            retry_in = recheck_in = None
            try:
                recheck_in = self._handle(key, resync)
                self._failures.pop(key, None)
            except Exception:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                retry_in = RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1]
                log.exception("Reconcile failed key=%s retryIn=%.0fs", key, retry_in)
            with self._cond:
                self._active.discard(key)
                again = self._again.pop(key, None)
            if again is not None:
                self.add(key, resync=again)
            if retry_in is not None:
                self.add(key, resync=True, delay=retry_in)
            elif recheck_in is not None:
                self.add(key, resync=False, delay=recheck_in)
