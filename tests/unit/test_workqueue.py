import logging
import threading
import time

from kubernetes.client.exceptions import ApiException

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
    assert "key=ns/a retryIn=1s: status=500 reason=Internal Server Error" in warning.getMessage()
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records)
