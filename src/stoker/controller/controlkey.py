"""The operator's control key, kept in a Secret of its own namespace that the operator creates once."""

from __future__ import annotations

import base64
import binascii
import logging
import secrets

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stoker.controller.kube import Kube
from stoker.snapshot.trust import MINIMUM_KEY_LENGTH

log = logging.getLogger(__name__)

KEY_FIELD = "key"


class ControlKeyError(Exception):
    """The control key Secret exists but holds no usable key."""


def ensure_control_key(kube: Kube, namespace: str, name: str) -> str:
    """The key in Secret `namespace/name`, created with a random key if absent.

    Create-only: an existing Secret is never overwritten, so a re-applied or upgraded chart, a restart and
    a second replica (whose create loses the race and reads the winner's) all keep the key that running
    standby pods' control tokens derive from."""
    fresh = secrets.token_urlsafe(36)
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "stoker"}),
        type="Opaque",
        string_data={KEY_FIELD: fresh},
    )
    try:
        kube.core.create_namespaced_secret(namespace, secret, field_manager=kube.field_manager)
        log.info("Created control key Secret namespace=%s name=%s", namespace, name)
        return fresh
    except ApiException as error:
        if error.status != 409:
            raise
    data = kube.core.read_namespaced_secret(name, namespace).data or {}
    try:
        key = base64.b64decode(data[KEY_FIELD], validate=True).decode()
    except (KeyError, binascii.Error, UnicodeDecodeError):
        key = ""
    if len(key) < MINIMUM_KEY_LENGTH:
        raise ControlKeyError(
            f"Secret {namespace}/{name} has no usable `{KEY_FIELD}` ({MINIMUM_KEY_LENGTH} characters or"
            " more): restore the key, or delete the Secret and the operator makes a new one (running standby"
            " pods are then replaced)"
        )
    return key
