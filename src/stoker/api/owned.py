"""What stoker owns in the pods it renders: label and annotation keys, volume names and mount paths.

The API refuses pod settings (`spec.pod`) that would override any of them, and the renderers use these same
constants, so the two cannot disagree.
"""

from __future__ import annotations

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
CACHE_KEY_LABEL = "stoker.dev/cache-key"
# Standby replicas: the Service selects role=active; the operator moves pods between the roles.
ROLE_LABEL = "stoker.dev/role"
# A pod whose PID 1 is engine_init, for the node's snapshot agent (issue 40): "true".
SNAPSHOT_LABEL = "stoker.dev/snapshot"

CACHE_KEY_ANNOTATION = "stoker.dev/cache-key"
ASLEEP_ANNOTATION = "stoker.dev/asleep-at"
STANDBY_SINCE_ANNOTATION = "stoker.dev/standby-since"
# The ReplicaSet controller deletes pods of lower cost first: standby pods go before active ones.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"

# Every key under this prefix is stoker's, including ones a later version adds.
OWNED_KEY_PREFIX = "stoker.dev/"
OWNED_LABELS = (NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL, MANAGED_BY_LABEL)
OWNED_ANNOTATIONS = (DELETION_COST_ANNOTATION,)

CACHE_VOLUME = "cache"
MODEL_CACHE_VOLUME = "model-cache"
MODEL_SOURCE_VOLUME = "model"
SHM_VOLUME = "shm"
PROGRAMS_VOLUME = "stoker-programs"
OWNED_VOLUMES = (CACHE_VOLUME, MODEL_CACHE_VOLUME, MODEL_SOURCE_VOLUME, SHM_VOLUME, PROGRAMS_VOLUME)

CACHE_MOUNT_PATH = "/var/cache/vllm"
MODEL_CACHE_MOUNT_PATH = "/var/cache/huggingface"
MODEL_SOURCE_MOUNT_PATH = "/models"
SHM_MOUNT_PATH = "/dev/shm"
# The programs stoker runs in its pods (stoker.inpod, stoker.guard), on PYTHONPATH in every container.
PROGRAMS_MOUNT_PATH = "/opt/stoker/programs"
OWNED_MOUNT_PATHS = (
    CACHE_MOUNT_PATH,
    MODEL_CACHE_MOUNT_PATH,
    MODEL_SOURCE_MOUNT_PATH,
    SHM_MOUNT_PATH,
    PROGRAMS_MOUNT_PATH,
)


def owned_label(key: str) -> bool:
    return key in OWNED_LABELS or key.startswith(OWNED_KEY_PREFIX)


def owned_annotation(key: str) -> bool:
    return key in OWNED_ANNOTATIONS or key.startswith(OWNED_KEY_PREFIX)


def shadows_owned_path(path: str) -> bool:
    """`path` (absolute, no trailing slash) is one of stoker's mount paths, inside one, or above one."""
    return any(
        path == owned or path.startswith(owned + "/") or owned.startswith(path + "/")
        for owned in OWNED_MOUNT_PATHS
    )
