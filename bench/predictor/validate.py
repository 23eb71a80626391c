"""Validate the startup predictor as the paper did: fit on some shapes, predict the held-out ones.

usage: python -m bench.predictor.validate RUNS_DIR --hardware KEY [--out FILE] [--coefficients-out FILE]
         [--note TEXT] [--other-host RUNS_DIR]...

RUNS_DIR/runs.jsonl holds one line per start: {"shape", "profile", "rep", "log" (relative to RUNS_DIR,
plain or .gz), "facts" (read_model_facts), "settings" (EngineSettings)}. Each log is parsed with
`stoker.phases.parse_log`, the parser the operator runs, and the compile-cache state is the one the log
shows. The measured total is the parser's: process start to `Starting vLLM server on`; the engine phases
add up to it (each ends where the next begins), so the predicted total, the sum of the predicted phases,
is compared with the same span. Kubernetes phases (scheduling, image pull) are not in a log and not here.

--out: fit on the shapes without `held_out` (bench/predictor/shapes.py), predict every start of the
held-out shapes, write {"fittedOn", "heldOut": [...], "logs", "summary", "coefficients"} and print a table.
--coefficients-out: fit on every start and write the shipped coefficient set, its observations included.
--note: added to `fittedOn` of both, for what a reader must know about the fit (e.g. one shape only).
--other-host: starts of the same hardware class on another host (hosts differ in speed: a slower disk and
CPU stretch every phase). They are fitted only in the regimes RUNS_DIR's starts never ran (e.g. a loader
the sweep did not have), so that the fits the sweep measured stay one host's; they are never held out.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.predictor.shapes import SHAPES

from stoker.phases import ENGINE_PHASES, parse_log
from stoker.predict import (
    PHASE_MODELS,
    EngineSettings,
    HardwareClass,
    ModelFacts,
    Observation,
    fit,
    logged_settings,
    predict,
    regime_of,
)

TOTAL = "total"


@dataclass(frozen=True)
class Run:
    shape: str
    profile: str
    rep: int
    observation: Observation
    total_seconds: float

    @property
    def held_out(self) -> bool:
        shape = SHAPES.get(self.shape)
        return shape is not None and shape.held_out


def log_lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as log:
        yield from log


def load_runs(runs_dir: Path) -> list[Run]:
    """Every start of RUNS_DIR that reached `Starting vLLM server on`; others are reported and left out."""
    lines = (runs_dir / "runs.jsonl").read_text().splitlines()
    return runs_of([json.loads(line) for line in lines if line.strip()], runs_dir)


def runs_of(records: Sequence[dict[str, Any]], base: Path) -> list[Run]:
    """The starts of runs.jsonl's `records` (each log relative to `base`, or absolute) that reached
    `Starting vLLM server on`; others are reported and left out."""
    runs = []
    for number, record in enumerate(records, start=1):
        timeline = parse_log(log_lines(base / record["log"]))
        label = f"{record['shape']}/{record['profile']}/r{record['rep']}"
        if timeline.total_seconds is None:
            print(f"left out {label} (record {number}): not ready in its log", file=sys.stderr)
            continue
        settings = logged_settings(
            EngineSettings.model_validate(record["settings"]),
            timeline.compile_cache,
            timeline.compile_cache_reason,
        )
        observation = Observation(
            facts=ModelFacts.model_validate(record["facts"]),
            settings=settings,
            phases=timeline.phases,
            label=label,
        )
        runs.append(
            Run(record["shape"], record["profile"], record["rep"], observation, timeline.total_seconds)
        )
    return runs


def new_regimes_only(runs: Sequence[Run], other_host: Sequence[Run]) -> list[Run]:
    """`other_host`'s starts cut to the phases whose regime none of `runs` ran; starts left with none go."""

    def regime(run: Run, phase: str) -> tuple[str, str]:
        return phase, regime_of(phase, run.observation.settings)

    ran = {regime(run, phase) for run in runs for phase in run.observation.phases if phase in PHASE_MODELS}
    kept = []
    for run in other_host:
        phases = {
            phase: seconds
            for phase, seconds in run.observation.phases.items()
            if phase in PHASE_MODELS and regime(run, phase) not in ran
        }
        if phases:
            observation = run.observation.model_copy(update={"phases": phases})
            kept.append(dataclasses.replace(run, observation=observation))
    return kept


def shapes_of(runs: Sequence[Run], note: str | None = None) -> list[str]:
    return [*sorted({run.shape for run in runs}), *([note] if note else [])]


def validation(
    runs: Sequence[Run], hardware: str, logs: str, note: str | None = None, other_host: Sequence[Run] = ()
) -> dict[str, Any]:
    fitted = [*(run for run in runs if not run.held_out), *new_regimes_only(runs, other_host)]
    if not fitted:
        raise SystemExit("no start of a fitted (not held-out) shape in runs.jsonl: nothing to fit on")
    fitted_on = shapes_of(fitted, note)
    coefficients = fit(
        [run.observation for run in fitted], hardware=hardware, source="shipped", fitted_on=fitted_on
    )
    held_out = []
    for run in (run for run in runs if run.held_out):
        prediction = predict(run.observation.facts, run.observation.settings, coefficients)
        measured = run.observation.phases
        names = [*measured, *(name for name in prediction.phases if name not in measured)]
        held_out.append(
            {
                "shape": run.shape,
                "profile": run.profile,
                "rep": run.rep,
                "measuredTotal": run.total_seconds,
                "predictedTotal": prediction.total_seconds,
                "phases": {
                    name: {"measured": measured.get(name, 0.0), "predicted": prediction.phases.get(name, 0.0)}
                    for name in names
                },
            }
        )
    return {
        "hardware": hardware,
        "fittedOn": fitted_on,
        "heldOut": held_out,
        "logs": logs,
        "summary": summary(held_out),
        "coefficients": coefficients.to_json_dict(),
    }


def errors(pairs: Sequence[tuple[float, float]]) -> dict[str, float | None]:
    """MAE and max error in seconds, and as % of the measured: MAE / mean measured, max of each error / its
    measured (None where the measured is 0)."""
    absolute = [abs(predicted - measured) for measured, predicted in pairs]
    mean_measured = statistics.fmean(measured for measured, _ in pairs)
    relative = [
        error / measured for error, (measured, _) in zip(absolute, pairs, strict=True) if measured > 0
    ]
    return {
        "maeSeconds": round(statistics.fmean(absolute), 3),
        "maxErrorSeconds": round(max(absolute), 3),
        "maePercent": round(100 * statistics.fmean(absolute) / mean_measured, 1)
        if mean_measured > 0
        else None,
        "maxErrorPercent": round(100 * max(relative), 1) if relative else None,
    }


def summary(held_out: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not held_out:
        return {}
    seen = {name for row in held_out for name in row["phases"]}
    names = [name for name in ENGINE_PHASES if name in seen]
    by_phase = {
        name: errors(
            [
                (row["phases"][name]["measured"], row["phases"][name]["predicted"])
                for row in held_out
                if name in row["phases"]
            ]
        )
        for name in names
    }
    by_profile = {
        profile: errors(
            [(row["measuredTotal"], row["predictedTotal"]) for row in held_out if row["profile"] == profile]
        )
        for profile in dict.fromkeys(row["profile"] for row in held_out)
    }
    return {
        "starts": len(held_out),
        TOTAL: errors([(row["measuredTotal"], row["predictedTotal"]) for row in held_out]),
        "phases": by_phase,
        "totalByProfile": by_profile,
    }


def table(document: dict[str, Any]) -> str:
    lines = [
        f"fitted on: {', '.join(document['fittedOn'])}",
        f"{'held-out start':<34} {'measured s':>10} {'predicted s':>11} {'error %':>8}",
    ]
    for row in document["heldOut"]:
        name = f"{row['shape']}/{row['profile']}/r{row['rep']}"
        error = 100 * (row["predictedTotal"] - row["measuredTotal"]) / row["measuredTotal"]
        lines.append(
            f"{name:<34} {row['measuredTotal']:>10.2f} {row['predictedTotal']:>11.2f} {error:>+8.1f}"
        )
    if document["summary"]:
        lines.append(f"{'phase':<14} {'MAE s':>7} {'max s':>7} {'MAE %':>7} {'max %':>7}")
        rows = {**document["summary"]["phases"], TOTAL: document["summary"][TOTAL]}
        for name, figures in rows.items():
            cells = [f"{figures[key]:>7.2f}" for key in ("maeSeconds", "maxErrorSeconds")]
            for key in ("maePercent", "maxErrorPercent"):
                cells.append(f"{figures[key]:>7.1f}" if figures[key] is not None else f"{'-':>7}")
            lines.append(f"{name:<14} {' '.join(cells)}")
    return "\n".join(lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.predictor.validate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs_dir", metavar="RUNS_DIR", type=Path)
    parser.add_argument("--hardware", required=True, help="hardware key, e.g. NVIDIA-H100-80GB-HBM3_x1_v0.26")
    parser.add_argument("--out", type=Path, help="validation results (bench/results/predictor-<hw>.json)")
    parser.add_argument("--coefficients-out", type=Path, help="shipped set fitted on every start")
    parser.add_argument("--note", help="added to fittedOn")
    parser.add_argument(
        "--other-host",
        type=Path,
        action="append",
        default=[],
        metavar="RUNS_DIR",
        help="starts on another host, fitted only in regimes RUNS_DIR lacks (repeatable)",
    )
    arguments = parser.parse_args(argv)
    if arguments.out is None and arguments.coefficients_out is None:
        parser.error("nothing to write: give --out, --coefficients-out or both")
    try:
        hardware = HardwareClass.from_key(arguments.hardware).key
    except ValueError as error:
        parser.error(str(error))
    runs = load_runs(arguments.runs_dir)
    other_host = [run for runs_dir in arguments.other_host for run in load_runs(runs_dir)]
    logs = ", ".join(str(runs_dir) for runs_dir in [arguments.runs_dir, *arguments.other_host])
    if arguments.out is not None:
        document = validation(runs, hardware, logs, arguments.note, other_host)
        write_json(arguments.out, document)
        print(table(document))
    if arguments.coefficients_out is not None:
        fitted = [*runs, *new_regimes_only(runs, other_host)]
        observations = [run.observation for run in fitted]
        fitted_on = shapes_of(fitted, arguments.note)
        shipped = fit(observations, hardware=hardware, source="shipped", fitted_on=fitted_on)
        write_json(
            arguments.coefficients_out,
            shipped.model_copy(update={"observations": observations}).to_json_dict(),
        )
        print(f"wrote {arguments.coefficients_out}: fitted on {len(observations)} starts of {fitted_on}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
