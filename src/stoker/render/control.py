"""The Secret holding a VLLMService's control token (standby replicas only).

The engine pods read it as STOKER_CONTROL_TOKEN (see stoker.guard); the operator presents it to put pods
to sleep and wake them. The controller creates it once and never rewrites it: running pods hold the
token they started with.
"""

from __future__ import annotations

import secrets

from stoker.api import VLLMService
from stoker.render.names import CONTROL_TOKEN_KEY, Json, common_labels, control_secret_name, object_meta


def new_control_token() -> str:
    return secrets.token_urlsafe(32)


def build_control_secret(svc: VLLMService, token: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(svc, control_secret_name(svc.name), common_labels(svc.name, "control")),
        "type": "Opaque",
        "stringData": {CONTROL_TOKEN_KEY: token},
    }
