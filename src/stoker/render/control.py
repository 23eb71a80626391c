"""The Secret holding a VLLMService's control token (standby replicas only).

The engine pods read it as STOKER_CONTROL_TOKEN (see stoker.guard); the operator presents it to put pods
to sleep and wake them. The token is derived from the operator's key and the object's uid, so the operator
never reads Secrets: it only writes this one. A new key rewrites the Secret; pods started with the old
token then fail their wake and are replaced by pods that read the new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from stoker.api import VLLMService
from stoker.render.names import CONTROL_TOKEN_KEY, Json, common_labels, control_secret_name, object_meta


def control_token(key: str, uid: str) -> str:
    digest = hmac.new(key.encode(), f"stoker-control/{uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def build_control_secret(svc: VLLMService, token: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(svc, control_secret_name(svc.name), common_labels(svc.name, "control")),
        "type": "Opaque",
        # `data`, not `stringData`: server-side apply then owns exactly the field it writes.
        "data": {CONTROL_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }
