"""An MTP depth's decoder layers under NVFP4, restated from Megatron (d98e8a6):

- MultiTokenPredictionLayer._proj_and_transformer_layer
  (megatron/core/transformer/multi_token_prediction.py:1387-1392) enters
  get_fp8_context(config) around eh_proj and around its decoder layer when config.fp8,
  else nullcontext; under --fp4-format config.fp8 is unset, so neither runs in an
  autocast ("TODO: currently ignoring FP4 in MTP layers", line 1394), and its layers are
  built under get_fp8_context(config, is_init=True) (lines 1927, 1944): bf16 weights.
- A GPT model's depth runs one TransformerLayer (line 1220), which enters no context of
  its own: the whole depth is bf16, eh_proj, attention, MLP or experts.
- A hybrid model's depth runs a HybridStack (line 1203, pp_layer_offset=0), whose
  forward enters get_fp4_context(config, layer.layer_number - 1) around each of its
  layers (megatron/core/models/hybrid/hybrid_block.py:349-379): NVFP4, except an index
  (0, 1, ... in the MTP pattern) that --first-last-layers-bf16 keeps in bf16
  (megatron/core/fp4_utils.py:255-263).
- Under --fp8-format the depth's global get_fp8_context (no layer index) encloses all of
  it: FP8, even beside --first-last-layers-bf16.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.costs.fp8 import mtp_layers_fp8
from ppsim.costs.transformer import transformer_costs
from ppsim.job.layers import job_costs
from ppsim.job.model import build_job

NVFP4 = {"fp8": "e2m1", "fp8_recipe": "nvfp4"}
GPT = {"preset": "llama3-8b", "num_layers": 2, "hidden_size": 1024, "num_heads": 8,
       "num_kv_heads": 8, "ffn_hidden_size": 4096, "mtp_layers": 1, "tp": 2,
       "sequence_parallel": True, "recompute": "none"}
HYBRID = {"preset": "tiny-hybrid", "hybrid_layer_pattern": "M*-E/*-", "dtype": "bf16",
          "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 16, "ffn_hidden_size": 8192,
          "seq_length": 4096, "recompute": "none"}


def _job(**model):
    c = config_from_dict({"model": model, "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "b200-180gb"}})
    job = build_job(c)
    assert job is not None
    return job


def _costs(**model):
    job = _job(**model)
    return transformer_costs(job.arch, job.accelerator)


def test_a_gpt_models_depth_runs_wholly_in_bf16_under_nvfp4() -> None:
    """Its decoder layers run NVFP4; its MTP depth costs what it costs in bf16: the same
    times, weights (no cached FP4 copies) and saved activations."""
    bf16, fp4 = _costs(**GPT), _costs(**GPT, **NVFP4)
    assert fp4.layers[0].forward_ms < bf16.layers[0].forward_ms
    assert fp4.kinds[-1] == "mtp"
    assert fp4.layers[-1] == bf16.layers[-1]


def test_a_gpt_models_depth_waits_for_bf16_collectives_under_nvfp4() -> None:
    """Its sequence-parallel gathers move bf16, not NVFP4: the job's MTP piece, compute and
    exposed collectives, is bf16's."""
    bf16, fp4 = _job(**GPT), _job(**GPT, **NVFP4)
    got, plain = job_costs(fp4, fp4.accelerator), job_costs(bf16, bf16.accelerator)
    assert got.layers[-1] == plain.layers[-1]
    assert got.layers[0] != plain.layers[0]


@pytest.mark.parametrize("more", [{}, {"first_last_layers_bf16": True}])
def test_the_depth_runs_fp8_under_fp8(more: dict) -> None:
    """Under MXFP8 the depth is quicker than in bf16, also where every decoder layer is
    kept in bf16 (two layers, the first and the last)."""
    bf16 = _costs(**GPT)
    fp8 = _costs(**GPT, fp8="e4m3", fp8_recipe="mxfp8", **more)
    assert fp8.layers[-1].forward_ms < bf16.layers[-1].forward_ms
    assert (fp8.layers[0] == bf16.layers[0]) == bool(more)


def test_a_hybrid_models_depth_runs_its_layers_in_nvfp4_by_their_index() -> None:
    """The HybridStack's layers run NVFP4 (its projection bf16); --first-last-layers-bf16
    keeps its first layer, index 0, in bf16 and leaves the second."""
    bf16, fp4 = _costs(**HYBRID), _costs(**HYBRID, **NVFP4)
    part = _costs(**HYBRID, **NVFP4, first_last_layers_bf16=True)
    assert fp4.kinds[-1] == part.kinds[-1] == "mtp"
    assert fp4.layers[-1].forward_ms < part.layers[-1].forward_ms < bf16.layers[-1].forward_ms
    arch = _job(**HYBRID, **NVFP4, first_last_layers_bf16=True).arch
    assert mtp_layers_fp8(arch, 2) == (False, True)
    assert mtp_layers_fp8(replace(arch, num_layers_at_start_in_bf16=0), 2) == (True, True)
    assert mtp_layers_fp8(replace(arch, hybrid_layer_pattern=""), 2) == (False, False)
