"""Turn a coldstart.py output folder into the committed results: JSON, chart, markdown table, small logs.

Every log is parsed with `stoker.phases.parse_log`, the parser the operator runs on pod logs, so the phases
in the results are the ones the operator would report. Needs matplotlib for the chart.

usage: PYTHONPATH=src:. python bench/gpu/report.py RUN_DIR NAME [--doc docs/benchmarks/gpu-coldstart.md]
                                                    [--rename OLD=NEW,...]
  RUN_DIR holds runs.jsonl, host.json, model.json and logs/ (as coldstart.py writes them), and driver*.log
  and importtime*.txt if there are any; NAME is the results' base name, e.g. coldstart-h100-v0.26.0:
  bench/results/NAME.json, NAME.png, NAME-logs/. --doc replaces the table between
  `<!-- results-table:NAME:begin -->` and `:end -->`. --rename gives profiles the names they have now when
  the renderer changed after the run (e.g. a measured lever became the default): it applies to every record
  before anything else, the logs are copied under the new names, and the JSON keeps the map as "renamed".
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shutil
import statistics
from graphlib import TopologicalSorter
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.predictor.shapes import CHECKPOINTS, describe
from profiles import DEFAULT_PROFILE

from stoker.inpod.seed import first_start
from stoker.phases import ENGINE_PHASES, parse_log

RESULTS = Path(__file__).resolve().parents[1] / "results"
WARM_NODE_PROFILE = "stoker-warm"
# Between the "Starting vLLM server" line (the parser's last phase end) and the first 200 from /health.
SERVER_UP = "serverUp"
# The seed Job's run: its ready time is how long seeding takes, not a start to compare with stock.
SEED = "stoker-seed"
CHART_PHASES = (*ENGINE_PHASES, SERVER_UP)


def run_entry(record: dict[str, Any], log_path: Path) -> dict[str, Any]:
    with log_path.open(errors="replace") as log:
        # A seed's run is its first start, as the operator records it (a second start loads what it compiled).
        timeline = parse_log(first_start(log)).to_json_dict()
    phases = dict(timeline["phases"])
    if record["readySeconds"] is not None and timeline["totalSeconds"] is not None:
        phases[SERVER_UP] = round(record["readySeconds"] - timeline["totalSeconds"], 3)
    entry = {
        "profile": record["profile"],
        "repetition": record["repetition"],
        "readySeconds": record["readySeconds"],
        "phases": phases,
        "compileCache": timeline["compileCache"],
        "firstCompletionSeconds": record.get("firstCompletion", {}).get("seconds"),
        "decodeTokensPerSecond": record.get("decode", {}).get("tokensPerSecond"),
    }
    for key in (
        "sleepWake",
        "cacheBytesAfter",
        "gpuMemoryUsedMiB",
        "pageCacheDropped",
        "exitCode",
        "warmedBytes",
        "cacheWritten",
    ):
        if key in record:
            entry[key] = record[key]
    return entry


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per profile: mean ready time and phases, and paired ratios against the same repetition's runs."""
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["readySeconds"] is not None:
            by_profile.setdefault(run["profile"], []).append(run)
    ready = {(r["profile"], r["repetition"]): r["readySeconds"] for r in runs}
    decode = {(r["profile"], r["repetition"]): r["decodeTokensPerSecond"] for r in runs}

    def decode_change(profile: str, reps: list[int], baseline: str) -> list[float]:
        """`profile`'s decode speed against `baseline`'s in the same repetitions, as fractions."""
        return [
            round(decode[(profile, rep)] / decode[(baseline, rep)] - 1, 4)
            for rep in reps
            if decode.get((baseline, rep)) and decode.get((profile, rep))
        ]

    summary = {}
    for profile, group in by_profile.items():
        times = [r["readySeconds"] for r in group]
        reps = [r["repetition"] for r in group]
        paired = [ready[("stock", rep)] / ready[(profile, rep)] for rep in reps if ready.get(("stock", rep))]
        rates = [r["decodeTokensPerSecond"] for r in group if r["decodeTokensPerSecond"]]
        summary[profile] = {
            "runs": len(group),
            "readySecondsMean": round(statistics.mean(times), 2),
            "readySecondsMedian": round(statistics.median(times), 2),
            "readySeconds": times,
            "readySecondsMin": min(times),
            "readySecondsMax": max(times),
            "stockOverProfilePaired": [round(x, 3) for x in paired],
            "stockOverProfileMean": round(statistics.mean(paired), 3) if paired else None,
            "phasesMean": {
                phase: round(statistics.mean(r["phases"].get(phase, 0.0) for r in group), 2)
                for phase in CHART_PHASES
            },
            "compileCache": sorted({r["compileCache"] for r in group}),
            "firstCompletionSecondsMean": mean_or_none([r["firstCompletionSeconds"] for r in group]),
            "decodeTokensPerSecondMean": round(statistics.mean(rates), 2) if rates else None,
            "decodeChangeVsStokerPaired": decode_change(profile, reps, DEFAULT_PROFILE),
            "decodeChangeVsStockPaired": decode_change(profile, reps, "stock"),
        }
    if "stock" in summary:
        stock_median = summary["stock"]["readySecondsMedian"]
        for entry in summary.values():
            entry["stockOverProfileMedians"] = round(stock_median / entry["readySecondsMedian"], 3)
    return summary


def compared_with_stock(profile: str) -> bool:
    """Every profile but stock itself and the seeds (a seed's run is no start to compare; a lever's own
    seed is `stoker-seed-<lever>`)."""
    return profile != "stock" and not profile.startswith(SEED)


def mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.mean(present), 3) if present else None


def phase_order(runs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The phases in the order the runs' logs had them (versions differ: 0.26's jitWarmup follows
    graphCapture, 0.29's precedes it)."""
    order: TopologicalSorter[str] = TopologicalSorter()
    for run in runs:
        for earlier, later in pairwise(run["phases"]):
            order.add(later, earlier)
    return tuple(order.static_order())


def chart(summary: dict[str, dict[str, Any]], order: tuple[str, ...], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(summary)
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(profiles) + 2.8))
    colors = plt.get_cmap("tab20").colors
    left = [0.0] * len(profiles)
    for index, phase in enumerate(order):
        widths = [summary[p]["phasesMean"][phase] for p in profiles]
        ax.barh(
            profiles, widths, left=left, color=colors[index % len(colors)], label=phase, edgecolor="white"
        )
        for row, (start, width) in enumerate(zip(left, widths, strict=True)):
            if width >= 3:
                ax.text(start + width / 2, row, f"{width:.0f}", ha="center", va="center", fontsize=8)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for row, profile in enumerate(profiles):
        s = summary[profile]
        shown = compared_with_stock(profile) and s["stockOverProfileMean"]
        ratio = f"  ({s['stockOverProfileMean']:.2f}x faster than stock)" if shown else ""
        ax.text(left[row] + 0.8, row, f"{s['readySecondsMean']:.1f} s{ratio}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(
        "seconds from process start to /health 200 (mean of repetitions; phases from stoker.phases)",
        labelpad=4,
    )
    ax.set_xlim(0, max(left) * 1.45)
    ax.set_title(title)
    ax.legend(ncol=6, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(summary: dict[str, dict[str, Any]]) -> str:
    head = (
        "| profile | runs | ready (s), mean [min-max] | stock ÷ profile | imports | model info "
        "| engine start | weights | Dynamo | compile or load | profiling | graphs | JIT warm-up | API up "
        "| compile cache "
        "| first completion (s) | decode tok/s (vs stoker) | ready (s), median | stock ÷ profile (medians) |"
    )
    lines = [head, "|" + "---|" * 19]
    for profile, s in summary.items():
        p = s["phasesMean"]
        shown = compared_with_stock(profile) and s["stockOverProfileMean"]
        ratio = f"{s['stockOverProfileMean']:.2f}x" if shown else "—"
        change = s["decodeChangeVsStokerPaired"]
        versus = f" ({statistics.mean(change) * 100:+.1f}%)" if change and profile != "stoker" else ""
        decode = f"{s['decodeTokensPerSecondMean']}{versus}" if s["decodeTokensPerSecondMean"] else "—"
        first = f"{s['firstCompletionSecondsMean']:.2f}" if s["firstCompletionSecondsMean"] else "—"
        of_medians = f"{s['stockOverProfileMedians']:.2f}x" if shown else "—"
        lines.append(
            f"| {profile} | {s['runs']} | {s['readySecondsMean']:.1f} [{s['readySecondsMin']:.1f}-"
            f"{s['readySecondsMax']:.1f}] | {ratio} | {p['bootstrap']:.1f} | {p['modelInfo']:.1f} "
            f"| {p['engineStart']:.1f} | {p['weightLoad']:.1f} | {p['dynamo']:.1f} "
            f"| {p['compile'] + p['compileLoad']:.1f} | {p['profiling']:.1f} | {p['graphCapture']:.1f} "
            f"| {p['jitWarmup']:.1f} | {p['apiReady'] + p[SERVER_UP]:.1f} "
            f"| {', '.join(s['compileCache'])} | {first} | {decode} | {s['readySecondsMedian']:.1f} "
            f"| {of_medians} |"
        )
    return "\n".join(lines)


def renames(text: str) -> dict[str, str]:
    """`OLD=NEW,...` as a map; argparse reports the ValueError of a malformed pair."""
    pairs = [pair.split("=") for pair in text.split(",") if pair]
    if any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise ValueError(text)
    return dict(pairs)


def renamed(records: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """`records` with their profiles renamed; each keeps the name it ran under in "ranAs" for its log."""
    missing = set(names) - {r["profile"] for r in records}
    if missing:
        raise SystemExit(f"--rename: no runs of {', '.join(sorted(missing))}")
    result = [{**r, "profile": names.get(r["profile"], r["profile"]), "ranAs": r["profile"]} for r in records]
    keys = [(r["profile"], r["repetition"]) for r in result]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"--rename {names}: two profiles would share a name")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("--doc", type=Path, help="markdown file whose results table to replace")
    parser.add_argument("--title", help="chart title (default: the vLLM version and GPU of host.json)")
    parser.add_argument("--rename", type=renames, default={}, help="OLD=NEW,...: profiles to rename")
    parser.add_argument("--checkpoint", choices=CHECKPOINTS, help="make_model.py's, if model.json has none")
    parser.add_argument("--layers", type=int, help="make_model.py's layers, if model.json has none")
    args = parser.parse_args()
    lines = (args.run_dir / "runs.jsonl").read_text().splitlines()
    records = renamed([json.loads(line) for line in lines if line], args.rename)
    logs_out = RESULTS / f"{args.name}-logs"
    shutil.rmtree(logs_out, ignore_errors=True)
    logs_out.mkdir(parents=True)
    runs = []
    for record in records:
        source = args.run_dir / "logs" / f"r{record['repetition']}-{record['ranAs']}.log"
        runs.append(run_entry(record, source))
        gzip_copy(source, logs_out / f"r{record['repetition']}-{record['profile']}.log.gz")
    # driver*.log: the driver's own output, one file per invocation when a run was extended. Raw files keep
    # the names the run used.
    for raw in ["runs.jsonl", "host.json", "model.json", *(p.name for p in args.run_dir.glob("driver*.log"))]:
        shutil.copy(args.run_dir / raw, logs_out / raw)
    # importtime*.txt: `python -X importtime` of the API server's imports (cold page cache, then warm).
    for imports in args.run_dir.glob("importtime*.txt"):
        gzip_copy(imports, logs_out / f"{imports.name}.gz")
    host = json.loads((args.run_dir / "host.json").read_text())
    model = json.loads((args.run_dir / "model.json").read_text())
    # make_model.py names its checkpoint in model.json since the 70B shape; earlier runs wrote the 8B.
    published = CHECKPOINTS[model.get("checkpoint", args.checkpoint or "llama-8b")]
    shape = dataclasses.replace(published, layers=model.get("layers", args.layers or published.layers))
    summary = summarize(runs)
    document = {
        "gpu": host["gpu"],
        "model": {"description": describe(shape), "bytes": model["bytes"]},
        "vllm": host["vllm"],
        "default": DEFAULT_PROFILE,
        # The profile started on a node stoker warmed (coldstart.py), when the run had one.
        **({"warmNode": WARM_NODE_PROFILE} if WARM_NODE_PROFILE in summary else {}),
        **({"renamed": args.rename} if args.rename else {}),
        "host": host,
        "profiles": {r["profile"]: {"argv": r["argv"], "env": r["env"]} for r in records},
        "summary": summary,
        "runs": runs,
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(document, indent=1) + "\n")
    gpu = host["gpu"].split(",")[0]
    title = args.title or f"vLLM {host['vllm']} cold start, {shape.name} ({shape.layers} layers), {gpu}"
    chart(summary, phase_order(runs), title, RESULTS / f"{args.name}.png")
    markdown = table(summary)
    print(markdown)
    if args.doc:
        begin, end = f"<!-- results-table:{args.name}:begin -->", f"<!-- results-table:{args.name}:end -->"
        text = args.doc.read_text()
        before, rest = text.split(begin, 1)
        _, after = rest.split(end, 1)
        args.doc.write_text(f"{before}{begin}\n{markdown}\n{end}{after}")


def gzip_copy(source: Path, target: Path) -> None:
    # mtime 0: a rerun over the same run writes the same bytes.
    with (
        source.open("rb") as src,
        target.open("wb") as raw,
        gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as dst,
    ):
        shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main()
