"""The owned-flag rule against vLLM's own `vllm serve` parser (0.22.1, 0.26.0, 0.33.0).

For each version, every prefix of every owned flag (with `-` and `_`, the value after `=` or in the next
argument, with no value), dotted and JSON forms of `--compilation-config` / `-cc`, short aliases, `--config
FILE`, `-O` with anything after it, JSON values of other flags naming owned keys, and bare values are
appended to the arguments stoker renders, and vLLM's parser reads them (bench/conformance/vllm_serve_parse.py,
run by a vLLM interpreter). Whenever a spelling changes a value stoker owns, stoker's validator (the pydantic
model; the CRD's CEL rule is the same regex) must refuse it; a set of ordinary user flags must pass both.
The other way round, from vLLM's side: every option of the release's own parser is tried with a set of
values, and each option that reaches an owned value must be refused in every spelling argparse maps to it
(each abbreviation, `_` for `-`), and be one that stoker's list names.

Where it runs: wherever a real vLLM CPU environment exists under ~/.cache/stoker/vllm (hack/vllm-venv on the
`conformance` branch builds ~/.cache/stoker/vllm/<version>). A version without its own environment is
parsed by the newest complete environment's interpreter (for torch, transformers, ...) with that
version's pure-Python source first on PYTHONPATH; only the parser is built, nothing runs. To prepare one
(0.22.1 needs `gguf` from PyPI beside it, 0.33.0 `orjson`):

    pip download --no-deps vllm==0.22.1 -d /tmp/w
    unzip -q /tmp/w/vllm-0.22.1-*.whl -x '*.so' 'vllm/third_party/*' 'vllm-*.dist-info/*' \\
        -d ~/.cache/stoker/vllm/src/0.22.1
    pip install --no-deps --target ~/.cache/stoker/vllm/src/0.22.1-deps gguf

(the dist-info is left out so that vLLM's platform check reads the CPU environment's `+cpu` version).
Without any environment the test is skipped with that reason; `make conformance-flags` sets
STOKER_REQUIRE_CONFORMANCE=1, which turns the skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from bench.conformance import serve_options
from pydantic import ValidationError

from stoker.api import VLLMService
from stoker.api.flags import (
    API_KEY_FLAG,
    JSON_LONG_FLAGS,
    JSON_SHORT_FLAGS,
    OWNED_JSON_KEYS,
    OWNED_LONG_FLAGS,
    OWNED_SHORT_FLAGS,
    sets_owned_flag,
)
from stoker.render import engine_invocation

VERSIONS = ("0.22.1", "0.26.0", "0.33.0")
VLLM_CACHE = Path(os.environ.get("STOKER_CACHE") or Path.home() / ".cache" / "stoker") / "vllm"
JSON_FLAG_DEST = "compilation_config"
# Namespace entries stoker sets (or relies on) through the arguments it renders.
OWNED_DESTS = {
    "model_tag",
    "model",
    "port",
    "host",
    "uds",
    "served_model_name",
    "revision",
    "max_model_len",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "load_format",
    "model_loader_extra_config",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "enforce_eager",
    "enable_sleep_mode",
    *(f"{JSON_FLAG_DEST}.{key}" for key in OWNED_JSON_KEYS),
}
STANDBY_ONLY_DESTS = {"api_key"}
# Values vLLM accepts for each flag, so that a spelling it maps to the flag parses.
VALUES = {
    "model": "other/model",
    "port": "9001",
    "host": "127.0.0.2",
    "uds": "/tmp/other.sock",
    "served-model-name": "other",
    "revision": "v2",
    "max-model-len": "1024",
    "gpu-memory-utilization": "0.5",
    "tensor-parallel-size": "2",
    "load-format": "safetensors",
    "model-loader-extra-config": '{"concurrency": 2}',
    "cudagraph-capture-sizes": "8",
    "max-cudagraph-capture-size": "8",
    "compilation-config": '{"cudagraph_mode": "NONE", "max_cudagraph_capture_size": 8}',
    "api-key": "secret",
}
OWNED_JSON = VALUES["compilation-config"]
# Issue 23, item 5: `-O` with JSON or a key after it, older vLLM's capture-sizes flag, owned compilation keys
# inside other flags' JSON values. stoker refuses each; the test prints what each release makes of them.
ROUTES_AROUND_CAPTURE_SIZES = [
    ["-O", OWNED_JSON],
    [f"-O{OWNED_JSON}"],
    [f"-O={OWNED_JSON}"],
    ["-O.cudagraph_capture_sizes=[8]"],
    ["-O=.cudagraph_mode=NONE"],
    ["-O4"],
    ["--cuda-graph-sizes", "8"],
    ["--cuda-graph-sizes=8,16"],
    *(
        [flag, value]
        for flag in ("--speculative-config", "--additional-config", "--hf-overrides", "--kv-transfer-config")
        for value in (f'{{"compilation_config": {OWNED_JSON}}}', OWNED_JSON)
    ),
]
KEY_VALUES = {"cudagraph_capture_sizes": "[8]", "max_cudagraph_capture_size": "8", "cudagraph_mode": "NONE"}
BENIGN = [
    ["--max-num-seqs", "64"],
    ["--max_num_seqs=64"],
    ["--enable-prefix-caching"],
    ["--kv-cache-dtype", "fp8"],
    ["--trust-remote-code"],
    ["--model-impl", "vllm"],
    ["--seed", "1"],
    ["-O0"],
    ["-q", "fp8"],
    ["--dtype=bfloat16", "--max-num-batched-tokens", "8192"],
]


def manifest(extra_args: list[str], standby: bool) -> dict[str, Any]:
    cold_start: dict[str, Any] = {"standby": {}} if standby else {}
    return {
        "metadata": {"name": "conformance"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "runtime": {"extraArgs": extra_args},
            "coldStart": cold_start,
        },
    }


def accepted(extra_args: list[str], standby: bool) -> bool:
    try:
        VLLMService.model_validate(manifest(extra_args, standby))
    except ValidationError:
        return False
    return True


def rendered_argv(standby: bool) -> list[str]:
    """`vllm serve` and the arguments stoker renders for a serving pod (before any extraArgs)."""
    return ["serve", *engine_invocation(VLLMService.model_validate(manifest([], standby)), "serve").args]


def candidates(config_file: Path) -> list[list[str]]:
    spellings: list[list[str]] = [["128"], ["-1"], ["--", "8"], ["--port=9001\n"], ["--port", " 9001"]]
    for name in (*OWNED_LONG_FLAGS, *JSON_LONG_FLAGS, API_KEY_FLAG):
        value = str(config_file) if name == "config" else VALUES.get(name, "x")
        for end in range(1, len(name) + 1):
            for prefix in {name[:end], name[:end].replace("-", "_")}:
                flag = f"--{prefix}"
                spellings += [[flag], [flag, value], [f"{flag}={value}"]]
    for name in OWNED_SHORT_FLAGS:
        for end in range(1, len(name) + 1):
            flag = f"-{name[:end]}"
            spellings += [[flag, "2"], [f"{flag}=2"], [f"{flag}2"], [f"{flag}.x=2"]]
    json_flags = [f"--{n[:end]}" for n in JSON_LONG_FLAGS for end in range(1, len(n) + 1)]
    json_flags += [f"--{n.replace('-', '_')}" for n in JSON_LONG_FLAGS]
    json_flags += [f"-{n[:end]}" for n in JSON_SHORT_FLAGS for end in range(1, len(n) + 1)]
    json_flags += ["-O"]
    for flag in json_flags:
        spellings.append([flag, VALUES["compilation-config"]])
        for key, value in KEY_VALUES.items():
            for spelled in {key, key.replace("_", "-")}:
                spellings += [[f"{flag}.{spelled}={value}"], [f"{flag}.{spelled}", value]]
                spellings.append([f"{flag}.{spelled}+=8,16"])
    spellings += [["-O3"], ["-O", "3"], ["-O.cudagraph_mode=NONE"], ["--config", str(config_file)]]
    return spellings + ROUTES_AROUND_CAPTURE_SIZES


def ask_vllm(version: str, request: dict[str, Any]) -> list[Any]:
    """The runner's JSON lines for `request`, from `version`'s own parser (skipped without one)."""
    try:
        return serve_options.ask_vllm(version, request)
    except LookupError as missing:
        if os.environ.get("STOKER_REQUIRE_CONFORMANCE"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


def parse_with_vllm(version: str, argvs: list[list[str]]) -> list[dict[str, str] | None]:
    request = {"argvs": argvs, "json_flag_dest": JSON_FLAG_DEST, "json_keys": list(OWNED_JSON_KEYS)}
    parsed = ask_vllm(version, request)
    assert len(parsed) == len(argvs), f"vLLM {version} answered {len(parsed)} of {len(argvs)} argument lists"
    return parsed


@pytest.mark.parametrize("version", VERSIONS)
def test_every_spelling_vllm_maps_to_an_owned_value_is_refused(version: str, tmp_path: Path) -> None:
    config_file = tmp_path / "stoker.yaml"
    config_file.write_text("port: 9001\ntensor-parallel-size: 2\n")
    spellings = candidates(config_file)
    cases = [(standby, extra) for standby in (False, True) for extra in [[], *spellings, *BENIGN]]
    parsed = parse_with_vllm(version, [rendered_argv(standby) + extra for standby, extra in cases])

    baselines = {standby: parsed[i] for i, (standby, extra) in enumerate(cases) if not extra}
    assert all(baselines.values()), "vLLM refused stoker's own arguments"
    slipped, owned_hits = [], set()
    for (standby, extra), namespace in zip(cases, parsed, strict=True):
        if namespace is None or not extra:
            continue  # vLLM refuses it: the pod would fail to start, but stoker's values hold
        dests = OWNED_DESTS | (STANDBY_ONLY_DESTS if standby else set())
        changed = {d for d in dests if namespace.get(d) != baselines[standby].get(d)}
        if extra in BENIGN:
            assert not changed, f"benign {extra} changed {changed} in vLLM {version}"
            assert accepted(extra, standby), f"benign {extra} refused"
        elif changed:
            owned_hits.add(tuple(extra))
            if accepted(extra, standby):
                slipped.append((extra, sorted(changed), standby))
    assert not slipped, f"vLLM {version} reads these as owned flags, stoker accepts them: {slipped}"
    refused_by_vllm = sum(namespace is None for namespace in parsed)
    print(
        f"vLLM {version}: {len(cases)} argument lists, {refused_by_vllm} refused by vLLM,"
        f" {len(owned_hits)} spellings reach a value stoker owns, all refused by stoker"
    )
    baseline = baselines[False] or {}
    for route in ROUTES_AROUND_CAPTURE_SIZES:
        parsed_route = parsed[cases.index((False, route))]
        if parsed_route is None:
            what = "refused by vLLM"
        else:
            moved = sorted(d for d in OWNED_DESTS if parsed_route.get(d) != baseline.get(d))
            what = f"changes {moved or 'nothing stoker owns'}"
        print(f"  {route}: {what}; refused by stoker")
        assert not accepted(route, standby=False), route
    # The spellings from the issue are real: vLLM maps them to owned values, and they are refused above.
    for spelling in (["--por=9001"], ["--load-form=safetensors"], ["--served-model=other"], ["128"]):
        assert tuple(spelling) in owned_hits, f"{spelling} did not reach an owned value in vLLM {version}"


def option_values(option: dict[str, Any], config_file: Path) -> list[list[str]]:
    """Values to try an option with: none for a switch; else a port (an integer, a number or a string),
    JSON setting owned compilation keys, a config file, and its first and last choice."""
    if not option["takes_value"]:
        return [[]]
    choices = option["choices"] or []
    values = ["9001", VALUES["compilation-config"], str(config_file), *choices[:1], *choices[-1:]]
    return [[value] for value in dict.fromkeys(values)]


def spellings_of(string: str, same_option: list[str], every_string: list[str]) -> set[str]:
    """Every argument argparse (allow_abbrev) reads as option string `string`: itself, and each prefix of it
    that starts no string of another option (`same_option` are its own option's), also with `_` for `-` in
    the name, as vLLM accepts it."""
    spellings = {string}
    if string.startswith("--"):
        for end in range(3, len(string)):
            prefix = string[:end]
            if all(other in same_option for other in every_string if other.startswith(prefix)):
                spellings |= {prefix, "--" + prefix[2:].replace("-", "_")}
    return spellings


@pytest.mark.parametrize("version", VERSIONS)
def test_every_option_of_vllms_parser_that_reaches_an_owned_value_is_refused(
    version: str, tmp_path: Path
) -> None:
    config_file = tmp_path / "stoker.yaml"
    config_file.write_text("port: 9001\ntensor-parallel-size: 2\n")
    listing = ask_vllm(version, {"options": True})
    options = [option["strings"] for option in listing]
    assert len(options) > 100, f"vLLM {version} listed {len(options)} options"
    # With standby stoker renders all it owns, --enable-sleep-mode included (which a user may add without).
    cases = [
        (string, [string, *value])
        for option in listing
        for string in option["strings"]
        for value in option_values(option, config_file)
    ]
    rendered = rendered_argv(standby=True)
    baseline, *parsed = parse_with_vllm(version, [rendered, *(rendered + extra for _, extra in cases)])
    assert baseline, "vLLM refused stoker's own arguments"
    reaching: dict[str, set[str]] = {}
    for (string, _), namespace in zip(cases, parsed, strict=True):
        changed = {d for d in OWNED_DESTS if namespace is not None and namespace.get(d) != baseline.get(d)}
        if changed:
            reaching.setdefault(string, set()).update(changed)
    every_string = [string for strings in options for string in strings]
    own_option = {string: strings for strings in options for string in strings}
    unrefused = {
        spelling: sorted(dests)
        for string, dests in reaching.items()
        for spelling in spellings_of(string, own_option[string], every_string)
        if not (sets_owned_flag(spelling) and sets_owned_flag(f"{spelling}=x"))
    }
    print(
        f"vLLM {version}: {len(options)} options, {len(cases)} tries;"
        f" these reach a value stoker owns: {sorted(reaching)}"
    )
    assert not unrefused, f"vLLM {version} reads these as owned options, stoker accepts them: {unrefused}"
    # stoker's list is complete: each option string that reaches an owned value is one that it names.
    listed = {f"--{name}" for name in (*OWNED_LONG_FLAGS, *JSON_LONG_FLAGS)}
    listed |= {f"-{name}" for name in (*OWNED_SHORT_FLAGS, *JSON_SHORT_FLAGS)}
    assert set(reaching) <= listed, f"vLLM {version}: not in stoker's list: {set(reaching) - listed}"
    # And no more: of the release's own option strings, stoker refuses only those it lists.
    refused = {string for string in every_string if sets_owned_flag(string)}
    assert refused <= listed, f"vLLM {version}: refused, not owned: {refused - listed}"
