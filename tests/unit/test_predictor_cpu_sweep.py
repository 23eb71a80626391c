"""The CPU predictor sweep's pure parts: its plan, the model writer's shapes, and runs.jsonl as validate
reads it (one real CPU start's log, and the committed sweep)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from bench.conformance import tiny_model
from bench.predictor import cpu_sweep, validate
from bench.predictor.shapes import CPU_SHAPES

REPO = Path(__file__).resolve().parents[2]
SERVING_LOG = Path(__file__).parent / "data" / "predictor" / "vllm-0.26.0-cpu-stoker.log"


def test_pass_one_seeds_before_serving_and_pass_two_repeats_stock_and_stoker():
    starts = cpu_sweep.plan(CPU_SHAPES)
    first_pass, second_pass = starts[: 3 * len(CPU_SHAPES)], starts[3 * len(CPU_SHAPES) :]
    assert [(s.profile, s.rep) for s in first_pass[:3]] == [("stock", 1), ("stoker-seed", 1), ("stoker", 1)]
    assert {s.shape for s in first_pass} == set(CPU_SHAPES)
    assert {(s.profile, s.rep) for s in second_pass} == {("stock", 2), ("stoker", 2)}
    assert len({s.log for s in starts}) == len(starts) == 5 * len(CPU_SHAPES)


def test_the_model_config_follows_the_shape_and_the_conformance_model_keeps_its_own(tmp_path):
    shape = next(s for s in CPU_SHAPES if s.kv_heads < s.heads)
    tiny_model.write_config(tmp_path, shape)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        shape.layers,
        shape.hidden,
        shape.vocab,
    )
    assert (config["num_key_value_heads"], config["head_dim"]) == (
        shape.kv_heads,
        shape.hidden // shape.heads,
    )
    # The conformance model's tokenizer is trained on the fixed corpus alone, as before shapes existed.
    assert tiny_model.vocabulary_text(tiny_model.CONFORMANCE_SHAPE.vocab) == tiny_model.CORPUS
    assert len(tiny_model.vocabulary_text(8192)) == len(tiny_model.CORPUS) + 1


def test_runs_jsonl_carries_facts_and_settings_that_validate_reads(tmp_path):
    shape = CPU_SHAPES[0]
    work_dir, runs_dir = tmp_path / "work", tmp_path / "runs"
    model = cpu_sweep.model_dir(shape, work_dir)
    model.mkdir(parents=True)
    tiny_model.write_config(model, shape)
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    (model / "tokenizer.json").write_text("{}")
    start = cpu_sweep.Start(shape, cpu_sweep.SERVE_PROFILE, 1)
    (runs_dir / start.log).parent.mkdir(parents=True)
    shutil.copyfile(SERVING_LOG, runs_dir / start.log)
    argv = ["nice", "-n", "-10", "vllm", "serve", str(model), "--load-format", "runai_streamer"]
    record = {"shape": shape.name, "profile": start.profile, "rep": 1, "log": start.log, "argv": argv}
    (runs_dir / cpu_sweep.STARTS_FILE).write_text(json.dumps({**record, "env": {}}) + "\n")

    assert cpu_sweep.write_runs(runs_dir, work_dir, "0.26.0") == 1
    [run] = validate.load_runs(runs_dir)
    assert (run.shape, run.profile, run.rep) == (shape.name, "stoker", 1)
    assert (run.observation.facts.layers, run.observation.facts.checkpoint_bytes) == (shape.layers, 4096)
    assert run.observation.settings.loader == "runai_streamer"
    assert run.observation.settings.cache_state == "miss"  # a CPU runner never loads a kept compile cache
    assert run.total_seconds == pytest.approx(sum(run.observation.phases.values()))
    assert run.total_seconds > 0


def test_the_committed_cpu_sweep_has_every_start_of_every_shape_and_validate_reads_it():
    runs = validate.load_runs(cpu_sweep.RUNS_DIR)
    counts = Counter((run.shape, run.profile) for run in runs)
    for shape in CPU_SHAPES:
        assert counts[(shape.name, "stock")] == 2
        assert counts[(shape.name, "stoker-seed")] == 1
        assert counts[(shape.name, "stoker")] == 2
    assert {run.observation.facts.layers for run in runs} == {shape.layers for shape in CPU_SHAPES}
