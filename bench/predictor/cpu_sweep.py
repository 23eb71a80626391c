"""`make predictor-cpu`: the CPU starts the predictor is fitted and judged on, with real vLLM CPU builds.

    python -m bench.predictor.cpu_sweep [--shapes NAME,...] [--runs-only] [--runs-dir DIR --record-only]

For every CPU shape (bench/predictor/shapes.py) it writes a tiny checkpoint of that shape
(bench/conformance/tiny_model.py) and starts vLLM on it as the conformance harness does (the same rendered
containers, swaps and recorder, bench/conformance/), in three profiles:

- `stock`: plain `vllm serve MODEL --port P --served-model-name NAME`, only user-level settings, twice;
- `stoker-seed`: the seed Job's rendered command on an empty cache volume, once;
- `stoker`: the rendered serving command on the cache volume that seed filled, twice.

Pass 1 starts every shape once in each profile, pass 2 repeats stock and stoker, so a cut-short sweep
still covers every shape. Before each start the HOME and TMPDIR a new pod would not have (vLLM's default
cache root, Inductor's default /tmp cache) are emptied, as is the cache volume before a seed, and the page
cache is dropped when the kernel allows it (recorded per start). Engines run at raised priority
(`nice -n -10`) because other work shares the cores; each start records the load average it began under.

RUNS_DIR (bench/results/predictor-cpu-logs/) gets one log per start and starts.jsonl (argv, env, load,
outcome per start, appended as each ends: a rerun skips starts already there), then runs.jsonl: each start
with the model's facts (stoker.predict.facts) and the engine settings of its argv with the cache state its
log shows (stoker.predict.settings), the format bench/predictor/validate.py reads. Last, validate fits on
the four fitted shapes and judges the two held out (bench/results/predictor-cpu.json), and fits the shipped
CPU coefficients on all six (src/stoker/predict/coefficients/cpu_x0_v<major.minor>.json). --runs-only
redoes these last steps from the starts already recorded. --runs-dir records into another directory and
--record-only stops after runs.jsonl: a sweep of another host (bench/predictor/cross_hardware.py) that
must not refit the shipped set. Each start's record holds the seed's CPU probe (`cpuSeconds`,
stoker.inpod.host), taken just before it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.conformance import tiny_model
from bench.conformance.matrix import START_TIMEOUT_SECONDS, ensure_venv, rendered_containers
from bench.conformance.process import RecordedProcess, free_port, wait_healthy
from bench.conformance.swaps import SERVE_SUBCOMMAND, LocalRun, container_argv, local_argv, local_env
from bench.conformance.versions import default_version, venv_path
from bench.predictor import validate
from bench.predictor.shapes import CPU_SHAPES, SHAPES, Shape

from stoker.inpod.facts import read_model_facts
from stoker.inpod.host import measure_host
from stoker.phases import parse_log
from stoker.predict import HardwareClass
from stoker.predict.settings import engine_settings, logged_settings
from stoker.render import PORT

REPO = Path(__file__).resolve().parents[2]
RUNS_DIR = REPO / "bench" / "results" / "predictor-cpu-logs"
RESULTS_JSON = REPO / "bench" / "results" / "predictor-cpu.json"
COEFFICIENTS_DIR = REPO / "src" / "stoker" / "predict" / "coefficients"
WORK_DIR = Path(os.environ.get("STOKER_PREDICTOR_WORK", "/tmp/stoker-predictor-cpu"))
STARTS_FILE = "starts.jsonl"
RUNS_FILE = "runs.jsonl"
SEED_PROFILE, SERVE_PROFILE, STOCK_PROFILE = "stoker-seed", "stoker", "stock"
# (profile, repetition) per pass: the seed once, before the serving starts that use its cache.
PASSES = (
    ((STOCK_PROFILE, 1), (SEED_PROFILE, 1), (SERVE_PROFILE, 1)),
    ((STOCK_PROFILE, 2), (SERVE_PROFILE, 2)),
)
ENGINE_PRIORITY = -10
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
SERVED_MODEL_NAME = "tiny"


@dataclass(frozen=True)
class Start:
    shape: Shape
    profile: str
    rep: int

    @property
    def log(self) -> str:
        """The log's path relative to RUNS_DIR."""
        return f"{self.shape.name}/{self.profile}-{self.rep}.log"


def plan(shapes: tuple[Shape, ...]) -> list[Start]:
    return [Start(shape, profile, rep) for run in PASSES for shape in shapes for profile, rep in run]


def profile_containers(version: str) -> dict[str, dict[str, Any]]:
    """The container each profile runs: stoker's seed Job and serving container for minimal.yaml, and the
    stock command a user writes without stoker."""
    rendered = rendered_containers(version)
    stock_args = ["MODEL", "--port", str(PORT), "--served-model-name", SERVED_MODEL_NAME]
    return {
        SEED_PROFILE: rendered["minimal/seed"],
        SERVE_PROFILE: rendered["minimal/serve"],
        STOCK_PROFILE: {"command": ["vllm", SERVE_SUBCOMMAND], "args": stock_args},
    }


def model_dir(shape: Shape, work_dir: Path = WORK_DIR) -> Path:
    return work_dir / "models" / shape.name


def write_models(version: str, shapes: tuple[Shape, ...]) -> None:
    for shape in shapes:
        if not (model_dir(shape) / "config.json").exists():
            python = str(venv_path(version) / "bin" / "python")
            subprocess.run([python, tiny_model.__file__, model_dir(shape), shape.name], check=True)


def empty(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def drop_page_cache() -> bool:
    """Drop the page cache so a start reads its model and libraries from disk, as on a new node; False where
    the kernel refuses (then the start runs on a warm page cache, and the record says so)."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


def run_start(
    start: Start, container: dict[str, Any], version: str, runs_dir: Path, work_dir: Path = WORK_DIR
) -> dict[str, Any]:
    """One start to readiness (a seed: to its own exit), with its model, caches, HOME and TMPDIR under
    `work_dir`; the record starts.jsonl keeps."""
    if start.profile == SEED_PROFILE:
        empty(work_dir / "cache" / start.shape.name)
    cache_dir = work_dir / "cache" / (STOCK_PROFILE if start.profile == STOCK_PROFILE else start.shape.name)
    if start.profile == STOCK_PROFILE:
        empty(cache_dir)
    run = LocalRun(
        venv_path(version),
        model_dir(start.shape, work_dir),
        cache_dir,
        empty(work_dir / "hf-home"),
        empty(work_dir / "home"),
        free_port(),
    )
    argv = local_argv(container_argv(container), run)
    env = {**local_env(container, run), "TMPDIR": str(empty(work_dir / "tmp"))}
    record: dict[str, Any] = {
        "shape": start.shape.name,
        "profile": start.profile,
        "rep": start.rep,
        "log": start.log,
        "argv": argv,
        "env": env,
        "pageCacheDropped": drop_page_cache(),
        "loadAverage": [round(load, 2) for load in os.getloadavg()],
        "cpuSeconds": measure_host(None)["cpuSeconds"],
        "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    process = RecordedProcess(["nice", "-n", str(ENGINE_PRIORITY), *argv], env, runs_dir / start.log)
    if start.profile == SEED_PROFILE:
        code = process.wait(START_TIMEOUT_SECONDS)
        record["ready"] = code == 0
        record["exitCode"] = process.stop() if code is None else code
    else:
        record["ready"] = wait_healthy(process, run.port, START_TIMEOUT_SECONDS)
        record["exitCode"] = process.stop()
    record["wallSeconds"] = round(time.monotonic() - process.started, 1)
    return record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sweep(version: str, shapes: tuple[Shape, ...], runs_dir: Path) -> None:
    ensure_venv(version)
    write_models(version, shapes)
    containers = profile_containers(version)
    starts_file = runs_dir / STARTS_FILE
    done = {record["log"] for record in read_jsonl(starts_file)}
    began = time.monotonic()
    for start in plan(shapes):
        if start.log in done:
            continue
        record = run_start(start, containers[start.profile], version, runs_dir)
        with starts_file.open("a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        print(
            f"{time.monotonic() - began:6.0f} s  {start.log}: ready={record['ready']} "
            f"in {record['wallSeconds']} s (load {record['loadAverage'][0]})",
            flush=True,
        )


def write_runs(runs_dir: Path, work_dir: Path, version: str) -> int:
    """runs.jsonl from starts.jsonl: each start with its model's facts and its argv's engine settings."""
    runs = []
    for record in read_jsonl(runs_dir / STARTS_FILE):
        timeline = parse_log((runs_dir / record["log"]).read_text().splitlines(keepends=True))
        engine_argv = record["argv"][record["argv"].index(SERVE_SUBCOMMAND) :]
        run_version = timeline.engine_version or version
        settings = logged_settings(
            engine_settings(engine_argv, record["env"], timeline.compile_cache, run_version),
            timeline.compile_cache,
            timeline.compile_cache_reason,
        )
        facts = read_model_facts(str(model_dir(SHAPES[record["shape"]], work_dir)))
        runs.append({**record, "facts": facts, "settings": settings.to_json_dict()})
    (runs_dir / RUNS_FILE).write_text("".join(json.dumps(run, sort_keys=True) + "\n" for run in runs))
    return len(runs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.predictor.cpu_sweep", description=__doc__)
    parser.add_argument("--shapes", help="comma-separated CPU shape names (default: all six)")
    parser.add_argument("--runs-only", action="store_true", help="only rewrite runs.jsonl")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR, help=f"default: {RUNS_DIR}")
    parser.add_argument(
        "--record-only", action="store_true", help="stop after runs.jsonl: no fit, no shipped coefficients"
    )
    args = parser.parse_args(argv)
    version = default_version()
    cpu_shapes = {shape.name: shape for shape in CPU_SHAPES}
    names = args.shapes.split(",") if args.shapes else list(cpu_shapes)
    unknown = [name for name in names if name not in cpu_shapes]
    if unknown:
        parser.error(f"not a CPU shape: {' '.join(unknown)}; known: {' '.join(cpu_shapes)}")
    runs_dir = args.runs_dir.resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    if not args.runs_only:
        sweep(version, tuple(cpu_shapes[name] for name in names), runs_dir)
    print(f"{write_runs(runs_dir, WORK_DIR, version)} starts in {runs_dir / RUNS_FILE}")
    if args.record_only:
        return 0
    hardware = HardwareClass(gpu_product="cpu", gpu_count=0, engine_version=version).key
    return validate.main(
        [
            os.path.relpath(runs_dir, REPO),  # as the results record it
            f"--hardware={hardware}",
            f"--out={RESULTS_JSON.relative_to(REPO)}",
            f"--coefficients-out={(COEFFICIENTS_DIR / f'{hardware}.json').relative_to(REPO)}",
        ]
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
