"""The stored `vllm serve` options (src/stoker/engines/serve_options.txt) and stoker's reading of extraArgs,
against each release's own parser.

For each release the file stores: its list equals what its parser has, and for every option string, with and
without a value, glued or not, abbreviated, with `_`, and for stray values, unknown flags and ambiguous
prefixes, stoker refuses what vLLM refuses for the arguments' shape (unknown, ambiguous, a value missing or
too many; stoker refuses it by its shape or as a flag it owns) and its reading of the shape accepts what vLLM
accepts; a value's type or choices are vLLM's to judge. One vLLM interpreter per release answers both; all
are asked at the first test and run two at a time (each is mostly vLLM's imports, one core's work).
Environments as in bench/conformance/serve_options.py; without one the release is skipped, and with
STOKER_REQUIRE_CONFORMANCE=1 (`make conformance-flags`, which prepares every release) that fails.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from bench.conformance import serve_options as real

from stoker.api import VLLMService
from stoker.api.flags import FIRST_ARG_REGEX, sets_owned_flag
from stoker.engines.serve_options import check_extra_args, stored_options
from stoker.render import engine_invocation

# argparse's words for a refusal of the arguments' shape (the rest are about a value's type or choices).
SHAPE_REFUSAL = re.compile(
    r"unrecognized arguments|ambiguous option|ignored explicit argument"
    r"|expected (one|at most one|at least one|\d+) arguments?"
)


RELEASES = sorted(stored_options(), key=lambda r: tuple(map(int, r.split("."))))


def parsed(release: str) -> list[dict[str, object] | None]:
    try:
        return asked()[release].result()
    except LookupError as missing:
        if os.environ.get("STOKER_REQUIRE_CONFORMANCE"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


def stoker_refuses(argv: list[str], release: str) -> bool:
    """Whether extraArgs `argv` is refused (api.models: owned flags, the first argument, the shape)."""
    owned = any(sets_owned_flag(arg) for arg in argv) or not re.match(FIRST_ARG_REGEX, argv[0])
    return owned or check_extra_args(argv, release) is not None


def candidates(strings: list[str]) -> list[list[str]]:
    every = strings
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
    return answer is not None and "refused" in answer and SHAPE_REFUSAL.search(answer["refused"]) is not None


def argument_lists(release: str) -> list[list[str]]:
    """The candidates, from the stored list (the parser's own list, asked in the same run, must equal it)."""
    strings = [string for option in stored_options()[release] for string in option.strings]
    return [list(argv) for argv in dict.fromkeys(map(tuple, candidates(strings)))]


@functools.cache
def asked() -> dict[str, Future[list[dict[str, object] | None]]]:
    model = VLLMService.model_validate(
        {"metadata": {"name": "c"}, "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}}}
    )
    rendered = ["serve", *engine_invocation(model, "serve").args]
    runners = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vllm-parser")
    return {
        release: runners.submit(
            real.ask_vllm,
            release,
            {
                "options": True,
                "argvs": [rendered + argv for argv in argument_lists(release)],
                "explain": True,
                "json_flag_dest": "compilation_config",
                "json_keys": [],
            },
        )
        for release in RELEASES
    }


@pytest.mark.timeout(900)  # one start of vLLM's CLI and a few thousand parses, asked in the tests' order
@pytest.mark.parametrize("release", RELEASES)
def test_stored_options_and_their_reading_match_the_real_parser(release: str) -> None:
    stored = stored_options()[release]
    argvs = argument_lists(release)
    lines = parsed(release)
    listed, answers = lines[: len(lines) - len(argvs)], lines[len(lines) - len(argvs) :]
    assert set(stored) == set(real.options_of(listed)), (
        f"serve_options.txt differs from vLLM {release}'s parser: python -m bench.conformance.serve_options"
    )
    assert not shape_refused(answers[argvs.index(["-O0"])])
    # argparse stops at the first error, and a value's type or choices are vLLM's to judge: so stoker must
    # refuse every argument list whose shape vLLM refuses, and its reading of the shape must accept every
    # one vLLM accepts whole.
    disagree = []
    for argv, answer in zip(argvs, answers, strict=True):
        shape = check_extra_args(argv, release)
        if (shape_refused(answer) and not stoker_refuses(argv, release)) or (accepted(answer) and shape):
            disagree.append((argv, answer, shape))
    refusals = sum(shape_refused(answer) for answer in answers)
    print(
        f"vLLM {release}: {len(stored)} options, {len(argvs)} argument lists, {refusals} refused by their"
        f" shape, {len(disagree)} disagreements"
    )
    assert not disagree[:20], f"vLLM {release} and stoker disagree: {disagree[:20]}"
