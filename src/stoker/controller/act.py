"""Act: carry out what `decide` planned, and nothing else. Every write's result goes into the watch cache
at once, so the next pass does not act on what it already did (the Deployment controller's expectations).

Writes carry what the observation saw, so that the API server refuses them if it changed meanwhile (see
ownership.py): creates are POSTs (409 if something appeared), applies carry the live uid, deletions a uid
precondition, the control Secret a JSON patch testing its owner.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

from kubernetes.client.exceptions import ApiException

from stoker.api import VLLMServiceStatus
from stoker.controller.cache import ObjectCache
from stoker.controller.conditions import Condition, merge_conditions, now_rfc3339
from stoker.controller.decide import ChildrenPlan, Event, Outcome
from stoker.controller.kube import Kube, Manifest, namespace_terminating, status_body
from stoker.controller.objects import merge_patch
from stoker.controller.ownership import (
    ChildConflict,
    claim_signature,
    foreign_fields,
    foreign_list_items,
    release,
    signed_for_creation,
    stokers,
)
from stoker.render import CLAIM_SIGNATURE_ANNOTATION, SEED_CLAIM_UID_ANNOTATION

log = logging.getLogger(__name__)

SECRET_MEMORY = 65536  # control Secrets remembered as written; forgetting one costs one write


class InTheWay(Exception):
    """A child's name is taken by an object that is not this VLLMService's (one the watch had not shown)."""

    def __init__(self, conflict: ChildConflict) -> None:
        super().__init__(conflict.message)
        self.conflict = conflict


class NamespaceTerminating(Exception):
    """The namespace is being deleted, this VLLMService with it: no child can be created there any more."""


class Actor:
    def __init__(self, kube: Kube, cache: ObjectCache, signing_key: str) -> None:
        self.kube = kube
        self.cache = cache
        self.signing_key = signing_key
        # The control Secret is never read (no watch, no GET), so what this process wrote is what it
        # knows: (namespace, name, owner uid) -> digest of the written data.
        self._secrets: dict[tuple[str, str, str], str] = {}
        self._guard = threading.Lock()

    def write_children(
        self, body: Manifest, plan: ChildrenPlan, live: dict[tuple[str, str], Manifest | None]
    ) -> Outcome:
        """Create, apply and delete as planned; refused writes are collected, not raised (the status says
        them, the queue backs off). Returns the `live` children as they are after the writes. Raises
        InTheWay if the control Secret's name is taken, NamespaceTerminating at the first create the
        namespace's deletion refuses."""
        namespace, uid = body["metadata"]["namespace"], body["metadata"]["uid"]
        written_children = dict(live)
        apply_errors: list[str] = []
        claim_uid: str | None = None
        for write in plan.writes:
            child, kind, name = write.desired, write.desired["kind"], write.desired["metadata"]["name"]
            if kind == "Job" and claim_uid is not None:  # the claim was created just now
                child["metadata"]["annotations"][SEED_CLAIM_UID_ANNOTATION] = claim_uid
            try:
                written = self._write(child, write.current, body)
                letting_go = release(written, uid) if write.release_owner and written is not None else []
                if letting_go:  # the apply may have dropped the reference it once applied itself
                    written = self.kube.patch_json("v1", kind, namespace, name, letting_go)
            except ApiException as error:
                if namespace_terminating(error):
                    raise NamespaceTerminating(namespace) from error
                apply_errors.append(f"{kind} {namespace}/{name}: {api_error_message(error)}")
                continue
            if written is None:
                continue
            self.cache.remember(written)
            written_children[(kind, name)] = written
            if kind == "PersistentVolumeClaim" and name == plan.claim_name:
                claim_uid = written["metadata"]["uid"]
            if kind == "Job":
                self.event(body, Event("SeedStarted", f"Started seed job {name}"))
        for obj in plan.deletions:
            meta = obj["metadata"]
            self.kube.delete(obj["apiVersion"], obj["kind"], namespace, meta["name"], meta["uid"])
            log.info("Deleted %s=%s/%s", obj["kind"].lower(), namespace, meta["name"])
        return Outcome(written_children, apply_errors)

    def _write(self, child: Manifest, current: Manifest | None, body: Manifest) -> Manifest | None:
        """Create a missing child or apply one that is stoker's; the Secret only if this process has not
        written it as it is now."""
        owner_uid = body["metadata"]["uid"]
        if child["kind"] == "Secret":
            return self._write_secret(child, owner_uid)
        if current is None:
            # Create, not apply: if an object of that name appeared since the read, this fails (409)
            # instead of taking it over.
            if child["kind"] == "PersistentVolumeClaim":
                child = signed_for_creation(child, self.signing_key, time.time())
            try:
                created = self.kube.create(child)
            except ApiException as error:
                if error.status != 409:
                    raise
                return self._taken_since(child, body, error)
            if child["kind"] == "PersistentVolumeClaim":
                return self._sign(created)
            if child["kind"] == "Deployment":
                # So that later applies remove what stoker stops rendering in the pod template (a label
                # dropped from spec.pod). Only here: the other kinds' specs are immutable or hold fields the
                # server allocates, and what stoker renders on them does not shrink.
                self._own_as_applied(created)
            return created
        # The uid read with the owner reference: if the object was replaced since, the API server refuses
        # the apply (uid is immutable) instead of applying to the newcomer.
        child["metadata"]["uid"] = current["metadata"]["uid"]
        colliding = foreign_list_items(child["kind"], current, child, self.kube.field_manager)
        if colliding:
            uid_test = {"op": "test", "path": "/metadata/uid", "value": child["metadata"]["uid"]}
            self._patch_logged(
                child, [uid_test, *colliding], "Put back as rendered lists that others added items to"
            )
        written = self.kube.apply(child)
        foreign = foreign_fields(child["kind"], written, self.kube.field_manager)
        if foreign:
            written = self._patch_logged(child, foreign, "Removed from the spec what stoker does not render")
        return written

    def _patch_logged(self, child: Manifest, ops: list[Manifest], done: str) -> Manifest:
        """A JSON patch of a child, logged with the paths it changes (its `test`s left out)."""
        meta = child["metadata"]
        written = self.kube.patch_json(
            child["apiVersion"], child["kind"], meta["namespace"], meta["name"], ops
        )
        changed = ",".join(op["path"] for op in ops if op["op"] != "test")
        log.info(
            "%s %s=%s/%s paths=%s", done, child["kind"].lower(), meta["namespace"], meta["name"], changed
        )
        return written

    def _taken_since(self, child: Manifest, body: Manifest, error: ApiException) -> Manifest:
        """The object a create met (409), if it is stoker's (one the watch had not delivered yet: the next
        pass applies what differs); InTheWay if it is not."""
        meta = child["metadata"]
        live = self.kube.get(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
        if live is None:
            raise error  # gone again: the queue retries
        owner = body["metadata"]
        if not stokers(child["kind"], live, owner["uid"], owner["name"], self.signing_key):
            raise InTheWay(ChildConflict(child["kind"], meta["namespace"], meta["name"]))
        return live

    def _sign(self, claim: Manifest) -> Manifest:
        """Sign a claim stoker just created (ownership.claim_signature), testing its uid on the way; one
        it could not sign is deleted again, as no later pass could tell it from a tenant's."""
        meta = claim["metadata"]
        annotations = dict(meta.get("annotations") or {})
        annotations[CLAIM_SIGNATURE_ANNOTATION] = claim_signature(self.signing_key, claim)
        ops = [
            {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
            {"op": "add", "path": "/metadata/annotations", "value": annotations},
        ]
        try:
            return self.kube.patch_json("v1", "PersistentVolumeClaim", meta["namespace"], meta["name"], ops)
        except ApiException:
            self.kube.delete("v1", "PersistentVolumeClaim", meta["namespace"], meta["name"], meta["uid"])
            raise

    def _own_as_applied(self, created: Manifest) -> None:
        try:
            self.kube.own_as_applied(created)
        except ApiException as error:  # the child exists as created; only later pruning is at stake
            meta = created["metadata"]
            log.warning(
                "Taking created fields as applied failed %s=%s/%s: %s",
                created["kind"].lower(),
                meta["namespace"],
                meta["name"],
                api_error_message(error),
            )

    def _write_secret(self, secret: Manifest, owner_uid: str) -> Manifest | None:
        """Create the Secret, or patch it only if its first owner reference is this object's: a JSON
        patch whose `test` makes the ownership check and the write one atomic step, without a read."""
        meta = secret["metadata"]
        memory = (meta["namespace"], meta["name"], owner_uid)
        digest = hashlib.sha256(json.dumps(secret, sort_keys=True).encode()).hexdigest()
        with self._guard:
            if self._secrets.get(memory) == digest:
                return None
        try:
            self.kube.create(secret)
        except ApiException as error:
            if error.status != 409:
                raise
            ops = [
                {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": owner_uid},
                {"op": "add", "path": "/metadata/labels", "value": meta["labels"]},
                {"op": "add", "path": "/data", "value": secret["data"]},
            ]
            try:
                self.kube.patch_json("v1", "Secret", meta["namespace"], meta["name"], ops)
            except ApiException as refused:
                if refused.status == 422:  # the test failed: no owner reference, or another owner's
                    raise InTheWay(ChildConflict("Secret", meta["namespace"], meta["name"])) from refused
                raise
        with self._guard:
            if len(self._secrets) >= SECRET_MEMORY:
                self._secrets.clear()
            self._secrets[memory] = digest
        return None

    def event(self, body: Manifest, event: Event) -> None:
        self.kube.post_event(body, event.reason, event.message, warning=event.warning)

    def write_status(self, body: Manifest, new_status: Manifest) -> None:
        """A merge patch of what changed in status, nothing if nothing did."""
        wanted, written = status_document(new_status), status_document(body.get("status") or {})
        if wanted == written:
            return  # nothing changed: no write, no watch event, no churn
        meta = body["metadata"]
        try:
            patched = self.kube.patch_service_status(
                meta["namespace"], meta["name"], merge_patch(written, wanted)
            )
        except ApiException as error:
            if error.status in (400, 422):  # refused for what it says: say so where the user looks
                self._report_refused_status(body, api_error_message(error))
            raise  # the work queue retries with its backoff
        self.cache.remember(patched)  # the next pass, and the learning path, see it before its watch event

    def _report_refused_status(self, body: Manifest, message: str) -> None:
        """A status the API server refused (an admission policy, a schema an older CRD has) as a Degraded
        condition alone, in a patch small enough to pass, and a Warning Event (aggregated on repeats)."""
        meta = body["metadata"]
        previous = (body.get("status") or {}).get("conditions") or []
        text = f"The API server refused the status: {message}"[:1024]
        refused = Condition("Degraded", True, "StatusRefused", text)
        degraded = merge_conditions(previous, [refused], int(meta.get("generation") or 0), now_rfc3339())
        conditions = [c for c in previous if c.get("type") != "Degraded"] + degraded
        self.kube.post_event(body, "StatusRefused", refused.message, warning=True)
        try:
            self.kube.patch_service_status(meta["namespace"], meta["name"], {"conditions": conditions})
        except ApiException as error:
            log.warning(
                "Status refused, and its Degraded condition too vllmservice=%s/%s: %s",
                meta["namespace"],
                meta["name"],
                api_error_message(error),
            )


def api_error_message(error: ApiException) -> str:
    """The API server's own message for a refused request, with its status code."""
    message = status_body(error).get("message") or error.reason
    return f"{message} (HTTP {error.status})"


def status_document(status: Manifest) -> Manifest:
    """Status through its model: what is written has the CRD's shape, or this fails loudly here."""
    return VLLMServiceStatus.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)
