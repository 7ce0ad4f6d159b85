"""The built-in GPT at tp above its key/value groups (ppsim.executor.builders.qkv_gather):
its tensor ranks' rows of the fused QKV, put together in rank order, are the whole
layer's query rows and packed K and V rows interleaved group by group, each bias entry
beside its weight row, none repeated or lost."""

from __future__ import annotations

import copy

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from ppsim.executor.builders.gpt import Block, GPTShape  # noqa: E402
from ppsim.executor.builders.tensor import TensorGroup  # noqa: E402


def _shape(heads: int, groups: int, head_dim: int) -> GPTShape:
    return GPTShape(num_layers=1, hidden_size=heads * head_dim, num_heads=heads,
                    num_kv_heads=groups, ffn_hidden_size=8 * head_dim, vocab_size=16,
                    seq_length=4, micro_batch_size=1, gated_mlp=False, dtype="fp32")


def _interleaved(heads: int, groups: int, hd: int) -> list[int]:
    """Each fused row's index into the whole layer's rows q then kv (K heads, V heads)."""
    per, h = heads // groups, heads * hd
    out: list[int] = []
    for i in range(groups):
        out += list(range(i * per * hd, (i + 1) * per * hd))  # the group's query heads
        out += list(range(h + i * hd, h + (i + 1) * hd))  # its key head
        out += list(range(h + groups * hd + i * hd, h + groups * hd + (i + 1) * hd))  # value
    return out


@settings(max_examples=12)
@given(groups=st.sampled_from([1, 2]), ranks_per_group=st.sampled_from([2, 4]),
       heads_per_rank=st.sampled_from([1, 2]), head_dim=st.sampled_from([2, 3, 4]))
def test_the_ranks_fused_rows_are_the_whole_layers_interleaved(
        groups: int, ranks_per_group: int, heads_per_rank: int, head_dim: int) -> None:
    tp = groups * ranks_per_group
    heads = tp * heads_per_rank
    assume((heads + 2 * groups) * head_dim % tp == 0)  # the config's rule (kv_split)
    torch.manual_seed(0)
    whole = Block(_shape(heads, groups, head_dim))
    with torch.no_grad():  # biases too (a fresh layer's are zero)
        for p in whole.parameters():
            p.normal_()
    fused = []
    for rank in range(tp):
        block = copy.deepcopy(whole)
        block.shard(TensorGroup(group=None, rank=rank, size=tp))
        assert block.q is None and block.kv is None and block.qkv is not None
        assert (block.heads, block.kv_heads) == (heads // tp, 1)
        fused.append(block.qkv)
    rows = _interleaved(heads, groups, head_dim)
    weight = torch.cat([whole.q.weight, whole.kv.weight]).detach()
    bias = torch.cat([whole.q.bias, whole.kv.bias]).detach()
    assert torch.equal(torch.cat([f.weight for f in fused]).detach(), weight[rows])
    assert torch.equal(torch.cat([f.bias for f in fused]).detach(), bias[rows])
