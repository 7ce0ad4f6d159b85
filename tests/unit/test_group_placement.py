"""Groups of one kind that fall on nodes differently: each kind is priced at its worst
placed group, the one the job waits for. On GB200 NVL72 (72 GPUs a node) at tp 8, pp 2,
dp 8 rank 0's data-parallel group, ranks 0, 8, ..., 56, stays in node 0, but pipeline
rank 1's, ranks 64, 72, ..., 120, has rank 64 alone on node 0: its ring goes in and out
of that node through rank 64's one NIC."""

from __future__ import annotations

import json
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.job.model import groups
from ppsim.job.ranks import DIMS, Sizes, parse_order, pipeline_hops, span

NIC_GBPS, NIC_STEP_MS = 50.0, 5e-3  # one 400 Gb/s NIC a GPU, a step across nodes


def test_a_group_is_bound_by_its_thinnest_node() -> None:
    # tp 2 x cp 3 = 6: the dp group 0, 6, 12, 18 has two ranks on node 0, one on 1 and 2.
    w = span([0, 6, 12, 18], 8)
    assert (w.size, w.nodes, w.per_node) == (4, 3, 1)


def test_nvl72_second_stage_dp_group_crosses_nodes() -> None:
    g = groups(Sizes(tp=8, dp=8, pp=2), "tp-cp-ep-dp-pp", 72)
    assert (g.dp.size, g.dp.nodes, g.dp.per_node) == (8, 2, 1)
    assert not g.tp.crosses_nodes  # 72 = 9 x 8: every tp group inside a node
    # rank 8's replica: stage 0 on rank 8 (node 0), stage 1 on rank 72 (node 1)
    assert pipeline_hops(Sizes(tp=8, dp=8, pp=2), 72) == [True]


def test_nvl72_gradient_all_reduce_runs_at_one_nic(capsys) -> None:
    """Llama 3 8B, 128 GB200s, tp 8, pp 2: each rank's fp32 gradients ring-all-reduced
    over dp 8 at one NIC's bandwidth (rank 64's), 2(n - 1) steps across nodes."""
    argv = ["--preset", "llama3-8b", "--hardware", "gb200-186gb", "--tp", "8", "--pp", "2",
            "--gpus", "128", "--json"]
    assert main(["costs", *argv]) == 0
    rows = [c for c in json.loads(capsys.readouterr().out)["priced_collectives"]
            if c["collective"] == "dp all-reduce"]
    assert main(["simulate", *argv]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"]["crosses_nodes"]["dp"] is True
    n = 8
    for row, step in zip(rows, out["step_collectives"], strict=True):
        ring = 2 * (n - 1) * NIC_STEP_MS + 2 * (n - 1) / n * row["nbytes"] / (NIC_GBPS * 1e6)
        assert row["link"] == "network"
        assert step["ms"] == pytest.approx(ring, rel=1e-9)


def _every_group(s: Sizes, dims: tuple[str, ...], order: str) -> list[list[int]]:
    """Brute force: all ranks, grouped by their coordinates outside `dims`."""
    sizes = {"tp": s.tp, "cp": s.cp, "ep": 1, "dp": s.dp, "pp": s.pp}
    names = parse_order(order)
    out: dict[tuple[int, ...], list[int]] = {}
    for coords in product(*(range(sizes[d]) for d in names)):
        rank, stride = 0, 1
        for d, c in zip(names, coords, strict=True):
            rank, stride = rank + c * stride, stride * sizes[d]
        key = tuple(c for d, c in zip(names, coords, strict=True) if d not in dims)
        out.setdefault(key, []).append(rank)
    return list(out.values())


def _worst(every: list[list[int]], gpn: int) -> tuple[int, bool, int, int]:
    """(size, crosses nodes, fewest members on a node, nodes) of the slowest group: any
    crossing nodes before those inside one, then the thinnest node, then the most nodes."""
    def placed(g: list[int]) -> tuple[int, bool, int, int]:
        per = [sum(r // gpn == n for r in g) for n in {r // gpn for r in g}]
        return len(g), len(per) > 1, min(per), len(per)
    return max((placed(g) for g in every), key=lambda p: (p[1], -p[2], p[3]))


@settings(max_examples=80, deadline=None)
@given(s=st.builds(Sizes, tp=st.sampled_from([1, 2, 3, 4, 8]), cp=st.sampled_from([1, 3]),
                   dp=st.sampled_from([1, 2, 3, 6]), pp=st.sampled_from([1, 2, 3])),
       order=st.permutations(DIMS), gpn=st.sampled_from([4, 6, 8, 72]),
       dim=st.sampled_from(["tp", "cp", "dp", "pp"]))
def test_the_priced_group_is_the_worst_of_all(s: Sizes, order: list[str], gpn: int,
                                              dim: str) -> None:
    """The span priced for a kind is the worst over every group of it in the world, and
    a pipeline boundary crosses nodes where it does in any replica."""
    o = "-".join(order)
    g = groups(s, o, gpn)
    every = _every_group(s, (dim,) if dim != "dp" else ("cp", "dp"), o)
    field = {"tp": g.tp, "cp": g.cp, "dp": g.dp}
    if dim in field:
        w = field[dim]
        assert (w.size, w.nodes > 1, w.per_node, w.nodes) == _worst(every, gpn)
    else:
        hops = [any(r[i] // gpn != r[i + 1] // gpn for r in every) for i in range(s.pp - 1)]
        assert list(g.pipeline_hops) == hops
