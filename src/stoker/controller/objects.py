"""Reading Kubernetes objects as the API server returns them (plain dicts): pure helpers."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

Manifest = dict[str, Any]


def pod_is_ready(pod: Manifest) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def main_container_status(pod: Manifest) -> Manifest | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    name = pod["spec"]["containers"][0]["name"]
    return next((s for s in statuses if s.get("name") == name), None)


def job_outcome(job: Manifest | None) -> str | None:
    """None (no Job), running, succeeded or failed, from the Job's conditions."""
    if job is None:
        return None
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if condition.get("status") == "True" and condition.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    return "running"


def parse_time(value: str | None) -> dt.datetime | None:
    """An RFC 3339 timestamp as Kubernetes writes it (`2026-11-22T07:40:16Z`)."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def still_running(record: Manifest, pods: list[Manifest]) -> bool:
    """Whether a startup record's pod belongs to a ReplicaSet that still has pods: once an edit replaced
    it (or a scale-down emptied it) the record describes nothing that serves. Records written before
    the template hash was kept fall back to their pod's name."""
    template_hash = record.get("podTemplateHash")
    if template_hash is None:
        return any(pod["metadata"]["name"] == record.get("pod") for pod in pods)
    return any(
        (pod["metadata"].get("labels") or {}).get("pod-template-hash") == template_hash for pod in pods
    )


def merge_patch(before: Manifest, after: Manifest) -> Manifest:
    """A JSON merge patch (RFC 7386) turning `before` into `after`: what `after` changed, and null for each
    key it dropped (a merge patch leaves absent keys as they were, so a cleared record would stay). What it
    left as it was is not in the patch, so another writer's newer value of it stays."""
    patch: Manifest = {}
    for key, value in after.items():
        old = before.get(key)
        if key in before and old == value:
            continue
        patch[key] = merge_patch(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    patch.update({key: None for key in before.keys() - after.keys()})
    return patch


def facts_json(model: Manifest) -> str:
    """Model facts (status.startup.model) as the JSON text the operator signs on a cache claim."""
    return json.dumps(model, sort_keys=True, separators=(",", ":"))
