"""The expert-parallel dispatch in real gloo processes, against the whole MoE layer in
each: routing that leaves the highest experts unchosen still sends each pair to its
expert's rank (the counts cover all E experts, not the E / ep a rank holds), and with
each expert split over two ranks too, the ranks holding the unchosen experts receive
and gather no pairs at all."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from ppsim.executor.builders import load_builder  # noqa: E402
from ppsim.executor.builders.tensor import ExpertGroup, TensorGroup, set_group  # noqa: E402
from ppsim.executor.spawned import spawn_results  # noqa: E402
from ppsim.fileio import write_json_atomic  # noqa: E402

pytestmark = pytest.mark.e2e
FIELDS = {"preset": "tiny-gpt", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
          "num_kv_heads": 2, "ffn_hidden_size": 128, "vocab_size": 256, "seq_length": 16,
          "micro_batch_size": 2, "dtype": "fp32", "gated_mlp": True, "layers": "dense, moe",
          "num_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 32, "norm": "rmsnorm",
          "position": "rotary"}


def _moe(experts: ExpertGroup | None, split: TensorGroup | None = None) -> torch.nn.Module:
    """Layer 1's MoE block from the shipped builder, its router sending every positive
    input to experts 0 and 1 alone."""
    set_group(None, experts, split)
    torch.manual_seed(0)
    moe = load_builder("ppsim.executor.builders.llama:build", FIELDS).layer(1).mlp
    set_group(None, None)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None]
                                .expand_as(moe.router.weight))
    return moe


def _compare(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=2)
    whole = _moe(None)
    split = _moe(ExpertGroup(group=dist.group.WORLD, rank=rank, size=2))
    x = torch.rand(2, 16, 64, generator=torch.Generator().manual_seed(rank))
    y, want = split(x), whole(x)
    y.sum().backward()
    write_json_atomic(os.path.join(folder, f"r{rank}.json"),
                      {"err": float((y - want).abs().max()),
                       "experts": int(split.up.shape[0])})
    dist.destroy_process_group()


def test_pairs_reach_their_experts_when_the_highest_go_unchosen(tmp_path) -> None:
    paths = [str(tmp_path / f"r{r}.json") for r in range(2)]
    results = spawn_results(_compare, (str(tmp_path),), 2, paths)
    assert [r["experts"] for r in results] == [2, 2]  # E / ep each
    assert all(r["err"] < 1e-5 for r in results), results


def _compare_split(rank: int, folder: str) -> None:
    """ep 2 x etp 2 over 4 processes (place q: expert tensor rank q % 2, expert rank
    q // 2): ranks 2 and 3 hold experts 2 and 3, which no pair reaches."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=4)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    shared = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    whole = _moe(None)
    split = _moe(ExpertGroup(group=shared[rank % 2], rank=rank // 2, size=2),
                 TensorGroup(group=pairs[rank // 2], rank=rank % 2, size=2))
    x = torch.rand(2, 16, 64, generator=torch.Generator().manual_seed(rank))
    y, want = split(x), whole(x)
    y.sum().backward()
    write_json_atomic(os.path.join(folder, f"r{rank}.json"),
                      {"err": float((y - want).abs().max()), "units": int(split.up.shape[2])})
    dist.destroy_process_group()


def test_ranks_whose_experts_go_unchosen_gather_no_pairs(tmp_path) -> None:
    paths = [str(tmp_path / f"r{r}.json") for r in range(4)]
    results = spawn_results(_compare_split, (str(tmp_path),), 4, paths)
    assert [r["units"] for r in results] == [16] * 4  # half of each expert's 32 units
    assert all(r["err"] < 1e-5 for r in results), results
