"""The GPU benchmarks' synthetic checkpoints: shards as published checkpoints have them, every one written."""

from __future__ import annotations

import dataclasses
import math

from bench.predictor.shapes import CHECKPOINTS, MIN_SHARDS, SHARD_BYTES, describe, sharded, tensor_shapes


def test_a_70b_shape_of_34_layers_is_62_gb_in_shards_of_about_5_gb_each_written():
    shape = dataclasses.replace(CHECKPOINTS["llama-70b"], layers=34)
    plan = sharded(shape)
    sizes: dict[int, int] = {}
    for _, dims, number in plan:
        sizes[number] = sizes.get(number, 0) + 2 * math.prod(dims)
    assert sum(sizes.values()) == 62_387_208_192
    assert sorted(sizes) == list(range(1, 14))  # 13 shards, none skipped
    assert all(0.5 * SHARD_BYTES < size < 1.2 * SHARD_BYTES for size in sizes.values())
    assert [name for name, _, _ in plan] == [name for name, _ in tensor_shapes(shape)]
    assert [number for _, _, number in plan] == sorted(number for _, _, number in plan)


def test_a_small_checkpoint_still_has_the_minimum_of_shards():
    assert {number for _, _, number in sharded(CHECKPOINTS["llama-8b"])} == set(range(1, MIN_SHARDS + 1))


def test_the_description_says_how_many_of_the_published_layers_were_kept():
    assert describe(dataclasses.replace(CHECKPOINTS["llama-70b"], layers=34)).startswith(
        "synthetic llama-70b-shaped checkpoint (34 of 80 layers, hidden 8192, GQA 64/8"
    )
    assert "(32 layers, hidden 4096, GQA 32/8, vocab 128256" in describe(CHECKPOINTS["llama-8b"])
