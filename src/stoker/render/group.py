"""A replica across nodes: a LeaderWorkerSet group (leaderworkerset.x-k8s.io/v1) running vLLM's own
multi-node processes, no Ray, and the seed Job that reproduces its topology.

Every pod of a group runs the same `vllm serve` (render.engine, with `--nnodes N` and the parallel sizes)
plus its rank's flags: `--node-rank`, `--master-addr` (the leader's address) and `--master-port`; the
leader serves the API, every other pod runs `--headless` (its workers join the leader's torch.distributed
group). The rank and the leader's address come from the environment through the kubelet's `$(VAR)`
expansion: LWS's pod webhook sets LWS_WORKER_INDEX and LWS_LEADER_ADDRESS on a group's pods, the Job
controller sets JOB_COMPLETION_INDEX on an Indexed Job's.

The group is ready when every pod is (LWS counts a group in readyReplicas only then; the leader's
/health answers only once every rank has joined), starts at once (startupPolicy LeaderCreated: the leader
waits for its workers, so LeaderReady would never start them) and restarts whole: with
RecreateGroupOnPodRestart, one pod failing or deleted makes LWS delete and recreate every pod of its group,
since vLLM's ranks cannot rejoin a running group.
"""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.cachekey import SHORT_KEY_LENGTH, cache_key
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    COMPONENT_LABEL,
    COMPONENT_SEED,
    COMPONENT_SERVER,
    COMPONENT_WORKER,
    INSTANCE_LABEL,
    Json,
    common_labels,
    deployment_name,
    object_meta,
    seed_group_service_name,
)
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE, ENGINE_CONTAINER, pod_metadata, pod_spec
from stoker.render.prefetch import serving_invocation

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
# Set by LWS's pod webhook on every pod of a group (sigs.k8s.io/lws api/leaderworkerset/v1).
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_TEMPLATE_HASH_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
# Set by the Job controller on an Indexed Job's pods.
JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"
# torch.distributed's rendezvous on the leader (KServe's and vLLM's examples use the same).
MASTER_PORT = 29500
RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"


def multi_node(svc: VLLMService) -> bool:
    return svc.spec.runtime.nodes_per_replica > 1


def rank_args(svc: VLLMService, node_rank: str, leader_address: str, *, leader: bool) -> list[str]:
    """The flags of one pod's rank, after the replica's own (render.engine); `$(VAR)` values are left for
    the kubelet to expand."""
    flags = svc.spec.runtime.engine_profile.flags
    args = [
        flags.node_rank,
        node_rank,
        flags.master_addr,
        leader_address,
        flags.master_port,
        str(MASTER_PORT),
    ]
    return args if leader else [*args, flags.headless]


def with_rank_args(spec: Json, args: list[str]) -> Json:
    """`spec` with `args` after its engine container's: raw, unlike the rest of the args (render.pods escapes
    `$` in what comes from the spec), so that the kubelet expands the variables they name."""
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    engine["args"] = [*engine["args"], *args]
    return spec


def _worker_spec(spec: Json) -> Json:
    """A headless rank answers no HTTP: no probes, no port. It is Ready once running; the group is ready
    when its leader is, which needs every rank."""
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    for field in ("startupProbe", "readinessProbe", "livenessProbe", "ports"):
        engine.pop(field, None)
    return spec


def build_leader_worker_set(
    svc: VLLMService, *, replicas: int | None = None, programs_image: str = DEFAULT_PROGRAMS_IMAGE
) -> Json:
    """The serving group of a multi-node replica, `replicas` groups (runtime.replicas by default). The
    leader pods are the serving pods (component server, behind the Service); the others are component
    worker."""
    key = cache_key(svc)
    short_key = key[:SHORT_KEY_LENGTH]
    annotations = {CACHE_KEY_ANNOTATION: key}
    labels = common_labels(svc.name, COMPONENT_SERVER, short_key)
    worker_labels = common_labels(svc.name, COMPONENT_WORKER, short_key)
    invocation = serving_invocation(svc)
    address, rank = f"$({LWS_LEADER_ADDRESS_ENV})", f"$({LWS_WORKER_INDEX_ENV})"
    leader = with_rank_args(
        pod_spec(svc, "serve", invocation, programs_image), rank_args(svc, "0", address, leader=True)
    )
    worker = _worker_spec(
        with_rank_args(
            pod_spec(svc, "serve", invocation, programs_image), rank_args(svc, rank, address, leader=False)
        )
    )
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": object_meta(svc, deployment_name(svc.name), labels, annotations),
        "spec": {
            "replicas": svc.spec.runtime.replicas if replicas is None else replicas,
            "startupPolicy": STARTUP_POLICY,
            # A headless Service per group, named after its leader pod: one named after the
            # LeaderWorkerSet (subdomainPolicy Shared) would be the VLLMService's own Service's name.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "leaderWorkerTemplate": {
                "size": svc.spec.runtime.nodes_per_replica,
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": {"metadata": pod_metadata(svc, labels, annotations), "spec": leader},
                "workerTemplate": {"metadata": pod_metadata(svc, worker_labels, annotations), "spec": worker},
            },
        },
    }


def build_seed_group_service(svc: VLLMService) -> Json:
    """The headless Service that gives a multi-node seed's pods their names in DNS
    (`<job>-<index>.<service>`), so that the seed's ranks find its leader, index 0."""
    labels = common_labels(svc.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(svc, seed_group_service_name(svc.name), labels),
        "spec": {
            "clusterIP": "None",
            # The ranks look the leader up before any of them is ready.
            "publishNotReadyAddresses": True,
            "selector": {INSTANCE_LABEL: svc.name, COMPONENT_LABEL: COMPONENT_SEED},
        },
    }
