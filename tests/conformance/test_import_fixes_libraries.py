"""stoker.inpod.import_fixes on the libraries of stoker's default vLLM version (its CPU build): both fixes
apply, and what the fixed modules build is what the unfixed ones build: the lazy import structure of
`transformers.models`, and the source of every fake kernel torch and torchvision register."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

PROBE = """
import json, sys
if sys.argv[1] == "fixed":
    from stoker.inpod import import_fixes
    applied = import_fixes.install()
else:
    applied = []
import torch, torchvision
import transformers, transformers.models
from torch._library.simple_registry import singleton
sources = sorted(str(e.fake_impl.kernel.source) for e in singleton._data.values() if e.fake_impl.kernel)
built = {"models": sorted(dir(transformers.models)), "sources": sources}
print(json.dumps({**built, "applied": sorted(applied)}))
"""


def imported(engine_venv: Path, programs: Path, mode: str) -> dict:
    python = str(engine_venv / "bin" / "python")
    env = {"PYTHONPATH": str(programs), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([python, "-c", PROBE, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_both_fixes_apply_and_change_nothing_the_libraries_build(engine_venv: Path, programs: Path) -> None:
    plain, fixed = imported(engine_venv, programs, "plain"), imported(engine_venv, programs, "fixed")
    assert fixed["applied"] == ["torch._library.utils", "transformers.utils.import_utils"]
    assert len(fixed["models"]) > 1000 and fixed["models"] == plain["models"]
    assert len(fixed["sources"]) > 100 and fixed["sources"] == plain["sources"]
