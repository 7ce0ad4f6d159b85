"""Model presets against their models' published definitions (configs, papers, the
Megatron scripts their notes cite)."""

from __future__ import annotations

from ppsim.config.model import parse_model


def test_nemotron_h_56b_attention_has_no_position_embedding() -> None:
    # Megatron-LM examples/post_training/modelopt/conf/nvidia/Nemotron-H-56B-Base-8K.sh:
    # --position-embedding-type none (no learned table, no rotary).
    arch = parse_model({"preset": "nemotron-h-56b"}).arch
    assert not arch.learned_positions and not arch.rotary
