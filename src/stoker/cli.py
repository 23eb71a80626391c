"""The `stoker` command: run the operator, render a VLLMService's children, parse a startup log, predict
one, or copy the programs stoker runs in its pods into a directory (what the pods' init container does)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import stoker

COMMANDS = ["run", "render", "phases", "predict", "programs"]


def copy_programs(directory: Path) -> list[Path]:
    """Copy the programs stoker runs in its pods under `directory`, as the package tree that
    `PYTHONPATH=DIRECTORY python3 -m stoker.inpod.NAME` imports: stoker/__init__.py, stoker/guard.py and
    stoker/inpod/*.py, all of them standard library only. Returns the files written."""
    package = Path(stoker.__file__).parent
    sources = [package / "__init__.py", package / "guard.py", *sorted((package / "inpod").glob("*.py"))]
    written = []
    for source in sources:
        target = directory / "stoker" / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    return written


def programs_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stoker programs",
        description="Copy the programs stoker runs in its pods (stoker.inpod, stoker.guard) into DIRECTORY,"
        " for `PYTHONPATH=DIRECTORY python3 -m stoker.inpod.read_ahead --help` and the like in any image"
        " with python3. The seed and serving pods' stoker-programs init container runs it.",
    )
    parser.add_argument("directory", type=Path, help="where to copy them (created if absent)")
    options = parser.parse_args(argv)
    written = copy_programs(options.directory)
    print(f"stoker programs: {len(written)} files in {options.directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="stoker", description=__doc__)
    parser.add_argument("command", choices=COMMANDS, help="what to do")
    if args[:1] in (["-h"], ["--help"]):
        parser.print_help()
        return 0
    if not args or args[0] not in COMMANDS:
        parser.print_help(sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    # Each subcommand owns its arguments; imports stay lazy so `render` and `phases` need no cluster libs.
    if command == "run":
        from stoker.controller.main import main as run_main

        return run_main(rest)
    if command == "render":
        from stoker.render.cli import main as render_main

        return render_main(rest)
    if command == "predict":
        from stoker.predict.cli import main as predict_main

        return predict_main(rest)
    if command == "programs":
        return programs_main(rest)
    from stoker.phases.cli import main as phases_main

    return phases_main(rest)


if __name__ == "__main__":
    sys.exit(main())
