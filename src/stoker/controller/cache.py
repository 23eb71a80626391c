"""The operator's view of the cluster: every VLLMService and every object stoker labels, kept from kopf's
watch streams (an informer's store), so that a reconcile reads memory instead of GETting each child.

kopf's watch handlers fill it (`register`); a write's result goes in at once (`remember`), so the pass
after a write sees it even before its watch event arrives, and an older watch event never replaces a newer
object (resourceVersions of one kind only grow). Of what is not labelled as stoker's only the name is
here: a user's object in a child's way is read once, before anything is written; one the watch has not
delivered yet makes the create answer 409, and the reconcile reads it then.

Each object is held as its JSON text, which Python's cyclic garbage collector does not walk: held as dicts,
500 services' children were about a million tracked objects, and each full collection stopped every
thread for 0.4 to 1.3 s (measured in the operator during bench/operator_scale.py), the tail of a
`kubectl scale`'s reaction. A reader gets a fresh parse, its own copy.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

import kopf

from stoker.api import GROUP, KIND, PLURAL, VERSION
from stoker.controller.warming import Node, claim_capacity, node_of
from stoker.render import INSTANCE_LABEL

Manifest = dict[str, Any]
CacheKey = tuple[str, str, str]  # (kind, namespace, name)

MANAGED = {"app.kubernetes.io/managed-by": "stoker"}
# The kinds stoker creates, as kopf names their resources: (group, version, plural, kind).
CHILD_RESOURCES = (
    ("apps", "v1", "deployments", "Deployment"),
    ("apps", "v1", "daemonsets", "DaemonSet"),
    ("batch", "v1", "jobs", "Job"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    ("", "v1", "services", "Service"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
)
# Kinds whose names alone are not watched cluster-wide: stoker creates no pod, and every Service of the
# cluster has EndpointSlices; a peer EndpointSlice's name taken by another object makes its create fail
# (409), and the reconcile reads that object then.
_NAMES_UNWATCHED = ("Pod", "EndpointSlice")


def _resource_version(obj: Manifest) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class _Held(NamedTuple):
    """One object as the cache keeps it: what the cache compares and indexes, and the object as JSON text.
    The collector tracks this tuple alone, not every dict and list of the object."""

    version: int
    uid: str | None
    instance: str | None
    text: str

    @classmethod
    def of(cls, obj: Manifest) -> _Held:
        meta = obj["metadata"]
        instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        return cls(_resource_version(obj), meta.get("uid"), instance, json.dumps(obj, separators=(",", ":")))

    def parsed(self) -> Manifest:
        loaded: Manifest = json.loads(self.text)
        return loaded


class ObjectCache:
    """Thread-safe: kopf's event loop writes, the reconcile workers read copies."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._objects: dict[CacheKey, _Held] = {}
        # (kind, namespace, instance label) -> names: a service's pods and Jobs without a scan.
        self._by_instance: dict[tuple[str, str, str], set[str]] = {}
        # Every object of the kinds stoker creates, labelled or not (kopf watches them whole anyway): a
        # child's name taken by something else is known without a GET before each create.
        self._taken: set[CacheKey] = set()
        # VLLMServices with coldStart.nodeWarming enabled, which share the per-node budget.
        self._warming: set[tuple[str, str]] = set()
        # Every Node, as the warming planner reads it (name, labels, allocatable memory; not the rest).
        self._nodes: dict[str, Node] = {}
        # Every bound PersistentVolumeClaim's capacity, stoker's or not: it bounds what a service's node
        # warmer may claim of the per-node budget (controller/warming.py).
        self._capacities: dict[tuple[str, str], int] = {}

    def observe(self, kind: str, obj: Manifest, deleted: bool = False) -> None:
        """A watch event: the object as the server has it now, or its deletion."""
        meta = obj["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        with self._guard:
            held = self._objects.get(key)
            if held is not None and held.version > _resource_version(obj):
                return  # an event older than what a write put here
            if deleted:
                if held is not None and held.uid == meta.get("uid"):
                    self._forget(key, held)
                    self._warming.discard(key[1:])
                return
            if held is not None:
                self._forget(key, held)
            if kind == KIND:
                if _warms(obj):
                    self._warming.add(key[1:])
                else:
                    self._warming.discard(key[1:])
            held = self._objects[key] = _Held.of(obj)
            if held.instance:
                self._by_instance.setdefault((kind, key[1], held.instance), set()).add(key[2])

    def remember(self, obj: Manifest) -> None:
        """What a write returned: newer than anything the watch delivered before it."""
        self.observe(obj["kind"], obj)

    def _forget(self, key: CacheKey, held: _Held) -> None:
        self._objects.pop(key, None)
        names = self._by_instance.get((key[0], key[1], held.instance or ""))
        if names is not None:
            names.discard(key[2])
            if not names:
                del self._by_instance[(key[0], key[1], held.instance or "")]

    def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        with self._guard:
            held = self._objects.get((kind, namespace, name))
        return held.parsed() if held is not None else None

    def of_instance(
        self, kind: str, namespace: str, instance: str, matches: Callable[[Manifest], bool] | None = None
    ) -> list[Manifest]:
        """Objects of `kind` labelled as the VLLMService `instance`'s, optionally filtered."""
        with self._guard:
            names = sorted(self._by_instance.get((kind, namespace, instance), ()))
            found = [self._objects[(kind, namespace, name)].parsed() for name in names]
        return [obj for obj in found if matches is None or matches(obj)]

    def of_kind(self, kind: str, namespace: str) -> list[Manifest]:
        """Every object of `kind` in `namespace` (a scan: for the few passes that look across services)."""
        with self._guard:
            held = [h for (k, ns, _), h in self._objects.items() if k == kind and ns == namespace]
        return [h.parsed() for h in held]

    def warming_services(self) -> list[Manifest]:
        """Every VLLMService with coldStart.nodeWarming enabled, in any namespace."""
        with self._guard:
            held = [self._objects.get((KIND, *key)) for key in self._warming]
        return [h.parsed() for h in held if h is not None]

    def observe_node(self, obj: Manifest, deleted: bool = False) -> None:
        name = obj["metadata"]["name"]
        with self._guard:
            if deleted:
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = node_of(obj)

    def nodes(self) -> list[Node]:
        with self._guard:
            return list(self._nodes.values())

    def name_taken(self, kind: str, obj: Manifest, deleted: bool = False) -> None:
        """A watch event of any object of a kind stoker creates: only whether its name is taken."""
        meta = obj["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        capacity = claim_capacity(obj) if kind == "PersistentVolumeClaim" and not deleted else None
        with self._guard:
            if deleted:
                self._taken.discard(key)
            else:
                self._taken.add(key)
            if capacity is None:
                self._capacities.pop(key[1:], None)
            else:
                self._capacities[key[1:]] = capacity

    def claim_capacity(self, namespace: str, name: str) -> int | None:
        """The capacity of the bound claim `namespace/name` (see name_taken), else None."""
        with self._guard:
            return self._capacities.get((namespace, name))

    def taken(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the watch saw an object of this name, stoker's or not (see name_taken)."""
        with self._guard:
            return (kind, namespace, name) in self._taken


def register(cache: ObjectCache) -> None:
    """kopf watch handlers that keep `cache` current: all VLLMServices, every object stoker labels, and
    the names of all objects of the kinds it creates."""

    # Coroutines: kopf runs them in its event loop, a plain function in a thread pool (a hop per event).
    def keeper(kind: str) -> Callable[..., Coroutine[Any, Any, None]]:
        async def keep(type: str | None, body: kopf.Body, **_: Any) -> None:
            cache.observe(kind, dict(body), deleted=type == "DELETED")

        return keep

    def names(kind: str) -> Callable[..., Coroutine[Any, Any, None]]:
        async def note(type: str | None, body: kopf.Body, **_: Any) -> None:
            cache.name_taken(kind, dict(body), deleted=type == "DELETED")

        return note

    kopf.on.event(GROUP, VERSION, PLURAL, id="cache")(keeper(KIND))

    @kopf.on.event("v1", "nodes", id="cache")
    async def node(type: str | None, body: kopf.Body, **_: Any) -> None:
        cache.observe_node(dict(body), deleted=type == "DELETED")

    for group, version, plural, kind in CHILD_RESOURCES:
        resource = (group, version, plural) if group else (version, plural)
        kopf.on.event(*resource, labels=MANAGED, id="cache")(keeper(kind))
        if kind not in _NAMES_UNWATCHED:
            kopf.on.event(*resource, id="names")(names(kind))


def _warms(service: Manifest) -> bool:
    cold_start = (service.get("spec") or {}).get("coldStart") or {}
    return (cold_start.get("nodeWarming") or {}).get("enabled") is True


def labels_match(selector: Mapping[str, str]) -> Callable[[Manifest], bool]:
    def matches(obj: Manifest) -> bool:
        labels = obj["metadata"].get("labels") or {}
        return all(labels.get(key) == value for key, value in selector.items())

    return matches
