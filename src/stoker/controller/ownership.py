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

Claims are the one kind a tenant who may not create pods can make, and an owner reference is just a field
its creator writes: a PersistentVolumeClaim is stoker's only with the operator's signature over its
namespace, name and uid (`stoker.dev/claim-signature`), which stoker adds right after creating it (a claim
it cannot sign is deleted again). The uid exists only once the claim does, so the create itself carries a
signature over namespace, name and the time it was sent (`stoker.dev/claim-created-at`), good only while the
API server's creationTimestamp is within CREATION_WINDOW_SECONDS of that time: an operator stopped between
the create and the uid signature leaves a claim its successor can still prove (and then signs over the uid),
and a copy of those annotations onto a claim created later proves nothing. A claim a tenant made, with a
copied owner reference or copied annotations, has another uid and another creation time: a conflict, never
mounted. One exception, explicit and narrow:
a compile-cache PVC kept after its VLLMService was deleted (`retentionPolicy: Retain`) has no owner
reference by design; it carries the uid of the VLLMService it belongs to, signed with the claim's uid
(`stoker.dev/compile-cache-owner`). Only that very VLLMService takes it back, or a later one of the same
name whose spec asks for it (`compileCache.reuseRetained`, which the admission policy admits only from an
author who may `use` that claim): the claim is then re-signed for its new owner. A VLLMService of the same
name that did not ask gets a conflict naming the claim and how to take it, never the claim. What the cache
holds is trusted (the seed skipped) only with a second signature over the claim's uid, its owner, the
seeded key, when it was seeded and the facts the seed read (`stoker.dev/seeded-signature`): Inductor and
Triton caches are code the pods load, and a claim that changed owner is seeded again, the seed emptying it
first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.utils import parse_quantity

from stoker.render import (
    CACHE_OWNER_ANNOTATION,
    CACHE_OWNER_SIGNATURE_ANNOTATION,
    CLAIM_CREATED_AT_ANNOTATION,
    CLAIM_SIGNATURE_ANNOTATION,
    MODEL_FACTS_ANNOTATION,
    RETAINED_CACHE_ANNOTATION,
    SEEDED_AT_ANNOTATION,
    SEEDED_KEY_ANNOTATION,
    SEEDED_SIGNATURE_ANNOTATION,
)

Manifest = dict[str, Any]
# How far a claim's creationTimestamp may be from the time its create was signed at: request latency and
# clock skew between the operator and the API server, with room.
CREATION_WINDOW_SECONDS = 120


def owned_by(obj: Manifest, owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])


def _hmac(secret: str, *parts: str) -> str:
    return hmac.new(secret.encode(), "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def claim_signature(secret: str, claim: Manifest) -> str:
    """The operator's HMAC-SHA256 over a claim it created: namespace, name and uid. A tenant can copy
    stoker's annotations and owner reference onto a claim, not sign that claim's uid."""
    meta = claim["metadata"]
    return _hmac(secret, "claim", meta["namespace"], meta["name"], meta["uid"])


def creation_signature(secret: str, namespace: str, name: str, created_at: str) -> str:
    """The operator's HMAC-SHA256 in a claim's create: namespace, name and when it sent the create."""
    return _hmac(secret, "claim-create", namespace, name, created_at)


def signed_for_creation(claim: Manifest, secret: str, now: float) -> Manifest:
    """`claim` as the operator creates it: signed over its namespace, name and `now` (unix seconds)."""
    meta = claim["metadata"]
    created_at = str(int(now))
    annotations = meta.setdefault("annotations", {})
    annotations[CLAIM_CREATED_AT_ANNOTATION] = created_at
    annotations[CLAIM_SIGNATURE_ANNOTATION] = creation_signature(
        secret, meta["namespace"], meta["name"], created_at
    )
    return claim


def _created_by_the_operator(claim: Manifest, secret: str, signature: str) -> bool:
    """The create's signature (signed_for_creation), on a claim the API server created close to the time it
    was signed at."""
    meta = claim["metadata"]
    created_at = (meta.get("annotations") or {}).get(CLAIM_CREATED_AT_ANNOTATION)
    if not created_at or not created_at.isdigit() or not meta.get("creationTimestamp"):
        return False
    try:
        created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return False
    return abs(created - int(created_at)) <= CREATION_WINDOW_SECONDS and hmac.compare_digest(
        signature, creation_signature(secret, meta["namespace"], meta["name"], created_at)
    )


def signed_claim(claim: Manifest, secret: str | None) -> bool:
    """Whether the operator signed this very claim: over its uid (claim_signature), or in its create
    (signed_for_creation) when it stopped before it could sign the uid."""
    meta = claim["metadata"]
    signature = (meta.get("annotations") or {}).get(CLAIM_SIGNATURE_ANNOTATION)
    if secret is None or signature is None or not meta.get("uid"):
        return False
    return hmac.compare_digest(signature, claim_signature(secret, claim)) or _created_by_the_operator(
        claim, secret, signature
    )


def owner_signature(secret: str, claim: Manifest, owner_uid: str) -> str:
    """The operator's HMAC-SHA256 saying that this very claim (namespace and uid) belongs to the
    VLLMService of uid `owner_uid`."""
    meta = claim["metadata"]
    return _hmac(secret, "owner", meta["namespace"], meta["uid"], owner_uid)


def cache_owner(claim: Manifest, secret: str | None) -> str | None:
    """The uid of the VLLMService a compile-cache claim belongs to, if the operator signed it for this
    claim; None for a claim with no owner recorded, or a record a tenant wrote or copied."""
    annotations = claim["metadata"].get("annotations") or {}
    owner = annotations.get(CACHE_OWNER_ANNOTATION)
    signature = annotations.get(CACHE_OWNER_SIGNATURE_ANNOTATION)
    if secret is None or not owner or not signature or not claim["metadata"].get("uid"):
        return None
    return owner if hmac.compare_digest(signature, owner_signature(secret, claim, owner)) else None


def made_before_owners_were_recorded(claim: Manifest | None, service: Manifest, secret: str | None) -> bool:
    """A compile-cache claim of an operator that did not record owners yet, created while this very
    VLLMService existed: names are unique at any time, so it was made for this one (a claim retained from
    an earlier VLLMService of the name is older than this one)."""
    if claim is None or cache_owner(claim, secret) is not None:
        return False
    created = claim["metadata"].get("creationTimestamp")
    since = service["metadata"].get("creationTimestamp")
    return bool(created and since) and _instant(created) >= _instant(since)


def _instant(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00"))


def retained_cache_of(
    kind: str, obj: Manifest, service_name: str, secret: str | None, owner_uid: str | None
) -> bool:
    """A compile-cache PVC stoker created for a VLLMService of this name and kept after its deletion: no
    owner reference, annotated with that name, signed by the operator for this very claim and, unless
    `owner_uid` is None (the service asked to reuse whatever cache of its name was retained), belonging to
    the VLLMService of that uid."""
    meta = obj["metadata"]
    return (
        kind == "PersistentVolumeClaim"
        and not meta.get("ownerReferences")
        and (meta.get("annotations") or {}).get(RETAINED_CACHE_ANNOTATION) == service_name
        and signed_claim(obj, secret)
        and (owner_uid is None or cache_owner(obj, secret) == owner_uid)
    )


def stokers(
    kind: str,
    obj: Manifest,
    owner_uid: str,
    service_name: str,
    secret: str | None,
    reuse_retained: bool = False,
) -> bool:
    """Whether stoker may apply to this object for the VLLMService (uid, name); a claim only if signed, and
    a retained one only if it is this VLLMService's or the service asked to reuse it (`reuse_retained`)."""
    if kind == "PersistentVolumeClaim":
        return signed_claim(obj, secret) and (
            owned_by(obj, owner_uid)
            or retained_cache_of(kind, obj, service_name, secret, None if reuse_retained else owner_uid)
        )
    return owned_by(obj, owner_uid)


def seeded_signature(secret: str, claim: Manifest, owner_uid: str, seeded: SeededClaim) -> str:
    """The operator's HMAC-SHA256 proving that it seeded this very claim (namespace and uid) of the
    VLLMService `owner_uid` for `seeded.key` at `seeded.at`, and read `seeded.facts` from that seed."""
    meta = claim["metadata"]
    return _hmac(
        secret, "seeded", meta["namespace"], meta["uid"], owner_uid, seeded.key, seeded.at, seeded.facts or ""
    )


@dataclass(frozen=True)
class SeededClaim:
    """What a cache claim proves stoker seeded into it: the key, when (RFC 3339) and the facts read."""

    key: str
    at: str
    facts: str | None


def seeded_annotations(secret: str, claim: Manifest, owner_uid: str, seeded: SeededClaim) -> dict[str, str]:
    """The annotations recording a seed on a claim, signed (see proven_seed)."""
    annotations = {SEEDED_KEY_ANNOTATION: seeded.key, SEEDED_AT_ANNOTATION: seeded.at}
    if seeded.facts is not None:
        annotations[MODEL_FACTS_ANNOTATION] = seeded.facts
    annotations[SEEDED_SIGNATURE_ANNOTATION] = seeded_signature(secret, claim, owner_uid, seeded)
    return annotations


def proven_seed(claim: Manifest | None, secret: str | None, owner_uid: str) -> SeededClaim | None:
    """The seed a claim's annotations record, only if the operator signed it for this claim's uid and
    the VLLMService `owner_uid`: annotations a tenant wrote, copied from another claim, or left by another
    owner of the claim prove nothing."""
    if claim is None or secret is None:
        return None
    annotations = claim["metadata"].get("annotations") or {}
    key, signature = annotations.get(SEEDED_KEY_ANNOTATION), annotations.get(SEEDED_SIGNATURE_ANNOTATION)
    at = annotations.get(SEEDED_AT_ANNOTATION)
    if not key or not at or not signature or not claim["metadata"].get("uid"):
        return None
    seeded = SeededClaim(key, at, annotations.get(MODEL_FACTS_ANNOTATION))
    if not hmac.compare_digest(signature, seeded_signature(secret, claim, owner_uid, seeded)):
        return None
    return seeded


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
    # A compile cache retained from another VLLMService of this name (deleted since): it is not reused
    # unless this one asks for it.
    retained: bool = False

    @property
    def subject(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def message(self) -> str:
        if self.retained:
            return (
                f"{self.subject} is a compile cache retained from another VLLMService of this name, and is"
                " not reused for this one: set spec.coldStart.compileCache.reuseRetained to take it over"
                " (admitted only if you may `use` that PersistentVolumeClaim; it is then seeded again,"
                " emptied first), or delete it"
            )
        return f"{self.subject} exists and is not owned by this VLLMService; rename or delete it"


def conflicts(
    owner_uid: str,
    service_name: str,
    live: list[tuple[str, Manifest]],
    secret: str | None,
    reuse_retained: bool = False,
) -> list[ChildConflict]:
    """The live objects (kind, object) in the way: a child's name, neither carrying this VLLMService's
    owner reference nor a compile cache retained for it (see stokers)."""
    return [
        ChildConflict(
            kind,
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
            retained=retained_cache_of(kind, obj, service_name, secret, None),
        )
        for kind, obj in live
        if not stokers(kind, obj, owner_uid, service_name, secret, reuse_retained)
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


def covers(live: Any, desired: Any) -> bool:
    """Whether the live object already has every field stoker renders, with the same value: then applying
    would change nothing that stoker owns. Fields the server defaulted or others added are ignored here
    (`foreign_fields` removes what others added to a child's spec). Quantities compare by
    value, as the server may print `1000m` as `1`."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            key in live and covers(live[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(covers(have, want) for have, want in zip(live, desired, strict=True))
        )
    if type(live) is type(desired) and live == desired:  # True is not 1
        return True
    if isinstance(desired, str) and isinstance(live, str):
        try:
            return bool(parse_quantity(live) == parse_quantity(desired))
        except ValueError:
            return False
    return False


# What drift correction compares whole on every child: its spec. Under it, the fields another manager may
# keep: the API server allocates a Service's cluster IPs and families (immutable once set), the volume
# binder sets a claim's volumeName, a user may expand a claim (never_shrink), and `kubectl rollout restart`
# stamps an annotation whose removal would roll the pods out once more. Everything else under spec that
# only others set (a selector key, a port, a sidecar added by hand) is removed.
_COMPARED = "f:spec"
_TEMPLATE_RESTART = (
    "f:spec",
    "f:template",
    "f:metadata",
    "f:annotations",
    "f:kubectl.kubernetes.io/restartedAt",
)
_KEPT_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (_TEMPLATE_RESTART,),
    "DaemonSet": (_TEMPLATE_RESTART,),
    "Service": tuple(
        ("f:spec", field)
        for field in (
            "f:clusterIP",
            "f:clusterIPs",
            "f:ipFamilies",
            "f:ipFamilyPolicy",
            "f:healthCheckNodePort",
        )
    ),
    "PersistentVolumeClaim": (
        ("f:spec", "f:volumeName"),
        ("f:spec", "f:resources", "f:requests", "f:storage"),
    ),
}


def foreign_fields(kind: str, live: Manifest, manager: str) -> list[Manifest]:
    """A JSON patch removing from a live child's spec every field that only other field managers own: a
    selector key or port added to the Service by hand, a sidecar, env variable or volume, `hostNetwork:
    true` or another `serviceAccountName` in a pod template. managedFields say who set what; what the
    server defaulted or allocated has no manager and stays, and a field stoker owns too (the same value
    applied by both) stays.

    Call it on the object as stoker's last apply returned it: the apply took back every field stoker
    renders, so what others still own is what stoker does not render. Each removal is preceded by `test`s
    of the keys of every list item on its path, so the patch fails whole if the object moved since."""
    found = (_resolve(live, path) for path in _foreign_paths(kind, live, manager))
    resolved = [r for r in found if r is not None]
    ops: list[Manifest] = []
    # Deepest and last items first, so that no removal shifts the index of one still to come.
    for pointer, tests in sorted(resolved, key=lambda r: r[0], reverse=True):
        ops += [op for op in tests if op not in ops]
        ops.append({"op": "remove", "path": _pointer(pointer)})
    return ops


def foreign_list_items(kind: str, live: Manifest, desired: Manifest, manager: str) -> list[Manifest]:
    """A JSON patch, for before the apply, putting back as rendered every list of the spec that holds an
    item only other managers set, if stoker renders that list. The apply merges list items by key, so an
    item of theirs stays next to stoker's and may collide with it: a port of the Service changed by hand
    keeps the name `http` that stoker's re-added port has, and the API server refuses the duplicate. Each
    replacement `test`s the list as read, so the patch fails whole if the object moved since."""
    # A list others own whole (stoker's items gone from it), or one with an item of theirs.
    lists = {
        path[:-1] if path[-1][:2] in ("k:", "v:") else path: None
        for path in _foreign_paths(kind, live, manager)
    }
    put_back: list[tuple[str, ...]] = []
    ops: list[Manifest] = []
    for path in sorted(lists, key=len):  # outer lists first: one put back takes the lists in it along
        if any(path[: len(outer)] == outer for outer in put_back):
            continue
        where, rendered = _resolve(live, path), _resolve(desired, path)
        if where is None or rendered is None or not isinstance(_at(live, where[0]), list):
            continue
        put_back.append(path)
        pointer, tests = where
        ops += [op for op in tests if op not in ops]
        ops += [
            {"op": "test", "path": _pointer(pointer), "value": _at(live, pointer)},
            {"op": "replace", "path": _pointer(pointer), "value": _at(desired, rendered[0])},
        ]
    return ops


def _foreign_paths(kind: str, live: Manifest, manager: str) -> list[tuple[str, ...]]:
    """fieldsV1 paths of the spec's fields (or the topmost of a subtree) that only managers other than
    `manager` own, less those that _KEPT_FIELDS leaves to others."""
    kept = _KEPT_FIELDS.get(kind, ())
    ours: set[tuple[str, ...]] = set()
    theirs: list[tuple[str, ...]] = []
    for entry in live["metadata"].get("managedFields") or []:
        if entry.get("subresource"):
            continue
        spec = (entry.get("fieldsV1") or {}).get(_COMPARED)
        if not isinstance(spec, dict):
            continue
        leaves = [(_COMPARED, *path) for path in _leaf_paths(spec, ())]
        if entry.get("manager") == manager:
            ours.update(path[:depth] for path in leaves for depth in range(1, len(path) + 1))
        else:
            theirs += leaves
    targets: dict[tuple[str, ...], None] = {}
    for path in theirs:
        if any(path[: len(field)] == field for field in kept):
            continue
        depth = next((d for d in range(1, len(path) + 1) if path[:d] not in ours), None)
        if depth is not None:
            targets[path[:depth]] = None
    return list(targets)


def _at(obj: Any, pointer: tuple[Any, ...]) -> Any:
    for part in pointer:
        obj = obj[part]
    return obj


def _leaf_paths(node: dict[str, Any], prefix: tuple[str, ...]) -> Any:
    """Paths of managedFields' fieldsV1 leaves: an empty set, or a node marked owned itself ('.')."""
    children = [key for key in node if key != "."]
    if not children or "." in node:
        yield prefix
    for key in children:
        if isinstance(node[key], dict):
            yield from _leaf_paths(node[key], (*prefix, key))


def _resolve(obj: Any, path: tuple[str, ...]) -> tuple[tuple[Any, ...], list[Manifest]] | None:
    """The JSON pointer parts of a fieldsV1 path in `obj` and `test`s of the keys of each list item on the
    way; None if the path is no longer there."""
    pointer: list[Any] = []
    tests: list[Manifest] = []
    for token in path:
        kind, _, value = token.partition(":")
        if kind == "f" and isinstance(obj, dict) and value in obj:
            pointer.append(value)
            obj = obj[value]
        elif kind == "k" and isinstance(obj, list):
            keys = json.loads(value)
            index = next(
                (i for i, item in enumerate(obj) if all(item.get(k) == v for k, v in keys.items())), None
            )
            if index is None:
                return None
            pointer.append(index)
            where = _pointer(pointer)
            tests += [{"op": "test", "path": f"{where}/{_escape(k)}", "value": v} for k, v in keys.items()]
            obj = obj[index]
        elif kind == "v" and isinstance(obj, list) and json.loads(value) in obj:
            pointer.append(obj.index(json.loads(value)))
            obj = obj[pointer[-1]]
        else:
            return None
    return tuple(pointer), tests


def _pointer(parts: tuple[Any, ...] | list[Any]) -> str:
    return "".join(f"/{_escape(p)}" for p in parts)


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def _dig(obj: Manifest, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)  # type: ignore[assignment]
    return obj
