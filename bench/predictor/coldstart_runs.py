"""Turn a GPU cold-start benchmark's logs (bench/gpu/coldstart.py, kept as bench/results/<name>-logs/) into
a RUNS_DIR for validate.py; the logs stay where they are and are referenced.

usage: python -m bench.predictor.coldstart_runs LOGS_DIR [--facts FACTS.json --shape NAME]
         --engine-version X.Y.Z --profiles stock,stoker-seed,stoker --out RUNS_DIR

A profile run (one model, so one shape): FACTS.json is `read_model_facts` of the benchmark's model
directory. A shape sweep (`coldstart.py --shapes`): each run names its shape and log, and LOGS_DIR/models.json
holds each shape's facts as read on the host, or, where the host had no `read_model_facts`, the checkpoint's
config.json and file sizes, from which the same function reads them here. Settings come from each run's
own argv and environment (`stoker.predict.engine_settings`), the cache state from its log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.predictor.validate import log_lines

from stoker.inpod.facts import read_model_facts
from stoker.phases import parse_log
from stoker.predict import ModelFacts, engine_settings, logged_settings


def sweep_facts(model: dict[str, Any]) -> dict[str, Any]:
    """A sweep shape's facts: as read on the host, else read here from a stand-in directory holding its
    config.json and files of the recorded sizes (sparse: no bytes written)."""
    if "facts" in model:
        return dict(model["facts"])
    with tempfile.TemporaryDirectory() as stand_in:
        for name, size in model["files"].items():
            with open(os.path.join(stand_in, name), "wb") as file:
                file.truncate(size)
        Path(stand_in, "config.json").write_text(json.dumps(model["config"]))
        return read_model_facts(stand_in)


def predictor_records(
    logs_dir: Path,
    engine_version: str,
    profiles: Sequence[str],
    facts: ModelFacts | None = None,
    shape: str | None = None,
) -> list[dict[str, Any]]:
    """The starts of `profiles` in LOGS_DIR as validate.py's records, each `log` the path of its log. A
    sweep's facts come from LOGS_DIR/models.json; a profile run's are `facts`, of `shape`."""
    models_path = logs_dir / "models.json"
    sweep = json.loads(models_path.read_text()) if models_path.exists() else {}
    facts_of = {
        name: ModelFacts.model_validate(sweep_facts(model)).to_json_dict() for name, model in sweep.items()
    }
    if not sweep:
        if facts is None or shape is None:
            raise ValueError(f"{logs_dir}: no models.json, so a profile run's facts and shape are needed")
        facts_of[shape] = facts.to_json_dict()
    records = []
    for line in (logs_dir / "runs.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["profile"] not in profiles:
            continue
        name = record.get("log", f"r{record['repetition']}-{record['profile']}.log")
        log = next(path for path in (logs_dir / name, logs_dir / f"{name}.gz") if path.exists())
        timeline = parse_log(log_lines(log))
        settings = logged_settings(
            engine_settings(record["argv"], record["env"], timeline.compile_cache, engine_version),
            timeline.compile_cache,
            timeline.compile_cache_reason,
        )
        run_shape = record.get("shape", shape)
        records.append(
            {
                "shape": run_shape,
                "profile": record["profile"],
                "rep": record["repetition"],
                "log": log,
                "facts": facts_of[run_shape],
                "settings": settings.to_json_dict(),
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.predictor.coldstart_runs")
    parser.add_argument("logs_dir", metavar="LOGS_DIR", type=Path)
    parser.add_argument("--facts", type=Path, help="a profile run's model facts (not for a sweep)")
    parser.add_argument("--shape", help="a profile run's shape name (not for a sweep)")
    parser.add_argument("--engine-version", required=True)
    parser.add_argument("--profiles", required=True, help="comma-separated profiles to take")
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args(argv)
    facts = ModelFacts.model_validate_json(arguments.facts.read_text()) if arguments.facts else None
    try:
        records = predictor_records(
            arguments.logs_dir,
            arguments.engine_version,
            arguments.profiles.split(","),
            facts,
            arguments.shape,
        )
    except ValueError as error:
        parser.error(str(error))
    lines = [{**record, "log": os.path.relpath(record["log"], arguments.out)} for record in records]
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} runs to {arguments.out / 'runs.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
