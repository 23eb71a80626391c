"""The GPU benchmark driver: stock `vllm serve` against stoker's rendered seed and serving runs, in one of
four modes that share one harness (harness.py) and one launcher (launch.sh).

Profiles (default). Per repetition, in this order: `stock` (plain `vllm serve`, empty caches), `stoker-seed`
(the seed Job's invocation, run until it stops itself; with --seed-once, in the first repetition only; a
profile whose spec changes the cache key gets its own seed, `stoker-seed-<profile>`), then
each serving profile (`stoker` and the --required ones first, then the levers in profiles.VARIANTS) on a
fresh copy of the cache the seed left.
Ready time is the first 200 from /health, counted from process start; then one
completion (latency) and one streamed 256-token completion (decode tokens/s), so no profile buys startup
with serving speed unnoticed. Logs: OUT/logs/r<rep>-<profile>.log.

Sweep (--shapes, the predictor's validation, bench/predictor/shapes.py): the manifest serves each shape's
synthetic checkpoint (make_model.py --shapes, under /models/<shape>) in turn. Pass 1 runs stock, stoker-seed
and stoker for every shape (held-out shapes before the last fitted one); pass 2 runs stock and stoker
again, held-out shapes first, so that a lease that ends early still leaves every shape measured once.
Each shape keeps its own seeded cache. Logs: OUT/logs/<shape>-r<rep>-<profile>.log; OUT/models.json holds
each checkpoint's model facts (stoker.predict.read_model_facts), config and file sizes.

Seed warm-up (--seed-warmup, seedwarmup.py), standby (--standby, standby.py), the shared standby pool
(--pool, standby_pool.py) and snapshot and restore (--snapshot, snapshot_restore.py): see those modules.

Before every start the page cache is dropped and the container-local JIT caches are wiped, as for a new pod
on a new node. Every mode writes OUT/runs.jsonl (one line per start) and OUT/host.json; bench/gpu/report.py,
seedwarmup_report.py and bench/predictor/coldstart_runs.py turn them into results.

usage: coldstart.py MANIFEST OUT [--repetitions 3] [--profiles stoker,stoker-spawn] [--required NAME,...]
                          [--seed-once] [--stop-after 1300]
       coldstart.py MANIFEST OUT --shapes NAME,NAME,... [--no-decode] [--stop-after 1300]
       coldstart.py MANIFEST OUT --seed-warmup [--repetitions 3] [--stop-after 600]
       coldstart.py MANIFEST OUT --standby [--servers 3] [--wakes 2] [--asleep-seconds 3]
       coldstart.py MANIFEST OUT --pool SHAPE,SHAPE [--engines 2] [--wakes-in-pool 24] [--stop-after 500]
       coldstart.py MANIFEST OUT --snapshot [--snapshot-kind full|minimized] [--repetitions 3]
                          [--stop-after 1300]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import seedwarmup
import snapshot_restore
import standby
import standby_pool
from bench.predictor.shapes import SHAPES, Shape
from harness import (
    CONTAINER_LOCAL,
    HOME,
    PROGRAMS,
    SEED_SNAPSHOT,
    Budget,
    host_facts,
    prepare,
    start_and_measure,
    tree_bytes,
    warm_node,
)
from profiles import (
    DEFAULT_PROFILE,
    VARIANTS,
    Invocation,
    load_service,
    patched_service,
    seed_invocation,
    seed_key,
    serve_invocation,
    stock_invocation,
)

from stoker.api import VLLMService
from stoker.api.owned import CACHE_MOUNT_PATH, MODEL_SOURCE_MOUNT_PATH
from stoker.cli import copy_programs
from stoker.inpod.facts import read_model_facts
from stoker.render.prefetch import import_pages_listing

# The sweep keeps one seeded cache per shape (the model path is part of vLLM's compile-cache key).
SHAPE_SNAPSHOTS = HOME / "seeded-caches"
# The profiles mode keeps one per seed (a profile whose spec moves the cache key has a seed of its own).
SEED_SNAPSHOTS = HOME / "seeded-caches-by-seed"
SEED = "stoker-seed"
# A later device call may write this to change the remaining plan without restarting the driver.
PLAN_OVERRIDE = HOME / "bench-plan.json"
# Rough durations for the time budget, replaced by the longest one seen (plus a margin).
ESTIMATE_S = {"stock": 110.0, SEED: 130.0}
# Stock started on a node stoker warmed (harness.warm_node); stoker's say so in Variant.warm_node.
STOCK_WARM = "stock-warm"


def run(
    name: str,
    rep: int,
    inv: Invocation,
    out: Path,
    budget: Budget,
    role: str,
    reserve: list[str],
    shape: str | None = None,
    decode: bool = True,
    snapshot: Path = SEED_SNAPSHOT,
    warm: tuple[str, str] | None = None,
) -> dict[str, Any] | None:
    """One start of `inv` as profile `name` (a serving start on the cache `snapshot` holds); with `shape`,
    the sweep's start of that shape's checkpoint on its own seeded cache; with `warm` (checkpoint, listing),
    on a node that keeps both resident."""
    key = f"{shape}/{name}" if shape else name
    # It must end before the stop time and still leave room for the runs in `reserve`.
    like = SEED if name.startswith(SEED) else name
    if not budget.fits(budget.estimate(key, like=like) + sum(budget.estimate(later) for later in reserve)):
        skipped = {"shape": shape, "profile": name, "repetition": rep, "skipped": "time budget"}
        print(json.dumps(skipped), flush=True)
        return None
    if shape:
        snapshot = SHAPE_SNAPSHOTS / shape
    dropped = prepare(inv.cache_mount_path, restore_seed=role == "serve", snapshot=snapshot)
    warmed = warm_node(*warm) if warm else None
    log = Path("logs") / (f"{shape}-r{rep}-{name}.log" if shape else f"r{rep}-{name}.log")
    started_at = time.time()
    started = time.monotonic()
    result = start_and_measure(out / log, inv, measure=role != "seed", decode=decode)
    budget.record(name, time.monotonic() - started)
    budget.record(key, time.monotonic() - started)
    record = {"profile": name, "repetition": rep, "role": role, **result, "pageCacheDropped": dropped}
    if warmed is not None:
        record["warmedBytes"] = warmed
    if shape:
        record.update(shape=shape, log=str(log))
    record.update(argv=inv.argv, env=inv.env)
    if inv.cache_mount_path:
        record["cacheBytesAfter"] = tree_bytes(inv.cache_mount_path)
        record["cacheWritten"] = written_since(inv.cache_mount_path, started_at)
    # What the start wrote where a pod's writes are lost with it (prepare wipes these before each start).
    record["containerLocalWritten"] = {
        str(path): written_since(str(path), started_at) for path in CONTAINER_LOCAL if path.exists()
    }
    with (out / "runs.jsonl").open("a") as runs:
        runs.write(json.dumps(record) + "\n")
    summary = {key: record.get(key) for key in ("shape", "profile", "repetition", "readySeconds", "exitCode")}
    summary["first"] = result.get("firstCompletion", {}).get("seconds")
    summary["tps"] = result.get("decode", {}).get("tokensPerSecond")
    print(json.dumps(summary), flush=True)
    return record


def written_since(root: str, since: float, listed: int = 300) -> dict[str, Any]:
    """What a start wrote into its cache volume (a seeded cache should take nothing new): files and bytes
    per directory two levels down, and the Triton kernels compiled (their `.cubin` names)."""
    per_directory: dict[str, list[int]] = {}
    kernels: set[str] = set()
    for directory, _, files in os.walk(root):
        for file in files:
            path = os.path.join(directory, file)
            try:
                stat = os.lstat(path)
            except OSError:
                continue
            if stat.st_mtime < since:
                continue
            top = "/".join(Path(path).relative_to(root).parts[:2])
            counts = per_directory.setdefault(top, [0, 0])
            counts[0] += 1
            counts[1] += stat.st_size
            if file.endswith(".cubin"):
                kernels.add(file.removesuffix(".cubin"))
    return {
        "files": {top: {"files": n, "bytes": b} for top, (n, b) in sorted(per_directory.items())},
        "tritonKernels": sorted(kernels)[:listed],
        "tritonKernelCount": len(kernels),
    }


def shape_service(manifest: str, shape: Shape) -> VLLMService:
    """The manifest, serving the checkpoint of `shape` (written by make_model.py to /models/NAME)."""
    svc = load_service(manifest)
    assert svc.spec.model.source.pvc is not None, "the sweep's manifest takes its model from a PVC"
    svc.spec.model.source.pvc.path = f"/{shape.name}"
    return svc


def pool_service(manifest: str, shape: Shape) -> VLLMService:
    """The sweep's service of `shape`, named and served as the shape: one of the pool's models."""
    svc = shape_service(manifest, shape)
    svc.metadata["name"] = shape.name
    svc.spec.model.served_model_name = shape.name
    return svc


def model_record(model_dir: str) -> dict[str, Any]:
    """What the predictor needs of a checkpoint: the model facts the seed Job prints (the same function),
    and the config and file sizes they were read from."""
    files = {name: os.path.getsize(os.path.join(model_dir, name)) for name in sorted(os.listdir(model_dir))}
    config = json.loads(Path(model_dir, "config.json").read_text())
    return {"config": config, "files": files, "facts": read_model_facts(model_dir)}


def sweep_plan(shapes: list[Shape]) -> list[tuple[Shape, int, str]]:
    """(shape, repetition, profile), most useful first. Pass 1: every shape once (stock, seed, stoker), the
    held-out shapes before the last fitted one, so that a cut-off still leaves shapes to fit and to judge.
    Pass 2: stock and stoker again, held-out shapes first (pass 1's seed serves pass 2)."""
    fitted = [shape for shape in shapes if not shape.held_out]
    held_out = [shape for shape in shapes if shape.held_out]
    once = [*fitted[:-1], *held_out, *fitted[-1:]]
    first = [(shape, 1, name) for shape in once for name in ("stock", SEED, DEFAULT_PROFILE)]
    again = [*held_out, *fitted]
    return first + [(shape, 2, name) for shape in again for name in ("stock", DEFAULT_PROFILE)]


def sweep(manifest: str, shapes: list[Shape], out: Path, budget: Budget, decode: bool) -> None:
    models = {shape.name: model_record(f"{MODEL_SOURCE_MOUNT_PATH}/{shape.name}") for shape in shapes}
    (out / "models.json").write_text(json.dumps(models, indent=1))
    for shape, rep, name in sweep_plan(shapes):
        svc = shape_service(manifest, shape)
        if name == "stock":
            run(name, rep, stock_invocation(svc), out, budget, "stock", [], shape.name, decode)
        elif name == SEED:
            seeded = run(name, rep, seed_invocation(svc), out, budget, "seed", [], shape.name, decode)
            seed_cache = seed_invocation(svc).cache_mount_path
            if seeded and seeded["readySeconds"] is not None and seed_cache:
                shutil.rmtree(SHAPE_SNAPSHOTS / shape.name, ignore_errors=True)
                shutil.copytree(seed_cache, SHAPE_SNAPSHOTS / shape.name, symlinks=True)
        elif (SHAPE_SNAPSHOTS / shape.name).exists():
            run(name, rep, serve_invocation(svc, name), out, budget, "serve", [], shape.name, decode)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("out")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--shapes", help="the predictor's sweep over these bench/predictor/shapes.py shapes")
    mode.add_argument("--seed-warmup", action="store_true", help="seedwarmup.py's experiment")
    mode.add_argument("--standby", action="store_true", help="standby.py's sleep and wake cycles")
    mode.add_argument("--pool", help="standby_pool.py: engines of these shapes' checkpoints on one GPU")
    mode.add_argument("--snapshot", action="store_true", help="snapshot_restore.py: restores against starts")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--profiles", default="stoker,stoker-spawn,stoker-nocompile")
    parser.add_argument("--first-repetition", type=int, default=1, help="to go on after an interruption")
    parser.add_argument("--skip-stock", action="store_true", help="only stoker's runs (safety checks)")
    parser.add_argument(
        "--required", default="", help="profiles besides the default that every repetition runs before levers"
    )
    parser.add_argument("--seed-once", action="store_true", help="seed once, in the first repetition")
    parser.add_argument(
        "--stop-after", type=float, default=1300, help="seconds; no run starts that would end later"
    )
    parser.add_argument("--no-decode", action="store_true", help="one completion per start, no decode probe")
    parser.add_argument(
        "--snapshot-kind",
        choices=("full", "minimized"),
        default="full",
        help="snapshot: the whole replica, or asleep at level 2 (weights reloaded after a restore)",
    )
    parser.add_argument("--servers", type=int, default=3, help="standby: serving starts, each a new pod")
    parser.add_argument("--wakes", type=int, default=2, help="standby: sleep and wake cycles per start")
    parser.add_argument("--asleep-seconds", type=float, default=3.0, help="standby")
    parser.add_argument("--engines", type=int, default=2, help="pool: engines per model on the one GPU")
    parser.add_argument("--wakes-in-pool", type=int, default=24, help="pool: wakes, alternating models")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = f"{HOME}/site"
    copy_programs(PROGRAMS)
    host_facts(out)
    if args.shapes:
        shapes = [SHAPES[name] for name in args.shapes.split(",")]
        sweep(args.manifest, shapes, out, Budget(args.stop_after, ESTIMATE_S), decode=not args.no_decode)
    elif args.seed_warmup:
        seedwarmup.seed_warmup(load_service(args.manifest), out, args.repetitions, args.stop_after)
    elif args.standby:
        svc = load_service(args.manifest)
        standby.standby(svc, args.manifest, out, args.servers, args.wakes, args.asleep_seconds)
    elif args.snapshot:
        svc = load_service(args.manifest)
        snapshot_restore.snapshot_restore(
            svc, out, args.repetitions, args.stop_after, args.snapshot_kind, warm_node_of(svc, SEED_SNAPSHOT)
        )
    elif args.pool:
        services = [pool_service(args.manifest, SHAPES[name]) for name in args.pool.split(",")]
        budget = Budget(args.stop_after, ESTIMATE_S)
        standby_pool.pool(services, out, args.engines, args.wakes_in_pool, budget)
    else:
        profiles(args, out)
    print("done", flush=True)


def warm_node_of(svc: VLLMService, snapshot: Path) -> tuple[str, str]:
    """What a warmed node keeps resident for `svc`: its checkpoint, and the import-pages listing its seed
    wrote (the volume's copy in `snapshot`)."""
    assert svc.spec.model.source.pvc is not None, "the warmed node's checkpoint is on a PVC"
    listing = Path(import_pages_listing(svc)).relative_to(CACHE_MOUNT_PATH)
    return f"{MODEL_SOURCE_MOUNT_PATH}{svc.spec.model.source.pvc.path}", str(snapshot / listing)


def seeds_of(svc: VLLMService, names: list[str]) -> tuple[dict[str, Invocation], dict[str, str]]:
    """The seeds to run, by name, and each profile's seed: `stoker-seed` (the default's), which every profile
    with the default's cache key restores, and `stoker-seed-<profile>` for the first profile of each other
    key, which the later profiles of that key restore too."""
    seeds = {SEED: seed_invocation(svc)}
    seed_of_key = {seed_key(svc, DEFAULT_PROFILE): SEED}
    seed_of_profile = {}
    for name in names:
        if name in ("stock", STOCK_WARM):
            continue
        key = seed_key(svc, name)
        if key not in seed_of_key:
            seed_of_key[key] = f"{SEED}-{name}"
            seeds[seed_of_key[key]] = seed_invocation(svc, name)
        seed_of_profile[name] = seed_of_key[key]
    return seeds, seed_of_profile


def profiles(args: argparse.Namespace, out: Path) -> None:
    svc = load_service(args.manifest)
    names, repetitions = args.profiles.split(","), args.repetitions
    seeds, seed_of = seeds_of(svc, names)
    budget = Budget(args.stop_after, ESTIMATE_S)
    # The runs every repetition needs; a lever runs only if the later repetitions' required runs still fit.
    kept = [DEFAULT_PROFILE, *(name for name in args.required.split(",") if name and name != DEFAULT_PROFILE)]
    required = ([] if args.skip_stock else ["stock"]) + ([] if args.seed_once else [SEED]) + kept
    rep = args.first_repetition
    while rep <= repetitions:
        if PLAN_OVERRIDE.exists():
            plan = json.loads(PLAN_OVERRIDE.read_text())
            names, repetitions = plan.get("profiles", names), plan.get("repetitions", repetitions)
        if not args.skip_stock:
            run("stock", rep, stock_invocation(svc), out, budget, "stock", reserve=[])
        if rep == args.first_repetition or not args.seed_once:
            for seed_name, seed in seeds.items():
                seeded = run(seed_name, rep, seed, out, budget, "seed", reserve=[])
                if seeded and seeded["readySeconds"] is not None and seed.cache_mount_path:
                    shutil.rmtree(SEED_SNAPSHOTS / seed_name, ignore_errors=True)
                    shutil.copytree(seed.cache_mount_path, SEED_SNAPSHOTS / seed_name, symlinks=True)
        # Required profiles first, so that a lever cut short by the budget leaves them measured.
        for name in sorted(names, key=lambda name: name not in kept):
            snapshot = SEED_SNAPSHOTS / seed_of.get(name, SEED)
            if snapshot.exists():
                reserve = [] if name in kept else required * (repetitions - rep)
                warm_node = name == STOCK_WARM or (name in VARIANTS and VARIANTS[name].warm_node)
                profile_svc = svc if name == STOCK_WARM else patched_service(svc, name)
                warm = warm_node_of(profile_svc, snapshot) if warm_node else None
                if name == STOCK_WARM:
                    run(name, rep, stock_invocation(svc), out, budget, "stock", reserve, warm=warm)
                else:
                    inv = serve_invocation(svc, name)
                    run(name, rep, inv, out, budget, "serve", reserve, snapshot=snapshot, warm=warm)
        rep += 1


if __name__ == "__main__":
    main()
