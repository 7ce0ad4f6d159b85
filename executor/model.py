"""Compatibility names for code written before model builders (ppsim.executor.builders).

New code takes a `ModelBuilder` (ppsim.executor.builders) and builds stages with
`ppsim.executor.builders.stage.build_stage`.
"""

from __future__ import annotations

import torch
from ppsim.executor.builders.deferral import DeferringLinear as Linear
from ppsim.executor.builders.deferral import WeightGradStore
from ppsim.executor.builders.gpt import DTYPES, Block, Embedding, GPTBuilder, GPTShape, stage_loss
from ppsim.executor.builders.gpt import Head as _Head
from ppsim.executor.builders.stage import Stage

__all__ = ["DTYPES", "Block", "Embedding", "GPTShape", "Head", "Linear", "StageModule",
           "WeightGradStore", "microbatch", "stage_loss"]


def StageModule(s: GPTShape, offset: int, num_layers: int, has_embedding: bool,  # noqa: N802
                has_head: bool, seed: int = 0) -> Stage:
    """The GPT stage (offset, layers, embedding?, head?) of the old signature."""
    return Stage(GPTBuilder(s), offset, num_layers, has_embedding, has_head, seed)


def microbatch(s: GPTShape, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    return GPTBuilder(s).microbatch(seed, iteration, index)


def Head(s: GPTShape) -> _Head:  # noqa: N802
    """The GPT head (final LayerNorm and vocabulary projection) of a shape."""
    return _Head(s.hidden_size, s.vocab_size)
