"""Runs inside a vLLM environment (not stoker's): parses argument lists with vLLM's own `vllm serve` parser.

Reads JSON from stdin, {"argvs": [[...], ...], "json_flag_dest": "compilation_config", "json_keys": [...]},
and prints one JSON line per argv: null when vLLM refuses it (with "explain": true, {"refused": its error
message}), else the parsed namespace as {dest: repr(value)}, with the owned keys of the JSON-valued flag as
`<dest>.<key>` entries.
With {"options": true}, it first prints every option of `vllm serve` once, one JSON line each:
{"strings": [...], "takes_value": bool, "nargs": argparse's nargs (null: one value),
"choices": [...] or null}; then the argvs' lines, if the request has argvs.
The parser is built the way `vllm` (vllm/entrypoints/cli/main.py) builds it, from the `serve` subcommand.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser


def serve_parser() -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return parser


def key_value(config: object, key: str) -> object:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def serve_options(parser: FlexibleArgumentParser) -> None:
    (subparsers,) = [action for action in parser._actions if action.dest == "subparser"]
    for action in subparsers.choices["serve"]._actions:
        if action.option_strings:
            choices = [str(choice) for choice in action.choices] if action.choices else None
            line = {
                "strings": action.option_strings,
                "takes_value": action.nargs != 0,
                "nargs": action.nargs,
                "choices": choices,
            }
            print(json.dumps(line), flush=True)


def main() -> None:
    request = json.load(sys.stdin)
    parser = serve_parser()
    if request.get("options"):
        serve_options(parser)
    for argv in request.get("argvs", []):
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
                namespace = vars(parser.parse_args(list(argv)))
        except (SystemExit, Exception) as refusal:
            # argparse prints its message and exits; anything else raised is the message itself.
            message = errors.getvalue().strip().splitlines()[-1:] or [repr(refusal)]
            print(json.dumps({"refused": message[0]}) if request.get("explain") else "null", flush=True)
            continue
        parsed = {dest: repr(value) for dest, value in namespace.items()}
        config = namespace.get(request["json_flag_dest"])
        for key in request["json_keys"]:
            parsed[f"{request['json_flag_dest']}.{key}"] = repr(key_value(config, key))
        print(json.dumps(parsed), flush=True)


if __name__ == "__main__":
    main()
