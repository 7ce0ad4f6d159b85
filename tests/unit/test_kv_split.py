"""Tensor parallelism beyond the key/value groups, restated from Megatron's code, not
from ppsim's (megatron/core/transformer/attention.py):

- SelfAttention.__init__: num_query_groups_per_partition = 1 when num_query_groups <
  tp (each rank one whole group after the gather), else num_query_groups / tp;
  linear_qkv is a ColumnParallelLinear over the whole (np + 2 ng) x hn output (plus
  np x hn for the output gate), its weights split over tp, none repeated.
- get_query_key_value_tensors: mixed_qkv [sq, b, ng x (np/ng + 2) x hn / tp] (gated:
  ng x (2 np/ng + 2) x hn / tp) goes through all_gather_last_dim_from_tensor_parallel_
  region (whose backward reduce-scatters the gradient), then each rank slices its group
  and np / tp of its query heads.

Collectives against the closed form (nccl-tests' all-gather: (n - 1) alpha + (n - 1) / n
x S / B, inside one node: 450 GB/s and 1 us a step on the H100 preset)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.modules import module_effect
from ppsim.costs.saved import saved_tensors
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.errors import UserError
from ppsim.job.layers import layer_collectives
from ppsim.job.model import build_job

S, BF16 = 4096, 2


def gather_ms(nbytes: float, n: int) -> float:
    return (n - 1) * 1e-3 + (n - 1) / n * nbytes / 450e6


def _cfg(model: dict, tp: int) -> object:
    return config_from_dict({
        "model": {"num_layers": 2, "seq_length": S, "micro_batch_size": 1, "tp": tp,
                  "dp": 8 // tp, **model},
        "pipeline": {"pp": 1, "global_batch_size": 8},
        "hardware": {"preset": "h100-80gb"}})


def _tp_ms(model: dict, tp: int, kind: str) -> tuple[float, float]:
    cfg = _cfg(model, tp)
    job, acc = build_job(cfg), accelerator(cfg.hardware)
    layer = transformer_costs(job.arch, acc).layers[0]
    comm = layer_collectives(job, job.arch, acc, kind, layer)
    f, b = ([c.total_ms for c in side if c.group == "tp"] for side in (comm.forward,
                                                                      comm.backward))
    return f[0], b[0]


LLAMA_KV2 = {"preset": "llama3-8b", "num_kv_heads": 2}  # np 32, hn 128, h 4,096


def test_simulate_runs_tp_beyond_the_groups(capsys) -> None:
    # qwen3-235b-a22b has 4 key/value groups; Megatron runs it at tp 8
    assert main(["simulate", "--preset", "qwen3-235b-a22b", "--hardware", "h100-80gb",
                 "--tp", "8", "--pp", "8", "--microbatches", "16"]) == 0
    assert "iteration time" in capsys.readouterr().out


def test_the_gather_of_qkv_moves_the_whole_projection_output() -> None:
    # dense layer, sequence parallel: two sublayers' gather and scatter each way, and the
    # QKV output gathered (forward) and its gradient reduce-scattered (backward), and in
    # the backward each sublayer's input gathered again for its weight gradient:
    # s x b x ng x (np/ng + 2) x hn = 4,096 x 2 x (16 + 2) x 128 elements
    sp, again = 4 * gather_ms(S * 4096 * BF16, 4), 2 * gather_ms(S * 4096 * BF16, 4)
    qkv = gather_ms(S * 2 * (32 // 2 + 2) * 128 * BF16, 4)
    f, b = _tp_ms(LLAMA_KV2, 4, "dense")
    assert f == pytest.approx(sp + qkv, rel=1e-9)
    assert b == pytest.approx(sp + again + qkv, rel=1e-9)


def test_an_output_gate_is_gathered_with_qkv() -> None:
    # qwen3-next: np 16, ng 2, hn 256, h 2,048, gated: ng x (2 np/ng + 2) x hn; a hybrid
    # attention block is one sequence-parallel sublayer
    sp = 2 * gather_ms(S * 2048 * BF16, 4)
    qkv = gather_ms(S * 2 * (2 * 16 // 2 + 2) * 256 * BF16, 4)
    f, _ = _tp_ms({"preset": "qwen3-next-80b-a3b", "ep": 2}, 4, "attention")
    assert f == pytest.approx(sp + qkv, rel=1e-9)


@settings(max_examples=12, deadline=None)
@given(groups=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([2, 4, 8]))
def test_tp_dividing_the_groups_gathers_nothing_more(groups: int, tp: int) -> None:
    # at tp <= groups (tp | groups) a layer's tp traffic is the sequence-parallel
    # gathers and scatters alone (the backward's inputs gathered again); above them the
    # QKV gather joins, both ways
    f, b = _tp_ms({"preset": "llama3-8b", "num_kv_heads": groups}, tp, "dense")
    sp, again = 4 * gather_ms(S * 4096 * BF16, tp), 2 * gather_ms(S * 4096 * BF16, tp)
    qkv = gather_ms(S * groups * (32 // groups + 2) * 128 * BF16, tp) if tp > groups else 0
    assert f == pytest.approx(sp + qkv, rel=1e-9)
    assert b == pytest.approx(sp + again + qkv, rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(groups=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]))
def test_a_rank_keeps_its_query_heads_and_its_groups_keys(groups: int, tp: int) -> None:
    # num_query_groups_per_partition: ng / tp, or 1 above the groups; np / tp query heads
    a = _cfg({"preset": "llama3-8b", "num_kv_heads": groups}, tp).model.arch
    t = saved_tensors(a, "dense")
    kv_heads = 1 if groups < tp else groups // tp
    assert t["attn.k"] == t["attn.v"] == S * kv_heads * 128 * BF16
    assert t["attn.q"] == S * 32 // tp * 128 * BF16


def test_the_query_and_key_norms_keep_one_key_head_a_rank() -> None:
    # qwen3-235b-a22b at tp 8: np / tp = 8 query heads and 1 key head, RMSNorm's fp32
    # rstd one a head and token
    a = _cfg({"preset": "qwen3-235b-a22b", "ep": 8}, 8).model.arch
    t = saved_tensors(a, "moe")
    assert t["qk_norm.in"] == S * (8 + 1) * 128 * BF16
    assert t["qk_norm.stats"] == S * (8 + 1) * 4


def test_the_backward_holds_the_gathered_gradient() -> None:
    # the slices' backward fills a zero tensor of the gathered width: s x (np + 2 ng) x hn
    a = _cfg(LLAMA_KV2, 8).model.arch
    assert module_effect(a, "dense").transient_bytes >= S * (32 + 2 * 2) * 128 * BF16


def test_ulysses_needs_a_ranks_key_value_heads_to_split() -> None:
    # above the groups Transformer Engine's core gets num_gqa_groups = tp, one a rank,
    # which the all-to-all over cp 2 cannot split
    with pytest.raises(UserError, match="num_heads_kv = 1, cp_size = 2"):
        config_from_dict({"model": {**LLAMA_KV2, "tp": 4, "cp": 2, "cp_comm_type": "a2a"}})


def test_plan_offers_tp_beyond_the_groups(tmp_path, capsys) -> None:
    # 2 groups at 32k tokens on 8 GPUs without pp or cp: tp 1 and 2 overflow, tp 4 and 8
    # (multiples of the groups) fit
    cfg = tmp_path / "m.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\nnum_kv_heads = 2\nseq_length = 32768\n')
    assert main(["plan", "--config", str(cfg), "--hardware", "h100-80gb", "--gpus", "8",
                 "--pp", "1", "--cp", "1", "--global-batch-size", "8", "--json"]) in (0, 3)
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["tp"] in (4, 8)


@settings(max_examples=30, deadline=None)
@given(groups=st.sampled_from([1, 2, 4]), factor=st.sampled_from([2, 4]),
       head_dim=st.integers(1, 12), gate=st.booleans())
def test_simulate_takes_the_qkv_widths_megatron_splits(groups: int, factor: int,
                                                       head_dim: int, gate: bool) -> None:
    """Above the groups ColumnParallelLinear divides the projection's whole output, (np
    (twice with an output gate) + 2 ng) x hn, by tp (megatron/core/utils.py `divide`):
    a config whose width tp does not divide is refused naming model.head_dim."""
    tp, heads = groups * factor, groups * factor * 2
    model = {"kind": "transformer", "num_layers": 2, "hidden_size": heads * head_dim,
             "num_heads": heads, "num_kv_heads": groups, "head_dim": head_dim,
             "ffn_hidden_size": 64 * tp, "vocab_size": 64 * tp, "seq_length": 64 * tp,
             "micro_batch_size": 1, "tp": tp, "attention_output_gate": gate}
    width = (heads * (2 if gate else 1) + 2 * groups) * head_dim
    try:
        build_job(config_from_dict({"model": model}))
    except UserError as exc:
        assert width % tp and exc.field == "model.head_dim", exc
    else:
        assert width % tp == 0
