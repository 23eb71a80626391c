"""Which pods the snapshot agent may act on: those whose engine stoker rendered. Pure.

The agent is root on its node, and labels and annotations are whatever a pod's author writes. So the operator
signs each serving pod template it renders for snapshots (`SIGNATURE_ANNOTATION`): an HMAC-SHA256, keyed by
its control key, over the pod's namespace, service and cache key labels and what decides the engine's process
(the engine container's image, command, arguments, environment and security context, and the pod's security
context and host namespaces). The agent, holding the same key, recomputes it from the live pod. A tenant can
copy the annotation only onto a pod that runs what stoker rendered for that very namespace, service and key,
so the agent dumps and restores only stoker's engines, and a snapshot's directory (namespace/service/key) is
named by what the operator signed. Fields the API server fills in (imagePullPolicy, a fieldRef's apiVersion)
are left out or defaulted here, so that the template and its pods sign alike.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SIGNATURE_ANNOTATION = "stoker.dev/snapshot-signature"
# The operator's control key is at least this long (controller/controlkey.py).
MINIMUM_KEY_LENGTH = 16
_HOST_NAMESPACES = ("hostPID", "hostIPC", "hostNetwork")


def _env(env: list[Mapping[str, Any]]) -> list[Any]:
    """The environment as both a template and its pods have it (a fieldRef's apiVersion defaults to v1)."""
    entries = []
    for entry in env:
        value_from = copy.deepcopy(entry.get("valueFrom"))
        if value_from and "fieldRef" in value_from:
            value_from["fieldRef"].setdefault("apiVersion", "v1")
        entries.append([entry.get("name"), entry.get("value", ""), value_from])
    return entries


def signed_text(namespace: str, service: str, cache_key: str, spec: Mapping[str, Any], container: str) -> str:
    """What the signature covers, as one canonical text. KeyError if `container` is not in the spec."""
    engine = next(c for c in spec.get("containers", []) if c.get("name") == container)
    view = {
        "namespace": namespace,
        "service": service,
        "cacheKey": cache_key,
        "image": engine.get("image"),
        "command": engine.get("command", []),
        "args": engine.get("args", []),
        "env": _env(engine.get("env", [])),
        "securityContext": engine.get("securityContext", {}),
        "podSecurityContext": spec.get("securityContext", {}),
        "hostNamespaces": [bool(spec.get(field)) for field in _HOST_NAMESPACES],
    }
    return json.dumps(view, sort_keys=True, separators=(",", ":"))


def signature(
    key: str, namespace: str, service: str, cache_key: str, spec: Mapping[str, Any], container: str
) -> str:
    text = signed_text(namespace, service, cache_key, spec, container)
    return hmac.new(key.encode(), f"stoker-snapshot/{text}".encode(), hashlib.sha256).hexdigest()


def signed(key: str, pod: Mapping[str, Any], service: str, cache_key: str, container: str) -> bool:
    """Whether `pod` carries the operator's signature for its namespace, `service` and `cache_key`."""
    metadata = pod.get("metadata", {})
    presented = (metadata.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")
    try:
        wanted = signature(key, metadata["namespace"], service, cache_key, pod.get("spec", {}), container)
    except (KeyError, StopIteration, TypeError, AttributeError):
        return False
    return hmac.compare_digest(presented.encode(), wanted.encode())
