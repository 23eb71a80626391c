"""The operator's view of the cluster: every VLLMService and every object stoker labels, kept from kopf's
watch streams (an informer's store), so that a reconcile reads memory instead of GETting each child.

kopf's watch handlers fill it (`register`); a write's result goes in at once (`remember`), so the pass
after a write sees it even before its watch event arrives, and an older watch event never replaces a newer
object (resourceVersions of one kind only grow). Of what is not labelled as stoker's only the name is
here: a user's object in a child's way is read once, before anything is written; one the watch has not
delivered yet makes the create answer 409, and the reconcile reads it then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import kopf

from stoker.api import GROUP, KIND, PLURAL, VERSION
from stoker.render import INSTANCE_LABEL

Manifest = dict[str, Any]
CacheKey = tuple[str, str, str]  # (kind, namespace, name)

MANAGED = {"app.kubernetes.io/managed-by": "stoker"}
# The kinds stoker creates, as kopf names their resources: (group, version, plural, kind).
CHILD_RESOURCES = (
    ("apps", "v1", "deployments", "Deployment"),
    ("batch", "v1", "jobs", "Job"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    ("", "v1", "services", "Service"),
)


def _resource_version(obj: Manifest) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class ObjectCache:
    """Thread-safe: kopf's event loop writes, the reconcile workers read copies."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._objects: dict[CacheKey, Manifest] = {}
        # (kind, namespace, instance label) -> names: a service's pods and Jobs without a scan.
        self._by_instance: dict[tuple[str, str, str], set[str]] = {}
        # Every object of the kinds stoker creates, labelled or not (kopf watches them whole anyway): a
        # child's name taken by something else is known without a GET before each create.
        self._taken: set[CacheKey] = set()

    def observe(self, kind: str, obj: Manifest, deleted: bool = False) -> None:
        """A watch event: the object as the server has it now, or its deletion."""
        meta = obj["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        with self._guard:
            held = self._objects.get(key)
            if held is not None and _resource_version(held) > _resource_version(obj):
                return  # an event older than what a write put here
            if deleted:
                if held is not None and held["metadata"].get("uid") == meta.get("uid"):
                    self._forget(key, held)
                return
            if held is not None:
                self._forget(key, held)
            self._objects[key] = obj
            if instance:
                self._by_instance.setdefault((kind, key[1], instance), set()).add(key[2])

    def remember(self, obj: Manifest) -> None:
        """What a write returned: newer than anything the watch delivered before it."""
        self.observe(obj["kind"], clone(obj))

    def _forget(self, key: CacheKey, held: Manifest) -> None:
        self._objects.pop(key, None)
        instance = (held["metadata"].get("labels") or {}).get(INSTANCE_LABEL)
        names = self._by_instance.get((key[0], key[1], instance or ""))
        if names is not None:
            names.discard(key[2])
            if not names:
                del self._by_instance[(key[0], key[1], instance or "")]

    def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        with self._guard:
            obj = self._objects.get((kind, namespace, name))
            return clone(obj) if obj is not None else None

    def of_instance(
        self, kind: str, namespace: str, instance: str, matches: Callable[[Manifest], bool] | None = None
    ) -> list[Manifest]:
        """Objects of `kind` labelled as the VLLMService `instance`'s, optionally filtered."""
        with self._guard:
            names = sorted(self._by_instance.get((kind, namespace, instance), ()))
            found = [self._objects[(kind, namespace, name)] for name in names]
            return [clone(obj) for obj in found if matches is None or matches(obj)]

    def name_taken(self, kind: str, obj: Manifest, deleted: bool = False) -> None:
        """A watch event of any object of a kind stoker creates: only whether its name is taken."""
        meta = obj["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        with self._guard:
            if deleted:
                self._taken.discard(key)
            else:
                self._taken.add(key)

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
            cache.observe(kind, clone(dict(body)), deleted=type == "DELETED")

        return keep

    def names(kind: str) -> Callable[..., Coroutine[Any, Any, None]]:
        async def note(type: str | None, body: kopf.Body, **_: Any) -> None:
            cache.name_taken(kind, dict(body), deleted=type == "DELETED")

        return note

    kopf.on.event(GROUP, VERSION, PLURAL, id="cache")(keeper(KIND))
    for group, version, plural, kind in CHILD_RESOURCES:
        resource = (group, version, plural) if group else (version, plural)
        kopf.on.event(*resource, labels=MANAGED, id="cache")(keeper(kind))
        if kind != "Pod":  # stoker creates no pod itself
            kopf.on.event(*resource, id="names")(names(kind))


def clone(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), several times faster than copy.deepcopy,
    which keeps a memo for shared and cyclic objects that API objects never have."""
    if type(value) is dict:
        return {key: clone(item) for key, item in value.items()}
    if type(value) is list:
        return [clone(item) for item in value]
    return value


def labels_match(selector: Mapping[str, str]) -> Callable[[Manifest], bool]:
    def matches(obj: Manifest) -> bool:
        labels = obj["metadata"].get("labels") or {}
        return all(labels.get(key) == value for key, value in selector.items())

    return matches
