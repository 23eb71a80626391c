"""Parse a large vLLM log with stoker.phases and print seconds and peak memory.

Builds a log of --size-mb by spreading noise (DEBUG records, progress-bar redraws, stderr warnings, access
lines) evenly between the lines of a real startup log, so every phase boundary stays where it was and
every line goes through the full parse. Prints the time of the CLI's read-and-parse path, the peak of
Python allocations during the parse (tracemalloc, in a second pass because tracing slows it), and the
growth of the process's maximum resident set during the timed pass.

    .venv/bin/python bench/phases_parse.py [--size-mb 50] [--template LOG]
"""

import argparse
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from stoker.phases import StartupTimeline, parse_log
from stoker.phases.cli import decoded_lines

DEFAULT_TEMPLATE = Path(__file__).parent.parent / "tests/unit/data/phases/vllm-0.22.1-h100/baseline.log"
NOISE = [
    "(EngineCore pid=1057) DEBUG 11-22 04:40:51 [v1/worker/gpu_model_runner.py:4100] "
    "Allocating buffer for input_ids of shape (8192,) with dtype torch.int32 on cuda:0",
    "(EngineCore pid=1057) \rLoading safetensors checkpoint shards:  50% Completed | 2/4 "
    "[00:04<00:04,  2.01s/it]\rLoading safetensors checkpoint shards:  75% Completed | 3/4 "
    "[00:05<00:01,  1.99s/it]",
    "[W1122 04:40:50.831791819 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved.",
    '(APIServer pid=932) INFO:     127.0.0.1:37332 - "GET /health HTTP/1.1" 200 OK',
    "(EngineCore pid=1057) INFO 11-22 04:41:27 [loggers.py:259] Engine 000: "
    "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
    "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%",
]


def build_log(template: Path, size_bytes: int, target: Path) -> int:
    template_lines = template.read_bytes().decode("utf-8").splitlines()
    noise_size = sum(len(line.encode()) + 1 for line in NOISE)
    per_template_line = max(1, size_bytes // (noise_size * len(template_lines)))
    written = 0
    with target.open("w", encoding="utf-8", newline="") as log:
        for line in template_lines:
            log.write(line + "\n")
            prefix = line[: line.index("] ") + 2] if line.startswith("[") else ""
            block = "".join(prefix + noise + "\n" for noise in NOISE)
            for _ in range(per_template_line):
                log.write(block)
            written += 1 + per_template_line * len(NOISE)
    return written


def parse_file(path: Path) -> StartupTimeline:
    with path.open("rb") as log:
        return parse_log(decoded_lines(log))


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--size-mb", type=float, default=50.0)
    arguments.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE)
    options = arguments.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "big.log"
        lines = build_log(options.template, int(options.size_mb * 1024 * 1024), log)
        size_mib = log.stat().st_size / (1024 * 1024)

        rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        timeline = parse_file(log)
        seconds = time.perf_counter() - started
        rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib

        tracemalloc.start()
        parse_file(log)
        _, peak_bytes = tracemalloc.get_traced_memory()
        tracemalloc.stop()

    expected = parse_file(options.template)
    print(f"log: {size_mib:.1f} MiB, {lines} lines (template {options.template.name})")
    print(
        f"parse seconds: {seconds:.3f} ({size_mib / seconds:.1f} MiB/s, {lines / seconds / 1e3:.0f}k lines/s)"
    )
    print(f"peak traced allocations: {peak_bytes / 1024:.1f} KiB")
    print(f"max RSS growth: {rss_growth_kib} KiB")
    print(f"timeline equals the template's: {timeline == expected}")
    return 0 if timeline == expected else 1


if __name__ == "__main__":
    sys.exit(main())
