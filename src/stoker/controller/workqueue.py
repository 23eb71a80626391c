"""A work queue of objects to reconcile, as controller-runtime has: deduplicated, delayed, never concurrent.

kopf handlers only put keys here and return at once; a fixed pool of threads reconciles. A key is in
the queue at most once, however many events name it; a key is never reconciled by two threads at once;
an event that names a key under reconcile makes it run once more afterwards. Bursts of child events
(a rollout changes a Deployment and its pods many times) thus cost a reconcile or two, not one each.

The queue also runs the drift resync: a key's first run, and every run `resync_interval` seconds after
its last resync, is a resync, and each run schedules the next, until the handler says the object is
gone. So no timer lives on the object (a kopf timer would need a finalizer and annotations on it).

A failed run puts its key in backoff: it runs again after `retry_initial` seconds, doubling with each
failure in a row up to `retry_max`, and nothing that names the key (a child event, the resync) runs it
sooner; only an urgent add (a spec the queue has not run yet) ends the wait. A success ends the backoff.
The log says each change of state once: the first failure and each new error at WARNING, a repeat at
DEBUG, the recovery at INFO.

A handler that raises LeaseLost stops the whole queue: this replica may no longer write (see leader).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from stoker.controller.kube import LeaseLost
from stoker.controller.metrics import URGENT_WAIT_SECONDS

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]  # (namespace, name)


class Gone:
    """What a handler returns when the key's object no longer exists: the queue forgets the key."""


GONE = Gone()
Handler = Callable[[ObjectKey, bool], float | Gone | None]


class WorkQueue:
    def __init__(
        self,
        handle: Handler,
        workers: int,
        resync_interval: float | None = None,
        *,
        retry_initial: float = 1.0,
        retry_max: float = 300.0,
    ) -> None:
        """`handle(key, resync)` reconciles and raises on failure; it may return seconds after which to
        reconcile that key again, or GONE. With `resync_interval`, every key is resynced that often."""
        self._handle = handle
        self._resync_interval = resync_interval
        self._retry_initial, self._retry_max = retry_initial, retry_max
        self._resync_at: dict[ObjectKey, float] = {}  # key -> when its next run must be a resync
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, ObjectKey]] = []  # heap of (due time, tie-breaker, key)
        self._order = itertools.count()
        self._queued: dict[ObjectKey, bool] = {}  # key -> resync wanted; keys waiting in the heap
        self._due_at: dict[ObjectKey, float] = {}  # key -> when its live heap entry is due
        # Keys whose spec changed (or that are new) go before everything in the heap: a user's edit
        # should not wait behind a storm of child events.
        self._urgent: deque[tuple[ObjectKey, float]] = deque()  # (key, when it was added)
        self._active: set[ObjectKey] = set()
        # Keys named while under reconcile -> (resync wanted, urgent)
        self._again: dict[ObjectKey, tuple[bool, bool]] = {}
        self._failures: dict[ObjectKey, int] = {}  # keys in backoff -> failed runs in a row
        self._retry_at: dict[ObjectKey, float] = {}  # keys in backoff -> no run before then
        self._errors: dict[ObjectKey, str] = {}  # key -> the error last logged at WARNING, until a success
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
        """Reconcile `key` after `delay` seconds, or sooner if it is already due, but not before its retry
        time while it is in backoff. `urgent` (a spec not run yet): now, first, and its backoff ends.
        `resync` is sticky."""
        with self._cond:
            if key in self._active:
                wanted, was_urgent = self._again.get(key, (False, False))
                self._again[key] = (wanted or resync, was_urgent or urgent)
                return
            self._queued[key] = self._queued.get(key, False) or resync
            if urgent:
                self._failures.pop(key, None)
                self._retry_at.pop(key, None)
                if all(waiting != key for waiting, _ in self._urgent):
                    self._urgent.append((key, time.monotonic()))
                    self._cond.notify()
                return
            due = max(time.monotonic() + delay, self._retry_at.get(key, 0.0))
            if key in self._due_at and self._due_at[key] <= due:
                return  # already due no later than that
            self._due_at[key] = due
            heapq.heappush(self._due, (due, next(self._order), key))
            self._cond.notify()

    def urgent_waiting(self) -> bool:
        """Whether keys with a new spec wait for a worker."""
        with self._cond:
            return bool(self._urgent)

    def _next(self) -> tuple[ObjectKey, bool] | None:
        with self._cond:
            while not self._stopped:
                while self._urgent:
                    key, added = self._urgent.popleft()
                    if key in self._queued:  # not taken from the heap meanwhile
                        URGENT_WAIT_SECONDS.observe(time.monotonic() - added)
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
            started = time.monotonic()
            if self._resync_interval is not None:
                resync = resync or started >= self._resync_at.get(key, started)
            outcome: float | Gone | None = None
            failed = False
            try:
                outcome = self._handle(key, resync)
            except LeaseLost as error:
                self._stop_for(error)
                return
            except Exception as error:
                failed = True
                self._note_failure(key, error)
            else:
                self._note_success(key, outcome, resync, started)
            with self._cond:
                self._active.discard(key)
                again = self._again.pop(key, None)
                resync_at = self._resync_at.get(key)
            if again is not None:
                self.add(key, resync=again[0], urgent=again[1])
            if failed:
                self.add(key, resync=True)  # at its retry time
            elif isinstance(outcome, float | int):
                self.add(key, resync=False, delay=outcome)
            if resync_at is not None:
                self.add(key, resync=False, delay=max(resync_at - time.monotonic(), 0.0))

    def _note_failure(self, key: ObjectKey, error: Exception) -> None:
        message = _oneline(error)
        with self._cond:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            retry_in = min(self._retry_initial * 2 ** min(failures - 1, 32), self._retry_max)
            self._retry_at[key] = time.monotonic() + retry_in
            new_error = self._errors.get(key) != message
            self._errors[key] = message
        # The cause is in the object's status; here one line per new error, the traceback at DEBUG.
        log.log(
            logging.WARNING if new_error else logging.DEBUG,
            "Reconcile failed key=%s/%s failures=%d retryIn=%gs: %s",
            *key,
            failures,
            retry_in,
            message,
        )
        log.debug("Reconcile failed key=%s/%s", *key, exc_info=True)

    def _note_success(
        self, key: ObjectKey, outcome: float | Gone | None, resync: bool, started: float
    ) -> None:
        with self._cond:
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
            error = self._errors.pop(key, None)
            if isinstance(outcome, Gone):
                self._resync_at.pop(key, None)
                return
            if resync and self._resync_interval is not None:
                self._resync_at[key] = started + self._resync_interval
        if error is not None:
            log.info("Reconcile recovered key=%s/%s", *key)

    def _stop_for(self, error: LeaseLost) -> None:
        with self._cond:
            first = not self._stopped
            self._stopped = True
            self._cond.notify_all()
        if first:
            log.error("Work queue stopped, no more writes from this replica: %s", error)


def _oneline(error: Exception) -> str:
    """The error in one bounded line: for an API error its status and the server's message, not the
    response headers and body the client puts in str(); for an API server out of reach the cause without
    the request's URL, so that one outage is one error whichever request met it."""
    if isinstance(error, ApiException):
        try:
            message = json.loads(error.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            message = ""
        text = f"status={error.status} reason={error.reason} {message}"
    elif isinstance(error, MaxRetryError) and error.reason is not None:
        text = f"API server unreachable: {error.reason}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:500]
