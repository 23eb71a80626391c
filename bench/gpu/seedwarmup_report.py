"""Turn a seedwarmup.py output folder into bench/results/NAME.json and NAME-logs/ (gzipped logs).

Phases come from `stoker.phases.parse_log` via report.run_entry, as for the cold-start results.
usage: PYTHONPATH=src python bench/gpu/seedwarmup_report.py RUN_DIR seed-warmup-h100
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
from pathlib import Path

from report import RESULTS, run_entry


def main() -> None:
    run_dir, name = Path(sys.argv[1]), sys.argv[2]
    records = [json.loads(line) for line in (run_dir / "runs.jsonl").open()]
    logs_out = RESULTS / f"{name}-logs"
    logs_out.mkdir(parents=True, exist_ok=False)
    runs = []
    for record in records:
        log_name = f"r{record['repetition']}-{record['profile']}.log"
        entry = run_entry(record, run_dir / "logs" / log_name)
        for key in (
            "seedCache",
            "jitWarnings",
            "warmupCompletion",
            "secondCompletion",
            "addedByWarmup",
            "wallSeconds",
        ):
            if key in record:
                entry[key] = record[key]
        if "decode" in record:
            entry["warmFirstTokenSeconds"] = record["decode"].get("firstTokenSeconds")
        runs.append(entry)
        with (
            (run_dir / "logs" / log_name).open("rb") as src,
            gzip.open(logs_out / f"{log_name}.gz", "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
    for raw in ("host.json", "model.json", "driver.log"):
        shutil.copy(run_dir / raw, logs_out / raw)
    summary = {}
    for profile in ("stoker-seed", "stoker", "stoker-warmseed"):
        group = [r for r in runs if r["profile"] == profile and r["readySeconds"] is not None]
        first = [r["firstCompletionSeconds"] for r in group if r.get("firstCompletionSeconds") is not None]
        summary[profile] = {
            "runs": len(group),
            "readySecondsMean": round(statistics.mean(r["readySeconds"] for r in group), 2),
            "firstCompletionSecondsMean": round(statistics.mean(first), 3) if first else None,
        }
    seed = records[0]
    result = {
        "question": "does a seed that sends one completion after /health remove the serving pods' "
        "first-request Triton JIT (_compute_slot_mapping_kernel), without changing ready time?",
        "host": json.loads((run_dir / "host.json").read_text()),
        "model": {
            "layers": 8,
            "description": "synthetic Llama-3.1-8B-shaped checkpoint cut to 8 layers (LAYERS=8 "
            "bench/gpu/make_model.py), bf16, random weights",
            **json.loads((run_dir / "model.json").read_text().strip().splitlines()[-1]),
        },
        "manifest": "bench/gpu/llama-8b.json",
        "seedWarmupRequest": seed.get("warmupBody"),
        "servingFirstRequest": {"prompt": "def main():", "max_tokens": 16, "temperature": 0},
        "method": "one seed run per repetition (rendered seed invocation): the cache volume is copied at "
        "/health (= what today's seed leaves: profile stoker), then one completion, stop, copied again "
        "(profile stoker-warmseed); both serving runs use the rendered serving invocation on a fresh copy, "
        "page cache dropped, container-local JIT caches wiped, order alternating per repetition",
        "summary": summary,
        "runs": runs,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
