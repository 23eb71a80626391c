"""coldStart.peerWeights: which serving pods the peer EndpointSlices list (render.peers builds them)."""

from __future__ import annotations

import ipaddress

from stoker.api import VLLMService
from stoker.controller.objects import Manifest, pod_is_ready
from stoker.render import CACHE_KEY_ANNOTATION, cache_key
from stoker.render.peers import Peer


def peer_sources(svc: VLLMService, pods: list[Manifest]) -> list[Peer]:
    """Of `pods`, the serving pods of this VLLMService's own Deployment as the observer found them through
    their owners (so never a pod of another service or namespace, whatever its labels say), those Ready,
    not terminating and with an IP whose cache key and engine image are the current ones: a pod of an
    older template would be refused by ModelExpress's identity check at best, and hand over other weights
    at worst. Sorted by name, so that an unchanged set renders an unchanged EndpointSlice."""
    key, image = cache_key(svc), svc.spec.runtime.image
    found = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        if (
            meta.get("namespace") == svc.namespace
            and pod_is_ready(pod)
            and not meta.get("deletionTimestamp")
            and _address(status.get("podIP"))
            and (meta.get("annotations") or {}).get(CACHE_KEY_ANNOTATION) == key
            and containers[0].get("image") == image
        ):
            found.append(Peer(meta["name"], meta["uid"], status["podIP"], pod["spec"].get("nodeName")))
    return sorted(found, key=lambda peer: peer.pod)


def _address(value: object) -> bool:
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return False
    return True
