"""Model facts read from real checkpoint directories written here (safetensors files by hand: an 8-byte
little-endian header length, a JSON header, the tensor bytes), and the seed's facts line."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.predict import FACTS_LOG_PREFIX, ModelFacts, parse_facts_line, read_model_facts

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "torch_dtype": "bfloat16",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[int, ...]]) -> int:
    """A valid bf16 safetensors file of zeros; returns its size in bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 2
        for dimension in shape:
            size *= dimension
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))
    return path.stat().st_size


def write_model(directory: Path, config: dict[str, object]) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    first = write_safetensors(directory / "model-00001-of-00002.safetensors", {"embed": (1024, 256)})
    second = write_safetensors(directory / "model-00002-of-00002.safetensors", {"layer.0": (512, 256)})
    return first + second


def test_a_llama_directory(tmp_path: Path) -> None:
    checkpoint = write_model(tmp_path, LLAMA_CONFIG)
    facts = read_model_facts(str(tmp_path))
    assert facts == {
        "checkpointBytes": checkpoint,
        "layers": 2,
        "hiddenSize": 256,
        "intermediateSize": 512,
        "attentionHeads": 4,
        "kvHeads": 2,
        "vocabSize": 1024,
        "tokenizerBytes": (tmp_path / "tokenizer.json").stat().st_size,
        "moe": False,
        "experts": 0,
        "dtype": "bfloat16",
    }
    assert ModelFacts.model_validate(facts).checkpoint_bytes == checkpoint


def test_a_multimodal_moe_config_nests_its_language_model(tmp_path: Path) -> None:
    text = {**LLAMA_CONFIG, "num_local_experts": 8, "num_hidden_layers": 6}
    del text["num_key_value_heads"]
    write_model(tmp_path, {"architectures": ["LlavaForConditionalGeneration"], "text_config": text})
    facts = read_model_facts(str(tmp_path))
    assert (facts["layers"], facts["moe"], facts["experts"], facts["kvHeads"]) == (6, True, 8, 4)


def test_pytorch_weights_and_a_sentencepiece_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "n_routed_experts": 0}))
    (tmp_path / "pytorch_model.bin").write_bytes(bytes(1000))
    (tmp_path / "tokenizer.model").write_bytes(bytes(300))
    facts = read_model_facts(str(tmp_path))
    assert (facts["checkpointBytes"], facts["tokenizerBytes"], facts["moe"]) == (1000, 300, False)


def test_a_missing_or_garbled_config_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read config\.json"):
        read_model_facts(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_model_facts(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 256}))
    with pytest.raises(ValueError, match="no num_attention_heads / n_head / num_heads"):
        read_model_facts(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "num_hidden_layers": "two"}))
    with pytest.raises(ValueError, match=r"num_hidden_layers .* must be a non-negative integer"):
        read_model_facts(str(tmp_path))


def test_the_shipped_copy_runs_alone_in_a_bare_interpreter(tmp_path: Path, programs: Path) -> None:
    """What the seed Job runs: the programs volume's copy, without pydantic or site-packages."""
    write_model(tmp_path, LLAMA_CONFIG)
    script = (
        f"import json, sys; sys.path.insert(0, {str(programs)!r})\n"
        "from stoker.inpod.facts import FACTS_LOG_PREFIX, read_model_facts\n"
        "print(FACTS_LOG_PREFIX + json.dumps(read_model_facts(sys.argv[1])))\n"
    )
    printed = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    facts = parse_facts_line("2026-11-23T16:00:00.123456789Z " + printed)
    assert facts is not None and facts.to_json_dict() == read_model_facts(str(tmp_path))


def test_facts_lines() -> None:
    assert parse_facts_line("INFO 11-23 16:00:00 [api_server.py:1] Starting vLLM server on :8000") is None
    with pytest.raises(ValueError, match="garbled model facts line"):
        parse_facts_line(FACTS_LOG_PREFIX + '{"layers": 2')
    with pytest.raises(ValueError, match="layers"):
        parse_facts_line(FACTS_LOG_PREFIX + '{"layers": -1}')
