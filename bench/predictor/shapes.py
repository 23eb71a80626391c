"""The synthetic Llama shapes the predictor is validated on, per hardware: fitted on some, judged on the rest.

Startup phases depend on shapes, dtype and bytes, not on weight values (the paper's finding), so random
weights of these shapes stand in for real checkpoints. The held-out shapes lie inside the fitted range in
every dimension that varies: the predictor is judged on interpolation, as a fleet uses it.
"""

from __future__ import annotations

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
