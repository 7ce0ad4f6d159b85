"""A learned position table has --max-position-embeddings rows, not the sequence's:
Megatron's gpt_builders.py passes max_position_embeddings as the embedding's
max_sequence_length, and LanguageModelEmbedding builds Embedding(max_sequence_length, h)."""

from __future__ import annotations

import json

from tests.helpers import run_cli

GPT = ["simulate", "--gpus", "1", "--num-layers", "4", "--hidden-size", "1024",
       "--num-attention-heads", "16", "--seq-length", "1024", "--vocab-size", "50257",
       "--bf16", "--micro-batch-size", "1", "--global-batch-size", "8", "--json"]


def _static(*flags: str) -> int:
    ran = run_cli([*GPT, *flags])
    assert ran.returncode == 0, ran.stderr
    return sum(r["static_bytes"] for r in json.loads(ran.stdout)["ranks"])


def test_the_table_has_a_row_for_each_of_max_position_embeddings() -> None:
    """8,192 rows where the sequence is 1,024: 7,168 more rows of 1,024 weights, each
    weight 18 bytes (bf16 weight, fp32 gradient, master and Adam's two moments)."""
    more = _static("--max-position-embeddings", "8192") - _static(
        "--max-position-embeddings", "1024")
    assert more == (8192 - 1024) * 1024 * 18


def test_rotary_positions_keep_no_table_whatever_max_position_embeddings() -> None:
    rope = ("--position-embedding-type", "rope")
    assert _static(*rope, "--max-position-embeddings", "8192") == _static(
        *rope, "--max-position-embeddings", "1024")
