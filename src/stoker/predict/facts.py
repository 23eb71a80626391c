"""A model's facts from its own directory, and the log line the seed Job prints them in.

`read_model_facts` uses the standard library only and imports inside its body: its source is embedded
verbatim (`inspect.getsource`) into the seed Job's wrapper, which runs in the vLLM image without stoker, so
the seed pod and `stoker predict` read a model with the same code. Its annotations name builtins only:
the embedded copy evaluates them without this module's imports.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stoker.predict.model import ModelFacts

FACTS_LOG_PREFIX = "stoker-model-facts: "


def read_model_facts(model_dir: str) -> dict:
    """Shapes and sizes of the model in `model_dir` (a Hugging Face layout), camelCase keys.

    Raises ValueError naming the directory and what is missing when it holds no usable config.json.
    """
    import glob
    import json
    import os

    config_path = os.path.join(model_dir, "config.json")
    try:
        with open(config_path, encoding="utf-8") as config_file:
            config = json.load(config_file)
    except OSError as error:
        raise ValueError(f"{model_dir}: cannot read config.json ({error.strerror or error})") from None
    except ValueError as error:
        raise ValueError(f"{config_path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    # Multimodal configs keep the language model's shape under text_config; it wins where both say.
    text_config = config.get("text_config")
    merged = {**config, **text_config} if isinstance(text_config, dict) else config

    def first(*names: str, default: object = None) -> object:
        for name in names:
            value = merged.get(name)
            if value is not None:
                return value
        return default

    def whole(*names: str, default: int | None = None) -> int:
        value = first(*names, default=default)
        if value is None:
            raise ValueError(f"{config_path}: no {' / '.join(names)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{config_path}: {' / '.join(names)} must be a non-negative integer, got {value!r}"
            )
        return value

    def total_bytes(*patterns: str) -> int:
        paths = {path for pattern in patterns for path in glob.glob(os.path.join(model_dir, pattern))}
        # getsize follows the symlinks of a Hugging Face cache snapshot to the blobs.
        return sum(os.path.getsize(path) for path in paths if os.path.isfile(path))

    attention_heads = whole("num_attention_heads", "n_head", "num_heads")
    experts = 0
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        count = merged.get(name)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            experts = count
            break
    tokenizer_bytes = total_bytes("tokenizer.json") or total_bytes(
        "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "*.tiktoken"
    )
    return {
        "checkpointBytes": total_bytes("*.safetensors") or total_bytes("*.bin", "*.pt", "*.pth"),
        "layers": whole("num_hidden_layers", "n_layer", "num_layers"),
        "hiddenSize": whole("hidden_size", "n_embd", "d_model"),
        "intermediateSize": whole("intermediate_size", "ffn_dim", "n_inner", default=0),
        "attentionHeads": attention_heads,
        "kvHeads": whole("num_key_value_heads", "num_kv_heads", default=attention_heads),
        "vocabSize": whole("vocab_size"),
        "tokenizerBytes": tokenizer_bytes,
        "moe": experts > 0,
        "experts": experts,
        "dtype": first("torch_dtype", "dtype"),
    }


def parse_facts_line(line: str) -> ModelFacts | None:
    """The facts a log line carries (behind any timestamp prefix), or None for any other line.

    Raises ValueError (pydantic's ValidationError is one) when the line carries the prefix but its facts
    are not valid JSON or not a model's facts, so that a garbled line is reported, not taken for absent.
    """
    # Imported here: the module stays importable, and `read_model_facts` embeddable, without pydantic.
    from stoker.predict.model import ModelFacts

    _, prefix, document = line.partition(FACTS_LOG_PREFIX)
    if not prefix:
        return None
    try:
        facts = json.loads(document)
    except ValueError as error:
        raise ValueError(f"garbled model facts line ({error}): {line.strip()[:200]!r}") from None
    return ModelFacts.model_validate(facts)
