"""The engine container's default memory request, from the spec and, once the seed read them, the model's
facts (status.startup.model, valid for the compile-cache key whose seed read them).

Without any memory request a pod with only a GPU limit is BestEffort (extended resources do not count
towards the QoS class): the scheduler reserves no host memory for it, and the kubelet evicts it first. The
default is a request only, no limit, so that the page cache can grow past it and be reclaimed; a user who
sets runtime.resources.memory gets that as request and limit instead (render.pods).

- The engine's host side: BASE_BYTES plus PER_GPU_BYTES for each GPU the pod gets.
- Serving pods that read the checkpoint ahead (render.prefetch): the checkpoint, which the read-ahead pulls
  into the page cache, charged to the pod's cgroup, before the loader asks for it; requesting it puts the
  pod where those pages can stay until the loader reads them.
- Serving pods of a service with standby replicas: the checkpoint, since any of them may be put to sleep,
  and level 1 backs every GPU's weights up in pinned host memory (measured on an H100:
  bench/results/standby-h100/logs/serve-standby-1.log, `14.98 GiB is backed up in CPU` for 14.96 GiB of
  weights). Counted once with the read-ahead's: the read-ahead's pages are clean and needed only while
  the weights load, so the kernel reclaims them for the backup when the pod sleeps.
- The seed loads dummy weights, reads no checkpoint ahead and never sleeps: the engine's host side only.

The model's size is known only from the seed's facts; without them (no seed yet, no seed at all, a bare
manifest in `stoker render`) the request is the engine's host side only.
"""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.render.cachekey import short_cache_key
from stoker.render.engine import Role, reads_ahead

GIB = 1 << 30
# The engine's host side, for one GPU 8 GiB. vLLM runs an API server process (Python, torch, transformers,
# FastAPI, the tokenizer and detokenizer: 1-2 GiB resident) and an engine-core process (torch, the model
# definition, the scheduler, and with a compile-cache miss Inductor's compile workers: 2-4 GiB), and the
# read-ahead's reader beside them while the checkpoint is read (at most 2 GiB of address space,
# stoker.inpod.read_ahead.READER_ADDRESS_SPACE, ~0.8 GiB used).
BASE_BYTES = 6 * GIB
# Per GPU: a worker process each (with more than one GPU; with one, the engine core is the worker) with
# its own torch and CUDA context on the host side, pinned staging buffers, and with tensor parallelism
# NCCL's and vLLM's shared-memory broadcast buffers (the /dev/shm emptyDir, memory the pod is charged for).
PER_GPU_BYTES = 2 * GIB


def checkpoint_bytes(svc: VLLMService) -> int | None:
    """The model's weight bytes as the seed of the current compile-cache key read them, else None (facts
    of another key may be another model)."""
    startup = svc.status.startup if svc.status is not None else None
    if startup is None or startup.model is None or startup.model_cache_key != short_cache_key(svc):
        return None
    return startup.model.checkpoint_bytes


def host_side_bytes(svc: VLLMService) -> int:
    return BASE_BYTES + PER_GPU_BYTES * svc.spec.runtime.gpus


def weights_in_host_memory(svc: VLLMService, role: Role) -> bool:
    """Whether the role's pods hold the checkpoint in host memory: the read-ahead's page cache, or a
    level-1 standby's backup of the weights."""
    if role != "serve":
        return False
    standby = svc.spec.cold_start.standby
    return reads_ahead(svc) or (standby is not None and standby.level == 1)


def default_memory_request_bytes(svc: VLLMService, role: Role) -> int:
    """The default memory request of the engine container of `role`'s pods, in bytes."""
    wanted = host_side_bytes(svc)
    weights = checkpoint_bytes(svc)
    if weights is not None and weights_in_host_memory(svc, role):
        wanted += weights
    return wanted


def gib_quantity(size: int) -> str:
    """`size` bytes rounded up to whole GiB, as a Kubernetes quantity."""
    return f"{-(-size // GIB)}Gi"


def default_memory_request(svc: VLLMService, role: Role) -> str:
    return gib_quantity(default_memory_request_bytes(svc, role))
