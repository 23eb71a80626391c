"""A hub model's checkpoint bytes when its snapshot holds no weights: the seed's `Model loading took X GiB`
(parsed with the wording of the log's engine profile, on real logs) or the safetensors index's total_size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.predictor.seed_weights import seed_runs

from stoker.engines import SUPPORTED, TOLERANT
from stoker.phases import parse_log
from stoker.predict import ModelFacts, read_model_facts
from stoker.predict.facts import with_logged_weights
from tests.unit.test_predict_fleet import FACTS as LLAMA_8B

PHASES = Path(__file__).parent / "data" / "phases"
RESULTS = Path(__file__).parents[2] / "bench" / "results"
GIB = 1 << 30
# The 8B benchmark model's safetensors files (bench/results/coldstart-h100-v0.22.1-logs/model.json).
SYNTH_8B_BYTES = 16060522496
CPU_RELEASES = ("0.22.1", "0.25.1", "0.26.0", "0.28.0", "0.30.0", "0.32.0")
# A hub snapshot's facts line: the 8B model's config and tokenizer, no weight files.
FACTS = LLAMA_8B.model_copy(update={"checkpoint_bytes": 0})


def worker_weight_bytes(log: Path) -> int | None:
    with open(log, newline="") as lines:
        return parse_log(lines).worker_weight_bytes


@pytest.mark.parametrize(
    ("log", "gib"),
    [
        ("vllm-0.22.1-h100/seed.log", 14.96),  # V1 runner: `GiB memory and`
        ("vllm-0.26.0-h100/seed.log", 14.96),  # Model Runner V2 before 0.28: `GiB and`
        ("tp2-debug-v2-runner.log", 30.6),  # V2 logs on every rank; the first worker's share
        ("synthetic/vllm-0.32.0-load-failed.log", 14.96),
        ("synthetic/vllm-0.33.0-json.log", 14.96),  # a JSON record
    ],
)
def test_the_loaded_weights_of_each_recorded_gpu_log(log: str, gib: float) -> None:
    assert worker_weight_bytes(PHASES / log) == round(gib * GIB)


@pytest.mark.parametrize("release", CPU_RELEASES)
def test_the_cpu_runner_logs_no_weight_memory(release: str) -> None:
    assert worker_weight_bytes(PHASES / f"vllm-{release}-cpu" / "seed.log") is None


def test_each_release_reads_the_wordings_it_prints() -> None:
    v1_runner = "Model loading took 14.96 GiB memory and 1.985707 seconds"
    v2_runner_before_0_28 = "Model loading took 14.96 GiB and 1.985707 seconds"
    for profile in (*SUPPORTED, TOLERANT):
        assert profile.logged_weight_bytes(v1_runner) == round(14.96 * GIB), profile.name
        says_it = profile.first <= (0, 28)
        assert (profile.logged_weight_bytes(v2_runner_before_0_28) is not None) == says_it, profile.name
        assert profile.logged_weight_bytes("Warming up model for the compilation...") is None


def test_every_dummy_weight_seed_of_the_gpu_benchmarks_tells_its_checkpoint_within_0_1_percent() -> None:
    """What bench/results/seed-weights.txt prints: 0.22.1 and 0.26.0, one GPU and tensor parallel 2."""
    directories = ("coldstart-h100-v0.22.1-logs", "coldstart-h100-v0.26.0-logs", "coldstart-h200x2-tp2-logs")
    runs = [run for name in (*directories, "predictor-h100-logs") for run in seed_runs(RESULTS / name)]
    assert len(runs) == 16
    assert {run.engine_version for run in runs} == {"0.22.1", "0.26.0"}
    assert any(run.tensor_parallel == 2 for run in runs)
    for run in runs:
        assert abs(run.error_fraction) < 0.001, run


def test_logged_weights_stand_in_only_for_a_directory_without_weights() -> None:
    logged = with_logged_weights(FACTS, round(7.48 * GIB), tensor_parallel=2)
    assert logged.checkpoint_bytes == 2 * round(7.48 * GIB)
    assert logged.checkpoint_bytes_source == "seedLog"
    assert abs(logged.checkpoint_bytes - SYNTH_8B_BYTES) / SYNTH_8B_BYTES < 0.001
    assert logged.to_json_dict()["checkpointBytesSource"] == "seedLog"
    on_disk = FACTS.model_copy(update={"checkpoint_bytes": SYNTH_8B_BYTES})
    assert with_logged_weights(on_disk, round(14.96 * GIB), tensor_parallel=1) is on_disk
    assert with_logged_weights(FACTS, None, tensor_parallel=1) is FACTS  # a CPU seed: nothing to go by


def test_facts_read_from_files_carry_no_source() -> None:
    assert "checkpointBytesSource" not in FACTS.to_json_dict()
    assert ModelFacts.model_validate(FACTS.to_json_dict()) == FACTS


def write_index(directory: Path, total_size: object) -> None:
    index = {
        "metadata": {"total_size": total_size},
        "weight_map": {"embed": "model-00001-of-00002.safetensors"},
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_sharded_index_without_its_shards_gives_its_total_size(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_index(tmp_path, 16060522496)
    facts = read_model_facts(str(tmp_path))
    assert (facts["checkpointBytes"], facts["checkpointBytesSource"]) == (16060522496, "indexMetadata")
    assert ModelFacts.model_validate(facts).checkpoint_bytes_source == "indexMetadata"

    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(bytes(4096))
    facts = read_model_facts(str(tmp_path))
    assert facts["checkpointBytes"] == 4096 and "checkpointBytesSource" not in facts  # files win

    (tmp_path / "model-00001-of-00002.safetensors").unlink()
    for garbled in ("12 GB", -1, True, None):
        write_index(tmp_path, garbled)
        facts = read_model_facts(str(tmp_path))
        assert facts["checkpointBytes"] == 0 and "checkpointBytesSource" not in facts
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    assert read_model_facts(str(tmp_path))["checkpointBytes"] == 0
