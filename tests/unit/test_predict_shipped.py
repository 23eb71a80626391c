"""The shipped coefficient sets: nearest-match lookup, and what a set predicts for the starts it was fitted
on."""

import statistics

import pytest

from stoker.predict import HardwareClass, Observation, predict, shipped_coefficients, shipped_hardware

H100 = HardwareClass(gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=1, engine_version="0.26.0")


def test_hardware_keys_round_trip_and_refuse_garbage() -> None:
    assert H100.key == "NVIDIA-H100-80GB-HBM3_x1_v0.26"
    assert HardwareClass.from_key(H100.key) == H100
    with pytest.raises(ValueError, match=r"is not <gpu product>_x<gpu count>_v<major\.minor>"):
        HardwareClass.from_key("H100")
    with pytest.raises(ValueError, match=r"not X\.Y or X\.Y\.Z"):
        HardwareClass(gpu_product="cpu", gpu_count=0, engine_version="latest")


def test_every_shipped_file_is_a_valid_set_of_its_own_class() -> None:
    assert H100 in shipped_hardware()
    for hardware in shipped_hardware():
        shipped = shipped_coefficients(hardware)
        assert (shipped.hardware, shipped.source) == (hardware.key, "shipped")
        assert shipped.observations, "a shipped set carries the starts it was fitted from"


@pytest.mark.parametrize(
    "wanted",
    [
        H100.model_copy(update={"gpu_count": 2}),  # same product and version
        H100.model_copy(update={"engine_version": "0.22"}),  # same product
        HardwareClass(gpu_product="NVIDIA-L4", gpu_count=1, engine_version="0.26"),  # same version
    ],
)
def test_a_class_without_its_own_set_gets_the_nearest_which_names_itself(wanted: HardwareClass) -> None:
    nearest = shipped_coefficients(wanted)
    assert nearest.hardware != wanted.key
    assert HardwareClass.from_key(nearest.hardware).gpu_product in {wanted.gpu_product, H100.gpu_product}


def test_the_shipped_h100_set_predicts_its_own_starts() -> None:
    shipped = shipped_coefficients(H100)
    errors = []
    for observation in shipped.observations:
        prediction = predict(observation.facts, observation.settings, shipped)
        # A start of another host holds only the phases it was fitted in (validate.py --other-host).
        assert set(observation.phases) <= set(prediction.phases), observation.label
        assert not prediction.fallbacks
        measured = sum(observation.phases.values())
        predicted = sum(prediction.phases[phase] for phase in observation.phases)
        errors.append(abs(predicted - measured) / measured)
    assert statistics.fmean(errors) < 0.1


def test_a_stored_observation_reads_back() -> None:
    observation = shipped_coefficients(H100).observations[0]
    assert Observation.model_validate(observation.to_json_dict()) == observation


def test_a_gpu_class_never_gets_the_cpu_set_nor_the_reverse() -> None:
    unknown_gpu = HardwareClass(gpu_product="unknown", gpu_count=1, engine_version="0.26")
    assert HardwareClass.from_key(shipped_coefficients(unknown_gpu).hardware).gpu_count > 0
    other_cpu = HardwareClass(gpu_product="cpu", gpu_count=0, engine_version="0.30")
    assert HardwareClass.from_key(shipped_coefficients(other_cpu).hardware).gpu_product == "cpu"
