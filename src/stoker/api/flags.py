"""Which `extraArgs` set a flag stoker owns, in every spelling vLLM's argument parser accepts.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, the same in 0.22.1, 0.26.0 and 0.33.0) on top
of Python's argparse accepts, for a long flag `--tensor-parallel-size`:
- any unique prefix (`--tensor-par`, argparse's abbreviations; an ambiguous prefix is an error),
- `_` for `-` in the name (`--tensor_parallel-size`), with the value after `=` or in the next argument,
- a dotted key (`--name.key value`), which it turns into `--name '{"key": value}'`;
for a short alias (`-tp`, `-cc`) any prefix, `=`, and dotted keys; `--config FILE` reads any flag from a
YAML file. `-O<x>` and `-O=<x>` become `--optimization-level <x>`, an integer: `-O0` to `-O3` are left to the
user (they tune compilation the same way for the seed and the serving pods, and explicit capture sizes
still win); any other `-O...` (`-O{json}`, `-O.key=v`, which older vLLM read as a compilation config) is
refused, as is any argument that names a compilation key stoker owns (in a JSON value of any flag, in any
case, `-` or `_`).

One regular expression, built here from the data below, decides: the CRD's CEL rule and the pydantic
validator both use `OWNED_FLAG_REGEX`, and `tests/conformance/test_owned_flags_parser.py` checks it against
vLLM's real parser: every option of each supported release that reaches an owned value must be listed here
(that is how 0.33's `--device-memory-utilization` was found), and no other option string is refused.
Denying every prefix of an owned name is safe: a prefix that also starts a flag stoker does not own is
ambiguous, which vLLM refuses anyway.
"""

from __future__ import annotations

import re

# Long flags (without the leading `--`) stoker sets from spec fields, or that would move the server off
# its probes, split the seed from the serving pods, or (config) read any of these from a file.
OWNED_LONG_FLAGS = (
    "model",
    "port",
    "host",
    "uds",
    "served-model-name",
    "revision",
    "max-model-len",
    "gpu-memory-utilization",
    # 0.33's second name for it.
    "device-memory-utilization",
    "tensor-parallel-size",
    "load-format",
    "model-loader-extra-config",
    "cudagraph-capture-sizes",
    "max-cudagraph-capture-size",
    "enforce-eager",
    "no-enforce-eager",
    "config",
    # Older vLLM's name for the capture sizes; no supported release has it, and none may bring it back.
    "cuda-graph-sizes",
    # Standby needs sleep mode; 0.33 also spells its negation --disable-sleep-mode.
    "no-enable-sleep-mode",
    "disable-sleep-mode",
)
# The parallel layout (runtime.pipelineParallelSize, dataParallelSize, expertParallel) and a multi-node
# group's ranks (runtime.nodesPerReplica): GPUs, pods and ranks must agree. A CEL rule of their own: in one
# with the flags above, the API server's cost estimate of the regex over 64 arguments is over its budget.
LAYOUT_LONG_FLAGS = (
    "pipeline-parallel-size",
    "data-parallel-size",
    "enable-expert-parallel",
    "no-enable-expert-parallel",
    "nnodes",
    "node-rank",
    "master-addr",
    "master-port",
    "headless",
)
OWNED_SHORT_FLAGS = ("tp",)
LAYOUT_SHORT_FLAGS = ("pp", "dp", "ep", "n", "r")
# JSON-valued flags: the whole JSON value could set anything and is denied; dotted keys
# (`-cc.pass_config.fuse_norm_quant=true`) pass unless they name a key stoker owns.
JSON_LONG_FLAGS = ("compilation-config",)
JSON_SHORT_FLAGS = ("cc",)
OWNED_JSON_KEYS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode")
# `-O<level>`: the levels vLLM's OptimizationLevel has.
OPTIMIZATION_LEVELS = "0123"

# `--api-key` guards every path but the health check; the operator's wake-up completion would get 401,
# so with standby replicas it is refused (also as VLLM_API_KEY).
API_KEY_FLAG = "api-key"
API_KEY_ENV = "VLLM_API_KEY"


def _prefixes(names: tuple[str, ...]) -> str:
    """A regex matching every non-empty prefix of every name, `-` also spelled `_` (a trie of optionals)."""
    children: dict[str, tuple[str, ...]] = {}
    for name in names:
        if name:
            children.setdefault(name[0], ())
            children[name[0]] += (name[1:],)
    branches = []
    for char, rests in sorted(children.items()):
        atom = "[-_]" if char == "-" else char
        rest = _prefixes(rests)
        branches.append(f"{atom}({rest})?" if rest else atom)
    return "|".join(branches)


def _owned_spellings() -> list[str]:
    return [
        # `--` alone and `--=x` too: argparse ends the options there, after stoker's list-valued flags.
        f"--({_prefixes(OWNED_LONG_FLAGS)})?([=.].*)?",
        f"-({_prefixes(OWNED_SHORT_FLAGS)})([=.].*)?",
    ]


def _layout_spellings() -> list[str]:
    return [
        f"--({_prefixes(LAYOUT_LONG_FLAGS)})([=.].*)?",
        f"-({_prefixes(LAYOUT_SHORT_FLAGS)})([=.].*)?",
        # argparse reads a one-letter option's value joined to it: `-n2` is `--nnodes 2`.
        f"-({'|'.join(flag for flag in LAYOUT_SHORT_FLAGS if len(flag) == 1)}).+",
    ]


def _json_spellings() -> list[str]:
    keys = "|".join(key.replace("_", "[-_]") for key in OWNED_JSON_KEYS)
    flags = (f"--({_prefixes(JSON_LONG_FLAGS)})", f"-({_prefixes(JSON_SHORT_FLAGS)})")
    # The whole JSON value, and any argument naming an owned key: a dotted key, or a JSON value of any
    # flag (`(?i)`: in any case, which costs nothing, as no other flag's value has a reason to name them).
    return [*(f"{flag}(=.*)?" for flag in flags), f"(?i:.*({keys}).*)"]


def _optimization_spellings() -> str:
    """`-O` followed by anything but a level, or `=` and a level."""
    levels = f"[{OPTIMIZATION_LEVELS}]"
    return f"-O([^{OPTIMIZATION_LEVELS}=].*|{levels}.+|=|=[^{OPTIMIZATION_LEVELS}].*|={levels}.+)"


def _whole(spellings: list[str]) -> str:
    # (?s): a newline inside an argument is still part of it. No backslashes: the regex sits inside a
    # CEL string literal. RE2 (CEL) and Python's `re` agree on this syntax.
    return "(?s)^(" + "|".join(spellings) + ")$"


OWNED_FLAG_REGEX = _whole([*_owned_spellings(), *_json_spellings(), _optimization_spellings()])
LAYOUT_FLAG_REGEX = _whole(_layout_spellings())
API_KEY_REGEX = _whole([f"--({_prefixes((API_KEY_FLAG,))})([=.].*)?"])
# The first extra argument follows stoker's own flags; a bare value there would extend one of them
# (`--cudagraph-capture-sizes 1 2 4` takes a list).
FIRST_ARG_REGEX = "^--?[A-Za-z]"

_OWNED = (re.compile(OWNED_FLAG_REGEX), re.compile(LAYOUT_FLAG_REGEX))
_API_KEY = re.compile(API_KEY_REGEX)


def sets_owned_flag(arg: str) -> bool:
    """Whether vLLM's parser could read `arg` as a flag stoker owns (or one it cannot tell apart)."""
    return any(regex.fullmatch(arg) is not None for regex in _OWNED)


def sets_api_key(arg: str) -> bool:
    return _API_KEY.fullmatch(arg) is not None
