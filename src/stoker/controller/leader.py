"""Leader election on a coordination.k8s.io Lease (the kubernetes client's): only the leader reconciles.

kopf's peering only pauses operators that see each other; it elects no leader. Every replica runs kopf's
watches (a follower's queue fills, so it takes over warm), but only the Lease holder starts the work
queue. A leader that cannot renew exits: the kubelet restarts it as a follower, and no reconcile of the
old term can run beside the new leader's.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from stoker.controller.settings import OperatorSettings

log = logging.getLogger(__name__)

# Exit status of a replica that lost its Lease.
LOST_LEASE_EXIT = 3


def lead(settings: OperatorSettings, start_leading: Callable[[], None]) -> threading.Thread:
    """Campaign for the Lease in a daemon thread; `start_leading` runs once it is held."""
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    namespace, name = settings.operator_namespace, settings.leader_election_lease_name

    def started() -> None:
        log.info("Acquired lease namespace=%s name=%s identity=%s", namespace, name, identity)
        start_leading()

    def campaign() -> None:
        try:
            leaderelection.LeaderElection(config).run()  # returns when a renewal failed
        finally:
            log.error("Lost lease namespace=%s name=%s identity=%s; exiting", namespace, name, identity)
            logging.shutdown()
            os._exit(LOST_LEASE_EXIT)  # at once: no worker may finish a reconcile under the next leader

    config = electionconfig.Config(
        LeaseLock(name, namespace, identity),
        lease_duration=settings.leader_election_lease_seconds,
        renew_deadline=settings.leader_election_renew_deadline_seconds,
        retry_period=settings.leader_election_retry_seconds,
        onstarted_leading=started,
        onstopped_leading=lambda: None,  # campaign() exits
    )
    # The client logs every retry ("yet to finish lease_duration") at INFO.
    logging.getLogger("leaderelection").setLevel(logging.WARNING)
    log.info("Waiting for lease namespace=%s name=%s identity=%s", namespace, name, identity)
    thread = threading.Thread(target=campaign, name="leader-election", daemon=True)
    thread.start()
    return thread
