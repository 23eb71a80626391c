"""`make conformance`: stoker's rendered commands against real vLLM, version by version.

    python -m bench.conformance [VERSION ...]     (default: every version in versions.py)

For each CPU version: install it (hack/vllm-venv), render every example for it, parse every rendered seed
and serving argv with that version's own CLI (vllm_argv.py), then run minimal.yaml's seed Job command and
serving command as real processes (swaps.py says what changes and why) to /health and one completion,
and check stoker's parse of each log against the log itself (checks.py). Parse-only versions get the argv
check alone. Results merge into bench/results/conformance.json (one entry per version), the logs go to
bench/results/conformance/<version>/ (gzipped), and docs/compatibility.md is written from the JSON.
Set CONFORMANCE_RAW_LOG_DIR to also copy each raw log there as soon as its process ends.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench.conformance import checks, report
from bench.conformance.process import RecordedProcess, complete, free_port, wait_healthy
from bench.conformance.swaps import SERVE_SUBCOMMAND, LocalRun, container_argv, local_argv, local_env
from bench.conformance.versions import (
    CPU_VERSIONS,
    PARSE_ONLY_VERSIONS,
    install_command,
    select_version,
    venv_path,
)

from stoker.api import KIND, VLLMService
from stoker.inpod.seed import first_start
from stoker.phases import parse_log
from stoker.render import render_children

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FULL_RUN_EXAMPLE = "minimal"
RESULTS_JSON = REPO / "bench" / "results" / "conformance.json"
LOGS_ROOT = REPO / "bench" / "results" / "conformance"
START_TIMEOUT_SECONDS = 1800  # a 2-core machine shared with others: minutes per start


def rendered_containers(version: str) -> dict[str, dict[str, Any]]:
    """`<example>/<seed|serve>` -> the engine container stoker renders for `version`."""
    containers = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict) or document.get("kind") != KIND:
                continue
            svc = VLLMService.model_validate(select_version(document, version))
            for child in render_children(svc):
                role = {"Job": "seed", "Deployment": "serve"}.get(child["kind"])
                if role is not None:
                    containers[f"{path.stem}/{role}"] = child["spec"]["template"]["spec"]["containers"][0]
    return containers


def engine_argv(container: dict[str, Any]) -> list[str]:
    """The `serve ...` part of a container's argv (the seed runs it under `python3 -m stoker.inpod.seed`)."""
    argv = container_argv(container)
    return argv[argv.index(SERVE_SUBCOMMAND) :]


def parse_argvs(version: str, containers: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    argvs = {name: engine_argv(container) for name, container in containers.items()}
    result_file = out_dir / "argv.json"
    subprocess.run(
        [
            str(venv_path(version) / "bin" / "python"),
            str(Path(__file__).with_name("vllm_argv.py")),
            result_file,
        ],
        input=json.dumps(argvs),
        text=True,
        check=True,
        capture_output=True,
        env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    results: dict[str, Any] = json.loads(result_file.read_text())
    for name, argv in argvs.items():
        results[name]["argv"] = argv
    result_file.write_text(json.dumps(results, indent=1) + "\n")
    return results


def keep_log(log: Path, version: str, out_dir: Path) -> None:
    raw_copies = os.environ.get("CONFORMANCE_RAW_LOG_DIR")
    if raw_copies:
        target = Path(raw_copies) / version
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, target / log.name)
    # mtime=0 and no file name in the header: the same log always packs to the same bytes.
    with (
        open(log, "rb") as source,
        open(out_dir / f"{log.name}.gz", "wb") as target,
        gzip.GzipFile(filename="", mode="wb", fileobj=target, mtime=0) as packed,
    ):
        shutil.copyfileobj(source, packed)


def run_role(
    role: str, container: dict[str, Any], run: LocalRun, version: str, work: Path, out_dir: Path
) -> tuple[dict[str, bool], dict[str, Any]]:
    """Run one rendered container as a process; the seed runs to its own exit, the serving command to
    /health and one completion, then stops."""
    before = checks.compile_artifacts(run.cache_dir)
    process = RecordedProcess(
        local_argv(container_argv(container), run), local_env(container, run), work / f"{role}.log"
    )
    outcome: dict[str, Any] = {}
    if role == "seed":
        outcome["exitCode"] = process.wait(START_TIMEOUT_SECONDS)
        if outcome["exitCode"] is None:
            outcome["exitCode"] = process.stop()
        role_checks = {"seed_exit_ok": outcome["exitCode"] == 0}
    else:
        healthy = wait_healthy(process, run.port, START_TIMEOUT_SECONDS)
        model = container["args"][container["args"].index("--served-model-name") + 1]
        answered = healthy and complete(run.port, model)
        outcome["exitCode"] = process.stop()
        role_checks = {"serve_health": healthy, "serve_completion": answered}
    outcome["wallSeconds"] = round(time.monotonic() - process.started, 1)
    evidence = checks.CacheEvidence(before, checks.compile_artifacts(run.cache_dir))
    keep_log(process.log_path, version, out_dir)
    text = process.log_path.read_text(encoding="utf-8")
    if role == "seed":
        # A seed that starts twice (--start-again) is recorded by its first start, as the operator reads it.
        text = "".join(first_start(text.splitlines(keepends=True)))
    lines = checks.recorded_lines(text)
    timeline = parse_log(text.splitlines(keepends=True))
    role_checks.update(checks.log_checks(role, lines, timeline, evidence))
    outcome.update(
        parsed=timeline.to_json_dict(),
        observedCache=evidence.observed_state(),
        cacheLoadFailed=checks.load_failed(lines),
        serverLineSeconds=next((at for at, t in lines if checks.SERVER_LINE in t), None),
        # Which artifact directories (cache-key hashes) the run wrote, to tell a key split from a reload.
        artifactsWritten=sorted(
            {"/".join(path.split("/")[:2]) for path, _, _ in evidence.after - evidence.before}
        ),
    )
    return role_checks, outcome


def full_run(
    version: str, containers: dict[str, dict[str, Any]], model_dir: Path, out_dir: Path
) -> tuple[dict[str, bool], dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix=f"stoker-conformance-{version}-"))
    all_checks: dict[str, bool] = {}
    outcomes: dict[str, Any] = {}
    try:
        # One HOME for both, as pods of one image have. (A HOME per role splits 0.26.0's key unless
        # VLLM_CONFIG_ROOT and VLLM_XLA_CACHE_PATH are set, which stoker now renders:
        # bench/results/home-split-v0.26.0/.)
        cache_dir, hf_home, home = work / "cache", work / "hf-home", work / "home"
        for directory in (cache_dir, hf_home, home):
            directory.mkdir()
        for role in ("seed", "serve"):
            run = LocalRun(venv_path(version), model_dir, cache_dir, hf_home, home, free_port())
            role_checks, outcomes[role] = run_role(
                role, containers[f"{FULL_RUN_EXAMPLE}/{role}"], run, version, work, out_dir
            )
            all_checks.update(role_checks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return all_checks, outcomes


def ensure_venv(version: str) -> None:
    subprocess.run(
        [str(REPO / "hack" / "vllm-venv"), *install_command(version)], check=True, stdout=subprocess.DEVNULL
    )


def run_version(version: str, model_dir: Path) -> dict[str, Any]:
    out_dir = LOGS_ROOT / version
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    parse_only = version in PARSE_ONLY_VERSIONS
    ensure_venv(version)
    containers = rendered_containers(version)
    parsed = parse_argvs(version, containers, out_dir)
    version_checks = {"argv_accepted_all_examples": all(r["accepted"] for r in parsed.values())}
    entry: dict[str, Any] = {"version": version, "platform": "argparse-only" if parse_only else "cpu"}
    if not parse_only:
        if not (model_dir / "config.json").exists():
            subprocess.run(
                [
                    str(venv_path(version) / "bin" / "python"),
                    str(Path(__file__).with_name("tiny_model.py")),
                    model_dir,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        run_checks, entry["runs"] = full_run(version, containers, model_dir, out_dir)
        version_checks.update(run_checks)
    entry.update(
        ok=all(version_checks.values()),
        checks=version_checks,
        rejected={name: r["error"] for name, r in parsed.items() if not r["accepted"]},
        logs=str(out_dir.relative_to(REPO)),
    )
    return entry


def save(entry: dict[str, Any]) -> None:
    document = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {"versions": []}
    order = [*CPU_VERSIONS, *PARSE_ONLY_VERSIONS]
    versions = [v for v in document["versions"] if v["version"] != entry["version"]] + [entry]
    versions.sort(key=lambda v: order.index(v["version"]) if v["version"] in order else len(order))
    document["versions"] = versions
    RESULTS_JSON.write_text(json.dumps(document, indent=1) + "\n")
    report.write_compatibility(document)


def main(argv: list[str]) -> int:
    known = [*CPU_VERSIONS, *PARSE_ONLY_VERSIONS]
    unknown = [v for v in argv if v not in known]
    if unknown:
        print(
            f"usage: python -m bench.conformance [VERSION ...]; not in the matrix: {' '.join(unknown)}; "
            f"known: {' '.join(known)}",
            file=sys.stderr,
        )
        return 2
    versions = argv or known
    model_dir = Path(tempfile.gettempdir()) / "stoker-conformance-model"
    for version in versions:
        started = time.monotonic()
        entry = run_version(version, model_dir)
        save(entry)
        print(
            f"{version}: ok={entry['ok']} in {time.monotonic() - started:.0f} s {entry['checks']}", flush=True
        )
    return 0
