"""How often the operator asks again for a startup log it could not read: soon at first, then seldom,
then never, so that pods whose logs no one may read cost no requests for ever."""

from __future__ import annotations

from stoker.controller.startups import LOG_READ_ATTEMPTS, log_retry_in


def test_an_unreadable_log_is_read_again_sooner_then_later_then_never():
    waits = [log_retry_in(failures) for failures in range(1, LOG_READ_ATTEMPTS + 2)]
    assert waits == [10.0, 20.0, 40.0, 60.0, 60.0, None, None]
    assert sum(wait for wait in waits if wait is not None) < 4 * 60
