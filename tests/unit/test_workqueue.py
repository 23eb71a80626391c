import itertools
import logging
import threading
import time

from kubernetes.client.exceptions import ApiException
from urllib3 import HTTPSConnectionPool
from urllib3.exceptions import MaxRetryError, NewConnectionError

from stoker.controller.kube import LeaseLost
from stoker.controller.workqueue import GONE, WorkQueue


class Recorder:
    def __init__(self, hold: float = 0.0, fail_first: int = 0) -> None:
        self.runs: list[tuple[tuple[str, str], bool]] = []
        self.running: set[tuple[str, str]] = set()
        self.overlaps = 0
        self.hold = hold
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self, key: tuple[str, str], resync: bool) -> None:
        with self.lock:
            self.overlaps += key in self.running
            self.running.add(key)
            self.runs.append((key, resync))
            fail = len(self.runs) <= self.fail_first
        time.sleep(self.hold)
        with self.lock:
            self.running.discard(key)
        if fail:
            raise RuntimeError("boom")


def settle(queue: WorkQueue, seconds: float = 0.3) -> None:
    time.sleep(seconds)
    queue.stop()


def test_a_burst_of_events_for_one_key_is_one_run_and_resync_sticks():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=4)
    for _ in range(50):
        queue.add(("ns", "a"), resync=False, delay=0.05)
    queue.add(("ns", "a"), resync=True, delay=0.05)
    queue.start()
    settle(queue)
    assert recorder.runs == [(("ns", "a"), True)]


def test_an_event_during_a_run_makes_one_more_run_and_runs_never_overlap():
    recorder = Recorder(hold=0.1)
    queue = WorkQueue(recorder, workers=4)
    queue.start()
    queue.add(("ns", "a"), resync=False)
    time.sleep(0.03)
    for _ in range(10):
        queue.add(("ns", "a"), resync=False)
    settle(queue, 0.5)
    assert len(recorder.runs) == 2 and recorder.overlaps == 0


def test_a_sooner_request_overrides_a_later_one():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=1)
    queue.start()
    queue.add(("ns", "a"), resync=False, delay=30)
    queue.add(("ns", "a"), resync=False)
    settle(queue)
    assert len(recorder.runs) == 1


def test_a_failed_run_is_retried_with_resync():
    recorder = Recorder(fail_first=1)
    queue = WorkQueue(recorder, workers=2)
    queue.start()
    queue.add(("ns", "a"), resync=False)
    settle(queue, 1.5)
    assert recorder.runs == [(("ns", "a"), False), (("ns", "a"), True)]


def test_keys_run_in_parallel():
    recorder = Recorder(hold=0.2)
    queue = WorkQueue(recorder, workers=4)
    queue.start()
    started = time.monotonic()
    for name in "abcd":
        queue.add(("ns", name), resync=True)
    while len(recorder.runs) < 4 or recorder.running:
        time.sleep(0.01)
    assert time.monotonic() - started < 0.6
    queue.stop()


def test_urgent_keys_go_before_keys_already_due():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=1)
    for name in "abc":
        queue.add(("ns", name), resync=False)
    queue.add(("ns", "new"), resync=True, urgent=True)
    queue.add(("ns", "b"), resync=True, urgent=True)
    queue.start()
    settle(queue)
    assert [key[1] for key, _ in recorder.runs] == ["new", "b", "a", "c"]
    assert (("ns", "b"), True) in recorder.runs


def test_every_key_is_resynced_each_interval_until_it_is_gone():
    runs: list[tuple[str, bool]] = []
    gone = {"b"}

    def handle(key, resync):
        runs.append((key[1], resync))
        return GONE if key[1] in gone and len([r for r in runs if r[0] == key[1]]) > 1 else None

    queue = WorkQueue(handle, workers=2, resync_interval=0.2)
    queue.start()
    queue.add(("ns", "a"), resync=False)
    queue.add(("ns", "b"), resync=False)
    time.sleep(0.1)
    queue.add(("ns", "a"), resync=False)  # a child event between resyncs
    settle(queue, 0.75)
    a_runs = [resync for name, resync in runs if name == "a"]
    assert a_runs[:2] == [True, False]  # a key's first run is a resync; a child event is not
    assert a_runs.count(True) >= 3
    assert [resync for name, resync in runs if name == "b"] == [True, True]  # forgotten once gone


def test_a_failed_run_logs_one_line_at_warning_and_the_traceback_only_at_debug(caplog):
    def handle(key, resync):
        raise ApiException(status=500, reason="Internal Server Error")

    queue = WorkQueue(handle, workers=1)
    queue.start()
    with caplog.at_level(logging.DEBUG, logger="stoker.controller.workqueue"):
        queue.add(("ns", "a"), resync=False)
        settle(queue, 0.2)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.exc_info is None and "\n" not in warning.getMessage()
    assert "key=ns/a failures=1 retryIn=1s: status=500 reason=Internal Server Error" in warning.getMessage()
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)


def test_a_failing_key_backs_off_exponentially_up_to_the_cap_whatever_names_it():
    runs: list[float] = []

    def handle(key, resync):
        runs.append(time.monotonic())
        raise RuntimeError("refused")

    queue = WorkQueue(handle, workers=2, resync_interval=0.01, retry_initial=0.1, retry_max=0.4)
    queue.start()
    queue.add(("ns", "a"), resync=False)
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:  # child events and passed resyncs all the while
        queue.add(("ns", "a"), resync=False)
        time.sleep(0.005)
    queue.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    # Never sooner than the backoff (doubling, capped); on a busy machine a little later.
    assert len(gaps) >= 3
    for gap, backoff in zip(gaps, [0.1, 0.2, 0.4, 0.4, 0.4], strict=False):
        assert backoff - 0.005 <= gap < backoff + 0.1
    assert len(runs) <= 6  # at 0, 0.1, 0.3, 0.7, 1.1, 1.5


def test_a_new_spec_ends_the_backoff_and_a_success_resets_it():
    runs: list[tuple[str, float]] = []
    outcomes = iter(["fail", "fail", "ok", "fail"])

    def handle(key, resync):
        outcome = next(outcomes, "ok")
        runs.append((outcome, time.monotonic()))
        if outcome == "fail":
            raise RuntimeError("refused")

    queue = WorkQueue(handle, workers=1, retry_initial=0.2, retry_max=10)
    queue.start()
    queue.add(("ns", "a"), resync=False)
    time.sleep(0.3)  # failed at 0, and at 0.2: the next retry waits 0.4 s
    assert len(runs) == 2
    queue.add(("ns", "a"), resync=True, urgent=True)  # a spec not run yet: now
    time.sleep(0.05)
    assert [outcome for outcome, _ in runs] == ["fail", "fail", "ok"]
    queue.add(("ns", "a"), resync=False)
    time.sleep(0.1)
    settle(queue, 0.25)  # the failure after a success waits retry_initial again, not 0.8 s
    assert [outcome for outcome, _ in runs] == ["fail", "fail", "ok", "fail", "ok"]
    assert 0.195 <= runs[4][1] - runs[3][1] < 0.3


def test_one_log_line_per_change_of_state(caplog):
    errors = iter(["refused", "refused", "refused", "other", "other", None])

    def handle(key, resync):
        error = next(errors, None)
        if error:
            raise RuntimeError(error)

    queue = WorkQueue(handle, workers=1, retry_initial=0.01, retry_max=0.02)
    with caplog.at_level(logging.DEBUG, logger="stoker.controller.workqueue"):
        queue.start()
        queue.add(("ns", "a"), resync=False)
        settle(queue, 0.3)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if not r.exc_info]
    assert [(level, "refused" in text) for level, text in lines if level != "DEBUG"] == [
        ("WARNING", True),
        ("WARNING", False),
        ("INFO", False),
    ]
    assert "failures=5 retryIn=0.02s: RuntimeError: other" in lines[-2][1]  # the repeat, at DEBUG
    assert lines[-1] == ("INFO", "Reconcile recovered key=ns/a")


def test_a_lost_lease_stops_the_queue_without_a_retry(caplog):
    recorder = Recorder()
    ran: list[str] = []

    def handle(key, resync):
        ran.append(key[1])
        if key[1] == "a":
            raise LeaseLost("term over")
        recorder(key, resync)

    queue = WorkQueue(handle, workers=1)
    queue.start()
    with caplog.at_level(logging.WARNING, logger="stoker.controller.workqueue"):
        queue.add(("ns", "a"), resync=False)
        queue.add(("ns", "b"), resync=False, delay=0.05)
        time.sleep(1.3)
    assert ran == ["a"]
    (line,) = caplog.records
    assert line.levelname == "ERROR" and "term over" in line.getMessage()


def test_an_unreachable_api_server_is_one_error_whichever_request_met_it(caplog):
    def refused(path: str) -> MaxRetryError:
        pool = HTTPSConnectionPool("127.0.0.1", 1)
        return MaxRetryError(pool, path, NewConnectionError(pool, "Failed to establish a new connection"))

    errors = iter([refused("/apis/stoker.dev/v1alpha1/x"), refused("/api/v1/namespaces/ns/events")])

    def handle(key, resync):
        if (error := next(errors, None)) is not None:
            raise error

    queue = WorkQueue(handle, workers=1, retry_initial=0.01)
    with caplog.at_level(logging.INFO, logger="stoker.controller.workqueue"):
        queue.start()
        queue.add(("ns", "a"), resync=False)
        settle(queue, 0.2)
    warning, recovered = caplog.records
    assert "API server unreachable: " in warning.getMessage() and "/apis/" not in warning.getMessage()
    assert recovered.getMessage() == "Reconcile recovered key=ns/a"
