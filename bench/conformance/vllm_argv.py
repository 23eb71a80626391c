"""Parse `vllm serve` argvs with one vLLM version's own CLI, in that version's venv (no engine is started).

    python vllm_argv.py RESULT.json < ARGVS.json     (ARGVS: {name: ["serve", MODEL, "--flag", ...]})

vLLM's real `main()` builds its parser and runs the serve subcommand's validate(); only the subcommand's
action is replaced by one that stops. RESULT: {name: {"accepted": bool, "error": str | None}}.
Standard library only: it runs under each vLLM venv's interpreter.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


class _Parsed(Exception):
    pass


def _stop(args: object) -> None:
    raise _Parsed


def use_cpu_platform_without_a_device() -> None:
    """A CUDA build on a machine without a GPU cannot infer its platform, and the CLI asks for it while
    building its parser; vLLM's own `vllm bench` then switches to the CPU platform, and so does this."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def check(argv: list[str]) -> tuple[bool, str | None]:
    from vllm.entrypoints.cli import main, serve

    serve.ServeSubcommand.cmd = staticmethod(_stop)  # type: ignore[method-assign]
    sys.argv = ["vllm", *argv]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            main.main()
    except _Parsed:
        return True, None
    except SystemExit as error:
        return False, errors.getvalue().strip()[-2000:] or f"exit {error.code}"
    except Exception as error:  # validate() raises ValueError and friends on rejected values
        return False, f"{type(error).__name__}: {error}"
    return False, "vllm main() returned without running serve"


if __name__ == "__main__":
    result_path = sys.argv[1]  # read before check() replaces sys.argv
    argvs = json.load(sys.stdin)
    use_cpu_platform_without_a_device()
    results = {}
    for name, argv in argvs.items():
        accepted, error = check(argv)
        results[name] = {"accepted": accepted, "error": error}
    with open(result_path, "w") as out:
        json.dump(results, out, indent=1)
