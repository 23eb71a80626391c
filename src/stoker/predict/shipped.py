"""The coefficient sets stoker ships, one file per hardware class: `coefficients/<hardware key>.json`.

Each file holds the fit and the observations it was fitted from (`bench/predictor/validate.py
--coefficients-out` writes it), so a refit from fleet starts can take it as its prior.
"""

from __future__ import annotations

from importlib import resources

from stoker.predict.model import CoefficientSet, HardwareClass

_DIRECTORY = "coefficients"


class NoShippedCoefficients(LookupError):
    """No coefficient set is shipped at all (an installation without its package data)."""


def shipped_hardware() -> list[HardwareClass]:
    """Every hardware class a set is shipped for, by key."""
    folder = resources.files("stoker.predict").joinpath(_DIRECTORY)
    names = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".json"))
    return [HardwareClass.from_key(name.removesuffix(".json")) for name in names]


def shipped_coefficients(hardware: HardwareClass) -> CoefficientSet:
    """The shipped set nearest to `hardware`, never a CPU set for a GPU class nor the reverse: the same GPU
    product and engine version (the same GPU count first), else the same product, else the same version.

    The set's `hardware` is the class it was fitted on: where it differs from `hardware.key` the caller
    says so (a nearest match is an estimate from other hardware, not this class's own fit).
    """
    candidates = shipped_hardware()
    if not candidates:
        raise NoShippedCoefficients("no shipped coefficient set found in the stoker package")

    def closeness(candidate: HardwareClass) -> tuple[bool, bool, bool, bool, bool]:
        same_kind = (candidate.gpu_count > 0) == (hardware.gpu_count > 0)
        same_product = candidate.gpu_product == hardware.gpu_product
        same_version = candidate.engine_version == hardware.engine_version
        return (
            same_kind,
            same_product and same_version,
            same_product,
            same_version,
            candidate.gpu_count == hardware.gpu_count,
        )

    nearest = max(candidates, key=closeness)
    document = resources.files("stoker.predict").joinpath(_DIRECTORY, f"{nearest.key}.json").read_text()
    return CoefficientSet.model_validate_json(document)
