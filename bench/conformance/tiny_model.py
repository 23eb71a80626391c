"""Write a tiny Llama checkpoint of one shape (random weights, a BPE tokenizer trained here), byte for byte
the same on every run and machine, without network: the model real vLLM CPU processes serve in the
conformance harness and the live-engine e2e test (CONFORMANCE_SHAPE), and the shapes the CPU predictor
sweep starts (bench/predictor/shapes.py). Startup phases depend on shapes and code paths, not on weight
values.

    python bench/conformance/tiny_model.py DIR [SHAPE]   (needs numpy, safetensors and tokenizers: a vLLM
                                                          venv; SHAPE: a name in bench/predictor/shapes.py)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

if not __package__:  # run as a script by a vLLM venv's interpreter: bench/ is importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.predictor.shapes import SHAPES, Shape, llama_config, tensor_shapes

CONFORMANCE_SHAPE = Shape(
    "conformance",
    layers=4,
    hidden=512,
    intermediate=1024,
    heads=8,
    kv_heads=8,
    vocab=1024,
)
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


def write_config(out: Path, shape: Shape) -> None:
    config = llama_config(shape, max_len=MAX_LEN, rope_theta=10000.0)
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")


def write_weights(out: Path, shape: Shape) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    tensors = {
        name: (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)
        if len(dims) == 2
        else np.ones(dims, dtype=np.float16)
        for name, dims in tensor_shapes(shape)
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def vocabulary_text(vocab: int) -> list[str]:
    """CORPUS, plus made-up words when `vocab` is larger than CONFORMANCE_SHAPE's: the fixed corpus runs out
    of merges near 1,000 tokens, and a larger vocab should make a larger tokenizer file, as real ones do."""
    extra = vocab - CONFORMANCE_SHAPE.vocab
    if extra <= 0:
        return CORPUS
    letters = random.Random(SEED)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    words = ("".join(letters.choices(alphabet, k=letters.randint(3, 9))) for _ in range(extra * 4))
    return [*CORPUS, " ".join(words)]


def write_tokenizer(out: Path, shape: Shape) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(vocabulary_text(shape.vocab), trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "model_max_length": MAX_LEN,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, sort_keys=True) + "\n")


def write_checkpoint(out: Path, shape: Shape = CONFORMANCE_SHAPE) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, shape)
    write_weights(out, shape)
    write_tokenizer(out, shape)
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in SHAPES):
        sys.exit(f"{__doc__}\nshapes: {' '.join(SHAPES)}")
    shape = SHAPES[sys.argv[2]] if len(sys.argv) == 3 else CONFORMANCE_SHAPE
    print(write_checkpoint(Path(sys.argv[1]), shape))
