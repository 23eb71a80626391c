"""kopf handlers: thin triggers that put an object on the work queue. None branches on the event type.

Only watch-event handlers: kopf then keeps no state on a VLLMService (no finalizer, no annotations), so any
accepted object can be deleted whether the operator runs or not, and its children go with it through their
owner references. The drift resync runs from the work queue (see workqueue).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import kopf

from stoker.api import GROUP, PLURAL, VERSION
from stoker.api.owned import COMPONENT_LABEL
from stoker.controller.diagnose import pod_problem
from stoker.controller.objects import pod_is_ready
from stoker.controller.workqueue import WorkQueue
from stoker.render.names import COMPONENT_SEED
from stoker.render.peers import PEER_LABEL

FINALIZER = f"{GROUP}/finalizer"

MANAGED = {"app.kubernetes.io/managed-by": "stoker"}
INSTANCE_LABEL = "app.kubernetes.io/instance"
# A child's changes come in bursts (a rollout touches a Deployment and its pods many times): wait this
# long so that one reconcile sees the whole burst.
CHILD_EVENT_DELAY_SECONDS = 0.5


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own state lives under the project's API group; only warnings become kopf Events.

    With no handler that needs it, kopf removes this finalizer from any object that still carries it (one
    an earlier operator version put there), deleted or not."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # While the API server is away, each watch retries 1 s doubling to 30 s (as client-go's reflectors),
    # not kopf's 0.1 s reconnects and 9 tries in 54 s: an outage costs a few lines a minute per watch.
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = RetryForever()
    # kopf logs every handler run at INFO ("Handler 'cache' succeeded."): lines per watch event, not per
    # change of state. Its warnings and errors still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: only change-detecting handlers use one, and stoker has none. kopf's own deep-copies
    each watch event's body to build it, a tenth of the operator's CPU in a burst of new services."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class RetryForever:
    """kopf's backoffs for API requests: 1 s doubling to 30 s, then every 30 s without end. kopf escalates
    an error once its backoffs run out, and an API server error (the 503 of one still starting) escalated
    out of a watch stops the whole operator."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1.0, 2.0, 4.0, 8.0, 16.0), itertools.repeat(30.0))


def spec_changed(body: Mapping[str, Any]) -> bool:
    """A generation the operator has not reconciled yet: a new object or a spec edit."""
    generation = (body.get("metadata") or {}).get("generation")
    return generation != (body.get("status") or {}).get("observedGeneration")


def pod_ready(body: kopf.Body, **_: Any) -> bool:
    """Only a Ready pod brings news: its startup log can be read. Replica counts come from Deployments."""
    return pod_is_ready(dict(body))


def pod_in_trouble(body: kopf.Body, labels: Mapping[str, str], **_: Any) -> bool:
    """A pod that says why it does not start (the scheduler's or kubelet's word, a seed's exit): news for
    the conditions within one reconcile; the Deployment's or Job's status may not move for it."""
    of_seed = labels.get(COMPONENT_LABEL) == COMPONENT_SEED
    return pod_problem(dict(body), of_seed, dt.datetime.now(dt.UTC)) is not None


def register(queue: WorkQueue, startups: WorkQueue) -> None:
    """Register the handlers on kopf's default registry (it carries kopf's login handlers). `startups` is
    the startup recorder's queue: a pod turning Ready, a seed Job finishing and a rollout's end are its
    news too."""

    # Per key, the (uid, generation) last sent as urgent while status lagged behind it. A spec is urgent
    # once: while its reconciles fail, status keeps an older observedGeneration, and the events that
    # follow (the operator's own status writes among them) must wait out the queue's backoff.
    urgent_sent: dict[tuple[str, str], tuple[str, int]] = {}

    # New objects and spec edits apply every child, first. The listing at start names every object once
    # (a key's first run is a resync); status-only changes, such as the operator's own, bring nothing.
    # Coroutines: kopf runs them in its event loop, a plain function in a thread pool (a hop per event).
    @kopf.on.event(GROUP, VERSION, PLURAL, id="reconcile")
    async def service_changed(
        type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        key = (str(namespace), name)
        if type == "DELETED":
            urgent_sent.pop(key, None)
            return  # the queue forgets the key at its next run; the children go by garbage collection
        if not spec_changed(body):
            urgent_sent.pop(key, None)  # caught up
        else:
            meta = body.get("metadata") or {}
            spec = (str(meta.get("uid")), int(meta.get("generation") or 0))
            if urgent_sent.get(key) != spec:
                urgent_sent[key] = spec
                queue.add(key, resync=True, urgent=True)
                return
        if type is None:
            queue.add(key, resync=False)

    @kopf.on.event("batch", "v1", "jobs", labels=MANAGED, id="child")
    @kopf.on.event("apps", "v1", "deployments", labels=MANAGED, id="child")
    @kopf.on.event("apps", "v1", "daemonsets", labels=MANAGED, id="child")
    @kopf.on.event("v1", "services", labels=MANAGED, id="child")
    @kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED, id="child")
    @kopf.on.event("discovery.k8s.io", "v1", "endpointslices", labels=MANAGED, id="child")
    @kopf.on.event("v1", "pods", labels=MANAGED, when=pod_ready, id="child")
    async def child_changed(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        owner = labels.get(INSTANCE_LABEL)
        if owner:
            queue.add((str(namespace), owner), resync=False, delay=CHILD_EVENT_DELAY_SECONDS)
            startups.add((str(namespace), owner), resync=False, delay=CHILD_EVENT_DELAY_SECONDS)

    # coldStart.peerWeights: the peer EndpointSlices list the Ready serving pods, so these pods' every change
    # (turning unready, going away, a new IP) is news for the reconcile, not only their turning Ready.
    @kopf.on.event("v1", "pods", labels={**MANAGED, PEER_LABEL: "true"}, id="peer")
    @kopf.on.event("v1", "pods", labels=MANAGED, when=pod_in_trouble, id="troubled")
    async def pod_worth_a_pass(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        owner = labels.get(INSTANCE_LABEL)
        if owner:
            queue.add((str(namespace), owner), resync=False, delay=CHILD_EVENT_DELAY_SECONDS)
