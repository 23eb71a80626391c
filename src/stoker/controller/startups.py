"""The learning path: each start read from its pod's log into `status.startup`, and the fleet's startup
coefficients learned from it, on a work queue of its own.

Reading logs, pod events and nodes is slow and can fail; none of it runs in the VLLMService's reconcile, so
a slow log read delays only other log reads, never a child's write. The recorder writes `status.startup`
(a merge patch of what changed); the reconcile reads from it whether the seed's run is recorded and the last
start's compile cache. The model facts a seed printed reach the reconcile from this recorder's memory
(`seed_facts`), never from status, which a user with /status rights can write: the reconcile signs them on
the cache claim and rewrites status.startup.model from there on every pass.
The object, its pods, Jobs and Deployments come from the reconcile's watch cache (each status write goes
in at once); the API server is asked for logs, pod events and nodes.

A run comes from a serving pod turning Ready, a seed Job finishing or a Deployment changing (its old pods
gone: `last` may describe nothing that serves), and from the reconcile whenever what a prediction
depends on changed (`follow`: the object first seen, a new generation, a newly seeded cache key).
"""

from __future__ import annotations

import copy
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from stoker.api import KIND, VLLMService, user_message
from stoker.api.models import StartupStatus
from stoker.controller import metrics
from stoker.controller.act import api_error_message
from stoker.controller.cache import ObjectCache, labels_match
from stoker.controller.coefficients import CoefficientStore, RecordOutcome
from stoker.controller.conditions import now_rfc3339
from stoker.controller.kube import Kube, Manifest, ResourceMissing
from stoker.controller.objects import (
    facts_json,
    job_outcome,
    main_container_status,
    merge_patch,
    parse_time,
    pod_is_ready,
    still_running,
    template_hash,
)
from stoker.controller.observe import JOB_INDEX_ANNOTATION, JOB_NAME_LABEL
from stoker.controller.ownership import owned_by, runs_replicas
from stoker.controller.settings import OperatorSettings
from stoker.controller.workqueue import GONE, Gone, ObjectKey, WorkQueue
from stoker.inpod.facts import FACTS_LOG_PREFIX
from stoker.inpod.seed import first_start
from stoker.phases import (
    READY_GAP_PHASE,
    CompileCache,
    kubernetes_phases,
    parse_log,
    ready_gap_seconds,
    summarize,
)
from stoker.phases.timeline import snapshot_document, weights_document
from stoker.predict.facts import parse_facts_line, with_logged_weights
from stoker.predict.fleet import expected_status, on_node, slow_start
from stoker.predict.model import ModelFacts, Observation
from stoker.predict.predictor import predict
from stoker.predict.service import GPU_PRODUCT_LABEL, hardware_class, service_settings
from stoker.predict.settings import logged_settings, with_weights_source
from stoker.render import (
    CACHE_KEY_LABEL,
    COMPONENT_LABEL,
    COMPONENT_SERVER,
    Role,
    cache_key,
    deployment_name,
    seed_job_name,
    seed_wanted,
    short_cache_key,
)
from stoker.render.group import LWS_API_VERSION, LWS_PLURAL, multi_node
from stoker.snapshot.plan import NO_SNAPSHOT

log = logging.getLogger(__name__)

# An unreadable log is asked for again after 10 s, doubling to 1 min, LOG_READ_ATTEMPTS reads in all (about
# 3 minutes): a log that becomes readable is in status within a minute, and one that never does (no right to
# pods/log, nodes that serve none) costs no request after that. Its first and last failures are logged.
LOG_RETRY_SECONDS = 10.0
LOG_RETRY_MAX_SECONDS = 60.0
LOG_READ_ATTEMPTS = 6
LOG_RETRY_MEMORY = 4096  # failed log reads remembered at most; forgetting only means an earlier retry


def log_retry_in(failures: int) -> float | None:
    """Seconds until a log is read again after `failures` failed reads in a row; None: never again."""
    if failures >= LOG_READ_ATTEMPTS:
        return None
    return min(LOG_RETRY_SECONDS * 2 ** (failures - 1), LOG_RETRY_MAX_SECONDS)


def _serves(pod: Manifest, svc: VLLMService) -> bool:
    """A serving pod whose start is recorded: of the Deployment, or a group's leader (a multi-node
    replica's start is its leader's: the leader's engine answers only once every rank has loaded and
    compiled, so its start ends with the slowest rank's)."""
    labels = pod["metadata"].get("labels") or {}
    return runs_replicas(pod, svc) and labels.get(COMPONENT_LABEL) == COMPONENT_SERVER


@dataclass(frozen=True)
class ParsedStart:
    """One start parsed from its pod's log: its status record, its engine phases and, from a seed, the
    model facts it printed (checkpointBytes from its log where the model directory had no weights; see
    `with_logged_weights`); `label` names the start (pod and restarts) among the fleet's observations."""

    role: Role
    record: Manifest
    engine_phases: dict[str, float]
    total_seconds: float
    facts: ModelFacts | None
    # Device memory one engine worker's weights took, as its log said.
    worker_weight_bytes: int | None
    label: str


class StartupRecorder:
    """One worker: records of one object never race, and log reads never crowd out the reconcile's."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        cache: ObjectCache,
        recorded: Callable[[ObjectKey], None],
    ) -> None:
        """Pods, Jobs and Deployments come from the watch cache the reconcile reads too; `recorded(key)`
        is told after each write: the reconcile reads the compile cache of the last start and whether the
        seed's run is recorded from status.startup."""
        self.kube = kube
        self.settings = settings
        self.cache = cache
        self.recorded = recorded
        self.coefficients = CoefficientStore(
            kube,
            settings.operator_namespace,
            settings.coefficients_configmap,
            settings.coefficients_observations,
        )
        self.queue = WorkQueue(
            self.record,
            workers=1,
            retry_initial=settings.retry_initial_seconds,
            retry_max=settings.retry_max_seconds,
        )
        self._guard = threading.Lock()
        # (generation, seeded cache key) of each object as the reconcile last saw it.
        self._followed: dict[ObjectKey, tuple[int, str | None]] = {}
        # (pod uid, restarts) -> failed reads in a row, and when to read again (None: given up)
        self._log_retry: dict[tuple[str, int], tuple[int, float | None]] = {}
        # The model facts this process read from each object's seed log: (object uid, short cache key,
        # facts as JSON). The reconcile signs them onto the cache claim from here, never from status.
        self._seed_facts: dict[ObjectKey, tuple[str, str, str]] = {}

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    def seed_facts(self, key: ObjectKey, uid: str, short_key: str) -> str | None:
        """The model facts (JSON) this recorder read from the seed of this object (uid) and cache key."""
        with self._guard:
            found = self._seed_facts.get(key)
        return found[2] if found is not None and found[:2] == (uid, short_key) else None

    def follow(self, key: ObjectKey, generation: int, seeded_key: str | None) -> None:
        """The reconcile's view of an object: a prediction depends on its spec and on whether its cache
        is seeded, so the first sight of it and each change of either brings a run."""
        with self._guard:
            if self._followed.get(key) == (generation, seeded_key):
                return
            self._followed[key] = (generation, seeded_key)
        self.queue.add(key, resync=False)

    def record(self, key: ObjectKey, resync: bool) -> float | Gone | None:
        """Parse what started since the last run, learn from it, predict the next start and write
        `status.startup` if it changed; returns when to look again if a log could not be read."""
        namespace, name = key
        body = self.cache.get(KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            with self._guard:
                self._followed.pop(key, None)
                self._seed_facts.pop(key, None)
            metrics.forget_service(namespace, name)
            return GONE
        try:
            svc = VLLMService.model_validate(body)
        except ValidationError:
            return None  # the reconcile reports it; nothing starts from a spec the model refuses
        status = body.get("status") or {}
        before = status.get("startup") or {}
        uid = body["metadata"]["uid"]
        key_now, short_key = cache_key(svc), short_cache_key(svc)
        seeding = seed_wanted(svc)
        # Whether the cache is seeded for this key as the reconcile decided it (`follow`), not as status says:
        # a user with /status rights writes status.
        with self._guard:
            followed = self._followed.get(key)
        seeded = seeding and followed is not None and followed[1] == key_now
        seed_job = None
        if seeding and not (seeded and (before.get("seed") or {}).get("cacheKey") == short_key):
            job = self.cache.get("Job", namespace, seed_job_name(svc.name, short_key))
            if job is not None and owned_by(job, uid):  # a Job stoker did not create tells nothing
                seed_job = job
                # Before the reconcile writes it down: the prediction is for a seeded cache at once.
                seeded = seeded or job_outcome(job) == "succeeded"
        pods = self.cache.of_instance("Pod", namespace, name, lambda pod: _serves(pod, svc))
        startup, new_starts, unread = self._collect(body, pods, before, seed_job, svc)
        self._learn_and_expect(body, svc, startup, new_starts, seeding, seeded)
        if startup.get("last") and not still_running(startup["last"], pods):
            # Its ReplicaSet was replaced (an edit) or scaled away: history keeps its summary.
            del startup["last"]
        self._write(body, before, startup)
        if not unread:
            return None
        now = time.monotonic()
        retries = [self._log_retry.get(start, (0, now + LOG_RETRY_SECONDS))[1] for start in unread]
        due = [retry_at for retry_at in retries if retry_at is not None]
        return max(1.0, min(due) - now) if due else None

    def _collect(
        self,
        body: Manifest,
        pods: list[Manifest],
        previous: Manifest,
        seed_job: Manifest | None,
        svc: VLLMService,
    ) -> tuple[Manifest, list[ParsedStart], list[tuple[str, int]]]:
        """Parse each new Ready serving container, and the seed pod once its Job finished; returns the
        startup status, the starts parsed now and those whose log could not be read."""
        engine_version = svc.spec.runtime.resolved_engine_version
        startup = copy.deepcopy(previous)
        history: list[Manifest] = list(startup.get("history") or [])
        seen = {(sample["uid"], sample["restarts"]) for sample in history}
        namespace = body["metadata"]["namespace"]
        parsed: list[ParsedStart] = []
        unread: list[tuple[str, int]] = []  # the starts whose log could not be read
        new = [
            (pod, container)
            for pod in pods
            if (container := main_container_status(pod)) is not None
            and pod_is_ready(pod)
            and (pod["metadata"]["uid"], int(container.get("restartCount") or 0)) not in seen
        ]
        if new and not self._deployment_is_stokers(body, svc):
            new = []  # pods of a Deployment in the way; the reconcile reports the conflict
        for pod, container in new:
            start = self._startup_record(body, pod, container, "serve", engine_version)
            if start is None:
                unread.append((pod["metadata"]["uid"], int(container.get("restartCount") or 0)))
                continue
            parsed.append(start)
            record = start.record
            startup["last"] = record
            history.append(
                {
                    "uid": pod["metadata"]["uid"],
                    "restarts": int(container.get("restartCount") or 0),
                    "podTemplateHash": record["podTemplateHash"],
                    **_sample_summary(record),
                }
            )
        history = history[-self.settings.startup_history :]
        if history:
            totals = [sample["totalSeconds"] for sample in history]
            startup["history"] = history
            startup["recent"] = {
                "samples": len(totals),
                "p50TotalSeconds": round(statistics.median(totals), 2),
                "maxTotalSeconds": round(max(totals), 2),
            }
        if seed_job is not None and job_outcome(seed_job) in ("succeeded", "failed"):
            job_name = seed_job["metadata"]["name"]
            seed_pods = [
                pod
                for pod in self.cache.of_instance(
                    "Pod", namespace, svc.name, labels_match({JOB_NAME_LABEL: job_name})
                )
                # A multi-node seed's leader (index 0) seeds; the other indices only run their ranks.
                if (pod["metadata"].get("annotations") or {}).get(JOB_INDEX_ANNOTATION, "0") == "0"
            ]
            seed_pods.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
            if seed_pods and (startup.get("seed") or {}).get("pod") != seed_pods[-1]["metadata"]["name"]:
                container = main_container_status(seed_pods[-1])
                start = self._startup_record(body, seed_pods[-1], container or {}, "seed", engine_version)
                if start is None:
                    unread.append(
                        (seed_pods[-1]["metadata"]["uid"], int((container or {}).get("restartCount") or 0))
                    )
                else:
                    parsed.append(start)
                    startup["seed"] = start.record
        return startup, parsed, unread

    def _deployment_is_stokers(self, body: Manifest, svc: VLLMService) -> bool:
        namespace, name = str(svc.namespace), deployment_name(svc.name)
        if multi_node(svc):  # not watched (observe.py): read once per new Ready leader
            try:
                workload = self.kube.get_custom(LWS_API_VERSION, LWS_PLURAL, namespace, name)
            except ResourceMissing:
                return False
        else:
            workload = self.cache.get("Deployment", namespace, name)
        return workload is not None and owned_by(workload, body["metadata"]["uid"])

    def _startup_record(
        self, body: Manifest, pod: Manifest, container: Manifest, role: Role, engine_version: str
    ) -> ParsedStart | None:
        namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        attempt = (pod["metadata"]["uid"], int(container.get("restartCount") or 0))
        failures, retry_at = self._log_retry.get(attempt, (0, 0.0))
        if retry_at is None or time.monotonic() < retry_at:
            return None  # its log was unreadable moments ago, or every time; do not ask on every event
        state = container.get("state") or {}
        started_at = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        facts_lines: list[str] = []

        def noting_facts(lines: Iterable[str]) -> Iterator[str]:
            for line in lines:
                if FACTS_LOG_PREFIX in line:
                    facts_lines.append(line)
                yield line

        try:
            lines = self.kube.pod_log_lines(
                namespace, pod_name, pod["spec"]["containers"][0]["name"], self.settings.max_log_bytes
            )
            if role == "seed":
                lines = first_start(lines)
            # The spec's version until the log announces the one that really runs.
            timeline = parse_log(
                noting_facts(lines), process_start=parse_time(started_at), engine_version=engine_version
            )
            kube_phases = kubernetes_phases(pod, self.kube.pod_events(namespace, pod_name))
        except ApiException as error:
            retry_in = log_retry_in(failures + 1)
            if retry_in is None:
                log.warning(
                    "Gave up reading startup log pod=%s/%s failures=%d: start not recorded: %s",
                    namespace,
                    pod_name,
                    failures + 1,
                    api_error_message(error),
                )
            else:
                log.log(
                    logging.DEBUG if failures else logging.WARNING,
                    "Reading startup log failed pod=%s/%s retryIn=%.0fs: %s",
                    namespace,
                    pod_name,
                    retry_in,
                    api_error_message(error),
                )
            if len(self._log_retry) > LOG_RETRY_MEMORY:
                self._log_retry.clear()
            retry_at = None if retry_in is None else time.monotonic() + retry_in
            self._log_retry[attempt] = (failures + 1, retry_at)
            return None
        if failures:
            log.info("Read startup log pod=%s/%s after %d failed reads", namespace, pod_name, failures)
        self._log_retry.pop(attempt, None)
        # Kubernetes' phases come before the process starts; totalSeconds counts from process start.
        phases = {**kube_phases, **timeline.phases}
        ready_gap = ready_gap_seconds(pod, timeline.ready_at) if role == "serve" else None
        if ready_gap is not None:
            phases[READY_GAP_PHASE] = ready_gap
            metrics.STARTUP_READY_GAP_SECONDS.labels(namespace, body["metadata"]["name"]).observe(ready_gap)
        record: Manifest = {
            "pod": pod_name,
            "totalSeconds": round(timeline.total_seconds or 0.0, 2),
            "compileCache": timeline.compile_cache,
            "compileCacheReason": timeline.compile_cache_reason,
            "engineVersion": timeline.engine_version,
            "phases": {phase: round(seconds, 2) for phase, seconds in phases.items()},
            "cacheKey": pod["metadata"].get("labels", {}).get(CACHE_KEY_LABEL),
            "podTemplateHash": template_hash(pod),
            "finishedAt": now_rfc3339(),
            "gpuProduct": self._gpu_product(pod),
            **weights_document(timeline.weights),
            **snapshot_document(timeline.snapshot),
        }
        if timeline.failed:
            record.update(failed=True, reason=timeline.reason)
        if ready_gap is not None:
            record["readyGapSeconds"] = round(ready_gap, 2)
        for phase, seconds in phases.items():
            metrics.STARTUP_PHASE_SECONDS.labels(phase, role).observe(seconds)
        service = (namespace, body["metadata"]["name"])
        metrics.STARTUP_TOTAL_SECONDS.labels(*service, role).observe(record["totalSeconds"])
        metrics.COMPILE_CACHE_RESULTS.labels(*service, timeline.compile_cache, role).inc()
        metrics.observe_weights(service, timeline.weights)
        snapshot = timeline.snapshot
        restored = snapshot is not None and snapshot.outcome == "restored"
        self.kube.post_event(
            body,
            "Seeded" if role == "seed" else "Restored" if restored else "Started",
            f"{summarize(timeline)}; pod {pod_name}",
        )
        if snapshot is not None and not restored and snapshot.reason != NO_SNAPSHOT:
            # The node had a snapshot to restore, or the agent did not answer: the pod fell back.
            message = f"Pod {pod_name} started its engine itself: {snapshot.reason}"
            self.kube.post_event(body, "SnapshotNotRestored", message, warning=True)
        return ParsedStart(
            role=role,
            record=record,
            engine_phases=dict(timeline.phases),
            total_seconds=timeline.total_seconds or 0.0,
            facts=self._model_facts(body, pod_name, facts_lines),
            worker_weight_bytes=timeline.worker_weight_bytes,
            label=f"{namespace}/{pod_name}#{attempt[1]}",
        )

    def _model_facts(self, body: Manifest, pod_name: str, lines: list[str]) -> ModelFacts | None:
        """The facts the seed printed (its last facts line), or None; a garbled line is reported."""
        if not lines:
            return None
        try:
            return parse_facts_line(lines[-1])
        except ValueError as error:
            message = f"Pod {pod_name} printed unreadable model facts, so no startup prediction: {error}"
            self.kube.post_event(body, "ModelFactsUnreadable", message, warning=True)
            return None

    def _gpu_product(self, pod: Manifest) -> str | None:
        """The GPU product label of the pod's node, if the node says."""
        node = pod["spec"].get("nodeName")
        if not node:
            return None
        try:
            return self.kube.node_labels(node).get(GPU_PRODUCT_LABEL)
        except ApiException as error:  # no right to read nodes: the class is "unknown", nothing else fails
            log.warning("Reading node failed node=%s status=%s", node, error.status)
            return None

    def _learn_and_expect(
        self,
        body: Manifest,
        svc: VLLMService,
        startup: Manifest,
        new_starts: list[ParsedStart],
        seeding: bool,
        seeded: bool,
    ) -> None:
        """Keep the seed's model facts, add each new start to the fleet's observations (which refits its
        hardware class), warn about a serving start that overran its prediction, and predict the next one
        into startup["expected"]."""
        meta = body["metadata"]
        expected_before = startup.get("expected") or {}
        for start in new_starts:
            if start.role == "seed" and start.facts is not None:
                # The tensor-parallel size is in the cache key, so the seed ran with this spec's.
                seed_facts = with_logged_weights(
                    start.facts, start.worker_weight_bytes, svc.spec.runtime.effective_tensor_parallel_size
                )
                startup["model"] = seed_facts.model_dump(mode="json", by_alias=True)
                startup["modelCacheKey"] = start.record["cacheKey"]
                with self._guard:
                    self._seed_facts[(meta["namespace"], meta["name"])] = (
                        meta["uid"],
                        start.record["cacheKey"],
                        facts_json(startup["model"]),
                    )
        facts = _checked_facts(startup)
        # Facts hold for starts of the key whose seed read them: another key may be another model.
        current_facts = facts if startup.get("modelCacheKey") == short_cache_key(svc) else None
        for start in new_starts:
            record = start.record
            if record.get("snapshot") == "restored":
                continue  # no start to learn from: the engine was restored past its phases
            if start.role == "serve" and not record.get("failed"):
                metrics.set_startup_seconds(
                    metrics.STARTUP_OBSERVED_SECONDS,
                    (meta["namespace"], meta["name"]),
                    {**start.engine_phases, "total": record["totalSeconds"]},
                )
                if expected_before.get("phases"):
                    slow = slow_start(
                        start.engine_phases,
                        start.total_seconds,
                        expected_before["phases"],
                        expected_before["totalSeconds"],
                    )
                    if slow is not None:
                        self.kube.post_event(body, "SlowStart", slow.message(record["pod"]), warning=True)
            if facts is None or record.get("failed") or record["cacheKey"] != startup.get("modelCacheKey"):
                continue
            self._observe(body, svc, startup, start, facts)
        expected = self._expected(svc, startup, current_facts, seeding, seeded)
        if expected is None:
            startup.pop("expected", None)
        else:
            startup["expected"] = expected
        expected = expected or {}
        expected_seconds = dict(expected.get("phases") or {})
        if expected_seconds:
            expected_seconds["total"] = expected["totalSeconds"]
        metrics.set_startup_seconds(
            metrics.STARTUP_EXPECTED_SECONDS, (meta["namespace"], meta["name"]), expected_seconds
        )
        metrics.set_until_serving_seconds(
            (meta["namespace"], meta["name"]), expected.get("untilServingSeconds")
        )

    def _observe(
        self, body: Manifest, svc: VLLMService, startup: Manifest, start: ParsedStart, facts: ModelFacts
    ) -> None:
        """Add one start to the fleet's observations; a refused write is kept in status.startup.recording
        (a Warning Event when its message changes), and cleared by the next recorded start."""
        meta, record = body["metadata"], start.record
        hardware = on_node(hardware_class(svc), record.get("gpuProduct"))
        try:
            settings = with_weights_source(
                logged_settings(
                    service_settings(svc, record["compileCache"], start.role),
                    record["compileCache"],
                    record.get("compileCacheReason"),
                ),
                record.get("weightsSource"),
            )
            observation = Observation(
                facts=facts, settings=settings, phases=start.engine_phases, label=start.label
            )
            outcome = self.coefficients.record(meta["namespace"], hardware, observation)
        except ValueError as error:  # the start stays in status; only the fleet's fit misses it
            outcome = RecordOutcome(garbled=[], refused=f"Start of pod {record['pod']} not recorded: {error}")
        for key in outcome.garbled:
            self.kube.post_event(
                body,
                "StartupCoefficientsGarbled",
                f"ConfigMap {self.coefficients.namespace}/{self.coefficients.name} key {key} did not"
                " parse; replaced by what was observed from now on",
                warning=True,
            )
        if outcome.refused is None:
            startup.pop("recording", None)
            return
        if (startup.get("recording") or {}).get("refused") != outcome.refused:
            self.kube.post_event(body, "StartupNotRecorded", outcome.refused, warning=True)
            startup["recording"] = {"refused": outcome.refused[:1024], "at": now_rfc3339()}

    def _expected(
        self, svc: VLLMService, startup: Manifest, facts: ModelFacts | None, seeding: bool, seeded: bool
    ) -> Manifest | None:
        """The predicted next serving start, or why there is none (None while a seed may still tell)."""
        if facts is None:
            if not seeding:
                return {"reason": "no model facts: only the seed Job reads them, and it is off"}
            if seeded:
                return {"reason": "no model facts: no seed run of this cache key printed them"}
            return None  # the seed is still to tell
        seed, last = startup.get("seed") or {}, startup.get("last") or {}
        hardware = on_node(hardware_class(svc), seed.get("gpuProduct") or last.get("gpuProduct"))
        cache_state: CompileCache = "hit" if seeded else "miss"
        try:
            settings = service_settings(svc, cache_state)
            if svc.spec.cold_start.peer_weights.enabled:
                # While replicas serve, the next one takes its weights from them, as the last one did.
                settings = with_weights_source(settings, last.get("weightsSource"))
            coefficients = self.coefficients.coefficients(str(svc.namespace), hardware)
            if coefficients is None:
                return {"reason": f"no startup coefficients for hardware class {hardware.key}"}
            prediction = predict(facts, settings, coefficients)
        except ValueError as error:
            return {"reason": f"no prediction: {error}"}
        return expected_status(prediction, hardware, settings.cache_state, last.get("phases"))

    def _write(self, body: Manifest, before: Manifest, after: Manifest) -> None:
        """A merge patch of status.startup alone, through the status model, only if it changed."""
        written, wanted = _startup_document(before), _startup_document(after)
        if written == wanted:
            return
        meta = body["metadata"]
        try:
            patched = self.kube.patch_service_status(
                meta["namespace"], meta["name"], {"startup": merge_patch(written, wanted)}
            )
        except ApiException as error:
            if error.status not in (400, 422):
                raise
            # Refused for what it says: the reason alone, which the reconcile turns into StartupRecorded.
            refused = f"The API server refused status.startup: {api_error_message(error)}"[:1024]
            self.kube.post_event(body, "StartupNotRecorded", refused, warning=True)
            self.kube.patch_service_status(
                meta["namespace"],
                meta["name"],
                {"startup": {"recording": {"refused": refused, "at": now_rfc3339()}}},
            )
            raise
        # A start is recorded once: the next run reads this from the watch cache, before its watch event.
        self.cache.remember(patched)
        self.recorded((meta["namespace"], meta["name"]))


def _startup_document(startup: Manifest) -> Manifest:
    return StartupStatus.model_validate(startup).model_dump(mode="json", by_alias=True, exclude_none=True)


def _sample_summary(record: Manifest) -> Manifest:
    summary = {
        "pod": record["pod"],
        "totalSeconds": record["totalSeconds"],
        "compileCache": record["compileCache"],
    }
    if "readyGapSeconds" in record:
        summary["readyGapSeconds"] = record["readyGapSeconds"]
    return summary


def _checked_facts(startup: Manifest) -> ModelFacts | None:
    """The model facts in status if they are within their physical ranges; facts an earlier version let
    through (2^63-1 layers) are dropped from status instead of failing every run."""
    if not startup.get("model"):
        return None
    try:
        return ModelFacts.model_validate(startup["model"])
    except ValidationError as error:
        log.warning("Dropped model facts out of their ranges from status: %s", user_message(error))
        del startup["model"]
        startup.pop("modelCacheKey", None)
        return None
