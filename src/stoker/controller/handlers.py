"""kopf handlers: thin triggers that put an object on the work queue. None branches on the event type."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from stoker.api import GROUP, PLURAL, VERSION
from stoker.controller.objects import pod_is_ready
from stoker.controller.settings import OperatorSettings
from stoker.controller.workqueue import WorkQueue

MANAGED = {"app.kubernetes.io/managed-by": "stoker"}
INSTANCE_LABEL = "app.kubernetes.io/instance"
# A child's changes come in bursts (a rollout touches a Deployment and its pods many times): wait this
# long so that one reconcile sees the whole burst.
CHILD_EVENT_DELAY_SECONDS = 0.5


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own state lives under the project's API group; only warnings become kopf Events."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300


def pod_ready(body: kopf.Body, **_: Any) -> bool:
    """Only a Ready pod brings news: its startup log can be read. Replica counts come from Deployments."""
    return pod_is_ready(dict(body))


def register(queue: WorkQueue, operator: OperatorSettings) -> None:
    """Register the handlers on kopf's default registry (it carries kopf's login handlers)."""

    # Spec changes and (re)starts apply every child: resync.
    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="reconcile")
    def reconcile_service(namespace: str | None, name: str, **_: Any) -> None:
        queue.add((str(namespace), name), resync=True, urgent=True)

    # Drift: hand edits and deleted children are undone within one interval.
    @kopf.timer(GROUP, VERSION, PLURAL, interval=operator.drift_interval_seconds, id="drift")
    def correct_drift(namespace: str | None, name: str, **_: Any) -> None:
        queue.add((str(namespace), name), resync=True)

    @kopf.on.event("batch", "v1", "jobs", labels=MANAGED, id="child")
    @kopf.on.event("apps", "v1", "deployments", labels=MANAGED, id="child")
    @kopf.on.event("v1", "pods", labels=MANAGED, when=pod_ready, id="child")
    def child_changed(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        owner = labels.get(INSTANCE_LABEL)
        if owner:
            queue.add((str(namespace), owner), resync=False, delay=CHILD_EVENT_DELAY_SECONDS)
