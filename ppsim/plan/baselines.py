"""Reference splits and memory floors beside the search: DeepSpeed's
parameter-balanced split and the lowest peak any split reaches (the even
baseline is ppsim.pipeline.split.even_counts).

Each is a min-max over splits computed without recursion and stopped by a
deadline, so a huge model never holds a plan past its budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ppsim.costs.model import StageCost
from ppsim.plan.bounds import INF, MinMaxTable
from ppsim.plan.search import Deadline, SplitSearch


def deepspeed_counts(search: SplitSearch, deadline: Deadline | None = None
                     ) -> tuple[int, ...] | None:
    """DeepSpeed partition_method='parameters': contiguous parts minimising the largest
    parameter (static-byte) sum, with the embedding and head counted as layers.
    None when the deadline passes first."""
    table = MinMaxTable(search.S, search.L,
                        lambda pos, c, k: search.stage_bytes(pos, c, k)[0])
    return table.argmin() if table.solve(deadline) else None


def smallest_peak(search: SplitSearch, deadline: Deadline | None = None) -> tuple[int, int]:
    """(bytes, rank): the lowest highest-rank peak memory over all splits.

    Exact min-max table with one chunk per rank; with chunks a branch and
    bound. Either stops at the deadline, then answers the lowest found
    (among the splits the planner evaluated, too).
    """
    deadline = deadline or Deadline(time.perf_counter() + 5.0)
    seen = search.smallest_peak_seen()

    def total(r: int, costs: list[StageCost]) -> int:
        rc = [costs[s] for s in search.rank_stages[r]]
        return sum(c.static_bytes for c in rc) + search.rank_peak(r, rc)

    if search.vpp == 1:
        def term(pos: int, c: int, k: int) -> float:
            return search.one_chunk_total(pos, c, k)

        table = MinMaxTable(search.S, search.L, term)
        if table.solve(deadline):
            counts = table.argmin()
            assert counts is not None  # peaks are finite
            pos, worst = 0, (-1.0, -1)
            for k, c in enumerate(counts):
                worst = max(worst, (term(pos, c, k), k))
                pos += c
            return int(worst[0]), worst[1]
        return seen or (0, 0)
    found = _lowest_peak_dfs(search, total, deadline)
    if seen is not None and (found is None or seen[0] < found[0]):
        return seen
    return found or (0, 0)


def _lowest_peak_dfs(search: SplitSearch, total: Callable[[int, list[StageCost]], int],
                     deadline: Deadline) -> tuple[int, int] | None:
    """Branch and bound (explicit stack) for the lowest max-rank peak, several chunks."""
    S, L = search.S, search.L
    last_of_rank = {max(st): r for r, st in enumerate(search.rank_stages)}
    found: tuple[float, int] = (INF, -1)
    # Frame: (costs placed, first free layer, worst (peak, rank) so far, next count to try)
    stack: list[list] = [[[], 0, (0, -1), 0]]
    while stack and not deadline.passed():
        costs, pos, cur, c = stack[-1]
        k = len(costs)
        if k == S:
            if cur[0] < found[0]:
                found = cur
            stack.pop()
            continue
        choices = range(c, L - pos + 1) if k < S - 1 else range(L - pos, L - pos + 1)
        if c > L - pos or (k == S - 1 and c == -1):
            stack.pop()
            continue
        descended = False
        for c in choices:
            new = costs + [search.stage(pos, c, k)]
            v = cur
            r = last_of_rank.get(k)
            if r is not None:
                v = max(cur, (total(r, new), r))
            if v[0] >= found[0]:
                if r is not None:
                    break  # more layers only need more memory
                continue
            stack[-1][3] = c + 1 if k < S - 1 else -1
            stack.append([new, pos + c, v, 0])
            descended = True
            break
        if not descended:
            stack.pop()
    return (int(found[0]), found[1]) if found[1] >= 0 else None
