"""Startup prediction (issue 13): a model's facts and a start's settings to per-phase seconds.

Pure code, no cluster access: `facts` parses the seed Job's facts line (stoker.inpod.facts reads a model
directory, in the seed pod and for `stoker predict`), `settings` reads a `vllm serve` invocation,
`predictor` predicts and fits, `shipped` loads the coefficient sets fitted from the project's own runs.
"""

from stoker.inpod.facts import FACTS_LOG_PREFIX, read_model_facts
from stoker.predict.facts import parse_facts_line
from stoker.predict.model import (
    CoefficientSet,
    EngineSettings,
    HardwareClass,
    ModelFacts,
    Observation,
    PhaseFit,
    Prediction,
)
from stoker.predict.predictor import PHASE_MODELS, PRIOR_WEIGHT, expected_phases, fit, predict, regime_of
from stoker.predict.settings import engine_settings, logged_settings
from stoker.predict.shipped import NoShippedCoefficients, shipped_coefficients, shipped_hardware

__all__ = [
    "FACTS_LOG_PREFIX",
    "PHASE_MODELS",
    "PRIOR_WEIGHT",
    "CoefficientSet",
    "EngineSettings",
    "HardwareClass",
    "ModelFacts",
    "NoShippedCoefficients",
    "Observation",
    "PhaseFit",
    "Prediction",
    "engine_settings",
    "expected_phases",
    "fit",
    "logged_settings",
    "parse_facts_line",
    "predict",
    "read_model_facts",
    "regime_of",
    "shipped_coefficients",
    "shipped_hardware",
]
