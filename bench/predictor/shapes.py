"""The synthetic Llama shapes the predictor is validated on, per hardware: fitted on some, judged on the rest.

Startup phases depend on shapes, dtype and bytes, not on weight values (the paper's finding), so random
weights of these shapes stand in for real checkpoints. The held-out shapes lie inside the fitted range in
every dimension that varies: the predictor is judged on interpolation, as a fleet uses it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    held_out: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# H100: Llama-3.x widths (3B: 3072, 8B: 4096) at layer counts that keep a stock start near a minute.
H100_SHAPES = (
    Shape("l4-h4096", 4, 4096, 14336, 32, 8, 128256),
    Shape("l16-h4096", 16, 4096, 14336, 32, 8, 128256),
    Shape("l12-h2048", 12, 2048, 8192, 16, 8, 32000),
    Shape("l28-h3072", 28, 3072, 8192, 24, 8, 128256),
    Shape("l8-h4096", 8, 4096, 14336, 32, 8, 128256, held_out=True),
    Shape("l20-h3072", 20, 3072, 8192, 24, 8, 128256, held_out=True),
)

# CPU (2 cores, shared): the same family scaled down. Every CPU start compiles (vLLM 0.26's CPU runner cannot
# load a kept compile cache), and a 4-layer, hidden-512 start takes about 130 s on this machine under load,
# most of it imports and engine start; layer counts stay low so that the sweep's 30 starts fit its budget.
CPU_SHAPES = (
    Shape("l1-h256", 1, 256, 512, 4, 4, 1024),
    Shape("l4-h512", 4, 512, 1024, 8, 8, 4096),
    Shape("l2-h1024", 2, 1024, 2816, 16, 8, 8192),
    Shape("l6-h768", 6, 768, 2048, 12, 4, 16384),
    Shape("l3-h512", 3, 512, 1024, 8, 8, 2048, held_out=True),
    Shape("l4-h768", 4, 768, 2048, 12, 4, 8192, held_out=True),
)

SHAPES = {shape.name: shape for shape in (*H100_SHAPES, *CPU_SHAPES)}

# The GPU benchmarks' published shapes (bench/gpu/make_model.py); a run may keep fewer of their layers, e.g.
# 34 of Llama-3.1-70B's 80: 62.4 GB, a checkpoint that needs two GPUs.
CHECKPOINTS = {
    "llama-8b": Shape("llama-8b", 32, 4096, 14336, 32, 8, 128256),
    "llama-70b": Shape("llama-70b", 80, 8192, 28672, 64, 8, 128256),
}
# Checkpoint shards of about this size, as published checkpoints have, and at least this many.
SHARD_BYTES = 5 * 10**9
MIN_SHARDS = 4
BF16_BYTES = 2


def describe(shape: Shape) -> str:
    """What a results file says of a synthetic checkpoint of `shape`."""
    published = CHECKPOINTS.get(shape.name)
    kept = f"{shape.layers} of {published.layers}" if published and published.layers != shape.layers else ""
    return (
        f"synthetic {shape.name}-shaped checkpoint ({kept or shape.layers} layers, hidden {shape.hidden}, "
        f"GQA {shape.heads}/{shape.kv_heads}, vocab {shape.vocab}, bf16, random weights; "
        "bench/gpu/make_model.py)"
    )


def tensor_shapes(shape: Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every weight of a Llama checkpoint of `shape`, by name, in the order the model writers store them."""
    hidden, q_dim, kv_dim = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "model.embed_tokens.weight", (shape.vocab, hidden)
    for i in range(shape.layers):
        prefix = f"model.layers.{i}."
        yield prefix + "self_attn.q_proj.weight", (q_dim, hidden)
        yield prefix + "self_attn.k_proj.weight", (kv_dim, hidden)
        yield prefix + "self_attn.v_proj.weight", (kv_dim, hidden)
        yield prefix + "self_attn.o_proj.weight", (hidden, q_dim)
        yield prefix + "mlp.gate_proj.weight", (shape.intermediate, hidden)
        yield prefix + "mlp.up_proj.weight", (shape.intermediate, hidden)
        yield prefix + "mlp.down_proj.weight", (hidden, shape.intermediate)
        yield prefix + "input_layernorm.weight", (hidden,)
        yield prefix + "post_attention_layernorm.weight", (hidden,)
    yield "model.norm.weight", (hidden,)
    yield "lm_head.weight", (shape.vocab, hidden)


def sharded(shape: Shape) -> list[tuple[str, tuple[int, ...], int]]:
    """Every weight of `shape` with the number (1-based) of the shard it goes to: shards of about
    SHARD_BYTES, MIN_SHARDS where no weight is larger than a shard, each weight in the shard where its first
    byte falls, numbered without gaps."""
    weights = list(tensor_shapes(shape))
    sizes = [BF16_BYTES * math.prod(dims) for _, dims in weights]
    per_shard = sum(sizes) / max(MIN_SHARDS, -(-sum(sizes) // SHARD_BYTES))
    starts = itertools.accumulate(sizes[:-1], initial=0)
    slots = [int(start // per_shard) for start in starts]
    number = {slot: index + 1 for index, slot in enumerate(sorted(set(slots)))}
    return [(name, dims, number[slot]) for (name, dims), slot in zip(weights, slots, strict=True)]


def llama_config(shape: Shape, max_len: int, rope_theta: float) -> dict[str, object]:
    """The config.json of a Llama checkpoint of `shape`; each model writer adds what its engine needs."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
    }
