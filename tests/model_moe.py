"""A user's own model for the executor tests: `--model tests/model_moe.py:build`.

The shipped Llama-style builder with a heterogeneous stack (dense and MoE
layers with a shared expert) and grouped-query attention, written the way a
user would: a function of the [model] fields returning a ModelBuilder.
"""

from __future__ import annotations

from typing import Any

from ppsim.executor.builders.llama import LlamaBuilder
from ppsim.executor.builders.llama import build as llama


def build(fields: dict[str, Any]) -> LlamaBuilder:
    n = int(fields["num_layers"])
    kinds = ["moe" if i % 3 == 1 else "dense" for i in range(n)]
    return llama({**fields, "layers": kinds, "num_kv_heads": 2, "num_experts": 4,
                  "top_k": 2, "moe_ffn_hidden_size": 96, "shared_experts": 1})
