"""Leader election on a coordination.k8s.io Lease (the kubernetes client's): only the leader reconciles.

kopf's peering only pauses operators that see each other; it elects no leader. Every replica runs kopf's
watches (a follower's queue fills, so it takes over warm), but only the Lease holder starts the work
queue.

The leader's term: from the moment it sent its last successful renewal, `renew_deadline` seconds on the
monotonic clock, so a pause of the process (SIGSTOP, a frozen VM) counts. Every write is fenced by it
(Kube.fence raises LeaseLost after the term), and a leader whose term passes without a renewal exits:
the kubelet restarts it as a follower. A follower takes the Lease only `lease_duration` after it saw the
last renewal, later than the renewal was sent; the difference to `renew_deadline` is the margin for the
clocks' rates and a write's time in flight. A thread stopped between the fence and its request can still
write late: only a precondition checked by the API server could close that gap.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import urllib3
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from stoker.controller.kube import LeaseLost
from stoker.controller.settings import OperatorSettings

log = logging.getLogger(__name__)

# Exit status of a replica that lost its Lease.
LOST_LEASE_EXIT = 3


class _TermElection(leaderelection.LeaderElection):
    """The client's election, with a term measured on the monotonic clock from each renewal's start: the
    client measures its renew deadline on the wall clock from the start of a round of retries."""

    def __init__(self, config: electionconfig.Config, term_seconds: float) -> None:
        super().__init__(config)
        self.term_seconds = term_seconds
        self._renewed_at: float | None = None  # monotonic time the last successful acquire or renewal began

    def try_acquire_or_renew(self) -> bool:
        began = time.monotonic()
        try:
            held = bool(super().try_acquire_or_renew())
        except urllib3.exceptions.HTTPError as error:
            # The lock catches the API's answers, not a connection refused: without this, an API server
            # outage would end the campaign of every replica, a follower's too.
            log.debug("Lease attempt failed: %s", error)
            return False
        if held:
            self._renewed_at = began
        return held

    def term_left(self) -> float:
        """Seconds this replica may still write; 0 or less: not (or no longer) the leader."""
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + self.term_seconds - time.monotonic()

    def renew_loop(self, leading_failed: threading.Event | None = None) -> None:
        """Renew every retry period; return (run() then stops leading) once the term is over."""
        retry_period = self.election_config.retry_period
        while not (leading_failed is not None and leading_failed.is_set()):
            if self.term_left() <= 0:
                return
            renewed = self.try_acquire_or_renew()
            time.sleep(retry_period if renewed else max(min(retry_period, self.term_left()), 0.0))


class Leadership:
    """Campaign for the Lease in a daemon thread; `start_leading` runs once it is held."""

    def __init__(self, settings: OperatorSettings, start_leading: Callable[[], None]) -> None:
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.namespace, self.name = settings.operator_namespace, settings.leader_election_lease_name
        self._start_leading = start_leading
        config = electionconfig.Config(
            LeaseLock(self.name, self.namespace, self.identity),
            lease_duration=settings.leader_election_lease_seconds,
            renew_deadline=settings.leader_election_renew_deadline_seconds,
            retry_period=settings.leader_election_retry_seconds,
            onstarted_leading=self._started,
            onstopped_leading=lambda: None,  # _campaign() exits
        )
        self._election = _TermElection(config, settings.leader_election_renew_deadline_seconds)

    def fence(self) -> None:
        """Raise LeaseLost unless this replica holds the Lease and its term has not passed."""
        term, left = self._election.term_seconds, self._election.term_left()
        if left <= 0:
            raise LeaseLost(
                f"Lease {self.namespace}/{self.name} not renewed for {term - left:.1f} s (term {term} s):"
                " another replica may hold it"
            )

    def start(self) -> threading.Thread:
        # The client logs every retry ("yet to finish lease_duration") at INFO.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
        log.info(
            "Waiting for lease namespace=%s name=%s identity=%s", self.namespace, self.name, self.identity
        )
        thread = threading.Thread(target=self._campaign, name="leader-election", daemon=True)
        thread.start()
        return thread

    def _started(self) -> None:
        log.info("Acquired lease namespace=%s name=%s identity=%s", self.namespace, self.name, self.identity)
        self._start_leading()

    def _campaign(self) -> None:
        try:
            self._election.run()  # returns when the term passed without a renewal
        finally:
            log.error(
                "Lost lease namespace=%s name=%s identity=%s; exiting",
                self.namespace,
                self.name,
                self.identity,
            )
            logging.shutdown()
            os._exit(LOST_LEASE_EXIT)  # at once: no worker may finish a reconcile under the next leader
