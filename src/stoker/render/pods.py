"""The pod spec shared by the seed Job and the serving Deployment (one builder, so they cannot drift)."""

from __future__ import annotations

import copy

from stoker import __version__
from stoker.api import VLLMService
from stoker.api.owned import (
    CACHE_MOUNT_PATH,
    CACHE_VOLUME,
    MODEL_CACHE_MOUNT_PATH,
    MODEL_CACHE_VOLUME,
    MODEL_SOURCE_MOUNT_PATH,
    MODEL_SOURCE_VOLUME,
    PROGRAMS_MOUNT_PATH,
    PROGRAMS_VOLUME,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
)
from stoker.guard import CONTROL_TOKEN_ENV
from stoker.inpod import download
from stoker.inpod.seed import HEALTH_PATH
from stoker.render.engine import PORT, EngineInvocation, Role
from stoker.render.memory import default_memory_request
from stoker.render.names import (
    CONTROL_TOKEN_KEY,
    GPU_SHARE_CLAIM,
    GPU_SHARE_GATE,
    Json,
    cache_pvc_name,
    control_secret_name,
    model_pvc_name,
    server_selector_labels,
)
from stoker.render.peers import peer_container_ports, peer_env, peers_enabled

ENGINE_CONTAINER = "vllm"
DOWNLOAD_CONTAINER = "download-model"
PROGRAMS_CONTAINER = "stoker-programs"
# The image the programs are copied from: the operator's, so that operator and programs are one version
# (the chart passes the operator's own image, OperatorSettings.programs_image).
DEFAULT_PROGRAMS_IMAGE = f"ghcr.io/stoker-dev/stoker:{__version__}"
# The copy takes a tenth of a second and 12 MiB; the files take under 100 KiB.
PROGRAMS_RESOURCES: Json = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
PROGRAMS_VOLUME_SIZE = "16Mi"
GPU_RESOURCE = "nvidia.com/gpu"
# The user stoker's runtime image runs as (Dockerfile, target runtime); HOME=/home/vllm is theirs.
ENGINE_UID = 1000
ENGINE_GID = 1000
# Pod Security `restricted` wants these on every container (init containers too); runAsNonRoot and the
# seccomp profile are set once for the pod.
CONTAINER_SECURITY_CONTEXT: Json = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# The startup probe asks every second, so a pod is Ready about a second after its engine is (the kubelet
# runs the readiness probe at once when the startup probe succeeds, kubernetes PR #101738); a cold start
# compiles for minutes, so it allows failures for the longest start stoker allows, 30 min.
STARTUP_PROBE_PERIOD_SECONDS = 1
LONGEST_START_SECONDS = 30 * 60
STARTUP_PROBE_FAILURE_THRESHOLD = LONGEST_START_SECONDS // STARTUP_PROBE_PERIOD_SECONDS


def _hf_token_env(svc: VLLMService) -> list[Json]:
    hugging_face = svc.spec.model.source.hugging_face
    if hugging_face is None or hugging_face.token_secret_ref is None:
        return []
    ref = hugging_face.token_secret_ref
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def control_token_env(svc: VLLMService) -> Json:
    """The pod's control token (stoker.guard), from the service's control Secret (render.control)."""
    ref = {"name": control_secret_name(svc.name), "key": CONTROL_TOKEN_KEY}
    return {"name": CONTROL_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def _control_token_env(svc: VLLMService, role: Role) -> list[Json]:
    # Only the operator calls the guarded endpoints, and only on serving pods; the seed never needs it.
    if svc.spec.cold_start.standby is None or role == "seed":
        return []
    return [control_token_env(svc)]


def _secret_env(svc: VLLMService, role: Role) -> list[Json]:
    user_env = [
        {"name": var.name, "valueFrom": copy.deepcopy(var.value_from)}
        for var in svc.spec.runtime.env
        if var.value_from
    ]
    return _hf_token_env(svc) + _control_token_env(svc, role) + _peer_env(svc, role) + user_env


def _peer_env(svc: VLLMService, role: Role) -> list[Json]:
    # Serving pods only: the seed loads dummy weights. Not in the invocation's env, from which the compile-
    # cache key is computed, as the key is one of its values (MX_MODEL_REVISION).
    return peer_env(svc) if role == "serve" and peers_enabled(svc) else []


def _literal(text: str) -> str:
    """`text` as the process must see it: the kubelet expands `$(VAR)` in command, args and env values
    (Secret-sourced variables included), and `$$` is its escape for `$`."""
    return text.replace("$", "$$")


def _env(plain: dict[str, str], secret: list[Json]) -> list[Json]:
    return [{"name": name, "value": _literal(value)} for name, value in plain.items()] + secret


def _env_from(svc: VLLMService) -> list[Json]:
    s3 = svc.spec.model.source.s3
    if s3 is not None and s3.credentials_secret_ref is not None:
        return [{"secretRef": {"name": s3.credentials_secret_ref.name}}]
    return []


def _http_probe(period: int, failure_threshold: int, timeout: int = 5) -> Json:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failure_threshold,
        "timeoutSeconds": timeout,
    }


def shared_gpu_claim(svc: VLLMService, role: Role) -> str | None:
    """The ResourceClaim whose device the role's pods share (coldStart.standby.sharedGpu), else None.

    Serving pods only. The seed keeps a GPU of its own (nvidia.com/gpu): it runs before any engine of the
    service (gateRollout) and at the full runtime.gpuMemoryUtilization, which beside awake engines on the
    shared device would not fit; outside the shared GPU it neither waits for the operator to make room on
    it nor counts in what the operator wakes there, and it holds its GPU only for the compile."""
    standby = svc.spec.cold_start.standby
    if role != "serve" or standby is None or standby.shared_gpu is None:
        return None
    return standby.shared_gpu.resource_claim_name


def _resources(svc: VLLMService, role: Role) -> Json:
    """The user's CPU request; the user's memory as request and limit, else the default request for the
    role (render.memory: no limit, so that the page cache can grow and be reclaimed), so that no pod is
    BestEffort. The GPU: nvidia.com/gpu, or with a shared GPU the pod's claim of it (no extended
    resource: the device is the claim's, and nvidia.com/gpu would take a second, whole GPU)."""
    wanted = svc.spec.runtime.resources
    requests: Json = {"cpu": wanted.cpu} if wanted.cpu is not None else {}
    shared = shared_gpu_claim(svc, role) is not None
    limits: Json = {} if shared else {GPU_RESOURCE: str(svc.spec.runtime.gpus)}
    if wanted.memory is not None:
        requests["memory"] = limits["memory"] = wanted.memory
    else:
        requests["memory"] = default_memory_request(svc, role)
    resources: Json = {"requests": requests}
    if limits:
        resources["limits"] = limits
    if shared:
        resources["claims"] = [{"name": GPU_SHARE_CLAIM}]
    return resources


def _volumes_and_mounts(svc: VLLMService) -> tuple[list[Json], list[Json]]:
    cold_start = svc.spec.cold_start
    # Without a compile-cache volume the path still exists (emptyDir), so the invocation stays the same.
    cache_volume: Json = (
        {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache_pvc_name(svc.name)}}
        if cold_start.compile_cache.enabled
        else {"name": CACHE_VOLUME, "emptyDir": {}}
    )
    volumes = [cache_volume]
    mounts: list[Json] = [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT_PATH}]
    if cold_start.model_cache.enabled:
        volumes.append(
            {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": model_pvc_name(svc.name)}}
        )
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT_PATH})
    pvc = svc.spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": MODEL_SOURCE_VOLUME,
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": MODEL_SOURCE_VOLUME, "mountPath": MODEL_SOURCE_MOUNT_PATH, "readOnly": True})
    if svc.spec.runtime.effective_tensor_parallel_size > 1:
        # NCCL and vLLM's shared-memory broadcast need more than the runtime's 64 MiB /dev/shm.
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH})
    volumes.append({"name": PROGRAMS_VOLUME, "emptyDir": {"sizeLimit": PROGRAMS_VOLUME_SIZE}})
    mounts.append({"name": PROGRAMS_VOLUME, "mountPath": PROGRAMS_MOUNT_PATH, "readOnly": True})
    return volumes, mounts


def _programs_container(programs_image: str) -> Json:
    """Copies the programs (stoker.inpod, stoker.guard) from the operator's image onto the programs volume,
    so that every image runs the operator's own version of them."""
    return {
        "name": PROGRAMS_CONTAINER,
        "image": programs_image,
        "command": ["stoker", "programs", PROGRAMS_MOUNT_PATH],
        "resources": copy.deepcopy(PROGRAMS_RESOURCES),
        "volumeMounts": [{"name": PROGRAMS_VOLUME, "mountPath": PROGRAMS_MOUNT_PATH}],
        "securityContext": {**copy.deepcopy(CONTAINER_SECURITY_CONTEXT), "readOnlyRootFilesystem": True},
    }


def _with_programs_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with the programs volume first on PYTHONPATH, before the entries of runtime.env's PYTHONPATH.
    The image's own PYTHONPATH, if it sets one, is replaced: runtime.env can carry it."""
    user_path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{PROGRAMS_MOUNT_PATH}:{user_path}" if user_path else PROGRAMS_MOUNT_PATH}


def _download_container(svc: VLLMService, invocation: EngineInvocation, mounts: list[Json]) -> Json:
    """Fills HF_HOME on the model-cache volume; a no-op (a few hub requests) once the snapshot is there."""
    revision = [svc.spec.model.revision] if svc.spec.model.revision else []
    return {
        "name": DOWNLOAD_CONTAINER,
        "image": invocation.image,
        "command": [
            _literal(arg) for arg in ("python3", "-m", download.__name__, svc.spec.model.name, *revision)
        ],
        "env": _env(_with_programs_path({"HF_HOME": MODEL_CACHE_MOUNT_PATH}), _hf_token_env(svc)),
        "volumeMounts": [dict(m) for m in mounts if m["name"] in (MODEL_CACHE_VOLUME, PROGRAMS_VOLUME)],
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }


def engine_container(svc: VLLMService, role: Role, invocation: EngineInvocation, mounts: list[Json]) -> Json:
    container: Json = {
        "name": ENGINE_CONTAINER,
        "image": invocation.image,
        "command": [_literal(arg) for arg in invocation.command],
        "args": [_literal(arg) for arg in invocation.args],
        "env": _env(_with_programs_path(invocation.env), _secret_env(svc, role)),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": _resources(svc, role),
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    env_from = _env_from(svc)
    if env_from:
        container["envFrom"] = env_from
    if role == "seed":
        # A failed seed's last log lines land in its pod's status, where the operator reads why (Jobs are
        # created once per key, so this does not change a live object).
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if role == "serve" and peers_enabled(svc):
        container["ports"] += peer_container_ports(svc)
    if role == "serve":
        container["startupProbe"] = _http_probe(STARTUP_PROBE_PERIOD_SECONDS, STARTUP_PROBE_FAILURE_THRESHOLD)
        container["readinessProbe"] = _http_probe(5, 3)
        container["livenessProbe"] = _http_probe(15, 4, timeout=10)
    return container


def pod_spec(svc: VLLMService, role: Role, invocation: EngineInvocation, programs_image: str) -> Json:
    """The pod spec around `invocation` (the seed's wrapped one, or the plain one for serving pods), with
    the programs copied from `programs_image` first."""
    volumes, mounts = _volumes_and_mounts(svc)
    init_containers = [_programs_container(programs_image)]
    if svc.spec.cold_start.model_cache.enabled:
        init_containers.append(_download_container(svc, invocation, mounts))
    spec: Json = {
        "initContainers": init_containers,
        "containers": [engine_container(svc, role, invocation, mounts)],
        "volumes": volumes,
        # Service links inject `<SERVICE>_PORT`-style variables; a Service named `vllm` would set VLLM_PORT,
        # which vLLM reads, and any VLLM_* variable can split the compile-cache key between seed and pods.
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": ENGINE_UID,
            "runAsGroup": ENGINE_GID,
            # Lets the engine write the cache volumes; OnRootMismatch avoids a recursive chown per mount.
            "fsGroup": ENGINE_GID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if svc.spec.runtime.node_selector:
        spec["nodeSelector"] = dict(svc.spec.runtime.node_selector)
    if svc.spec.runtime.tolerations:
        spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in svc.spec.runtime.tolerations
        ]
    if role == "seed":
        spec["restartPolicy"] = "Never"
    claim = shared_gpu_claim(svc, role)
    if claim is not None:
        spec["resourceClaims"] = [{"name": GPU_SHARE_CLAIM, "resourceClaimName": claim}]
        # Created gated: the operator lifts the gate when the shared GPU has room for one more engine.
        spec["schedulingGates"] = [{"name": GPU_SHARE_GATE}]
    _apply_pod_settings(svc, role, spec)
    return spec


def pod_metadata(svc: VLLMService, labels: dict[str, str], annotations: dict[str, str]) -> Json:
    """Pod template metadata: the user's pod labels and annotations, then stoker's (the API refuses user
    keys stoker owns, so neither overrides the other)."""
    return {
        "labels": {**svc.spec.pod.labels, **labels},
        "annotations": {**svc.spec.pod.annotations, **annotations},
    }


def _topology_spread(svc: VLLMService) -> list[Json]:
    constraints = []
    for constraint in svc.spec.pod.topology_spread_constraints:
        rendered = constraint.model_dump(by_alias=True, exclude_none=True)
        # Without a selector a constraint counts no pods; the useful default is this service's replicas.
        rendered.setdefault("labelSelector", {"matchLabels": server_selector_labels(svc.name)})
        constraints.append(rendered)
    return constraints


def _apply_pod_settings(svc: VLLMService, role: Role, spec: Json) -> None:
    """spec.pod onto a rendered pod spec. The same for the seed and the serving pods, which must run where
    and as each other, except topology spread: it spreads serving replicas, and the seed is one pod."""
    pod = svc.spec.pod
    if pod.service_account_name:
        spec["serviceAccountName"] = pod.service_account_name
    else:
        # The namespace's default ServiceAccount is nobody's choice here: its token (and whatever an admin
        # bound to it) stays out of the author's image. A named one passed admission as the author's.
        spec["automountServiceAccountToken"] = False
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = [ref.model_dump(by_alias=True) for ref in pod.image_pull_secrets]
    if pod.affinity is not None:
        spec["affinity"] = pod.affinity.model_dump(by_alias=True, exclude_none=True)
    if pod.topology_spread_constraints and role == "serve":
        spec["topologySpreadConstraints"] = _topology_spread(svc)
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    if pod.runtime_class_name:
        spec["runtimeClassName"] = pod.runtime_class_name
    spec["volumes"].extend(volume.model_dump(by_alias=True) for volume in pod.volumes)
    engine = next(c for c in spec["containers"] if c["name"] == ENGINE_CONTAINER)
    engine["volumeMounts"].extend(
        mount.model_dump(by_alias=True, exclude_none=True) for mount in pod.volume_mounts
    )
