"""Host facts (issue 26): the seed's measurement, their physical ranges, and predicting a host from them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from stoker.controller import metrics
from stoker.inpod.host import measure_host
from stoker.predict import EngineSettings, ModelFacts, Observation, PhaseFit, fit, parse_facts_line, predict
from stoker.predict.fleet import expected_status
from stoker.predict.model import CoefficientSet, HardwareClass, HostFacts
from stoker.predict.predictor import GENTLE_READ_BYTES_PER_SECOND, IMPORT_PAGES_DISK_SHARE, host_factor

REFERENCE = HostFacts(cpu_seconds=0.10, disk_bytes_per_second=1.3e9, gpu_product="NVIDIA-H100-80GB-HBM3")
# A host with a core 1.4 times as fast and a disk of 1.0 GB/s.
FASTER_CPU_SLOWER_DISK = HostFacts(cpu_seconds=0.10 / 1.4, disk_bytes_per_second=1.0e9)
SETTINGS = EngineSettings(capture_sizes=4, cache_state="hit")
READ_AHEAD = SETTINGS.model_copy(update={"read_ahead": True, "gentle_read_ahead": True})


def model(host: HostFacts | None = None, checkpoint_bytes: int = 16_000_000_000) -> ModelFacts:
    return ModelFacts(
        checkpoint_bytes=checkpoint_bytes,
        layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        attention_heads=32,
        kv_heads=8,
        vocab_size=128256,
        tokenizer_bytes=9_000_000,
        moe=False,
        experts=0,
        host=host,
    )


def flat(seconds: float) -> dict[str, PhaseFit]:
    return {"cache=hit": PhaseFit(intercept=seconds, samples=3)}


COEFFICIENTS = CoefficientSet(
    hardware="NVIDIA-H100-80GB-HBM3_x1_v0.26",
    source="shipped",
    phases={
        "bootstrap": {"readahead=off": PhaseFit(intercept=14.0, samples=3)},
        "dynamo": flat(3.5),
        "profiling": flat(0.5),
        "weightLoad": {"loader=auto": PhaseFit(intercept=0.0, weights={"checkpointGB": 0.75}, samples=3)},
    },
    host=REFERENCE,
)


def test_the_seed_measures_cpu_disk_and_says_what_it_could_not(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    with weights.open("wb") as out:
        out.write(os.urandom(1 << 20) * 40)
        out.flush()
        os.fsync(out.fileno())
    (tmp_path / "small.bin").write_bytes(b"\0" * 10)
    (tmp_path / "fifo.safetensors").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "fifo.safetensors")  # never opened: it is not the largest regular weight file
    skipped: list[tuple[str, str]] = []
    found = HostFacts.model_validate(
        measure_host(str(tmp_path), lambda what, why: skipped.append((what, why)))
    )
    assert found.cpu_seconds is not None and 0 < found.cpu_seconds < 10
    # Either its pages left the page cache and the read was timed, or the measurement says why not.
    assert found.disk_bytes_per_second is not None or any("page cache" in why for _, why in skipped)


def test_without_weights_or_model_only_the_cpu_is_measured(tmp_path: Path) -> None:
    for directory in (str(tmp_path), None):
        found = measure_host(directory)
        assert set(found) - {"gpuProduct", "gpuMemoryBytes", "gpuCount"} == {"cpuSeconds"}


@pytest.mark.parametrize(
    "host",
    [
        {"cpuSeconds": 0},
        {"cpuSeconds": 3600},
        {"cpuSeconds": float("nan")},
        {"diskBytesPerSecond": 5e12},
        {"diskBytesPerSecond": 10},
        {"gpuProduct": "NVIDIA H100"},
        {"gpuProduct": "x" * 64},
        {"gpuMemoryBytes": 1 << 50},
        {"gpuCount": 100_000},
        {"cpuSeconds": 0.1, "forged": 1},
    ],
)
def test_host_facts_out_of_their_physical_ranges_are_refused(host: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HostFacts.model_validate(host)
    line = "stoker-model-facts: " + json.dumps({**model().to_json_dict(), "host": host})
    with pytest.raises(ValueError, match="host"):
        parse_facts_line(line)


def test_the_facts_line_carries_the_host_and_facts_without_one_serialise_as_before() -> None:
    measured = {"cpuSeconds": 0.08, "diskBytesPerSecond": 1.2e9, "gpuProduct": "NVIDIA-H200", "gpuCount": 1}
    parsed = parse_facts_line(
        "stoker-model-facts: " + json.dumps({**model().to_json_dict(), "host": measured})
    )
    assert parsed is not None and parsed.host == HostFacts.model_validate(measured)
    assert "host" not in model().to_json_dict()
    assert HostFacts(cpu_seconds=0.1).to_json_dict() == {"cpuSeconds": 0.1}


def test_each_phase_scales_with_the_host_fact_it_depends_on() -> None:
    faster = model(FASTER_CPU_SLOWER_DISK)
    base = predict(model(), SETTINGS, COEFFICIENTS).phases
    scaled = predict(faster, SETTINGS, COEFFICIENTS).phases
    assert scaled["bootstrap"] == pytest.approx(base["bootstrap"] / 1.4, abs=1e-3)
    assert scaled["dynamo"] == pytest.approx(base["dynamo"] / 1.4, abs=1e-3)
    assert scaled["profiling"] == base["profiling"]  # the GPU's own work
    assert scaled["weightLoad"] == pytest.approx(base["weightLoad"] * 1.3, abs=1e-3)  # bytes over the disk
    # The same start on the reference host, or without host facts on either side, is not scaled.
    assert predict(model(REFERENCE), SETTINGS, COEFFICIENTS).phases == base
    unscaled = COEFFICIENTS.model_copy(update={"host": None})
    assert predict(faster, SETTINGS, unscaled).phases == predict(model(), SETTINGS, unscaled).phases
    assert host_factor("dynamo", SETTINGS, HostFacts(disk_bytes_per_second=1e9), REFERENCE) == 1.0


def test_after_the_read_ahead_weights_wait_for_what_the_disk_has_not_read() -> None:
    eager = READ_AHEAD.model_copy(update={"gentle_read_ahead": False})
    coefficients = COEFFICIENTS.model_copy(
        update={
            "phases": {
                "bootstrap": {
                    "readahead=gentle": PhaseFit(intercept=10.0, samples=3),
                    "readahead=on": PhaseFit(intercept=10.0, samples=3),
                },
                "weightLoad": {
                    "loader=auto,readahead,gentle": PhaseFit(intercept=2.0, samples=3),
                    "loader=auto,readahead": PhaseFit(intercept=2.0, samples=3),
                },
            }
        }
    )
    fast_disk = model(HostFacts(cpu_seconds=0.1, disk_bytes_per_second=2e9))
    # All readers from the start: 16 GB at 2 GB/s is read in 8 s, before the 10 s of bootstrap end, so the
    # weights come from memory; at 0.8 GB/s the disk needs 20 s, and the load ends then.
    assert predict(fast_disk, eager, coefficients).phases["weightLoad"] == pytest.approx(2.0)
    slow = model(HostFacts(cpu_seconds=0.10, disk_bytes_per_second=0.8e9))
    assert predict(slow, eager, coefficients).phases["weightLoad"] == pytest.approx(20.0 - 10.0)
    # Gently: one reader reads 7 GB in the 10 s of bootstrap (GENTLE_READ_BYTES_PER_SECOND), and the disk
    # the other 9 GB after: 4.5 s at 2 GB/s, 6.9 s at 1.3 GB/s, 11.25 s at 0.8 GB/s.
    assert GENTLE_READ_BYTES_PER_SECOND == 0.7e9
    assert predict(fast_disk, READ_AHEAD, coefficients).phases["weightLoad"] == pytest.approx(4.5)
    reference = predict(model(REFERENCE), READ_AHEAD, coefficients)
    assert reference.phases["weightLoad"] == pytest.approx(9e9 / 1.3e9, abs=0.01)
    assert predict(slow, READ_AHEAD, coefficients).phases["weightLoad"] == pytest.approx(11.25)


def test_the_bootstrap_after_the_import_pages_scales_with_the_cpu_in_its_cpu_part_only() -> None:
    pages = READ_AHEAD.model_copy(update={"import_pages": True, "deferred_gc": True})
    coefficients = COEFFICIENTS.model_copy(
        update={"phases": {"bootstrap": {"readahead=gentle,pages,nogc": PhaseFit(intercept=12.0, samples=3)}}}
    )
    faster = model(FASTER_CPU_SLOWER_DISK)
    # The share that waits on the import pages' reads stays; the rest is 1.4 times as fast.
    expected = 12.0 * (IMPORT_PAGES_DISK_SHARE + (1 - IMPORT_PAGES_DISK_SHARE) / 1.4)
    assert predict(faster, pages, coefficients).phases["bootstrap"] == pytest.approx(expected, abs=1e-3)
    assert 12.0 / 1.4 < expected < 12.0
    # Without the import pages (or without the read-ahead) the whole bootstrap is the CPU's.
    assert host_factor("bootstrap", READ_AHEAD, FASTER_CPU_SLOWER_DISK, REFERENCE) == pytest.approx(1 / 1.4)
    no_read_ahead = SETTINGS.model_copy(update={"import_pages": True})
    without_read_ahead = host_factor("bootstrap", no_read_ahead, FASTER_CPU_SLOWER_DISK, REFERENCE)
    assert without_read_ahead == pytest.approx(1 / 1.4)
    # The refit scales such a start back by the same factor: predicted on its own host as it ran.
    starts = [
        Observation(facts=faster, settings=pages, phases={"bootstrap": 11.0}, label=f"s{n}") for n in range(3)
    ]
    refit = fit(starts, hardware=COEFFICIENTS.hardware, host=REFERENCE)
    assert predict(faster, pages, refit).phases["bootstrap"] == pytest.approx(11.0, abs=1e-2)


def test_starts_observed_on_another_host_are_fitted_scaled_to_the_sets_host() -> None:
    faster = model(FASTER_CPU_SLOWER_DISK)
    starts = [
        Observation(
            facts=faster, settings=SETTINGS, phases={"dynamo": 2.5, "weightLoad": 16.0}, label=f"s{n}"
        )
        for n in range(4)
    ]
    refit = fit(starts, hardware=COEFFICIENTS.hardware, host=REFERENCE)
    assert refit.host == REFERENCE
    assert refit.phases["dynamo"]["cache=hit"].intercept == pytest.approx(2.5 * 1.4, rel=1e-3)
    # ...and predicted back on their own host as they ran.
    back = predict(faster, SETTINGS, refit).phases
    assert back["dynamo"] == pytest.approx(2.5, abs=1e-2)
    assert back["weightLoad"] == pytest.approx(16.0, abs=1e-2)
    # A refit takes its prior's host.
    assert fit(starts, COEFFICIENTS).host == REFERENCE


def test_until_serving_adds_the_last_starts_kubernetes_phases_and_readiness_gap() -> None:
    prediction = predict(model(), SETTINGS, COEFFICIENTS)
    hardware = HardwareClass.from_key(COEFFICIENTS.hardware)
    last = {"scheduling": 0.5, "imagePull": 0.0, "containerStart": 1.0, "bootstrap": 99.0, "podReady": 1.5}
    status = expected_status(prediction, hardware, "hit", last)
    assert status["untilServingSeconds"] == pytest.approx(prediction.total_seconds + 3.0, abs=0.01)
    assert expected_status(prediction, hardware, "hit")["untilServingSeconds"] == status["totalSeconds"]


def test_the_until_serving_gauge_follows_the_status_and_goes_with_the_service() -> None:
    service = ("team-a", "until-serving")

    def sample() -> float | None:
        return metrics.STARTUP_UNTIL_SERVING_SECONDS.collect()[0].samples and next(
            (
                s.value
                for s in metrics.STARTUP_UNTIL_SERVING_SECONDS.collect()[0].samples
                if s.labels["name"] == service[1]
            ),
            None,
        )

    metrics.set_until_serving_seconds(service, 31.5)
    assert sample() == 31.5
    metrics.set_until_serving_seconds(service, None)
    assert not sample()
    metrics.set_until_serving_seconds(service, 20.0)
    metrics.forget_service(*service)
    assert not sample()


def test_stoker_predict_scales_the_stand_in_set_to_the_hosts_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stoker.predict.cli import EXIT_UNREADABLE, main
    from tests.unit.test_predict_facts import LLAMA_CONFIG, write_model

    write_model(tmp_path / "model", LLAMA_CONFIG)
    h200 = ["--hardware", "NVIDIA-H200_x1_v0.26", "--json"]
    assert main([str(tmp_path / "model"), *h200]) == 0
    stand_in = json.loads(capsys.readouterr().out)["prediction"]
    # The H200 probe's facts: a faster core and disk than the H100 set's host.
    facts = '{"cpuSeconds": 0.0517, "diskBytesPerSecond": 1918506656}'
    assert main([str(tmp_path / "model"), *h200, "--host-facts", facts]) == 0
    scaled = json.loads(capsys.readouterr().out)["prediction"]
    assert scaled["coefficientSet"] == stand_in["coefficientSet"] == "NVIDIA-H100-80GB-HBM3_x1_v0.26"
    assert scaled["phases"]["bootstrap"] == pytest.approx(
        stand_in["phases"]["bootstrap"] * 0.0517 / 0.0748, 1e-3
    )
    assert main([str(tmp_path / "model"), "--measure-host"]) == 0
    assert 'scaled from its host to this one: {"cpuSeconds"' in capsys.readouterr().out
    assert main([str(tmp_path / "model"), "--host-facts", '{"cpuSeconds": -1}']) == EXIT_UNREADABLE
    assert "cpuSeconds" in capsys.readouterr().err


def test_status_keeps_the_host_facts_and_until_serving_as_the_operator_writes_them() -> None:
    from stoker.api.models import StartupStatus

    host = {"cpuSeconds": 0.0517, "diskBytesPerSecond": 1918506656.0, "gpuProduct": "NVIDIA-H200"}
    model_facts = {**model().to_json_dict(), "host": host}
    startup = {"model": model_facts, "expected": {"totalSeconds": 20.1, "untilServingSeconds": 23.4}}
    written = StartupStatus.model_validate(startup).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert written["model"]["host"] == host
    assert written["expected"]["untilServingSeconds"] == 23.4
    assert ModelFacts.model_validate(written["model"]).host == HostFacts.model_validate(host)
