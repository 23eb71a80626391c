"""Per-phase startup prediction: one small linear model per engine phase and regime (the paper's finding).

Each phase is linear in a few features of the model and the settings (`PHASE_MODELS`), with coefficients
per regime, the part of the settings that changes the phase's work rather than its size:
- `cache=hit|miss|none` for what the compile cache decides (model-info inspection, Dynamo, compiling or
  loading compiled graphs, memory profiling, the kernel JIT warm-up, the API server);
- `loader=<load format>` for weight loading (the streamer, safetensors, dummy weights read nothing), with
  `,readahead` where the read-ahead wrapper put the checkpoint in the page cache first (InstantTensor then
  reads memory: ~3 s for 16 GB on an H100 host instead of ~15 s from the disk), `,readahead,gentle` where
  it read with one reader until the engine process existed (less of it may be in memory by then);
- `readahead=on|gentle|off` for the Python bootstrap (the imports share the disk with the read-ahead: ~9 s
  more with all its readers from the start), `,pages` where it read the seed's import pages first (the
  imports find them in memory: ~2-4 s less), `,nogc` where vLLM ran with its garbage collector off until
  the engine process started (~4 s less);
- `engine=fork|spawn` for the engine process start (a spawned process imports everything again), `,pages`
  with the import pages (the imports end sooner, and the engine process's own reads share the disk with
  the rest of the checkpoint: ~1.5-2 s more), `,nogc` without the collector (~1 s less);
- `all` for what none of these changes (CUDA graph capture).
Tokenizer initialisation happens in the engine-start phase of the log (after `Resolved architecture`),
so the tokenizer's size is a feature of `engineStart`; `modelInfo` is vLLM's architecture inspection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from stoker.engines import EngineProfile, profile_for
from stoker.phases import COMPILE_PHASES, logged_phase_name
from stoker.predict.model import (
    CoefficientSet,
    CoefficientSource,
    EngineSettings,
    HardwareClass,
    HostFacts,
    ModelFacts,
    Observation,
    PhaseFit,
    Prediction,
)

# How many starts the prior counts for: a handful of fleet starts move the coefficients part of the way
# toward them, a few dozen dominate.
PRIOR_WEIGHT = 5.0
# Just enough pull toward the prior (without one: the mean and zero weights) to settle what the starts
# cannot tell apart, e.g. a feature that is the same in all of them.
_IDENTIFIABILITY_WEIGHT = 1e-6
# A robust fit (Huber's, by reweighted least squares) gives a start whose residual exceeds HUBER_K robust
# scales the weight that caps its pull; the scale is the residuals' MAD, at least a fraction of the
# phase's typical seconds (a handful of alike starts would otherwise make any other one an outlier).
HUBER_K = 1.345
_HUBER_ITERATIONS = 20
_HUBER_SCALE_FLOOR = 0.05
_HUBER_SCALE_FLOOR_SECONDS = 0.5
_GB = 1e9
_MB = 1e6

Feature = Callable[[ModelFacts, EngineSettings], float]
FEATURES: dict[str, Feature] = {
    "tokenizerMB": lambda facts, _: facts.tokenizer_bytes / _MB,
    "checkpointGB": lambda facts, _: facts.checkpoint_bytes / _GB,
    "layers": lambda facts, _: float(facts.layers),
    # An MoE layer compiles to a larger graph than a dense one (the per-layer complexity of the paper).
    "moeLayers": lambda facts, _: float(facts.layers if facts.moe else 0),
    "captureSizes": lambda _, settings: float(settings.capture_sizes),
    # Capturing one size replays every layer's kernels once.
    "captureLayers": lambda facts, settings: float(settings.capture_sizes * facts.layers),
    "extraWorkers": lambda _, settings: float(settings.tensor_parallel - 1),
    "sleepMode": lambda _, settings: float(settings.sleep_mode),
}


def _all(_: EngineSettings) -> str:
    return "all"


_KEPT_MISS = "cache=miss,kept"
# Weights from a running replica (ModelExpress): a transfer over the pods' network, whatever the read-ahead
# does with the disk meanwhile.
LOADER_PEER = "loader=peer"


def _cache(settings: EngineSettings) -> str:
    if settings.cache_state == "miss" and settings.kept_cache:
        return _KEPT_MISS
    return f"cache={settings.cache_state}"


def _read_ahead(settings: EngineSettings) -> str:
    if not settings.read_ahead:
        return "readahead=off"
    regime = "readahead=gentle" if settings.gentle_read_ahead else "readahead=on"
    return regime + (",pages" if settings.import_pages else "") + _collector(settings)


def _loader(settings: EngineSettings) -> str:
    if settings.weights_from_peer:
        return LOADER_PEER
    if not settings.read_ahead:
        return f"loader={settings.loader}"
    return f"loader={settings.loader},readahead" + (",gentle" if settings.gentle_read_ahead else "")


def _engine(settings: EngineSettings) -> str:
    regime = "engine=fork" if settings.forked_engine else "engine=spawn"
    return regime + (",pages" if settings.import_pages else "") + _collector(settings)


def _collector(settings: EngineSettings) -> str:
    return ",nogc" if settings.deferred_gc else ""


@dataclass(frozen=True)
class PhaseModel:
    regime: Callable[[EngineSettings], str]
    features: tuple[str, ...]


PHASE_MODELS: dict[str, PhaseModel] = {
    "bootstrap": PhaseModel(_read_ahead, ()),
    "modelInfo": PhaseModel(_cache, ()),
    "engineStart": PhaseModel(_engine, ("tokenizerMB", "extraWorkers")),
    "weightLoad": PhaseModel(_loader, ("checkpointGB",)),
    "dynamo": PhaseModel(_cache, ("layers", "moeLayers")),
    "compile": PhaseModel(_cache, ("layers", "moeLayers")),
    "compileLoad": PhaseModel(_cache, ("layers", "moeLayers")),
    "profiling": PhaseModel(_cache, ("checkpointGB", "sleepMode")),
    "graphCapture": PhaseModel(_all, ("captureSizes", "captureLayers")),
    "jitWarmup": PhaseModel(_cache, ()),
    "apiReady": PhaseModel(_cache, ()),
}


# What a phase's seconds scale with from one host to another (the paper: the phases are CPU-bound, one
# thread mostly; weights are bytes over the disk). Python start-up and imports, model inspection, the
# engine process's start (imports again, the tokenizer), Dynamo's tracing, Inductor's compile, loading
# compiled graphs, graph capture (kernel launches from Python), the JIT warm-up and the API server's start
# run on the CPU; weight loading reads the disk, or memory after the read-ahead; memory profiling is the
# GPU's own work, not scaled.
CPU_PHASES = frozenset(
    {
        "bootstrap",
        "modelInfo",
        "engineStart",
        "dynamo",
        "compile",
        "compileLoad",
        "graphCapture",
        "jitWarmup",
        "apiReady",
    }
)
WEIGHT_PHASE = "weightLoad"
BOOTSTRAP_PHASE = "bootstrap"
DYNAMO_PHASE = "dynamo"
# What one gentle reader (512 KiB requests, one in flight) reads while vLLM imports: 0.7-0.8 GB/s on the H100
# hosts (docs/benchmarks/gpu-coldstart.md, the gentle read-ahead's run 2).
GENTLE_READ_BYTES_PER_SECOND = 0.7e9
# The share of the Python bootstrap that waits on the disk, not the CPU, when the read-ahead reads the seed's
# import pages first: the pages' own reads (2.6-3.8 s on every GPU host seen, at 1.2-1.9 GB/s: bound by the
# latency of many small requests, which no host fact measures) and the imports' other cold reads. That part
# is not scaled; the rest scales with the CPU. Measured, not fitted: (cold - warm) / cold of the bootstrap
# over the two H200 runs' 6 cold starts (page cache dropped, 12.78 s) and 6 on a warmed node (the checkpoint
# and the import pages resident, 9.11 s: CPU alone), bench/results/coldstart-h200-run{1,2}-logs.
IMPORT_PAGES_DISK_SHARE = 0.29


def host_factor(
    phase: str, settings: EngineSettings, host: HostFacts | None, reference: HostFacts | None
) -> float:
    """How many times as long `phase` takes on `host` as on `reference` (1 where either lacks the fact it
    scales with): the CPU phases with the seed's workload seconds, weight loading with the disk's read
    bandwidth, or with the CPU after the read-ahead (it then reads memory; `predict` bounds it below by
    what the disk cannot have read yet); the bootstrap after the import pages only in its CPU part
    (IMPORT_PAGES_DISK_SHARE); weights from a peer not at all (no host fact measures the pods' network)."""
    if host is None or reference is None or (phase == WEIGHT_PHASE and settings.weights_from_peer):
        return 1.0
    if phase == WEIGHT_PHASE and not settings.read_ahead:
        if host.disk_bytes_per_second is None or reference.disk_bytes_per_second is None:
            return 1.0
        return reference.disk_bytes_per_second / host.disk_bytes_per_second
    if phase in CPU_PHASES or phase == WEIGHT_PHASE:
        if host.cpu_seconds is None or reference.cpu_seconds is None:
            return 1.0
        cpu_ratio = host.cpu_seconds / reference.cpu_seconds
        if phase == BOOTSTRAP_PHASE and settings.read_ahead and settings.import_pages:
            return IMPORT_PAGES_DISK_SHARE + (1.0 - IMPORT_PAGES_DISK_SHARE) * cpu_ratio
        return cpu_ratio
    return 1.0


def regime_of(phase: str, settings: EngineSettings) -> str:
    return PHASE_MODELS[phase].regime(settings)


def expected_phases(profile: EngineProfile, settings: EngineSettings) -> list[str]:
    """The engine phases a start with `settings` logs, named and ordered as `stoker phases` prints them."""
    names = []
    for phase, _ in profile.phase_ends:
        if phase in COMPILE_PHASES and settings.cache_state == "none":
            continue
        if phase == DYNAMO_PHASE and settings.mega_aot_artifact and settings.cache_state == "hit":
            continue
        names.append(logged_phase_name(phase, settings.cache_state))
    return names


def predict(facts: ModelFacts, settings: EngineSettings, coefficients: CoefficientSet) -> Prediction:
    """Expected engine phases of one start, in the phases of the settings' engine version (else the set's);
    a phase the set has never seen (no fit in any regime, e.g. graph capture on CPU) is left out, as the
    parser leaves out a phase the log does not show."""
    version = settings.engine_version or f"{HardwareClass.from_key(coefficients.hardware).engine_version}.0"
    profile = profile_for(version)
    phases: dict[str, float] = {}
    fallbacks: dict[str, str] = {}
    runs_as = _as_run_on(coefficients, settings)
    for phase in expected_phases(profile, runs_as):
        fits = coefficients.phases.get(phase)
        if not fits:
            continue
        regime = regime_of(phase, runs_as)
        if runs_as is not settings and regime != regime_of(phase, settings):
            fallbacks[phase] = regime
        fit = fits.get(regime)
        if fit is None:
            # The best-supported regime of this phase stands in, and the prediction says so.
            regime, fit = max(fits.items(), key=lambda item: item[1].samples)
            fallbacks[phase] = regime
        seconds = _evaluate(fit, facts, settings) * host_factor(
            phase, settings, facts.host, coefficients.host
        )
        if phase == WEIGHT_PHASE and settings.read_ahead and not settings.weights_from_peer:
            seconds = max(seconds, _unread_seconds(facts, settings, phases))
        phases[phase] = round(max(0.0, seconds), 3)
    return Prediction(
        phases=phases,
        total_seconds=round(sum(phases.values()), 3),
        coefficient_set=coefficients.hardware,
        source=coefficients.source,
        fallbacks=fallbacks,
    )


def _unread_seconds(facts: ModelFacts, settings: EngineSettings, phases: dict[str, float]) -> float:
    """The read-ahead starts with the process: once `phases` have passed, the seconds the host's disk still
    needs for the rest of the checkpoint (0 without its bandwidth). A gentle read-ahead reads at most
    GENTLE_READ_BYTES_PER_SECOND until the engine process starts (the bootstrap's end), the disk's full rate
    after."""
    if facts.host is None or facts.host.disk_bytes_per_second is None:
        return 0.0
    disk, elapsed = facts.host.disk_bytes_per_second, sum(phases.values())
    gentle = phases.get(BOOTSTRAP_PHASE, 0.0) if settings.gentle_read_ahead else 0.0
    read_gently = min(disk, GENTLE_READ_BYTES_PER_SECOND) * gentle
    return (facts.checkpoint_bytes - read_gently) / disk - (elapsed - gentle)


def _as_run_on(coefficients: CoefficientSet, settings: EngineSettings) -> EngineSettings:
    """The start as it runs on the set's hardware: where a kept cache never loaded but was seen to miss
    (vLLM's CPU runner), an expected hit is a miss with the kept cache's other savings."""
    regimes = {regime for fits in coefficients.phases.values() for regime in fits}
    if settings.cache_state == "hit" and "cache=hit" not in regimes and _KEPT_MISS in regimes:
        return settings.model_copy(update={"cache_state": "miss", "kept_cache": True})
    return settings


def fit(
    observations: Iterable[Observation],
    prior: CoefficientSet | None = None,
    *,
    hardware: str | None = None,
    source: CoefficientSource = "fleet",
    fitted_on: Sequence[str] = (),
    prior_weight: float = PRIOR_WEIGHT,
    robust: bool = False,
    host: HostFacts | None = None,
) -> CoefficientSet:
    """Least squares per phase and regime, pulled toward `prior` as if it were `prior_weight` observations;
    `robust`: Huber's loss instead, so that a start far off the others pulls only a bounded amount (for
    starts parsed from tenants' logs; the shipped sets are plain least squares of the project's runs).

    Fits of the prior that no observation touches are kept as they are. `hardware` defaults to the prior's.
    A refit takes the shipped set as its prior and all observed starts, not its own previous result (which
    would count the same starts again).

    The fits hold for `host` (default: the prior's): a start observed on another host counts with its
    phases scaled to it (`host_factor`), where both hosts' facts say.
    """
    if host is None and prior is not None:
        host = prior.host
    if hardware is None:
        if prior is None:
            raise ValueError("fit needs the hardware key, or a prior coefficient set to take it from")
        hardware = prior.hardware
    groups: dict[tuple[str, str], list[Observation]] = {}
    for observation in observations:
        for phase in observation.phases:
            if phase in PHASE_MODELS:
                groups.setdefault((phase, regime_of(phase, observation.settings)), []).append(observation)
    phases: dict[str, dict[str, PhaseFit]] = {
        phase: dict(fits) for phase, fits in (prior.phases.items() if prior is not None else ())
    }
    for (phase, regime), members in sorted(groups.items()):
        prior_fit = prior.phases.get(phase, {}).get(regime) if prior is not None else None
        phases.setdefault(phase, {})[regime] = _fit_phase(
            phase, members, prior_fit, prior_weight, robust, host
        )
    return CoefficientSet(
        hardware=hardware, source=source, phases=phases, fitted_on=list(fitted_on), host=host
    )


def _fit_phase(
    phase: str,
    observations: list[Observation],
    prior: PhaseFit | None,
    prior_weight: float,
    robust: bool,
    host: HostFacts | None,
) -> PhaseFit:
    names = PHASE_MODELS[phase].features
    design = np.array(
        [[1.0, *(FEATURES[name](o.facts, o.settings) for name in names)] for o in observations], dtype=float
    )
    measured = np.array(
        [o.phases[phase] / host_factor(phase, o.settings, o.facts.host, host) for o in observations],
        dtype=float,
    )
    if prior is not None:
        target = np.array([prior.intercept, *(prior.weights.get(name, 0.0) for name in names)])
    else:
        target = np.array([measured.mean(), *([0.0] * len(names))])
        prior_weight = 0.0
    # The prior speaks as `prior_weight` starts at the observed points: n starts move the prediction there
    # n / (n + prior_weight) of the way. Directions the starts do not span get only the faint pull (each
    # coefficient in its feature's units).
    scale = np.sqrt((design**2).mean(axis=0))
    scale[scale == 0.0] = 1.0
    penalty = np.vstack(
        [
            np.sqrt(prior_weight / len(observations)) * design,
            np.sqrt(_IDENTIFIABILITY_WEIGHT) * np.diag(scale),
        ]
    )
    weights = np.ones(len(observations))
    scale_floor = max(_HUBER_SCALE_FLOOR * float(np.median(np.abs(measured))), _HUBER_SCALE_FLOOR_SECONDS)
    for _ in range(_HUBER_ITERATIONS if robust else 1):
        root = np.sqrt(weights)
        solution, *_ = np.linalg.lstsq(
            np.vstack([design * root[:, None], penalty]),
            np.concatenate([measured * root, penalty @ target]),
            rcond=None,
        )
        if not robust:
            break
        residuals = np.abs(measured - design @ solution)
        scale = max(1.4826 * float(np.median(residuals)), scale_floor)
        settled, weights = weights, np.minimum(1.0, HUBER_K * scale / np.maximum(residuals, 1e-12))
        if np.allclose(weights, settled, atol=1e-4):
            break
    return PhaseFit(
        intercept=_stored(solution[0]),
        weights={name: _stored(value) for name, value in zip(names, solution[1:], strict=True)},
        samples=len(observations) + (prior.samples if prior is not None else 0),
    )


def scaled(coefficients: CoefficientSet, factor: float) -> CoefficientSet:
    """`coefficients` predicting every phase `factor` times as long."""
    phases = {
        phase: {
            regime: fit.model_copy(
                update={
                    "intercept": _stored(fit.intercept * factor),
                    "weights": {name: _stored(weight * factor) for name, weight in fit.weights.items()},
                }
            )
            for regime, fit in fits.items()
        }
        for phase, fits in coefficients.phases.items()
    }
    return coefficients.model_copy(update={"phases": phases})


def _stored(value: float) -> float:
    # `+ 0.0` keeps a rounded -0.0 out of the stored documents.
    return round(float(value), 6) + 0.0


def _evaluate(fit: PhaseFit, facts: ModelFacts, settings: EngineSettings) -> float:
    unknown = set(fit.weights) - set(FEATURES)
    if unknown:
        raise ValueError(f"coefficient set uses features this stoker does not know: {sorted(unknown)}")
    return fit.intercept + sum(
        weight * FEATURES[name](facts, settings) for name, weight in fit.weights.items()
    )
