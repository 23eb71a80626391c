"""How well a seed's `Model loading took X GiB` stands in for a checkpoint's bytes (issue 13, hub models).

The seed loads dummy weights, so the operator takes a hub model's checkpointBytes from that line of the
seed's log (`stoker.predict.facts.with_logged_weights`). This reads every dummy-weight seed run the GPU
benchmarks kept (bench/results/<name>-logs/: runs.jsonl with each run's argv, the logs, the checkpoint's
sizes) and prints the estimate beside the bytes on disk.

usage: python -m bench.predictor.seed_weights [LOGS_DIR ...]   (default: the committed benchmark logs)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.predictor.validate import log_lines

from stoker.phases import parse_log
from stoker.predict import ModelFacts, engine_settings
from stoker.predict.facts import with_logged_weights

RESULTS = Path(__file__).resolve().parents[1] / "results"
DEFAULT_LOGS = (
    "coldstart-h100-v0.22.1-logs",
    "coldstart-h100-v0.26.0-logs",
    "coldstart-h200x2-tp2-logs",
    "predictor-h100-logs",
)
_GIB = 1 << 30
# What the seed's facts line says of a hub snapshot: everything but the weights.
_NO_WEIGHTS = ModelFacts(
    checkpoint_bytes=0,
    layers=0,
    hidden_size=0,
    intermediate_size=0,
    attention_heads=0,
    kv_heads=0,
    vocab_size=0,
    tokenizer_bytes=0,
    moe=False,
    experts=0,
)


@dataclass(frozen=True)
class SeedWeights:
    log: str
    engine_version: str | None
    tensor_parallel: int
    worker_weight_bytes: int | None
    estimated_bytes: int
    checkpoint_bytes: int

    @property
    def error_fraction(self) -> float:
        return (self.estimated_bytes - self.checkpoint_bytes) / self.checkpoint_bytes


def checkpoint_bytes(logs_dir: Path, shape: str | None) -> int:
    """The checkpoint's bytes on the benchmark host: its shape's weight files, else the one model's size."""
    if shape is not None:
        files = json.loads((logs_dir / "models.json").read_text())[shape]["files"]
        return sum(size for name, size in files.items() if name.endswith(".safetensors"))
    lines = [line for line in (logs_dir / "model.json").read_text().splitlines() if line.strip()]
    return int(json.loads(lines[-1])["bytes"])


def seed_runs(logs_dir: Path) -> Iterator[SeedWeights]:
    for line in (logs_dir / "runs.jsonl").read_text().splitlines():
        run = json.loads(line) if line.strip() else {}
        argv = run.get("argv") or []
        if run.get("role") != "seed" or "dummy" not in argv:
            continue
        name = run.get("log") or f"r{run['repetition']}-{run['profile']}.log"
        path = logs_dir / name
        path = path if path.exists() else path.with_name(path.name + ".gz")
        timeline = parse_log(log_lines(path))
        version = timeline.engine_version or "0.26.0"
        tensor_parallel = engine_settings(argv, run.get("env") or {}, "none", version).tensor_parallel
        facts = with_logged_weights(_NO_WEIGHTS, timeline.worker_weight_bytes, tensor_parallel)
        yield SeedWeights(
            log=f"{logs_dir.name}/{path.name}",
            engine_version=timeline.engine_version,
            tensor_parallel=tensor_parallel,
            worker_weight_bytes=timeline.worker_weight_bytes,
            estimated_bytes=facts.checkpoint_bytes,
            checkpoint_bytes=checkpoint_bytes(logs_dir, run.get("shape")),
        )


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    directories = [Path(name) for name in arguments] or [RESULTS / name for name in DEFAULT_LOGS]
    rows = [row for directory in directories for row in seed_runs(directory)]
    header = f"{'seed log':58} {'vLLM':>7} {'tp':>3} {'logged GiB':>10}"
    print(f"{header} {'estimate':>12} {'on disk':>12} {'error':>8}")
    for row in rows:
        logged = f"{row.worker_weight_bytes / _GIB:.2f}" if row.worker_weight_bytes else "-"
        print(
            f"{row.log:58} {row.engine_version or '?':>7} {row.tensor_parallel:>3} {logged:>10}"
            f" {row.estimated_bytes:>12} {row.checkpoint_bytes:>12} {100 * row.error_fraction:>7.3f}%"
        )
    worst = max((abs(row.error_fraction) for row in rows), default=0.0)
    print(f"{len(rows)} dummy-weight seed runs; largest error {100 * worst:.3f}% of the checkpoint's bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
