"""op-sac's partition of a layer's forward (ppsim.costs.op_sac): every op but attention's
core is either kept (its output saved) or run again in the backward, never both, never
neither; every second counted matmul is saved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import layer_ops
from ppsim.costs.op_sac import matmul_order, op_sac_kept, op_sac_repeats, saved_matmuls


@st.composite
def archs(draw) -> tuple[Architecture, str]:
    mla = draw(st.booleans())
    moe = draw(st.booleans())
    heads = draw(st.sampled_from([4, 8, 16]))
    head_dim = draw(st.sampled_from([32, 64]))
    fields = dict(num_layers=2, hidden_size=heads * head_dim, num_heads=heads,
                  num_kv_heads=heads if mla else draw(st.sampled_from([1, 2, heads])),
                  ffn_hidden_size=draw(st.sampled_from([256, 512])), vocab_size=512,
                  seq_length=draw(st.sampled_from([128, 256])), micro_batch_size=1,
                  gated_mlp=draw(st.booleans()), tp=draw(st.sampled_from([1, 2])),
                  recompute="op-sac", layers="moe*2" if moe else "")
    if mla:
        fields |= dict(attention="mla", head_dim=head_dim, q_lora_rank=draw(
            st.sampled_from([0, 64])), kv_lora_rank=64, qk_rope_head_dim=16,
            v_head_dim=head_dim)
    if moe:
        fields |= dict(num_experts=4, top_k=2, moe_ffn_hidden_size=128,
                       shared_experts=draw(st.sampled_from([0, 1])),
                       ep=draw(st.sampled_from([1, 2])))
    return Architecture(**fields), "moe" if moe else "dense"


@settings(max_examples=60, deadline=None)
@given(case=archs())
def test_each_op_is_kept_or_run_again(case: tuple[Architecture, str]) -> None:
    a, kind = case
    names = {op.name for op in layer_ops(a, kind)}
    order, saved = matmul_order(a, kind), saved_matmuls(a, kind)
    assert all(mm.op in names for mm in order)
    again = op_sac_repeats(a, kind)
    assert not again.whole & again.halved and "attention" not in again.whole | again.halved
    for op in names - {"attention"}:
        halves = [mm for mm in saved if mm.op == op and mm.half]
        whole_saved = any(mm.op == op and not mm.half for mm in saved)
        if whole_saved or len(halves) == 2:
            assert op not in again.whole | again.halved, op
        elif halves:
            assert op in again.halved, op
        else:
            assert op in again.whole, op
    kept = op_sac_kept(a, kind)
    assert all(v > 0 for v in kept.values())
    for mm in saved:  # each saved matmul's output is kept, under its op's name
        assert f"{mm.op}.out{mm.half or ''}" in kept, mm
