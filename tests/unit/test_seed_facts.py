"""The seed program's model-facts line (stoker.inpod.seed), as the operator parses it."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import pytest

from stoker.inpod import seed
from stoker.inpod.facts import MODEL_FACT_BOUNDS, impossible_facts, read_model_facts
from stoker.inpod.pagecache import SkipLines
from stoker.predict.facts import parse_facts_line
from stoker.predict.model import ModelFacts

CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


def printed(
    argv: list[str], seconds: float = seed.FACTS_SECONDS, import_pages_bytes: int | None = None
) -> str:
    """What the seed prints about the model for `argv` (what the seed pod runs, without the server)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        seed.print_model_facts(argv, SkipLines(seed.LINE_PREFIX), seconds, import_pages_bytes)
    return output.getvalue()


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_a_local_model_gives_one_facts_line_the_operator_parses(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    (line,) = printed(["vllm", "serve", str(directory), "--served-model-name", "m"]).splitlines()
    facts = parse_facts_line(f"2026-11-23T16:00:00.000000000Z {line}")
    assert facts is not None and facts.host is not None and facts.host.cpu_seconds  # measured next to it
    read_here = ModelFacts.model_validate(read_model_facts(str(directory)))
    assert facts.model_copy(update={"host": None}) == read_here
    assert facts.layers == 2 and facts.checkpoint_bytes == 4096 and facts.tokenizer_bytes == 2


def test_the_facts_line_says_how_many_import_pages_the_seed_recorded(tmp_path: Path) -> None:
    argv = ["vllm", "serve", str(model_dir(tmp_path)), "--served-model-name", "m"]
    (line,) = printed(argv, import_pages_bytes=1724613741).splitlines()
    facts = parse_facts_line(line)
    assert facts is not None and facts.import_pages_bytes == 1724613741
    # A pod's line is untrusted: more than the read-ahead would ever read of a listing is refused.
    forged = line.replace("1724613741", str(17 << 30))
    with pytest.raises(ValueError, match="importPagesBytes"):
        parse_facts_line(forged)


def test_a_streamer_uri_prints_no_facts() -> None:
    assert printed(["vllm", "serve", "s3://bucket/llama", "--load-format", "runai_streamer"]) == ""


def test_an_unreadable_model_prints_why_but_no_facts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    output = printed(["vllm", "serve", str(tmp_path)])
    assert output.startswith("stoker-seed: no model facts") and parse_facts_line(output) is None


def test_a_snapshot_with_the_index_but_no_shards_prints_the_indexed_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    index = {"metadata": {"total_size": 988097536}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (line,) = printed(["vllm", "serve", str(tmp_path), "--served-model-name", "m"]).splitlines()
    facts = parse_facts_line(line)
    assert facts is not None and facts.checkpoint_bytes == 988097536
    assert facts.checkpoint_bytes_source == "indexMetadata"


def test_facts_that_take_too_long_to_read_leave_the_seed_to_finish_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read that blocks (a hung volume): the seed goes on after its bound, with one line that says why.
    monkeypatch.setattr(seed, "read_model_facts", lambda *_: time.sleep(60))
    began = time.monotonic()
    output = printed(["vllm", "serve", str(tmp_path)], 0.5)
    assert time.monotonic() - began < 5
    assert output == "stoker-seed: no model facts (still reading after 0.5 s)\n"


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"num_hidden_layers": 10**30}, "layers 1000000000000000000000000000000 is outside 0..4096"),
        ({"hidden_size": 2**63}, f"hiddenSize {2**63} is outside 0..{1 << 20}"),
        ({"vocab_size": 1 << 24 + 1}, "vocabSize"),
    ],
)
def test_a_model_with_impossible_facts_prints_why_and_no_facts(
    tmp_path: Path, config: dict[str, int], refused: str
) -> None:
    """Hostile: a tenant's config.json claims what no model is; the seed prints no facts line the operator
    would have to refuse, and says which fact and range instead."""
    directory = model_dir(tmp_path)
    (directory / "config.json").write_text(json.dumps({**CONFIG, **config}))
    (line,) = printed(["vllm", "serve", str(directory), "--served-model-name", "m"]).splitlines()
    assert line.startswith("stoker-seed: no model facts (impossible: ") and refused in line
    assert parse_facts_line(line) is None


def test_the_seed_and_the_operator_bound_each_fact_alike(tmp_path: Path) -> None:
    """One definition of the physical ranges: what the seed refuses to print, ModelFacts refuses to read,
    and the bound itself passes both."""
    facts = ModelFacts.model_validate(read_model_facts(str(model_dir(tmp_path))))
    valid = facts.model_dump(by_alias=True, mode="json")
    for name, bound in MODEL_FACT_BOUNDS.items():
        assert not impossible_facts({**valid, name: bound})
        ModelFacts.model_validate({**valid, name: bound})
        assert impossible_facts({**valid, name: bound + 1})
        with pytest.raises(ValueError, match=name):
            ModelFacts.model_validate({**valid, name: bound + 1})
