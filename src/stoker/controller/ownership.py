"""What is stoker's, and what drift correction may change on it. Pure: plain dicts in, plain dicts out.

An object is stoker's only if it carries the VLLMService's owner reference (its uid). Anything else with
a child's name (a user's PVC with data, an object of another VLLMService or of Helm) is never applied to,
patched or deleted: it is reported as a conflict naming it, and the VLLMService waits.

The check and the write cannot be one request, so each write carries what the check saw and the API server
refuses it if that changed in between (no window in which a newcomer is taken):
- missing when read: created with POST (409 if anything of that name appeared since), never applied;
- stoker's when read: applied with the read object's `metadata.uid` in the body (uid is immutable: an
  object deleted and re-created by someone else since is refused with 422);
- the control Secret, which the operator never reads: POST, and on 409 a JSON patch whose first operation
  tests `/metadata/ownerReferences/0/uid` (atomic with the write; 422 if not stoker's);
- deletions (superseded seed Jobs, standby pods) carry a uid precondition.

One exception, explicit and narrow: a compile-cache PVC kept after its VLLMService was deleted
(`retentionPolicy: Retain`) has no owner reference by design, so the next VLLMService of the same name
takes it back when it has no owner references at all and carries the annotation stoker put on it when
creating it, naming that VLLMService (`stoker.dev/compile-cache-of`). A user's own PVC lacks the
annotation and is still refused; one that names another VLLMService, or has any owner, too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

from stoker.render import RETAINED_CACHE_ANNOTATION

Manifest = dict[str, Any]

# Lists in a pod template whose items are named: the ones drift correction prunes.
_POD_LISTS = ("containers", "initContainers", "volumes")
_CONTAINER_LISTS = ("env", "volumeMounts")


def owned_by(obj: Manifest, owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])


def retained_cache_of(kind: str, obj: Manifest, service_name: str) -> bool:
    """A compile-cache PVC stoker created for a VLLMService of this name and kept after its deletion."""
    meta = obj["metadata"]
    return (
        kind == "PersistentVolumeClaim"
        and not meta.get("ownerReferences")
        and (meta.get("annotations") or {}).get(RETAINED_CACHE_ANNOTATION) == service_name
    )


def stokers(kind: str, obj: Manifest, owner_uid: str, service_name: str) -> bool:
    """Whether stoker may apply to this object for the VLLMService (uid, name)."""
    return owned_by(obj, owner_uid) or retained_cache_of(kind, obj, service_name)


def release(obj: Manifest, owner_uid: str) -> list[Manifest]:
    """A JSON patch removing this owner's reference (so that garbage collection keeps the object), each
    removal preceded by a `test` of the uid at that index; empty if it carries none."""
    ops: list[Manifest] = []
    refs = obj["metadata"].get("ownerReferences") or []
    for index in reversed(range(len(refs))):
        if refs[index].get("uid") == owner_uid:
            path = f"/metadata/ownerReferences/{index}"
            ops += [{"op": "test", "path": f"{path}/uid", "value": owner_uid}, {"op": "remove", "path": path}]
    return ops


def created_by_deployment(pod: Manifest, deployment_name: str) -> bool:
    """A pod of one of the Deployment's ReplicaSets (`<deployment>-<template hash>`): the only pods the
    standby pool relabels or deletes. A pod that merely carries the labels is not one."""
    template_hash = (pod["metadata"].get("labels") or {}).get("pod-template-hash")
    return template_hash is not None and any(
        ref.get("kind") == "ReplicaSet"
        and ref.get("controller")
        and ref.get("name") == f"{deployment_name}-{template_hash}"
        for ref in pod["metadata"].get("ownerReferences") or []
    )


@dataclass(frozen=True)
class ChildConflict:
    kind: str
    namespace: str
    name: str

    @property
    def subject(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def message(self) -> str:
        return f"{self.subject} exists and is not owned by this VLLMService; rename or delete it"


def conflicts(owner_uid: str, service_name: str, live: list[tuple[str, Manifest]]) -> list[ChildConflict]:
    """The live objects (kind, object) in the way: a child's name, neither carrying this VLLMService's
    owner reference nor a compile cache retained for its name."""
    return [
        ChildConflict(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
        for kind, obj in live
        if not stokers(kind, obj, owner_uid, service_name)
    ]


def apply_ownership_patch(created: Manifest, manager: str) -> list[Manifest] | None:
    """A JSON patch that turns what `manager` set by creating `created` into fields it applied.

    A create is an Update operation in managedFields; server-side apply only removes a field that its own
    Apply entry owns, so without this a label or env variable later dropped from the rendered child would
    stay forever. The same upgrade kubectl's csaupgrade makes, on the entry's index, with `test`s so that it
    fails rather than touch another manager's entry if the list moved since the create."""
    for index, entry in enumerate(created["metadata"].get("managedFields") or []):
        created_here = entry.get("operation") == "Update" and not entry.get("subresource")
        if entry.get("manager") == manager and created_here:
            path = f"/metadata/managedFields/{index}"
            return [
                {"op": "test", "path": f"{path}/manager", "value": manager},
                {"op": "test", "path": f"{path}/operation", "value": "Update"},
                {"op": "replace", "path": f"{path}/operation", "value": "Apply"},
            ]
    return None


def never_shrink(desired: Manifest, live: Manifest) -> Manifest:
    """A PVC as desired, but keeping a larger live storage request: the API server refuses a shrink, and
    a user who expanded the volume meant it."""
    path = ("spec", "resources", "requests", "storage")
    live_size, wanted_size = _dig(live, path), _dig(desired, path)
    if live_size is None or wanted_size is None or parse_quantity(live_size) <= parse_quantity(wanted_size):
        return desired
    return {**desired, "spec": {**desired["spec"], "resources": {"requests": {"storage": live_size}}}}


def foreign_template_items(live: Manifest, desired: Manifest) -> list[Manifest]:
    """A JSON patch removing from a live Deployment's pod template every named item (container, init
    container, volume; env variable or volume mount of a stoker container) that stoker does not render.

    Server-side apply never removes what another field manager added (a hand-added sidecar stays), and a
    whole-template replace would also drop the server's defaults and other controllers' fields; removing
    exactly the foreign named items is the least that restores the rendered pods. Every removal is
    preceded by a `test` of the item's name, so the patch fails as a whole if the template moved since
    it was read."""
    live_pod = _dig(live, ("spec", "template", "spec")) or {}
    desired_pod = _dig(desired, ("spec", "template", "spec")) or {}
    base = "/spec/template/spec"
    ops: list[Manifest] = []
    # Items inside stoker's containers first: removing a foreign container shifts the indices after it.
    wanted_containers = {c["name"]: c for c in desired_pod.get("containers") or []}
    for index, container in enumerate(live_pod.get("containers") or []):
        wanted = wanted_containers.get(container.get("name"))
        if wanted is None:
            continue
        for field in _CONTAINER_LISTS:
            ops += _removals(f"{base}/containers/{index}/{field}", container.get(field), wanted.get(field))
    for field in _POD_LISTS:
        ops += _removals(f"{base}/{field}", live_pod.get(field), desired_pod.get(field))
    return ops


def _removals(path: str, live: list[Manifest] | None, desired: list[Manifest] | None) -> list[Manifest]:
    names = {item.get("name") for item in desired or []}
    ops: list[Manifest] = []
    for index in reversed(range(len(live or []))):
        name = (live or [])[index].get("name")
        if name not in names:
            ops.append({"op": "test", "path": f"{path}/{index}/name", "value": name})
            ops.append({"op": "remove", "path": f"{path}/{index}"})
    return ops


def _dig(obj: Manifest, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)  # type: ignore[assignment]
    return obj
