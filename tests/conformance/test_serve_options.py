"""The stored `vllm serve` options (src/stoker/engines/serve_options.txt) and stoker's reading of extraArgs,
against each release's own parser.

For each release the file stores: its list equals what its parser has, and for every option string, with and
without a value, glued or not, abbreviated, with `_`, and for stray values, unknown flags and ambiguous
prefixes, stoker refuses what vLLM refuses for the arguments' shape (unknown, ambiguous, a value missing or
too many) and accepts what vLLM accepts; a value's type or choices are vLLM's to judge.
Environments as in bench/conformance/serve_options.py; without one the release is skipped, and with
STOKER_REQUIRE_CONFORMANCE=1 (`make conformance-flags`, which prepares every release) that fails.
"""

from __future__ import annotations

import os

import pytest
from bench.conformance import serve_options as real

from stoker.api import VLLMService
from stoker.engines.serve_options import ServeOption, check_extra_args, stored_options
from stoker.render import engine_invocation

# argparse's words for a refusal of the arguments' shape (the rest are about a value's type or choices).
SHAPE_REFUSALS = (
    "unrecognized arguments",
    "ambiguous option",
    "expected ",  # one argument, at least one argument, N arguments
    "ignored explicit argument",
)


def real_options(release: str) -> list[ServeOption]:
    try:
        return real.serve_options(release)
    except LookupError as missing:
        if os.environ.get("STOKER_REQUIRE_CONFORMANCE"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


def candidates(options: list[ServeOption]) -> list[list[str]]:
    every = [string for option in options for string in option.strings]
    argvs = [["--max-batch-size", "8"], ["--max", "8"], ["--seed", "1", "2"], ["-O0"], ["-O", "3"], ["-x"]]
    for string in every:
        argvs += [[string], [string, "1"], [f"{string}=1"], [string, "1", "2"]]
        if string.startswith("--"):
            # An abbreviation (unique or not), `_` for `-`, a dotted key.
            underscored = "--" + string[2:].replace("-", "_")
            argvs += [[string[: (len(string) + 2) // 2], "1"], [underscored, "1"], [f"{string}.key=1"]]
        else:
            argvs += [[f"{string}1"]]
    return argvs


def accepted(answer: dict[str, str] | None) -> bool:
    return answer is not None and "refused" not in answer


def shape_refused(answer: dict[str, str] | None) -> bool:
    return answer is not None and "refused" in answer and any(s in answer["refused"] for s in SHAPE_REFUSALS)


@pytest.mark.timeout(900)  # two starts of vLLM's CLI and a few thousand parses
@pytest.mark.parametrize("release", sorted(stored_options(), key=lambda r: tuple(map(int, r.split(".")))))
def test_stored_options_and_their_reading_match_the_real_parser(release: str) -> None:
    options = real_options(release)
    assert set(stored_options()[release]) == set(options), (
        f"serve_options.txt differs from vLLM {release}'s parser: python -m bench.conformance.serve_options"
    )
    argvs = [list(argv) for argv in dict.fromkeys(map(tuple, candidates(options)))]
    model = VLLMService.model_validate(
        {"metadata": {"name": "c"}, "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}}
    )
    rendered = ["serve", *engine_invocation(model, "serve").args]
    answers = real.ask_vllm(
        release,
        {
            "argvs": [rendered + argv for argv in argvs],
            "explain": True,
            "json_flag_dest": "compilation_config",
            "json_keys": [],
        },
    )
    assert len(answers) == len(argvs)
    assert not shape_refused(answers[argvs.index(["-O0"])])
    # argparse stops at the first error, and a value's type or choices are vLLM's to judge: so stoker must
    # refuse every argument list whose shape vLLM refuses, and accept every one vLLM accepts whole.
    disagree = []
    for argv, answer in zip(argvs, answers, strict=True):
        refused = check_extra_args(argv, release)
        if (shape_refused(answer) and refused is None) or (accepted(answer) and refused is not None):
            disagree.append((argv, answer, refused))
    print(
        f"vLLM {release}: {len(options)} options, {len(argvs)} argument lists, {len(disagree)} disagreements"
    )
    assert not disagree[:20], f"vLLM {release} and stoker disagree: {disagree[:20]}"
