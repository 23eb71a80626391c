"""The results of coldstart.py's --snapshot mode (snapshot_restore.py): per profile, the seconds to the first
completion (`servedSeconds`) and to /health, the decode rate and whether every greedy completion equalled
the snapshot source's; the ratios of the medians and, per repetition, the paired ratios against stock.

usage: python3 bench/gpu/snapshot_report.py OUT_DIR RESULT_JSON
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

PROFILES = ("stock", "stoker", "restore", "restore-warm")
# Kept out of the result: the environment is the rendered one, in the logs and in stoker's own tests.
DROPPED = ("env",)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [run for run in runs if run.get("repetition") and run["profile"] in PROFILES]
    summary: dict[str, Any] = {}
    for name in PROFILES:
        mine = [run for run in measured if run["profile"] == name and run.get("servedSeconds")]
        served = [run["servedSeconds"] for run in mine]
        summary[name] = {
            "servedSeconds": served,
            "median": median(served),
            "readyMedian": median([run["readySeconds"] for run in mine]),
            "decodeTokensPerSecond": median([run["decode"]["tokensPerSecond"] for run in mine]),
            "greedyEqualAll": all(run.get("greedyEqual") for run in mine),
        }
        for part in ("criuRestoreSeconds", "cudaRestoreSeconds", "wakeSeconds"):
            if any(part in run for run in mine):
                summary[name][part] = median([run[part] for run in mine])
    stock = summary["stock"]["median"]
    for name in PROFILES[1:]:
        if stock and summary[name]["median"]:
            summary[name]["stockOverThis"] = round(stock / summary[name]["median"], 2)
            summary[name]["pairedStockOverThis"] = [
                round(s["servedSeconds"] / r["servedSeconds"], 2)
                for s in measured
                for r in measured
                if s["profile"] == "stock"
                and r["profile"] == name
                and s["repetition"] == r["repetition"]
                and s.get("servedSeconds")
                and r.get("servedSeconds")
            ]
    return summary


def main() -> None:
    out, result = Path(sys.argv[1]), Path(sys.argv[2])
    runs = [json.loads(line) for line in (out / "runs.jsonl").open()]
    report = {
        "host": json.loads((out / "host.json").read_text()),
        "snapshot": json.loads((out / "snapshot.json").read_text()),
        "summary": summarize(runs),
        "runs": [{k: v for k, v in run.items() if k not in DROPPED} for run in runs],
    }
    result.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
