"""The seed Job: one run of the serving command that fills the compile cache, then exits."""

from __future__ import annotations

import dataclasses

from stoker.api import VLLMService
from stoker.inpod import seed as seed_program
from stoker.render.cachekey import SHORT_KEY_LENGTH, cache_key
from stoker.render.engine import EngineInvocation, engine_invocation, loads_mega_aot_artifact, reads_ahead
from stoker.render.group import JOB_INDEX_ENV, multi_node, rank_args, with_rank_args
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    COMPONENT_SEED,
    Json,
    common_labels,
    object_meta,
    seed_group_service_name,
    seed_job_name,
)
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE, pod_metadata, pod_spec
from stoker.render.prefetch import BYTECODE_DIRECTORY, import_pages_listing

SEED_BACKOFF_LIMIT = 1
SEED_ACTIVE_DEADLINE_SECONDS = 2 * 3600


def seed_invocation(svc: VLLMService) -> EngineInvocation:
    """The seed's engine invocation wrapped in stoker.inpod.seed; image, env and mounts are untouched.

    The wrapper empties the cache volume, runs the server, waits for /health (vLLM writes its compile
    artifacts before it answers), prints the model's facts line, sends one completion, stops the server and
    exits 0; it exits non-zero if the server dies first. The completion JIT-compiles the Triton kernels of
    the first request into TRITON_CACHE_DIR on the volume: measured on an H100 (bench/results/
    seed-warmup-h100.json), serving pods' first completion then took 0.12 s instead of 1.26 s, at 1.1 s of
    the seed's time.

    It also records the import pages: it evicts the image's Python files (everything under sys.path) from
    the page cache, and once the server starts its engine process (its imports are done) records which
    pages of them and of the files the server mapped are in the page cache, on the cache volume; serving
    pods' read-ahead reads them first (render.prefetch). Measured on H100 hosts (bench/results/
    coldstart-h100-v0.26.0-pages*.json): 1.7 GB recorded, the serving pods' imports 2.3-3.7 s shorter (means
    of three runs). Pages that other processes on the node keep mapped stay cached and are listed too; the
    others of the image's files are read from the disk by whatever on the node next needs them.

    Where the engine loads the mega AOT artifact, the seed starts the server a second time: a start that
    loads the artifact JIT-compiles Triton kernels the compiling start compiled under other cache keys
    (measured on an H200 with vLLM 0.26.0: 22 kernels, 10.7 s of every serving start;
    docs/benchmarks/h200.md). A multi-node seed starts once: the group's first serving start compiles those
    kernels into the shared volume.

    Where serving pods read ahead, the seed pins TRITON_PTXAS_PATH as their read-ahead does
    (stoker.inpod.pin_ptxas): Triton keys a kernel by the ptxas that compiled it, and which one a process
    used depended on what ran first in it.
    """
    engine = engine_invocation(svc, "seed")
    # A multi-node seed (render.group): every index but the leader's runs its rank headless, and only the
    # leader empties the volume and seeds.
    flags = svc.spec.runtime.engine_profile.flags
    worker = ["--group-worker", JOB_INDEX_ENV, f"--worker-arg={flags.headless}"] if multi_node(svc) else []
    # Not for a group: its headless ranks do not notice the leader's first server stop, so the leader's second
    # start waited for ranks that never came (two real pods, vLLM 0.26.0 CPU, 2026-11-28).
    again = ["--start-again"] if loads_mega_aot_artifact(svc) and not multi_node(svc) else []
    # As the serving pods' read-ahead does: where serving pods run vLLM bare, neither pins nor keeps bytecode.
    pin = ["--pin-ptxas", "--bytecode", BYTECODE_DIRECTORY] if reads_ahead(svc) else []
    # Emptied first: the volume may hold what another key's or another owner's pods wrote (controller/
    # ownership.py), which vLLM would load as this key's compile cache.
    empty = ["--empty", engine.cache_mount_path]
    recorded = ["--pages", import_pages_listing(svc), *empty, *again, *pin, *worker, "--"]
    return dataclasses.replace(
        engine, command=["python3", "-m", seed_program.__name__], args=[*recorded, *engine.argv]
    )


def build_seed_job(svc: VLLMService, *, programs_image: str = DEFAULT_PROGRAMS_IMAGE) -> Json:
    key = cache_key(svc)
    short_key = key[:SHORT_KEY_LENGTH]
    labels = common_labels(svc.name, COMPONENT_SEED, short_key)
    annotations = {CACHE_KEY_ANNOTATION: key}
    name = seed_job_name(svc.name, short_key)
    spec = pod_spec(svc, "seed", seed_invocation(svc), programs_image)
    job: Json = {
        "backoffLimit": SEED_BACKOFF_LIMIT,
        "activeDeadlineSeconds": SEED_ACTIVE_DEADLINE_SECONDS,
        "template": {"metadata": pod_metadata(svc, labels, annotations), "spec": spec},
    }
    if multi_node(svc):
        # The group's topology: one pod per node of a replica, index i its node rank, all at once; the
        # seed has succeeded when its leader has (the Job then stops the other ranks). Each rank compiles
        # into its own rank_<rank>_<dp rank> directory of the shared volume, as the serving ranks read.
        nodes = svc.spec.runtime.nodes_per_replica
        leader = f"{name}-0.{seed_group_service_name(svc.name)}"
        with_rank_args(spec, rank_args(svc, f"$({JOB_INDEX_ENV})", leader, leader=True))
        spec["subdomain"] = seed_group_service_name(svc.name)
        job |= {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "successPolicy": {"rules": [{"succeededIndexes": "0"}]},
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(svc, name, labels, annotations),
        "spec": job,
    }
