"""Deterministic child names and the labels stoker puts on them (label and annotation keys are defined in
stoker.api.owned and re-exported here for the renderers and the controller)."""

from __future__ import annotations

from typing import Any

from stoker.api import VLLMService
from stoker.api.owned import ASLEEP_ANNOTATION as ASLEEP_ANNOTATION
from stoker.api.owned import CACHE_KEY_ANNOTATION as CACHE_KEY_ANNOTATION
from stoker.api.owned import (
    CACHE_KEY_LABEL,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
)
from stoker.api.owned import DELETION_COST_ANNOTATION as DELETION_COST_ANNOTATION
from stoker.api.owned import STANDBY_SINCE_ANNOTATION as STANDBY_SINCE_ANNOTATION

Json = dict[str, Any]

# On every compile-cache PVC stoker creates: the VLLMService (same namespace) it caches for. A retained
# claim without owner references is taken back only by a VLLMService of that name; see ownership.py.
RETAINED_CACHE_ANNOTATION = "stoker.dev/compile-cache-of"
# On a compile-cache PVC: the uid of the VLLMService it belongs to, and the operator's HMAC over the claim's
# namespace, uid and that owner's uid. A retained claim goes back only to that very VLLMService, or to one
# whose author asked for it with `reuseRetained` and may `use` the claim (checked at admission).
CACHE_OWNER_ANNOTATION = "stoker.dev/compile-cache-owner"
CACHE_OWNER_SIGNATURE_ANNOTATION = "stoker.dev/compile-cache-owner-signature"
# The full compile-cache key a seed filled the volume for: a later VLLMService taking a retained claim
# back skips the seed when its key is the same.
SEEDED_KEY_ANNOTATION = "stoker.dev/seeded-key"
# When that seed succeeded (RFC 3339): status.cache.seededAt is derived from it, never read back.
SEEDED_AT_ANNOTATION = "stoker.dev/seeded-at"
# Beside it, the model facts that seed printed: a VLLMService that reuses the claim without a seed run
# still has them for its startup prediction.
MODEL_FACTS_ANNOTATION = "stoker.dev/model-facts"
# The operator's HMAC over the claim's namespace, uid, owner, seeded key, time and facts: a tenant can copy
# the annotations above onto a claim of their own, but not sign them for its uid; a claim that changed
# owner proves no seed.
SEEDED_SIGNATURE_ANNOTATION = "stoker.dev/seeded-signature"
# The operator's HMAC over a claim's namespace, name and uid, added right after stoker created it: an
# owner reference proves nothing on a claim, as anyone who may create claims can write one (see
# controller/ownership.py).
CLAIM_SIGNATURE_ANNOTATION = "stoker.dev/claim-signature"
# When the operator sent a claim's create (unix seconds); signed with it, until the uid signature replaces it.
CLAIM_CREATED_AT_ANNOTATION = "stoker.dev/claim-created-at"
# On a seed Job: the uid of the cache claim it fills. A claim re-created since is not filled by it.
SEED_CLAIM_UID_ANNOTATION = "stoker.dev/seed-claim-uid"

ROLE_ACTIVE = "active"
ROLE_STANDBY = "standby"
STANDBY_DELETION_COST = "-100"
# With coldStart.standby.sharedGpu: the scheduling gate every serving pod is created with. The operator lifts
# it one pod at a time per shared GPU, when the engine's gpuMemoryUtilization share of it is free: an
# engine starting beside awake ones takes its share at start (the memory profile and KV cache).
GPU_SHARE_GATE = "stoker.dev/gpu-share"
# The pod's name for the shared ResourceClaim (spec.resourceClaims[].name, the container's resources.claims).
GPU_SHARE_CLAIM = "gpu"
CONTROL_TOKEN_KEY = "token"

COMPONENT_SERVER = "server"
COMPONENT_SEED = "seed"
# The pods of a multi-node group other than its leader (render.group): they serve no API.
COMPONENT_WORKER = "worker"
COMPONENT_CACHE = "cache"
COMPONENT_NODE_WARMER = "node-warmer"


def cache_pvc_name(name: str) -> str:
    return f"{name}-cache"


def model_pvc_name(name: str) -> str:
    return f"{name}-model"


def seed_job_name(name: str, short_key: str) -> str:
    return f"{name}-seed-{short_key}"


def seed_group_service_name(name: str) -> str:
    return f"{name}-seed"


def control_secret_name(name: str) -> str:
    return f"{name}-control"


def node_warmer_name(name: str) -> str:
    return f"{name}-node-warmer"


def peer_service_name(name: str, rank: int | str) -> str:
    """coldStart.peerWeights: the Service of a tensor-parallel rank (`{rank}` in ModelExpress's pattern)."""
    return f"{name}-peers-r{rank}"


def peer_policy_name(name: str) -> str:
    return f"{name}-peers"


def serving_policy_name(name: str) -> str:
    return f"{name}-serving"


def deployment_name(name: str) -> str:
    return name


def service_name(name: str) -> str:
    return name


def common_labels(name: str, component: str | None = None, short_key: str | None = None) -> dict[str, str]:
    labels = {
        NAME_LABEL: "vllm",
        INSTANCE_LABEL: name,
        MANAGED_BY_LABEL: "stoker",
    }
    if component:
        labels[COMPONENT_LABEL] = component
    if short_key:
        labels[CACHE_KEY_LABEL] = short_key
    return labels


def server_selector_labels(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name, COMPONENT_LABEL: COMPONENT_SERVER}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def server_selector(name: str) -> str:
    """Every serving pod, active or standby: what the Deployment owns."""
    return label_selector(server_selector_labels(name))


def serving_selector_labels(svc: VLLMService) -> dict[str, str]:
    """The pods behind the Service: with standby replicas, only the active ones."""
    labels = server_selector_labels(svc.name)
    if svc.spec.cold_start.standby is not None:
        labels[ROLE_LABEL] = ROLE_ACTIVE
    return labels


def serving_selector(svc: VLLMService) -> str:
    """status.selector (the scale subresource's labelSelectorPath): an HPA measures serving pods only."""
    return label_selector(serving_selector_labels(svc))


def object_meta(
    svc: VLLMService, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> Json:
    """Metadata of a child: same namespace as the VLLMService; the controller adds owner references."""
    metadata: Json = {"name": name, "labels": labels}
    if svc.namespace:
        metadata["namespace"] = svc.namespace
    if annotations:
        metadata["annotations"] = dict(annotations)
    return metadata
