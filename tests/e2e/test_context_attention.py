"""Context-parallel attention in real gloo processes against the whole sequence's in one:
each rank's queries at its two load-balanced chunks, K and V gathered over the ranks,
the outputs and the gradients of Q, K and V each rank's slice of the one-process ones
(causal, sliding-window, grouped-query and latent-attention head sizes), with K and V
passed round the ring, gathered, and the heads exchanged by all-to-all."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ppsim.executor.builders.context import chunk_positions, set_context  # noqa: E402
from ppsim.executor.builders.cp_attention import ATTENTION, context_attention  # noqa: E402
from ppsim.executor.builders.stage import AttentionCore  # noqa: E402
from ppsim.executor.groups import context_groups  # noqa: E402
from ppsim.executor.spawned import spawn_results  # noqa: E402
from ppsim.fileio import write_json_atomic  # noqa: E402

pytestmark = pytest.mark.e2e
CASES = [  # (heads, kv heads, qk dim, v dim, window)
    (4, 2, 8, 8, 0),   # grouped-query, causal
    (4, 4, 8, 8, 5),   # a sliding window reaching into the other rank's chunk
    (2, 2, 12, 8, 0),  # latent attention's narrower value heads
    (6, 3, 8, 8, 4),   # heads an all-to-all splits over 3 ranks
]


def _tensors(case: tuple, seq: int) -> list[torch.Tensor]:
    heads, kv, qk, v, _ = case
    g = torch.Generator().manual_seed(hash(case) % 1000)
    return [torch.randn(2, n, seq, d, generator=g, dtype=torch.float64)
            for n, d in ((heads, qk), (kv, qk), (kv, v))]


HEADS_SPLIT = {"a2a": lambda cp: cp, "a2a+p2p": lambda cp: A2A}
"""Over how many ranks a traffic exchanges the heads (they must divide them)."""
A2A = 2
"""a2a+p2p's all-to-all size (cp 4: two groups of 2, a ring of 2 across them)."""


def _runs(comm: str, cp: int, case: tuple) -> bool:
    """Whether `comm` takes `case` at `cp`: the heads split where it exchanges them."""
    if comm == "a2a+p2p" and cp % A2A + (cp == A2A):
        return False  # no all-to-all groups and ring of them
    split = HEADS_SPLIT.get(comm, lambda cp: 1)(cp)
    return not case[0] % split + case[1] % split


def _max_errors(rank: int, cp: int, seq: int, comm: str) -> list[float]:
    """Each case's largest difference, output and gradients, from the whole sequence's."""
    errors = []
    groups = context_groups(list(range(cp)), comm, A2A)
    for case in CASES:
        window = case[4]
        if not _runs(comm, cp, case):
            continue
        whole = [t.requires_grad_() for t in _tensors(case, seq)]
        set_context(None)  # the one-process attention, as AttentionCore runs it
        want = AttentionCore(window)(*whole)
        (want * torch.arange(want.numel()).view_as(want).sin()).sum().backward()
        mine = chunk_positions(seq, cp, rank)
        local = [t.detach()[:, :, mine].clone().requires_grad_() for t in whole]
        set_context(groups[rank])
        got = context_attention(*local, window)
        weight = torch.arange(want.numel()).view_as(want).sin()[:, :, mine]
        (got * weight).sum().backward()
        set_context(None)
        pairs = [(got, want[:, :, mine])] + [(x.grad, w.grad[:, :, mine])
                                             for x, w in zip(local, whole, strict=True)]
        errors.append(max(float((a - b).abs().max()) for a, b in pairs))
    return errors


def _compare(rank: int, folder: str, cp: int, seq: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=cp)
    write_json_atomic(os.path.join(folder, f"r{rank}.json"),
                      {comm: _max_errors(rank, cp, seq, comm) for comm in ATTENTION})
    dist.destroy_process_group()


@pytest.mark.parametrize(("cp", "seq"), [(2, 16), (3, 12), (4, 16)])
def test_each_rank_attends_as_the_whole_sequence_does(tmp_path, cp: int, seq: int) -> None:
    """K and V passed round the ring (p2p), gathered (all_gather), the heads exchanged
    (a2a: where cp divides them), or both (a2a+p2p at cp 4: pairs, a ring of 2)."""
    paths = [str(tmp_path / f"r{r}.json") for r in range(cp)]
    results = spawn_results(_compare, (str(tmp_path), cp, seq), cp, paths)
    assert set(results[0]) == {"p2p", "all_gather", "a2a", "a2a+p2p"}
    for comm in results[0]:
        runs = [c for c in CASES if _runs(comm, cp, c)]
        assert len(results[0][comm]) == len(runs), results
        assert runs or comm == "a2a+p2p" and cp != 4
        assert all(e < 1e-10 for r in results for e in r[comm]), results


def test_the_causal_core_checks_itself() -> None:
    """The reference above is the executor's own core: check it against the closed form
    (softmax over each query's keys at or before it) on a small case."""
    q, k, v = (torch.randn(1, 1, 4, 2, dtype=torch.float64) for _ in range(3))
    scores = (q @ k.transpose(-2, -1)) / 2 ** 0.5
    scores = scores.masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf"))
    want = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(AttentionCore()(q, k, v), want)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), want)
