"""The `stoker` command: run the operator, render a VLLMService's children, parse a startup log, predict
one."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="stoker", description=__doc__)
    parser.add_argument("command", choices=["run", "render", "phases", "predict"], help="what to do")
    if args[:1] in (["-h"], ["--help"]):
        parser.print_help()
        return 0
    if not args or args[0] not in {"run", "render", "phases", "predict"}:
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
    from stoker.phases.cli import main as phases_main

    return phases_main(rest)


if __name__ == "__main__":
    sys.exit(main())
