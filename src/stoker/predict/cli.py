"""`stoker predict MODEL_DIR [-f FILE] [--json] [--hardware KEY] [--cache hit|miss] [--host-facts JSON |
--measure-host]`: expected startup.

Reads the model's facts from MODEL_DIR (a Hugging Face layout: config.json, weights, tokenizer), renders
the serving pod's `vllm serve` for the VLLMService in FILE (without one: stoker's defaults for a service of
that model), and prints the expected engine phases from the shipped coefficients of its hardware class
(`--hardware` overrides the class the service's GPU product, GPU count and engine version name). With
the facts of the host the start runs on (`--host-facts`, as the seed reports them in
status.startup.model.host, or `--measure-host` on that host), a set fitted on another host is scaled to it.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any

from pydantic import ValidationError

from stoker.api import API_VERSION, KIND, VLLMService, user_message
from stoker.inpod.facts import read_model_facts
from stoker.inpod.host import measure_host
from stoker.predict.model import EngineSettings, HardwareClass, HostFacts, ModelFacts, Prediction
from stoker.predict.predictor import predict, regime_of
from stoker.predict.service import hardware_class, service_settings
from stoker.predict.shipped import NoShippedCoefficients, shipped_coefficients

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2
LINE_WIDTH = 100  # where the text output wraps an entry that runs on for a paragraph


class _Refused(Exception):
    """A clear message for stderr and the exit status that goes with it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stoker predict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 predicted, 1 an invalid or missing VLLMService in FILE, 2 bad usage, an"
        " unreadable model directory or file.",
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="local model directory")
    parser.add_argument("-f", "--filename", metavar="FILE", help="a YAML file with one VLLMService")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--hardware", metavar="KEY", help="e.g. NVIDIA-H100-80GB-HBM3_x1_v0.26")
    host = parser.add_mutually_exclusive_group()
    host.add_argument(
        "--host-facts",
        metavar="JSON",
        help='the host\'s facts, e.g. \'{"cpuSeconds": 0.052, "diskBytesPerSecond": 1.9e9}\'',
    )
    host.add_argument(
        "--measure-host", action="store_true", help="measure this machine (about 2 s) and predict for it"
    )
    parser.add_argument(
        "--cache",
        choices=["hit", "miss"],
        default="hit",
        help="expected compile cache (default: hit, seeded)",
    )
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:
        return EXIT_UNREADABLE if exit_request.code else EXIT_OK
    try:
        document = _prediction_document(arguments)
    except _Refused as refusal:
        print(f"stoker predict: {refusal}", file=sys.stderr)
        return refusal.status
    print(json.dumps(document, indent=2) if arguments.json else format_table(document))
    return EXIT_OK


def _prediction_document(arguments: argparse.Namespace) -> dict[str, Any]:
    try:
        facts = ModelFacts.model_validate(read_model_facts(arguments.model_dir))
    except (ValueError, OSError) as error:
        raise _Refused(str(error), EXIT_UNREADABLE) from None
    facts = facts.model_copy(update={"host": _host(arguments)})
    if facts.checkpoint_bytes == 0:
        print(
            f"stoker predict: warning: no weights (*.safetensors, *.bin, *.pt) in {arguments.model_dir}:"
            " weight loading is predicted for 0 bytes",
            file=sys.stderr,
        )
    svc = _service(arguments.filename, arguments.model_dir)
    try:
        hardware = HardwareClass.from_key(arguments.hardware) if arguments.hardware else hardware_class(svc)
        settings = service_settings(svc, arguments.cache)
    except ValueError as error:
        raise _Refused(str(error), EXIT_UNREADABLE) from None
    try:
        coefficients = shipped_coefficients(hardware)
    except NoShippedCoefficients as error:
        raise _Refused(str(error), EXIT_UNREADABLE) from None
    prediction = predict(facts, settings, coefficients)
    return {
        "modelDir": arguments.model_dir,
        "hardware": hardware.key,
        "facts": facts.to_json_dict(),
        "settings": settings.to_json_dict(),
        "regimes": {phase: regime_of(phase, settings) for phase in prediction.phases},
        "prediction": prediction.to_json_dict(),
        "fittedOn": coefficients.fitted_on,
    }


def _host(arguments: argparse.Namespace) -> HostFacts | None:
    try:
        if arguments.host_facts is not None:
            return HostFacts.model_validate_json(arguments.host_facts)
        if arguments.measure_host:
            return HostFacts.model_validate(measure_host(arguments.model_dir))
    except ValidationError as invalid:
        raise _Refused(f"host facts: {user_message(invalid)}", EXIT_UNREADABLE) from None
    return None


def _service(filename: str | None, model_dir: str) -> VLLMService:
    if filename is None:
        # stoker's defaults for a service of this model.
        return VLLMService.model_validate(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": "predict"},
                "spec": {"model": {"name": model_dir}},
            }
        )
    import yaml

    from stoker.render.cli import document_error, load_documents

    try:
        documents = load_documents(filename)
    except OSError as error:
        raise _Refused(f"cannot read {filename}: {error.strerror or error}", EXIT_UNREADABLE) from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise _Refused(f"{filename} is not valid YAML: {error}", EXIT_UNREADABLE) from None
    services = []
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        problem = document_error(document)
        if problem:
            raise _Refused(f"{filename}: document {index} {problem}", EXIT_INVALID)
        if document["kind"] == KIND:
            try:
                services.append(VLLMService.model_validate(document))
            except ValidationError as invalid:
                raise _Refused(
                    f"{filename}: document {index}: {KIND} is invalid:\n{user_message(invalid)}", EXIT_INVALID
                ) from None
    if len(services) != 1:
        raise _Refused(f"{filename} holds {len(services)} {KIND}s; stoker predict takes one", EXIT_INVALID)
    return services[0]


def format_table(document: dict[str, Any]) -> str:
    prediction = Prediction.model_validate(document["prediction"])
    facts = ModelFacts.model_validate(document["facts"])
    settings = EngineSettings.model_validate(document["settings"])
    rows = [("phase", "seconds", "regime")]
    for phase, seconds in prediction.phases.items():
        regime = document["regimes"][phase]
        used = prediction.fallbacks.get(phase)
        rows.append((phase, f"{seconds:.2f}", f"{regime} (no fit; used {used})" if used else regime))
    rows.append(("total", f"{prediction.total_seconds:.2f}", ""))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{name:<{width}}  {seconds:>8}  {regime}".rstrip() for name, seconds, regime in rows]
    lines.append(
        f"model: {document['modelDir']}: {facts.layers} layers, hidden {facts.hidden_size},"
        f" {facts.checkpoint_bytes / 1e9:.2f} GB checkpoint, tokenizer {facts.tokenizer_bytes / 1e6:.2f} MB"
        + (f", MoE with {facts.experts} experts" if facts.moe else "")
    )
    compiled = "compiled" if settings.compiled else "not compiled"
    loader = f"{settings.loader} (read ahead)" if settings.read_ahead else settings.loader
    lines.append(
        f"settings: loader {loader}, {compiled}, {settings.capture_sizes} capture sizes,"
        f" tensor parallel {settings.tensor_parallel}, cache {settings.cache_state},"
        f" engine {'forked' if settings.forked_engine else 'spawned'}"
        + (", mega AOT" if settings.mega_aot_artifact else "")
        + (", sleep mode" if settings.sleep_mode else "")
    )
    lines.append(f"coefficients: {prediction.coefficient_set} ({prediction.source})")
    if facts.host is not None:
        lines.append(f"  scaled from its host to this one: {json.dumps(facts.host.to_json_dict())}")
    if prediction.coefficient_set != document["hardware"]:
        lines.append(f"  no set for {document['hardware']}: the nearest shipped set stands in")
    # An entry can be a paragraph (where a merged set's regimes came from): wrapped to a terminal's width.
    lines.extend(
        textwrap.fill(
            entry,
            LINE_WIDTH,
            initial_indent="  fitted on: ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        for entry in document["fittedOn"]
    )
    return "\n".join(lines)
