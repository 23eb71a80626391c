"""Observe: one VLLMService and what it owns, read from the watch caches into a `decide.Snapshot`.

The only API reads left in a pass are the ones no watch serves, and each only when it matters: an object
with a child's name that stoker does not label is read before anything is written (it is in the way, and
nothing is written while anything is), and the Events of a claim still Pending or of a seed Job without
pods (once they had time to get going).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping

from pydantic import ValidationError

from stoker.api import KIND, VLLMService
from stoker.controller.cache import ObjectCache, labels_match
from stoker.controller.conditions import now_rfc3339
from stoker.controller.decide import Snapshot, job_outcome
from stoker.controller.diagnose import worth_a_closer_look
from stoker.controller.kube import Kube, Manifest, ResourceMissing
from stoker.controller.ownership import runs_replicas
from stoker.controller.peers import peer_sources
from stoker.controller.warming import Candidate, Verdict, candidate, plan_warming, weights_claim
from stoker.render import (
    COMPONENT_LABEL,
    COMPONENT_SEED,
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    cache_pvc_name,
    node_warmer_name,
    render_children,
    seed_job_name,
    short_cache_key,
)
from stoker.render.group import LWS_API_VERSION, LWS_KIND, LWS_PLURAL
from stoker.render.nodewarmer import node_warmer_selector_labels
from stoker.render.peers import PEER_KINDS, peer_labels, peers_enabled
from stoker.render.snapshot import Snapshots

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# Set by the Job controller on an Indexed Job's pods (a multi-node seed's).
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


class Observer:
    def __init__(
        self,
        kube: Kube,
        cache: ObjectCache,
        field_manager: str,
        programs_image: str,
        warming_budget: int = 0,
        warming_reserve: int = 0,
        warming_quotas: Mapping[str, int] | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.field_manager = field_manager
        self.programs_image = programs_image
        self.warming_budget = warming_budget  # per node, bytes (coldStart.nodeWarming)
        self.warming_reserve = warming_reserve
        self.warming_quotas = dict(warming_quotas or {})  # namespace -> bytes per node
        self.snapshots = snapshots  # the admin turned snapshot and restore on

    def service(self, namespace: str, name: str) -> Manifest | None:
        return self.cache.get(KIND, namespace, name)

    def snapshot(
        self, body: Manifest, svc: VLLMService, control_token: str | None, signing_key: str | None
    ) -> Snapshot:
        namespace, name = str(svc.namespace), svc.name
        children: dict[tuple[str, str], Manifest | None] = {}
        warming = self._warming(svc) if svc.spec.cold_start.node_warming.enabled else None
        pods = self.cache.of_instance("Pod", namespace, name, lambda pod: runs_replicas(pod, svc))
        sources = peer_sources(svc, pods) if peers_enabled(svc) else []
        rendered = render_children(
            svc,
            control_token=control_token,
            programs_image=self.programs_image,
            warming=warming.warming if warming is not None else None,
            peer_sources=sources,
            snapshots=self.snapshots,
        )
        pool_crd_missing: str | None = None
        group_crd_missing: str | None = None
        for child in rendered:
            kind, child_name = child["kind"], child["metadata"]["name"]
            if kind == INFERENCE_POOL_KIND:
                try:
                    children[(kind, child_name)] = self._inference_pool(namespace, child_name)
                except ResourceMissing as missing:
                    pool_crd_missing = str(missing)
            elif kind == LWS_KIND:
                # Read with a GET, as the pools are: another project's CRD, which the cluster may lack.
                try:
                    children[(kind, child_name)] = self.kube.get_custom(
                        LWS_API_VERSION, LWS_PLURAL, namespace, child_name
                    )
                except ResourceMissing as missing:
                    group_crd_missing = str(missing)
            elif kind != "Secret":  # the operator never reads Secrets; it learns whose one is when writing
                children[(kind, child_name)] = self._child(child["apiVersion"], kind, namespace, child_name)
        seed_jobs = self.cache.of_instance(
            "Job", namespace, name, labels_match({COMPONENT_LABEL: COMPONENT_SEED})
        )
        seed_name = seed_job_name(name, short_cache_key(svc))
        if ("Job", seed_name) in children:  # the current seed Job, also when it is not labelled as ours
            unlabelled = children.pop(("Job", seed_name))
            if unlabelled is not None and all(j["metadata"]["name"] != seed_name for j in seed_jobs):
                seed_jobs.append(unlabelled)
        seed_job = next((j for j in seed_jobs if j["metadata"]["name"] == seed_name), None)
        seed_pods = (
            self.cache.of_instance("Pod", namespace, name, labels_match({JOB_NAME_LABEL: seed_name}))
            # A failed seed's pods say why it failed (their log tails).
            if seed_job is not None and job_outcome(seed_job) in ("running", "failed")
            else []
        )
        now = dt.datetime.now(dt.UTC)
        claim_events = {
            claim["metadata"]["uid"]: self.kube.events_about(
                namespace, f"involvedObject.uid={claim['metadata']['uid']}"
            )
            for (kind, _), claim in children.items()
            if kind == "PersistentVolumeClaim"
            and claim is not None
            and (claim.get("status") or {}).get("phase") == "Pending"
            and worth_a_closer_look(claim, now)
        }
        job_events: list[Manifest] = []
        if (
            seed_job is not None
            and job_outcome(seed_job) == "running"
            and not (seed_job.get("status") or {}).get("active")
            and worth_a_closer_look(seed_job, now)
        ):
            job_events = self.kube.events_about(
                namespace, f"involvedObject.uid={seed_job['metadata']['uid']}"
            )
        stale_pool = None
        kept_pool = (body.get("status") or {}).get("inferencePool")
        if svc.spec.inference_pool is None and isinstance(kept_pool, str) and kept_pool:
            with contextlib.suppress(ResourceMissing):  # the CRD went, and the pool with it
                stale_pool = self._inference_pool(namespace, kept_pool)
        warmer = self.cache.get("DaemonSet", namespace, node_warmer_name(name))
        warmer_pods = (
            self.cache.of_instance("Pod", namespace, name, labels_match(node_warmer_selector_labels(name)))
            if warmer is not None
            else []
        )
        return Snapshot(
            body=body,
            svc=svc,
            rendered=rendered,
            children=children,
            seed_jobs=seed_jobs,
            pods=pods,
            seed_pods=seed_pods,
            claim_events=claim_events,
            job_events=job_events,
            control_token=control_token,
            signing_key=signing_key,
            field_manager=self.field_manager,
            programs_image=self.programs_image,
            snapshots=self.snapshots,
            now=now_rfc3339(),
            inference_pool_crd_missing=pool_crd_missing,
            group_crd_missing=group_crd_missing,
            stale_inference_pool=stale_pool,
            warming=warming,
            node_warmer=warmer,
            warmer_pods=warmer_pods,
            peer_sources=sources,
            peer_objects=[
                obj
                for kind in PEER_KINDS
                for obj in self.cache.of_instance(kind, namespace, name, labels_match(peer_labels(name)))
            ],
        )

    def _warming(self, svc: VLLMService) -> Verdict:
        """This service's share of the per-node budget, planned with every warming service the cache holds
        (this one as observed now)."""
        key = (str(svc.namespace), svc.name)
        candidates = [self._candidate(svc)]
        for body in self.cache.warming_services():
            meta = body["metadata"]
            if (meta.get("namespace"), meta.get("name")) == key:
                continue
            try:
                candidates.append(self._candidate(VLLMService.model_validate(body)))
            except (ValidationError, ValueError):
                continue  # an invalid spec runs nothing, so it warms nothing
        verdicts = plan_warming(
            candidates, self.cache.nodes(), self.warming_budget, self.warming_reserve, self.warming_quotas
        )
        return verdicts[key]

    def _candidate(self, svc: VLLMService) -> Candidate:
        return candidate(svc, self.cache.claim_capacity(str(svc.namespace), weights_claim(svc)))

    def _inference_pool(self, namespace: str, name: str) -> Manifest | None:
        """An InferencePool, read with a GET: its CRD may be missing, and kopf would watch a missing
        resource in vain, so the pools are not watched (only services that set spec.inferencePool read
        theirs, once per pass). Raises ResourceMissing without the CRD."""
        return self.kube.get_custom(INFERENCE_POOL_API_VERSION, INFERENCE_POOL_PLURAL, namespace, name)

    def compile_cache_claim(self, svc: VLLMService) -> Manifest | None:
        """The service's compile-cache claim as the watch cache holds it (stoker labels its claims), if
        the spec keeps one."""
        if not svc.spec.cold_start.compile_cache.enabled:
            return None
        return self.cache.get("PersistentVolumeClaim", str(svc.namespace), cache_pvc_name(svc.name))

    def _child(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        """The child from the watch cache; an unlabelled object of its name is read, as it is in the way."""
        cached = self.cache.get(kind, namespace, name)
        if cached is not None or not self.cache.taken(kind, namespace, name):
            return cached
        return self.kube.get(api_version, kind, namespace, name)
