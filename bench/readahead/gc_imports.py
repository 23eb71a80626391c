"""How much of vLLM's import time is Python's cyclic garbage collector?

Each trial times `import vllm.entrypoints.cli.serve` in a fresh interpreter of the vLLM venv (page cache
warm: this measures CPU, not disk), with the collector on (CPython's default) or off, as the serving pod's
wrapper runs it (stoker.inpod.read_ahead.run_with_deferred_gc), counts the collections the import
triggered, then times one full collection of the import heap as it is and after gc.freeze (what the wrapper
does once the engine process starts). The two variants alternate; one JSON line per trial, then the
medians. On the H100 the deferred collector took the default's imports from 17.0 to 13.1 s
(bench/results/coldstart-h100.json).

usage: .venv/bin/python -m bench.readahead.gc_imports [--repetitions 5] [--venv DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from bench.conformance.versions import default_version, venv_path

TRIAL = """
import gc, json, sys, time
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
if sys.argv[1] == "off":
    gc.disable()
began = time.perf_counter()
import vllm.entrypoints.cli.serve
imported = time.perf_counter() - began
during_import = len(collections)
gc.enable()
began = time.perf_counter()
gc.collect()
full = time.perf_counter() - began
gc.freeze()
began = time.perf_counter()
gc.collect()
frozen = time.perf_counter() - began
print(json.dumps({"gc": sys.argv[1], "importSeconds": round(imported, 2), "collections": during_import,
                  "fullCollectSeconds": round(full, 3), "frozenCollectSeconds": round(frozen, 3),
                  "objects": len(gc.get_objects()) + gc.get_freeze_count()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--venv", type=Path, default=venv_path(default_version()))
    arguments = parser.parse_args()
    python = arguments.venv / "bin/python"
    if not python.exists():
        raise SystemExit(f"no vLLM venv at {arguments.venv}: run hack/vllm-venv {default_version()}")
    subprocess.run([python, "-c", "import vllm.entrypoints.cli.serve"], check=True, capture_output=True)
    trials: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(arguments.repetitions):
        for variant in trials:
            done = subprocess.run([python, "-c", TRIAL, variant], check=True, capture_output=True, text=True)
            trial = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(trial), flush=True)
            trials[variant].append(trial)
    for variant, runs in trials.items():
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "gc"}
        print(json.dumps({"gc": variant, "median": medians}))


if __name__ == "__main__":
    main()
