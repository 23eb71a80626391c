"""`stoker render FILE`: print every child of the VLLMService(s) in FILE as multi-document YAML."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from stoker.api import KIND, VLLMService
from stoker.render.children import render_children


def render_manifest_yaml(manifest: dict[str, Any]) -> str:
    """The children of one VLLMService manifest as multi-document YAML."""
    import yaml  # kept out of import time: the GPU benchmark imports stoker.render without pyyaml

    children = render_children(VLLMService.model_validate(manifest))
    return yaml.safe_dump_all(children, sort_keys=False, default_flow_style=False)


def main(argv: list[str]) -> int:
    import yaml

    parser = argparse.ArgumentParser(prog="stoker render", description=__doc__)
    parser.add_argument("file", help="a YAML file with one or more VLLMService documents ('-' for stdin)")
    options = parser.parse_args(argv)
    try:
        if options.file == "-":
            documents = list(yaml.safe_load_all(sys.stdin))
        else:
            with open(options.file, encoding="utf-8") as stream:
                documents = list(yaml.safe_load_all(stream))
    except (OSError, yaml.YAMLError) as error:
        print(f"stoker render: cannot read {options.file}: {error}", file=sys.stderr)
        return 2
    outputs = []
    for document in documents:
        if not isinstance(document, dict) or document.get("kind") != KIND:
            continue
        try:
            outputs.append(render_manifest_yaml(document))
        except ValidationError as error:
            name = (document.get("metadata") or {}).get("name", "?")
            print(f"stoker render: {KIND} {name} is invalid:\n{error}", file=sys.stderr)
            return 1
    if not outputs:
        print(f"stoker render: no {KIND} in {options.file}", file=sys.stderr)
        return 1
    sys.stdout.write("---\n".join(outputs))
    return 0
