"""The programs stoker runs inside the pods it renders (docs/in-pod-programs.md), each with `--help`:

    python3 -m stoker.inpod.read_ahead   in front of `vllm serve` in serving pods
    python3 -m stoker.inpod.seed         around the seed Job's `vllm serve`
    python3 -m stoker.inpod.download     the download-model init container
    python3 -m stoker.inpod.node_warmer  the node warming DaemonSet's agent
    python3 -m stoker.inpod.engine_init  PID 1 of serving pods made for snapshot and restore

They run in whatever vLLM image a VLLMService names, from a copy of this package (with stoker/__init__.py
and stoker/guard.py) that the `stoker-programs` init container puts on a volume (`stoker programs DIR`):
the standard library only, and nothing of stoker but this package and stoker.guard.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import MutableMapping

PTXAS_ENV = "TRITON_PTXAS_PATH"
PYCACHE_PREFIX_ENV = "PYTHONPYCACHEPREFIX"


def program_parser(module: str, description: str | None, usage: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the program `python3 -m MODULE`, its module docstring its --help."""
    return argparse.ArgumentParser(
        prog=f"python3 -m {module}",
        usage=usage,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def options_and_command(arguments: list[str]) -> tuple[list[str], list[str]]:
    """`arguments` before and after the first `--`: a wrapper's own options, and the command it runs."""
    if "--" not in arguments:
        return arguments, []
    split = arguments.index("--")
    return arguments[:split], arguments[split + 1 :]


def working_directory_first() -> bool:
    """Whether `python3 -m` put the working directory first on sys.path: always but with -P or -I (which
    Python 3.11 added), in an image whose python3 may be older."""
    return not getattr(sys.flags, "safe_path", False)


def _find_package(name: str) -> importlib.machinery.ModuleSpec | None:
    """The image's top-level package `name`, found, not imported; None if it has none (or a broken one)."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def pin_ptxas(environ: MutableMapping[str, str] = os.environ) -> str:
    """Point TRITON_PTXAS_PATH at torch's own ptxas before vLLM starts, unless it is set; returns a line
    that says what it did.

    Why: Triton's kernel cache key holds the version of the ptxas it compiles with, and torch's Inductor sets
    this variable to torch's ptxas (torch 2.11: CUDA 13.0; Triton 3.6 bundles 12.8) in any process where it
    compiles a kernel, so whether a kernel compiled in the engine process is keyed to one ptxas or the other
    depended on what ran first. A start that loads compiled artifacts then missed the Triton cache its seed
    had written and compiled vLLM's own kernels again (bench/results/coldstart-h200-warm2*). Pinned, every
    start of every role keys them alike. Found without importing torch."""
    if PTXAS_ENV in environ:
        return f"{PTXAS_ENV}={environ[PTXAS_ENV]} (set already)"
    torch = _find_package("torch")
    for directory in (torch.submodule_search_locations or []) if torch else []:
        ptxas = os.path.join(directory, "bin", "ptxas")
        if os.path.isfile(ptxas) and os.access(ptxas, os.X_OK):
            environ[PTXAS_ENV] = ptxas
            return f"{PTXAS_ENV}={ptxas}"
    return f"{PTXAS_ENV} not set: no executable torch/bin/ptxas"


def keep_bytecode(directory: str, environ: MutableMapping[str, str] = os.environ) -> str:
    """Where the image holds no bytecode for vLLM, put Python's under `directory` (on the cache volume) for
    this process and the server's, and let them write it; returns a line that says what it did.

    Why: an image installed by uv (the upstream vLLM image) has no .pyc files, and the engine, not root,
    cannot write them beside the image's files, so every start compiles some 5,000 modules again: the API
    server's imports took 29.4 s instead of 15.5 s on this project's CPU host (medians,
    bench/results/bytecode-imports-cpu.txt). Under a prefix on the volume the seed compiles them once and
    serving pods load them; Python checks each against its source's mtime and size, as it would in the
    image. An image with bytecode is left alone: a prefix would make Python ignore it. Found without
    importing vLLM."""
    if PYCACHE_PREFIX_ENV in environ:
        return f"{PYCACHE_PREFIX_ENV}={environ[PYCACHE_PREFIX_ENV]} (set already)"
    vllm = _find_package("vllm")
    if vllm is None or not vllm.origin or not vllm.has_location:
        return "bytecode: no vllm package found, nothing set"
    if os.path.exists(importlib.util.cache_from_source(vllm.origin)):
        return "bytecode: the image has vLLM's"
    environ[PYCACHE_PREFIX_ENV] = directory
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # For a server run in this process (read_ahead --gc deferred): the import system reads these per import.
    sys.pycache_prefix = directory
    sys.dont_write_bytecode = False
    return f"bytecode: the image has none for vLLM, so {PYCACHE_PREFIX_ENV}={directory}"
