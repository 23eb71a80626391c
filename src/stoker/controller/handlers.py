"""kopf handlers: thin triggers for the one reconcile. None of them branches on the event type."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from stoker.api import GROUP, PLURAL, VERSION
from stoker.controller.reconcile import InvalidSpec, Reconciler
from stoker.controller.settings import OperatorSettings

MANAGED = {"app.kubernetes.io/managed-by": "stoker"}
INSTANCE_LABEL = "app.kubernetes.io/instance"
WAIT_RETRY_SECONDS = 10


def configure(settings: kopf.OperatorSettings, operator: OperatorSettings) -> None:
    """kopf's own state lives under the project's API group; only warnings become kopf Events."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = operator.workers
    settings.watching.server_timeout = 300


def register(reconciler: Reconciler, operator: OperatorSettings) -> None:
    """Register the handlers on kopf's default registry (it carries kopf's login handlers)."""

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="reconcile")
    def reconcile_service(namespace: str | None, name: str, **_: Any) -> None:
        try:
            outcome = reconciler.reconcile(str(namespace), name)
        except InvalidSpec as error:
            raise kopf.PermanentError(str(error)) from None
        if outcome.waiting_for:
            raise kopf.TemporaryError(f"Waiting for {outcome.waiting_for}", delay=WAIT_RETRY_SECONDS)

    def reconcile_quietly(namespace: str, name: str) -> None:
        # An invalid spec is already in status and in an Event; a retry from here changes nothing.
        with contextlib.suppress(InvalidSpec):
            reconciler.reconcile(namespace, name)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=operator.drift_interval_seconds, id="drift")
    def correct_drift(namespace: str | None, name: str, **_: Any) -> None:
        reconcile_quietly(str(namespace), name)

    @kopf.on.event("batch", "v1", "jobs", labels=MANAGED, id="child")
    @kopf.on.event("apps", "v1", "deployments", labels=MANAGED, id="child")
    @kopf.on.event("v1", "pods", labels=MANAGED, id="child")
    def child_changed(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        owner = labels.get(INSTANCE_LABEL)
        if owner:
            reconcile_quietly(str(namespace), owner)
