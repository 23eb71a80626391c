"""`stoker render FILE`: print every child of the VLLMService(s) in FILE as multi-document YAML.

Every VLLMService document must be one the API server would accept: apiVersion and kind exactly as the
CRD serves them, and a valid spec. Documents of other API groups (a Secret beside the service) are skipped.
Every bad document is reported, and nothing is printed to stdout unless all of them render.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from stoker.api import API_VERSION, GROUP, KIND, VLLMService, user_message
from stoker.render.children import render_children

EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def render_manifest_yaml(manifest: dict[str, Any]) -> str:
    """The children of one VLLMService manifest as multi-document YAML."""
    import yaml  # kept out of import time: the GPU benchmark imports stoker.render without pyyaml

    children = render_children(VLLMService.model_validate(manifest))
    return yaml.safe_dump_all(children, sort_keys=False, default_flow_style=False)


def _meant_as_vllm_service(document: dict[str, Any]) -> bool:
    """A document aimed at stoker's API: its group, or its kind in any case or spelling of the plural."""
    group = str(document.get("apiVersion") or "").split("/")[0]
    kind = str(document.get("kind") or "").lower()
    return group == GROUP or kind.rstrip("s") == KIND.lower()


def document_error(document: Any) -> str | None:
    """Why `document` is not something `kubectl apply` would accept, or None."""
    if not isinstance(document, dict):
        return f"is a {type(document).__name__}, not a Kubernetes object"
    missing = [field for field in ("apiVersion", "kind") if not document.get(field)]
    if missing:
        return f"has no {' and no '.join(missing)}"
    if _meant_as_vllm_service(document) and (document["apiVersion"], document["kind"]) != (API_VERSION, KIND):
        return (
            f"has apiVersion {document['apiVersion']!r} and kind {document['kind']!r};"
            f" a VLLMService needs apiVersion {API_VERSION!r} and kind {KIND!r}"
        )
    return None


def _label(index: int, document: Any) -> str:
    name = (document.get("metadata") or {}).get("name") if isinstance(document, dict) else None
    return f"document {index}" + (f" ({name})" if name else "")


def load_documents(file: str) -> list[Any]:
    import yaml

    if file == "-":
        return list(yaml.safe_load_all(sys.stdin))
    with open(file, encoding="utf-8") as stream:
        return list(yaml.safe_load_all(stream))


def main(argv: list[str]) -> int:
    import yaml

    parser = argparse.ArgumentParser(
        prog="stoker render",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 rendered, 1 an invalid or missing VLLMService,"
        " 2 an unreadable file or bad YAML.",
    )
    parser.add_argument("file", help="a YAML file with one or more VLLMService documents ('-' for stdin)")
    options = parser.parse_args(argv)
    try:
        documents = load_documents(options.file)
    except OSError as error:
        print(f"stoker render: cannot read {options.file}: {error.strerror or error}", file=sys.stderr)
        return EXIT_UNREADABLE
    except yaml.YAMLError as error:
        print(f"stoker render: {options.file} is not valid YAML: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    except UnicodeDecodeError as error:
        print(f"stoker render: {options.file} is not UTF-8 text: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    errors: list[str] = []
    outputs: list[str] = []
    # Empty documents (a stray `---`) are skipped, as kubectl does.
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        problem = document_error(document)
        if problem:
            errors.append(f"{_label(index, document)} {problem}")
        elif document["kind"] == KIND:
            try:
                outputs.append(render_manifest_yaml(document))
            except ValidationError as invalid:
                errors.append(f"{_label(index, document)}: {KIND} is invalid:\n{user_message(invalid)}")
    if errors:
        for message in errors:
            print(f"stoker render: {options.file}: {message}", file=sys.stderr)
        return EXIT_INVALID
    if not outputs:
        what = "is empty" if all(document is None for document in documents) else f"has no {KIND}"
        print(f"stoker render: {options.file} {what}", file=sys.stderr)
        return EXIT_INVALID
    sys.stdout.write("---\n".join(outputs))
    return 0
