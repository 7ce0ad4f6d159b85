"""An MTP depth's eh_proj under FP8: Megatron runs MultiTokenPredictionLayer's
projection, a TE column-parallel linear, under its global FP8 autocast (also beside
--first-last-layers-bf16) and under no FP4 one (multi_token_prediction.py): its GEMMs
run in FP8 as a layer's TE linears do, it keeps TE's cached FP8 weight and transpose,
and its sequence-parallel input gather moves FP8, all three or none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import mtp_ops
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import accelerator, transformer_costs

H = 1024
A = Architecture(**{**MODEL_PRESETS["llama3-8b"], "num_layers": 2, "hidden_size": H,
                    "num_heads": 8, "num_kv_heads": 8, "ffn_hidden_size": 4096,
                    "mtp_layers": 1, "tp": 2})


def _proj(a: Architecture):
    (op,) = (op for op in mtp_ops(a) if op.name == "mtp.proj")
    return op


@pytest.mark.parametrize("more", [{}, {"first_last_layers_bf16": True}])
def test_eh_proj_runs_in_fp8_under_fp8(more: dict) -> None:
    op = _proj(replace(A, fp8="hybrid", fp8_recipe="tensorwise", **more))
    assert op.fp8 and not op.fp4
    assert op.params == 2 * H * H // 2  # 2h -> h over tp 2


def test_eh_proj_stays_bf16_under_nvfp4_and_without_fp8() -> None:
    """Megatron's MTP enters only an FP8 autocast (FP4 in MTP layers is its TODO)."""
    for a in (A, replace(A, fp8="e2m1", fp8_recipe="nvfp4")):
        op = _proj(a)
        assert not op.fp8 and not op.fp4


def _costs(**model):
    c = config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 2, "hidden_size": H,
                                    "num_heads": 8, "num_kv_heads": 8, "ffn_hidden_size": 4096,
                                    "mtp_layers": 1, "tp": 2, "recompute": "none", **model},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    acc = accelerator(c.hardware)
    return c.model.arch, acc, transformer_costs(c.model.arch, acc)


def test_the_depth_is_faster_and_keeps_the_cached_fp8_weight() -> None:
    """FP8 GEMMs at the FP8 peak; TE's FP8 weight and transpose (2 bytes a parameter) on
    the MTP stage beside the depth's decoder layer's own."""
    a, acc, plain = _costs()
    fp8, _, quick = _costs(fp8="hybrid", fp8_recipe="tensorwise")
    r = acc.roofline()
    assert sum(op_times(r, _proj(fp8))[:3]) < sum(op_times(r, _proj(a))[:3])
    layer_fp8 = quick.layers[-2].static_bytes - plain.layers[-2].static_bytes
    mtp_fp8 = quick.layers[-1].static_bytes - plain.layers[-1].static_bytes
    assert mtp_fp8 - layer_fp8 == 2 * (2 * H * H // 2)
