"""The engine settings of a start, read from its `vllm serve` argv and environment.

The same reading serves the operator (on the invocation it renders) and the benchmark drivers (on each
run's argv, stoker's or a stock `vllm serve`). A wrapper may precede `vllm serve` in the argv: the seed's
facts reader, or the serving pods' read-ahead (`stoker.inpod.read_ahead`, recognised by its module).
Flag spellings and vLLM's default capture sizes come from the engine profile of the version; vLLM's own
normalisations are followed: `_` for `-` in a long flag's name, `--flag=value`, dotted compilation-config
keys (`-cc.mode=0`), `-O0` / `-O 0`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stoker.engines import EngineProfile, profile_for
from stoker.inpod import read_ahead as read_ahead_program
from stoker.phases import CompileCache, CompileCacheReason
from stoker.predict.model import EngineSettings
from stoker.render import prefetch
from stoker.render.engine import MEGA_AOT_ARTIFACT_ENV, MODELEXPRESS
from stoker.render.peers import storage_loader

_COMPILATION_CONFIG = ("--compilation-config", "-cc")
_OPTIMIZATION_LEVEL = ("--optimization-level", "-O")
_TENSOR_PARALLEL_SHORT = "-tp"
_MAX_NUM_SEQS = "--max-num-seqs"
_READ_AHEAD_MODULE = read_ahead_program.__name__
# A run recorded before the read-ahead was a module carries `python3 -c PROGRAM`: every revision of that
# program held the source of this function.
_READ_AHEAD_DEFINITION = f"def {read_ahead_program.read_ahead.__name__}("
_GENTLE_OPTION = prefetch.read_ahead_command([], gentle=1)[3]
_PAGES_OPTION = prefetch.read_ahead_command([], pages="LISTING")[5]
_DEFERRED_GC_OPTION = tuple(prefetch.read_ahead_command([], defer_gc=True)[5:7])
_DEFAULT_LOADER = "auto"
# compilation-config `mode` and `cudagraph_mode` values that switch torch.compile / graph capture off.
_NO_COMPILE = {0, "0", "NONE", "none"}
_NO_GRAPHS = {0, "0", "NONE", "none"}


@dataclass
class _Arguments:
    """The `vllm serve` options that matter here, last spelling wins as in argparse."""

    values: dict[str, list[str]] = field(default_factory=dict)
    compilation: dict[str, object] = field(default_factory=dict)

    def last(self, flag: str) -> str | None:
        found = self.values.get(flag)
        return found[-1] if found else None


def engine_settings(
    args: Sequence[str], env: Mapping[str, str], cache_state: CompileCache, engine_version: str
) -> EngineSettings:
    """Settings of `vllm serve` run with `args` (full argv, or only what follows `serve`) and `env`.

    Raises ValueError for an argument vLLM itself would refuse here (a non-numeric size, bad JSON).
    """
    profile = profile_for(engine_version)
    flags = profile.flags
    parsed = _parse(_serve_arguments(args), profile)
    compiled = (
        flags.enforce_eager not in parsed.values
        and parsed.compilation.get("mode") not in _NO_COMPILE
        and parsed.last(_OPTIMIZATION_LEVEL[0]) != "0"
    )
    loader = parsed.last(flags.load_format) or _DEFAULT_LOADER
    return EngineSettings(
        # ModelExpress's loader reads storage with its fallback loader unless a peer serves the weights
        # (`with_weights_source`).
        loader=storage_loader(env) if loader == MODELEXPRESS else loader,
        compiled=compiled,
        capture_sizes=_capture_sizes(parsed, profile),
        tensor_parallel=_integer(parsed.last(flags.tensor_parallel_size) or "1", flags.tensor_parallel_size),
        sleep_mode=flags.sleep_mode in parsed.values,
        cache_state=cache_state if compiled else "none",
        kept_cache=compiled and cache_state == "hit",
        forked_engine=env.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork",
        read_ahead=_reads_ahead(args),
        gentle_read_ahead=_reads_ahead_gently(args),
        import_pages=_reads_import_pages(args),
        deferred_gc=_defers_gc(args),
        mega_aot_artifact=profile.capabilities.loads_mega_aot_artifact(env.get(MEGA_AOT_ARTIFACT_ENV)),
        engine_version=engine_version,
    )


def logged_settings(
    settings: EngineSettings, compile_cache: CompileCache, reason: CompileCacheReason | None
) -> EngineSettings:
    """`settings` with the cache state a start's log showed: a kept cache that failed to load still was
    there (`kept_cache`), and spared what it could."""
    return settings.model_copy(
        update={"cache_state": compile_cache, "kept_cache": compile_cache == "hit" or reason == "loadFailed"}
    )


def with_weights_source(settings: EngineSettings, weights_source: str | None) -> EngineSettings:
    """`settings` with the weights' source a start's log showed (`weightsSource`), or the one expected."""
    return settings.model_copy(update={"weights_from_peer": weights_source == "peer"})


def _serve_arguments(args: Sequence[str]) -> list[str]:
    """What follows `vllm serve` (the seed Job's wrapper runs it as its own argv), else `args` itself."""
    for index in range(1, len(args)):
        if args[index] == "serve" and args[index - 1].rsplit("/", 1)[-1] == "vllm":
            return list(args[index + 1 :])
    return list(args)


def _reads_ahead(args: Sequence[str]) -> bool:
    """Whether `args` runs vLLM under the read-ahead: `python3 -m stoker.inpod.read_ahead ... -- vllm serve`,
    or a recorded run's `python3 -c PROGRAM ... -- vllm serve`."""
    if len(args) < 3:
        return False
    program = (args[1], args[2])
    return program == ("-m", _READ_AHEAD_MODULE) or (
        program[0] == "-c" and _READ_AHEAD_DEFINITION in program[1]
    )


def _read_ahead_options(args: Sequence[str]) -> dict[str, str]:
    """The read-ahead's options as its program reads them: `--name value` pairs after `-m MODULE` (or
    `-c PROGRAM`), up to the first path (a recorded run of an earlier program may have none); empty without
    the read-ahead."""
    options: dict[str, str] = {}
    rest = list(args[3:]) if _reads_ahead(args) else []
    while len(rest) > 1 and rest[0].startswith("--") and rest[0] != "--":
        options[rest[0]], rest = rest[1], rest[2:]
    return options


def _reads_ahead_gently(args: Sequence[str]) -> bool:
    """Whether the read-ahead has a gentle phase: `--gentle BYTES` with BYTES > 0 (the program before it had
    no such option and read with all readers from the start)."""
    return _read_ahead_options(args).get(_GENTLE_OPTION, "0") != "0"


def _reads_import_pages(args: Sequence[str]) -> bool:
    """Whether the read-ahead reads the seed's import pages first: `--pages LISTING` among its options."""
    return _PAGES_OPTION in _read_ahead_options(args)


def _defers_gc(args: Sequence[str]) -> bool:
    """Whether the read-ahead runs vLLM with the garbage collector off during its imports: `--gc deferred`
    among its options."""
    option, value = _DEFERRED_GC_OPTION
    return _read_ahead_options(args).get(option) == value


def _parse(args: list[str], profile: EngineProfile) -> _Arguments:
    flags = profile.flags
    multi_valued = {flags.capture_sizes}
    switches = {flags.enforce_eager, flags.sleep_mode}
    parsed = _Arguments()
    index = 0
    while index < len(args):
        name, inline = _normalised(args[index])
        index += 1
        if name is None:
            continue
        if name == _TENSOR_PARALLEL_SHORT:
            name = flags.tensor_parallel_size
        if name in switches:
            parsed.values.setdefault(name, [])
            continue
        if name.startswith("--no-"):
            # argparse's BooleanOptionalAction: the negation after the flag wins.
            parsed.values.pop("--" + name.removeprefix("--no-"), None)
            continue
        if name.startswith("-O") and name not in _OPTIMIZATION_LEVEL:
            continue
        values = [inline] if inline is not None else []
        while index < len(args) and _takes(args[index], values, name in multi_valued):
            values.append(args[index])
            index += 1
        base, _, dotted = name.partition(".")
        if base in _COMPILATION_CONFIG:
            _merge_compilation(parsed.compilation, dotted, values, args[index - 1])
        else:
            key = _OPTIMIZATION_LEVEL[0] if base in _OPTIMIZATION_LEVEL else base
            parsed.values[key] = values
    return parsed


def _normalised(arg: str) -> tuple[str | None, str | None]:
    """(flag, value after `=` or glued to -O) for an option, (None, None) for a positional argument."""
    if arg.startswith("--"):
        key, equals, value = arg.partition("=")
        head, dot, rest = key.partition(".")
        return "--" + head[2:].replace("_", "-") + dot + rest, value if equals else None
    if arg.startswith("-O") and not arg.startswith("-O."):
        level = arg[2:].lstrip("=")
        return _OPTIMIZATION_LEVEL[0], level or None
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        key, equals, value = arg.partition("=")
        return key, value if equals else None
    return None, None


def _takes(arg: str, values: list[str], multi_valued: bool) -> bool:
    """Whether `arg` is a value of the option before it (argparse: one value, or all up to the next flag)."""
    is_value = not arg.startswith("-") or arg[1:2].isdigit()
    return is_value and (multi_valued or not values)


def _merge_compilation(config: dict[str, object], dotted: str, values: list[str], arg: str) -> None:
    if not values:
        raise ValueError(f"{arg}: a compilation-config option needs a value")
    if not dotted:
        try:
            document = json.loads(values[-1])
        except ValueError as error:
            raise ValueError(f"--compilation-config is not JSON ({error}): {values[-1]!r}") from None
        if not isinstance(document, dict):
            raise ValueError(f"--compilation-config must be a JSON object: {values[-1]!r}")
        config.update(document)
        return
    if "." in dotted:
        return  # a nested key (`-cc.pass_config.x`): none of them switches compilation or graphs off
    # `-cc.cudagraph_capture_sizes [1,2]` holds JSON; `-cc.mode 0` a plain value.
    try:
        config[dotted] = json.loads(values[-1])
    except ValueError:
        config[dotted] = values[-1]


def _capture_sizes(parsed: _Arguments, profile: EngineProfile) -> int:
    flags = profile.flags
    compilation = parsed.compilation
    graphs_off = (
        flags.enforce_eager in parsed.values
        or compilation.get("cudagraph_mode") in _NO_GRAPHS
        or parsed.last(_OPTIMIZATION_LEVEL[0]) == "0"
    )
    if graphs_off:
        return 0
    explicit = parsed.values.get(flags.capture_sizes)
    configured = compilation.get("cudagraph_capture_sizes")
    if explicit is None and isinstance(configured, list):
        explicit = [str(size) for size in configured]
    if explicit is not None:
        return len({_integer(size, flags.capture_sizes) for size in explicit})
    max_size = parsed.last(flags.max_capture_size) or compilation.get("max_cudagraph_capture_size")
    max_num_seqs = parsed.last(_MAX_NUM_SEQS)
    return profile.capture_sizes.count(
        max_size=_integer(str(max_size), flags.max_capture_size) if max_size is not None else None,
        max_num_seqs=_integer(max_num_seqs, _MAX_NUM_SEQS) if max_num_seqs is not None else None,
    )


def _integer(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{flag} takes an integer, got {value!r}") from None
