"""Thin access to the API server: server-side apply, reads, status patches, pod logs and events."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError
from urllib3 import Retry

from stoker import __version__
from stoker.api import GROUP, KIND, PLURAL, VERSION
from stoker.controller.ownership import apply_ownership_patch

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

EVENT_AGGREGATION_SECONDS = 600.0  # as the kubelet's event correlator: a repeat within this counts
EVENT_MEMORY = 4096  # Events remembered for aggregation at most; the oldest is forgotten first


def load_config() -> None:
    """In a pod, the service account; elsewhere, $KUBECONFIG or ~/.kube/config.

    A refused connection is not retried here (urllib3 would retry it thrice at once, a warning each): the
    work queue retries with backoff, the Lease every retry period."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.retries = Retry(total=1, connect=0)  # one retry of a read on a connection closed under it
    client.Configuration.set_default(configuration)


def _parsed(response: Any) -> Manifest:
    """A response body as plain JSON: the dynamic client's own objects cost a tree of wrappers per call."""
    return cast(Manifest, json.loads(response.data))


class ResourceMissing(Exception):
    """The API server does not serve this resource: its CRD is not installed."""


def status_body(error: ApiException) -> dict[str, Any]:
    """The Status object a refused request's body holds; empty where the body is not one (plain text)."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def missing_object(error: ApiException, plural: str, name: str) -> bool:
    """Whether a 404 says that the object is absent (a Status naming it), not its resource: an unknown
    group answers `404 page not found` as text, an unknown resource of a known group a Status without
    the object's name."""
    body = status_body(error)
    details = body.get("details")
    return (
        isinstance(details, dict)
        and body.get("reason") == "NotFound"
        and details.get("name") == name
        and details.get("kind") == plural
    )


def namespace_terminating(error: ApiException) -> bool:
    """Whether the API server refused a create because the namespace is being deleted (its lifecycle
    admission's NamespaceTerminating cause): nothing created there would be admitted again."""
    details = status_body(error).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return (
        error.status == 403
        and isinstance(causes, list)
        and any(isinstance(cause, dict) and cause.get("reason") == "NamespaceTerminating" for cause in causes)
    )


class LeaseLost(Exception):
    """This replica's term may have passed to another replica: it must write nothing more."""


class Kube:
    """Every method that writes calls `fence` first (leader election sets it: it raises LeaseLost once
    this replica's term may have ended); so must any new one."""

    def __init__(self, field_manager: str, connections: int) -> None:
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = connections  # one per worker thread, none discarded
        self.api_client = client.ApiClient(configuration)
        # Names this process in the API server's audit log, apart from another replica of the same user.
        self.api_client.user_agent = f"stoker/{__version__} ({socket.gethostname()}; pid {os.getpid()})"
        self.dynamic = DynamicClient(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.field_manager = field_manager
        self.fence: Callable[[], None] | None = None
        # (namespace, object uid, reason, message) -> (Event name, count, first posted): aggregation.
        self._events: dict[tuple[str, str, str, str], tuple[str, int, float]] = {}
        self._events_guard = threading.Lock()

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence()

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, obj: Manifest) -> Manifest:
        """Server-side apply with the operator's one field manager; it wins conflicts on its own fields.

        Only for objects stoker owns: the caller has checked the owner reference and puts the live
        object's uid in the body, so that a look-alike created since that check is refused, not taken.
        """
        self._fenced()
        meta = obj["metadata"]
        return _parsed(
            self._resource(obj["apiVersion"], obj["kind"]).server_side_apply(
                # The client would send \u escapes (surrogate pairs for an emoji) that the API server's
                # YAML decoder of apply bodies refuses; JSON with the characters themselves is YAML too.
                body=json.dumps(obj, ensure_ascii=False).encode(),
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=self.field_manager,
                force_conflicts=True,
                serialize=False,
            )
        )

    def create(self, obj: Manifest) -> Manifest:
        """Create only: the API server answers 409 if anything of that name exists by now."""
        self._fenced()
        return _parsed(
            self._resource(obj["apiVersion"], obj["kind"]).create(
                body=obj,
                namespace=obj["metadata"]["namespace"],
                field_manager=self.field_manager,
                serialize=False,
            )
        )

    def own_as_applied(self, obj: Manifest) -> None:
        """Take the fields this manager set by creating `obj` as applied ones (see
        ownership.apply_ownership_patch); if the managedFields list moved since `obj` was read, read again."""
        meta = obj["metadata"]
        for attempt in range(2):
            ops = apply_ownership_patch(obj, self.field_manager)
            if ops is None:
                return
            try:
                self.patch_json(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"], ops)
                return
            except ApiException as error:
                if error.status != 422 or attempt:
                    raise
            fresh = self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            if fresh is None:
                return
            obj = fresh

    def patch_json(
        self, api_version: str, kind: str, namespace: str, name: str, ops: list[Manifest]
    ) -> Manifest:
        """A JSON patch; its `test` operations make it all-or-nothing against what the caller read.
        Returns the object as patched."""
        return self._patch(api_version, kind, namespace, name, ops, "application/json-patch+json")

    def patch_merge(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Manifest
    ) -> Manifest:
        """A JSON merge patch; with metadata.resourceVersion in it, the API server answers 409 if the object
        changed since that version (optimistic concurrency)."""
        return self._patch(api_version, kind, namespace, name, patch, "application/merge-patch+json")

    def _patch(
        self, api_version: str, kind: str, namespace: str, name: str, body: Any, content_type: str
    ) -> Manifest:
        self._fenced()
        return _parsed(
            self._resource(api_version, kind).patch(
                body=body,
                name=name,
                namespace=namespace,
                content_type=content_type,
                field_manager=self.field_manager,
                serialize=False,
            )
        )

    def node_labels(self, name: str) -> dict[str, str]:
        """A node's labels; empty if the node is gone."""
        node = self.get("v1", "Node", "", name)
        return dict(((node or {}).get("metadata") or {}).get("labels") or {})

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            resource = self._resource(api_version, kind)
            return _parsed(resource.get(name=name, namespace=namespace or None, serialize=False))
        except NotFoundError:
            return None

    def get_custom(self, api_version: str, plural: str, namespace: str, name: str) -> Manifest | None:
        """An object of a resource that may not be installed (a CRD of another project), without the
        dynamic client, whose discovery reloads every API group on each miss. Raises ResourceMissing if
        the API server does not serve the resource at all; None if only the object is absent."""
        group, _, version = api_version.rpartition("/")
        try:
            obj = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as error:
            if error.status != 404:
                raise
            if missing_object(error, plural, name):
                return None
            raise ResourceMissing(f"{plural}.{group}/{version}") from error
        return cast(Manifest, obj)

    def endpoint_slices(self, namespace: str, label_selector: str) -> list[Manifest]:
        """EndpointSlices (discovery.k8s.io/v1) of a Service, as plain JSON."""
        response: Any = client.DiscoveryV1Api(self.api_client).list_namespaced_endpoint_slice(
            namespace, label_selector=label_selector, _preload_content=False
        )
        items = json.loads(response.data).get("items")
        return [item for item in items or [] if isinstance(item, dict)]

    def node_pods(self, node: str, label_selector: str) -> list[Manifest]:
        """The pods of every namespace bound to `node` with the labels, as plain JSON (the snapshot agent's
        view of its node)."""
        response: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", label_selector=label_selector, _preload_content=False
        )
        items = json.loads(response.data).get("items")
        return [item for item in items or [] if isinstance(item, dict)]

    def scale_service_from_zero(self, namespace: str, name: str) -> Manifest | None:
        """Set a VLLMService's replicas from 0 to 1 through its scale subresource, as an autoscaler does:
        the Scale is replaced with the resourceVersion it was read at (409 if it changed since). Returns
        the Scale as written (its metadata is the VLLMService's), None if replicas were not 0."""
        self._fenced()
        scale = cast(
            Manifest, self.custom.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, name)
        )
        if int((scale.get("spec") or {}).get("replicas") or 0) != 0:
            return None
        body = {
            "apiVersion": scale.get("apiVersion", "autoscaling/v1"),
            "kind": "Scale",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": scale["metadata"]["resourceVersion"],
            },
            "spec": {"replicas": 1},
        }
        written = self.custom.replace_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, name, body, field_manager=self.field_manager
        )
        return cast(Manifest, written)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the object that was read (uid precondition): never a look-alike made since."""
        self._fenced()
        with contextlib.suppress(NotFoundError, ConflictError):
            self._resource(api_version, kind).delete(
                name=name,
                namespace=namespace,
                body={"propagationPolicy": "Background", "preconditions": {"uid": uid}},
            )

    def patch_pod_metadata(
        self, namespace: str, name: str, labels: dict[str, str | None], annotations: dict[str, str | None]
    ) -> None:
        """A merge patch of a pod's labels and annotations; None removes one."""
        self._fenced()
        self.core.patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": labels, "annotations": annotations}}
        )

    def get_service(self, namespace: str, name: str) -> Manifest | None:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return cast(Manifest, obj)

    def patch_service_metadata(self, namespace: str, name: str, patch: Manifest) -> None:
        """A merge patch of the VLLMService itself (only metadata: stoker never writes a user's spec)."""
        self._fenced()
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def patch_service_status(self, namespace: str, name: str, status: Manifest) -> Manifest:
        """A merge patch of the status subresource: lists (conditions) are replaced whole. Returns the
        object as patched."""
        self._fenced()
        patched = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, field_manager=self.field_manager
        )
        return cast(Manifest, patched)

    def set_service_condition(self, namespace: str, name: str, condition: Manifest) -> None:
        """Put one condition in place of the VLLMService's condition of its type, unless it says the same
        already; the patch carries the resourceVersion read (409 if the status changed since)."""
        self._fenced()
        current = self.get_service(namespace, name)
        if current is None:
            return
        conditions = (current.get("status") or {}).get("conditions") or []
        same = ("type", "status", "reason", "message")
        if any(all(c.get(k) == condition[k] for k in same) for c in conditions):
            return
        others = [c for c in conditions if c.get("type") != condition["type"]]
        self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": {"conditions": [*others, condition]},
            },
            field_manager=self.field_manager,
        )

    def pod_log_lines(self, namespace: str, pod: str, container: str, limit_bytes: int) -> Iterator[str]:
        """The container's log with kubelet timestamps, streamed line by line and bounded in size."""
        response: Any = self.core.read_namespaced_pod_log(
            pod,
            namespace,
            container=container,
            timestamps=True,
            limit_bytes=limit_bytes,
            _preload_content=False,
        )
        pending = b""
        try:
            for chunk in response.stream(64 * 1024):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def pod_events(self, namespace: str, pod: str) -> list[Manifest]:
        return self.events_about(namespace, f"involvedObject.kind=Pod,involvedObject.name={pod}")

    def events_about(self, namespace: str, field_selector: str) -> list[Manifest]:
        events = self.core.list_namespaced_event(namespace, field_selector=field_selector)
        return [self.api_client.sanitize_for_serialization(event) for event in events.items]

    def post_event(self, owner: Manifest, reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event about `owner`; the same reason and message again within EVENT_AGGREGATION_SECONDS
        raise the first one's count instead, as the kubelet's event correlator does, so a retrying object
        never floods its namespace. Best effort: a refused Event never fails a reconcile."""
        self._fenced()
        meta = owner["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = message[:1024]
        same = (meta["namespace"], str(meta.get("uid")), reason, message)
        with self._events_guard:
            seen = self._events.get(same)
        try:
            if seen is not None and time.monotonic() - seen[2] < EVENT_AGGREGATION_SECONDS:
                name, count = seen[0], seen[1] + 1
                try:
                    self.core.patch_namespaced_event(
                        name, meta["namespace"], {"count": count, "lastTimestamp": now}
                    )
                    self._remember_event(same, name, count, seen[2])
                    return
                except ApiException as error:
                    if error.status != 404:
                        raise
            event = {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid"),
                },
                "reason": reason,
                "message": message,
                "type": "Warning" if warning else "Normal",
                "source": {"component": "stoker"},
                "reportingComponent": "stoker",
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            created = self.core.create_namespaced_event(meta["namespace"], cast(Any, event))
            self._remember_event(same, str(created.metadata.name), 1, time.monotonic())
        except ApiException as error:
            # A namespace being deleted refuses new Events as it does everything new: not worth a warning.
            level = logging.DEBUG if namespace_terminating(error) else logging.WARNING
            log.log(level, "Posting event failed reason=%s status=%s", reason, error.status)

    def _remember_event(self, same: tuple[str, str, str, str], name: str, count: int, first: float) -> None:
        with self._events_guard:
            if len(self._events) >= EVENT_MEMORY and same not in self._events:
                self._events.pop(next(iter(self._events)))
            self._events[same] = (name, count, first)
