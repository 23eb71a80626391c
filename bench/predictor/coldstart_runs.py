"""Turn a GPU cold-start benchmark's logs (bench/gpu/coldstart.py, kept as bench/results/<name>-logs/) into
a RUNS_DIR for validate.py: one model, so one shape; the logs stay where they are and are referenced.

usage: python -m bench.predictor.coldstart_runs LOGS_DIR --facts FACTS.json --shape NAME
         --engine-version X.Y.Z --profiles stock,stoker-seed,stoker --out RUNS_DIR

FACTS.json is `read_model_facts` of the benchmark's model directory. Settings come from each run's own
argv and environment (`stoker.predict.engine_settings`), the cache state from its log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.predictor.validate import log_lines

from stoker.phases import parse_log
from stoker.predict import ModelFacts, engine_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.predictor.coldstart_runs")
    parser.add_argument("logs_dir", metavar="LOGS_DIR", type=Path)
    parser.add_argument("--facts", type=Path, required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--engine-version", required=True)
    parser.add_argument("--profiles", required=True, help="comma-separated profiles to take")
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args(argv)
    facts = ModelFacts.model_validate_json(arguments.facts.read_text()).to_json_dict()
    profiles = arguments.profiles.split(",")
    lines = []
    for line in (arguments.logs_dir / "runs.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["profile"] not in profiles:
            continue
        name = f"r{record['repetition']}-{record['profile']}.log"
        log = next(
            path for path in (arguments.logs_dir / name, arguments.logs_dir / f"{name}.gz") if path.exists()
        )
        timeline = parse_log(log_lines(log))
        settings = engine_settings(
            record["argv"], record["env"], timeline.compile_cache, arguments.engine_version
        )
        lines.append(
            {
                "shape": arguments.shape,
                "profile": record["profile"],
                "rep": record["repetition"],
                "log": os.path.relpath(log, arguments.out),
                "facts": facts,
                "settings": settings.to_json_dict(),
            }
        )
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} runs to {arguments.out / 'runs.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
