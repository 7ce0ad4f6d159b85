"""Model presets against their models' published definitions (configs, papers, the
Megatron scripts their notes cite)."""

from __future__ import annotations

import pytest

from ppsim.config.model import parse_model
from ppsim.costs.kinds import model_params
from ppsim.costs.layerops import padded_vocab


def test_nemotron_h_56b_attention_has_no_position_embedding() -> None:
    # Megatron-LM examples/post_training/modelopt/conf/nvidia/Nemotron-H-56B-Base-8K.sh:
    # --position-embedding-type none (no learned table, no rotary).
    arch = parse_model({"preset": "nemotron-h-56b"}).arch
    assert not arch.learned_positions and not arch.rotary


@pytest.mark.parametrize("name, total", [
    # Language Models are Few-Shot Learners (arXiv 2005.14165), Table 2.1: GPT-3 XL 1.3B,
    # GPT-3 175B; GPT-2's architecture, whose output layer is the token embedding's table
    # (Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh ties them too: no
    # --untie-embeddings-and-output-weights).
    ("gpt3-1.3b", 1.3e9),
    ("gpt3-175b", 175e9),
])
def test_gpt3_shares_its_embedding_with_the_output_layer(name: str, total: float) -> None:
    arch = parse_model({"preset": name}).arch
    assert arch.tie_embeddings
    assert model_params(arch).total == pytest.approx(total, rel=0.015)


@pytest.mark.parametrize("name, tp, rows", [("gpt3-1.3b", 1, 50304), ("gpt3-175b", 8, 51200)])
def test_gpt3_vocabulary_is_gpt2s_padded_as_megatron_pads_it(name: str, tp: int,
                                                             rows: int) -> None:
    # GPT-3 (arXiv 2005.14165) uses GPT-2's byte-level BPE of 50,257 tokens (Radford et al.
    # 2019, section 2.2); Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh reads
    # it from gpt2-vocab.json and pads it to a multiple of 128 x tp
    # (--make-vocab-size-divisible-by 128): 50,304 rows at tp 1, 51,200 at tp 8.
    arch = parse_model({"preset": name, "tp": tp}).arch
    assert arch.vocab_size == 50257
    assert padded_vocab(arch) == rows


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpt_oss_vocabulary_is_taken_as_it_is(tp: int) -> None:
    # Megatron-LM's examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh (the
    # preset's cited source): --padded-vocab-size 201088, openai/gpt-oss-120b's
    # config.json vocab_size; no padding to 128 x tp.
    arch = parse_model({"preset": "gpt-oss-120b", "tp": tp}).arch
    assert padded_vocab(arch) == 201088
