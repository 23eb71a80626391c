"""Write a tiny Llama checkpoint (random weights, a BPE tokenizer trained here), byte for byte the same on
every run and machine, without network: the model real vLLM CPU processes serve in the conformance harness
and the live-engine e2e test. Startup phases depend on shapes and code paths, not on weight values.

    python bench/conformance/tiny_model.py DIR     (needs numpy, safetensors and tokenizers: a vLLM venv)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS, HIDDEN, INTERMEDIATE, HEADS, VOCAB = 4, 512, 1024, 8, 1024
MAX_LEN = 2048
SEED = 20261123
SPECIAL_TOKENS = ["<s>", "</s>"]
# The tokenizer's training text; any fixed text works, the model's outputs are noise anyway.
CORPUS = [
    "The operator renders one VLLMService into pods that start vLLM fast: a seed job fills the compile "
    "cache, the Run:ai streamer loads weights, CUDA graphs are captured for a few batch sizes only. ",
    "Hello, world! Startup phases: bootstrap, model info, engine start, weight load, dynamo, compile, "
    "profiling, graph capture, API ready. 0123456789 ",
    "def main():\n    print('hello')\n    return {'key': [1, 2, 3]}\n",
] * 8


def write_config(out: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
    }
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")


def write_weights(out: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{prefix}self_attn.{projection}.weight"] = (HIDDEN, HIDDEN)
        shapes[f"{prefix}mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[f"{prefix}input_layernorm.weight"] = (HIDDEN,)
        shapes[f"{prefix}post_attention_layernorm.weight"] = (HIDDEN,)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    tensors = {
        name: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        if len(shape) == 2
        else np.ones(shape, dtype=np.float16)
        for name, shape in shapes.items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "model_max_length": MAX_LEN,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, sort_keys=True) + "\n")


def write_checkpoint(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_config(out)
    write_weights(out)
    write_tokenizer(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write_checkpoint(Path(sys.argv[1])))
