"""The programs stoker runs inside the pods it renders (docs/in-pod-programs.md), each with `--help`:

    python3 -m stoker.inpod.read_ahead   in front of `vllm serve` in serving pods
    python3 -m stoker.inpod.seed         around the seed Job's `vllm serve`
    python3 -m stoker.inpod.download     the download-model init container
    python3 -m stoker.inpod.node_warmer  the node warming DaemonSet's agent

They run in whatever vLLM image a VLLMService names, from a copy of this package (with stoker/__init__.py
and stoker/guard.py) that the `stoker-programs` init container puts on a volume (`stoker programs DIR`):
the standard library only, and nothing of stoker but this package and stoker.guard.
"""

from __future__ import annotations

import argparse
import sys


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
