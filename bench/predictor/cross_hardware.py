"""Predict starts on hardware left out of the fit (issue 26): fit on one host's starts, predict another
host's from the two hosts' facts (stoker.inpod.host), never from the other host's starts.

usage: python -m bench.predictor.cross_hardware [--out FILE] [--raw FILE]

Each host (HOSTS) is a RUNS_DIR of bench/predictor/coldstart_runs.py (its logs are the GPU runs' own), or a
shape sweep's own output (bench/gpu/coldstart.py --shapes: runs.jsonl, logs/, models.json, host.json),
and its host facts. An optional host (the H200 shape sweep) joins the experiments once its runs.jsonl is
there. The recorded runs predate the seed's host measurement, so a fact a run did not measure is
derived from its starts, and the JSON says which and how (`hosts[].how`):
- CPU speed (`cpuSeconds`, the seed's workload): the anchor host's measured figure times the ratio of the
  hosts' median seconds of one CPU phase in the same regime (stock starts, compile-cache miss), over the
  shapes both ran (all shapes for a phase whose model has no feature of the shape). Dynamo is pure CPU on
  one thread (bytecode tracing; it reads nothing), so that phase is calibrated by construction and every
  other phase is a prediction; hosts without a shape in common compare model inspection;
- disk bandwidth: the largest checkpoint's bytes over its stock starts' weight loading (safetensors after
  the page cache was dropped: one reader bound by the disk), where no `dd`-like figure was measured.

An experiment fits on every start of its fitted hosts (their facts become the set's host) and predicts every
start of its held-out hosts, with and without the host facts (`unscaledTotal`: what a stand-in set says).
Its `summary` judges the starts of regimes and shapes the fitted hosts ran; `allStarts` all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.predictor.coldstart_runs import predictor_records
from bench.predictor.validate import Run, load_runs, runs_of, summary, write_json

from stoker.predict import PHASE_MODELS, fit, predict, regime_of
from stoker.predict.model import CoefficientSet, HostFacts

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
RUNS = RESULTS / "predictor-cross-hardware-runs"
OUT = RESULTS / "predictor-cross-hardware.json"
RAW = RESULTS / "predictor-cross-hardware.txt"
COEFFICIENTS = REPO / "src" / "stoker" / "predict" / "coefficients"
DISK_PHASE = "weightLoad"
# As the probe: a smaller checkpoint loads in too little time to tell a disk's bandwidth.
DISK_MIN_BYTES = 32 << 20
# What a shape sweep's own output (bench/gpu/coldstart.py --shapes) holds of each shape.
SWEEP_PROFILES = ("stock", "stoker-seed", "stoker")


@dataclass(frozen=True)
class Host:
    name: str
    hardware: str
    runs_dir: Path
    # What was measured on the host itself; the rest is derived from its starts (`derive_facts`).
    measured: dict[str, Any]
    how: dict[str, str] = field(default_factory=dict)
    # Where the CPU was not measured: the host whose measured cpuSeconds it is scaled from, and by which
    # pure-CPU phase of both hosts' stock starts.
    anchor: str | None = None
    calibration_phase: str = "dynamo"
    # A host whose runs may not be there yet (a sweep still running): left out of every experiment until
    # they are.
    optional: bool = False


@dataclass(frozen=True)
class Experiment:
    fitted: tuple[str, ...]
    held_out: tuple[str, ...]


def stock(run: Run) -> bool:
    settings = run.observation.settings
    return settings.cache_state == "miss" and not settings.read_ahead and settings.loader == "auto"


def stock_medians(runs: Sequence[Run], phase: str) -> dict[str, float]:
    """The median seconds of `phase` over each shape's stock starts; one figure for all shapes where the
    phase's model has no feature of the shape (its work does not depend on it)."""
    shape_free = not PHASE_MODELS[phase].features
    seconds: dict[str, list[float]] = {}
    for run in runs:
        if stock(run) and phase in run.observation.phases:
            seconds.setdefault("" if shape_free else run.shape, []).append(run.observation.phases[phase])
    return {shape: statistics.median(values) for shape, values in seconds.items()}


def calibration_ratio(here: Sequence[Run], there: Sequence[Run], phase: str) -> float | None:
    """How many times as long `phase` takes here as there: the median over the shapes both hosts ran of the
    ratio of their stock medians (None where they ran none in common)."""
    mine, theirs = stock_medians(here, phase), stock_medians(there, phase)
    ratios = [mine[shape] / theirs[shape] for shape in mine.keys() & theirs.keys() if theirs[shape]]
    return statistics.median(ratios) if ratios else None


def disk_estimate(runs: Sequence[Run]) -> tuple[int, float] | None:
    """(checkpoint bytes, median stock weight-loading seconds) of the largest checkpoint the host's stock
    starts loaded: the fixed part of loading counts least there."""
    largest = max(run.observation.facts.checkpoint_bytes for run in runs)
    load = stock_medians(
        [run for run in runs if run.observation.facts.checkpoint_bytes == largest], DISK_PHASE
    )
    if largest < DISK_MIN_BYTES or not load:
        return None
    return largest, next(iter(load.values()))


def derive_facts(hosts: Sequence[Host], runs: dict[str, list[Run]]) -> dict[str, HostFacts]:
    """Each host's facts: what it measured, the CPU from its anchor's by the ratio of their calibration
    phase, the disk from its stock weight loading. `how` of each host is filled in."""
    by_name = hosts_by_name(hosts)
    derived = {}
    for host in hosts:
        facts = dict(host.measured)
        if "cpuSeconds" not in facts and host.anchor is not None:
            anchor_cpu = by_name[host.anchor].measured["cpuSeconds"]
            phase = host.calibration_phase
            ratio = calibration_ratio(runs[host.name], runs[host.anchor], phase)
            if ratio is not None:
                facts["cpuSeconds"] = round(anchor_cpu * ratio, 4)
                host.how["cpuSeconds"] = (
                    f"estimated: {host.anchor}'s measured {anchor_cpu} s x {ratio:.3f}, the ratio of the"
                    f" hosts' median stock {phase} seconds (a CPU phase, so calibrated by construction)"
                )
        estimate = disk_estimate(runs[host.name])
        if "diskBytesPerSecond" not in facts and estimate is not None:
            checkpoint, load = estimate
            facts["diskBytesPerSecond"] = round(checkpoint / load)
            host.how["diskBytesPerSecond"] = (
                f"estimated: {checkpoint} checkpoint bytes / median stock {DISK_PHASE} {load:.2f} s"
                " (safetensors, page cache dropped)"
            )
        derived[host.name] = HostFacts.model_validate(facts)
    return derived


def pooled(hosts: Sequence[HostFacts]) -> HostFacts:
    """The host a set fitted on these hosts' starts holds for: the mean of their CPU and disk figures (a
    figure none of them has stays absent)."""

    def mean(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return statistics.fmean(known) if known else None

    cpu = mean([host.cpu_seconds for host in hosts])
    disk = mean([host.disk_bytes_per_second for host in hosts])
    return HostFacts(
        cpu_seconds=round(cpu, 4) if cpu is not None else None,
        disk_bytes_per_second=round(disk) if disk is not None else None,
    )


def hosts_by_name(hosts: Sequence[Host]) -> dict[str, Host]:
    return {host.name: host for host in hosts}


def on_host(run: Run, host: HostFacts | None) -> Run:
    facts = run.observation.facts.model_copy(update={"host": host})
    return dataclasses.replace(run, observation=run.observation.model_copy(update={"facts": facts}))


def experiment(
    plan: Experiment, hosts: Sequence[Host], runs: dict[str, list[Run]], facts: dict[str, HostFacts]
) -> dict[str, Any]:
    by_name = hosts_by_name(hosts)
    fitted = [on_host(run, facts[name]) for name in plan.fitted for run in runs[name]]
    reference = pooled([facts[name] for name in plan.fitted])
    coefficients = fit(
        [run.observation for run in fitted],
        hardware=by_name[plan.fitted[0]].hardware,
        source="shipped",
        fitted_on=[f"{name}: {len(runs[name])} starts" for name in plan.fitted],
        host=reference,
    )
    rows = []
    for name in plan.held_out:
        for run in runs[name]:
            placed = on_host(run, facts[name])
            prediction = predict(placed.observation.facts, placed.observation.settings, coefficients)
            unscaled = predict(run.observation.facts, run.observation.settings, coefficients)
            measured = run.observation.phases
            names = [*measured, *(phase for phase in prediction.phases if phase not in measured)]
            rows.append(
                {
                    "host": name,
                    "shape": run.shape,
                    "profile": run.profile,
                    "rep": run.rep,
                    "measuredTotal": run.total_seconds,
                    "predictedTotal": prediction.total_seconds,
                    "unscaledTotal": unscaled.total_seconds,
                    "fallbacks": prediction.fallbacks,
                    "phases": {
                        phase: {
                            "measured": measured.get(phase, 0.0),
                            "predicted": prediction.phases.get(phase, 0.0),
                            "regime": regime_of(phase, run.observation.settings),
                        }
                        for phase in names
                    },
                }
            )
    # A start with a phase whose regime the fitted hosts never ran (a lever set or loader they did not
    # run, e.g. the collector on during the imports) is predicted from a stand-in regime: listed, but
    # judged apart, since no host fact tells what a lever does.
    # A start of a shape the fitted hosts never ran tells how shapes extrapolate (bench/predictor/validate.py
    # judges that), not hardware: listed, judged apart too.
    fitted_shapes = {run.shape for run in fitted}
    judged = [row for row in rows if not row["fallbacks"] and row["shape"] in fitted_shapes]
    return {
        "fittedOn": list(plan.fitted),
        "heldOutHardware": list(plan.held_out),
        "referenceHost": reference.to_json_dict(),
        "heldOut": rows,
        "shapes": sorted({row["shape"] for row in judged}),
        "summary": summary(judged),
        "unscaledSummary": summary([{**row, "predictedTotal": row["unscaledTotal"]} for row in judged])[
            "total"
        ],
        "allStarts": summary(rows)["total"] | {"starts": len(rows)},
    }


def table(document: dict[str, Any]) -> str:
    lines = []
    for result in document["experiments"]:
        lines.append(
            f"fit on {', '.join(result['fittedOn'])}; predict {', '.join(result['heldOutHardware'])}"
        )
        lines.append(f"  {'start':<44} {'measured':>9} {'predicted':>9} {'error %':>8} {'unscaled':>9}")
        for row in result["heldOut"]:
            name = f"{row['host']}/{row['shape']}/{row['profile']}/r{row['rep']}"
            error = 100 * (row["predictedTotal"] - row["measuredTotal"]) / row["measuredTotal"]
            stand_in = f"  stand-in regime: {', '.join(row['fallbacks'])}" if row["fallbacks"] else ""
            stand_in += "" if row["shape"] in result["shapes"] or row["fallbacks"] else "  shape not fitted"
            lines.append(
                f"  {name:<44} {row['measuredTotal']:>9.2f} {row['predictedTotal']:>9.2f} {error:>+8.1f}"
                f" {row['unscaledTotal']:>9.2f}{stand_in}"
            )
        total, unscaled, everything = (
            result["summary"]["total"],
            result["unscaledSummary"],
            result["allStarts"],
        )
        lines.append(
            f"  total: MAE {total['maePercent']} %, max {total['maxErrorPercent']} % over"
            f" {result['summary']['starts']} starts of {len(result['shapes'])} shapes"
            f" (without host facts: MAE {unscaled['maePercent']} %, max {unscaled['maxErrorPercent']} %)"
        )
        if everything["starts"] > result["summary"]["starts"]:
            lines.append(
                f"  all starts, those of regimes or shapes the fitted hosts never ran too:"
                f" MAE {everything['maePercent']} %,"
                f" max {everything['maxErrorPercent']} % over {everything['starts']} starts"
            )
        for phase, figures in result["summary"]["phases"].items():
            lines.append(
                f"    {phase:<13} MAE {figures['maeSeconds']:>6.2f} s"
                f"  max {figures['maxErrorSeconds']:>6.2f} s"
            )
    return "\n".join(lines)


def host_runs(host: Host) -> list[Run]:
    """A RUNS_DIR's starts, or a shape sweep's own output (runs.jsonl with each start's argv, models.json,
    host.json) read as coldstart_runs.py reads it."""
    if not (host.runs_dir / "models.json").exists():
        return load_runs(host.runs_dir)
    version = json.loads((host.runs_dir / "host.json").read_text())["vllm"]
    return runs_of(predictor_records(host.runs_dir, version, SWEEP_PROFILES), host.runs_dir)


def run_all(hosts: Sequence[Host], plans: Sequence[Experiment]) -> dict[str, Any]:
    hosts = [host for host in hosts if not host.optional or (host.runs_dir / "runs.jsonl").exists()]
    runs = {host.name: host_runs(host) for host in hosts}
    facts = derive_facts(hosts, runs)
    plans = [
        Experiment(
            tuple(name for name in plan.fitted if name in runs),
            tuple(name for name in plan.held_out if name in runs),
        )
        for plan in plans
    ]
    return {
        "hosts": [
            {
                "name": host.name,
                "hardware": host.hardware,
                "runs": os.path.relpath(host.runs_dir, REPO),
                "starts": len(runs[host.name]),
                "facts": facts[host.name].to_json_dict(),
                "how": host.how,
            }
            for host in hosts
        ],
        "experiments": [experiment(plan, hosts, runs, facts) for plan in plans],
    }


H100 = "NVIDIA-H100-80GB-HBM3_x1_v0.26"
H200 = "NVIDIA-H200_x1_v0.26"
CPU = "cpu_x0_v0.26"
H100_GPU = {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpuMemoryBytes": 81559 << 20, "gpuCount": 1}
# The seed's probe (stoker.inpod.host.measure_host, run as the seed runs it) on a machine of the
# lead's H200 run's kind (an nvidia-h200 lease: 16 Xeon cores, the models on /dev/vda) right after that run,
# the median of 5 runs (cpuSeconds 0.0499-0.1048, disk 1.65-2.05 GB/s; `dd` read the same file at 1.9 GB/s):
# bench/results/predictor-cross-hardware-h200-probe.txt. The run's own host was given back before it.
H200_GPU = {"gpuProduct": "NVIDIA-H200", "gpuMemoryBytes": 150754820096, "gpuCount": 1}
H200_PROBE = {"cpuSeconds": 0.0517, "diskBytesPerSecond": 1918506656, **H200_GPU}
# The probe in the sweep's process just before each of its 10 starts (starts.jsonl `cpuSeconds`), median
# (0.0686-0.1294) of a 2-core machine of the same kind as the earlier sweeps', 2026-11-27. The figure the
# earlier sweeps had (0.1877, 2026-11-26, best of 24 probes while other work shared the machine) is not
# used: on this kind of virtual machine the probe reads 0.07 or 0.13 s by spells with nothing else running,
# so those sweeps' CPU is calibrated on their starts instead.
CPU_20261127 = {"cpuSeconds": 0.0705}
HOSTS = (
    Host(
        "h200",
        H200,
        RUNS / "h200",
        H200_PROBE,
        {
            "cpuSeconds": "measured: the seed's probe on a machine of the run's kind, after it, median of 5",
            "diskBytesPerSecond": "measured: as cpuSeconds (the run's stock weight loading: 16.06 GB, 8.9 s)",
            "gpu": "the probe's nvidia-smi; bench/results/coldstart-h200-run1-logs/host.json says the same",
        },
    ),
    Host(
        "h200-shapes",
        H200,
        RUNS / "h200-shapes",
        H200_GPU,
        {"gpu": "host.json of the sweep (nvidia-smi)"},
        anchor="h200",
        # The h200 host ran one shape, none of the sweep's: calibrated on a phase whose work is the same
        # for every shape (vLLM's architecture inspection).
        calibration_phase="modelInfo",
        optional=True,
    ),
    Host(
        "h100-run4",
        H100,
        RUNS / "h100-run4",
        H100_GPU,
        {"gpu": "host.json of bench/results/coldstart-h100-logs (nvidia-smi)"},
        anchor="h200",
    ),
    Host(
        "h100-run5",
        H100,
        RUNS / "h100-run5",
        H100_GPU,
        {"gpu": "host.json of bench/results/coldstart-h100-run5-logs (nvidia-smi)"},
        anchor="h200",
    ),
    Host(
        "h100-shapes",
        H100,
        RESULTS / "predictor-h100-runs",
        H100_GPU,
        {"gpu": "host.json of bench/results/predictor-h100-logs (nvidia-smi)"},
        anchor="h200",
        calibration_phase="modelInfo",
    ),
    Host(
        "cpu-20261127",
        CPU,
        RESULTS / "predictor-cpu-logs-20261127",
        CPU_20261127,
        {"cpuSeconds": "measured: the probe before each start of the sweep, median of 10"},
    ),
    Host(
        "cpu-quiet",
        CPU,
        RESULTS / "predictor-cpu-logs",
        {},
        anchor="cpu-20261127",
        # No Dynamo phase of its own on CPU; model inspection runs after the imports, from a warm page cache.
        calibration_phase="modelInfo",
    ),
    Host(
        "cpu-contended",
        CPU,
        RESULTS / "predictor-cpu-logs-contended",
        {},
        anchor="cpu-20261127",
        calibration_phase="modelInfo",
    ),
)
# The hosts of the shipped H100 set's starts whose facts are known: the read-ahead regimes of today's default
# were fitted on their starts (bench/results/predictor-h100-gc*-runs).
SHIPPED_HOSTS = ("h100-run4", "h100-run5")
H100_HOSTS = ("h100-run4", "h100-run5", "h100-shapes")
H200_HOSTS = ("h200", "h200-shapes")
EXPERIMENTS = (
    Experiment(H100_HOSTS, H200_HOSTS),
    Experiment(H200_HOSTS, H100_HOSTS),
    Experiment(("h100-run4",), ("h100-run5",)),
    Experiment(("h100-run5",), ("h100-run4",)),
    Experiment(("cpu-quiet",), ("cpu-20261127",)),
    Experiment(("cpu-20261127",), ("cpu-quiet",)),
    Experiment(("cpu-quiet",), ("cpu-contended",)),
    Experiment(("cpu-contended",), ("cpu-quiet",)),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.predictor.cross_hardware", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--raw", type=Path, default=RAW, help="the printed table, kept as raw output")
    parser.add_argument(
        "--ship",
        action="store_true",
        help=f"write the host of the shipped {H100} set: {', '.join(SHIPPED_HOSTS)} pooled",
    )
    arguments = parser.parse_args(argv)
    document = run_all(HOSTS, EXPERIMENTS)
    if arguments.ship:
        facts = {host["name"]: HostFacts.model_validate(host["facts"]) for host in document["hosts"]}
        path = COEFFICIENTS / f"{H100}.json"
        shipped = CoefficientSet.model_validate_json(path.read_text())
        write_json(
            path,
            shipped.model_copy(
                update={"host": pooled([facts[name] for name in SHIPPED_HOSTS])}
            ).to_json_dict(),
        )
    write_json(arguments.out, document)
    printed = table(document)
    arguments.raw.write_text(printed + "\n")
    print(printed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
