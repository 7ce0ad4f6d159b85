"""Splits the frameworks make by their own rules, and the lowest peak any split reaches.

DeepSpeed (`partition_method='parameters'` and `'uniform'`) and torchtitan's
default split are computed here as those frameworks compute them, so `plan`
compares its answer with what their users get without ppsim (Megatron's
baseline is in ppsim.plan.references). Sources, read at the commits the
tests re-state them from: DeepSpeed edaa722 deepspeed/runtime/utils.py
(partition_uniform, partition_balanced) and runtime/pipe/module.py
(_partition_layers, _count_layer_params); torchtitan b5bcd76
torchtitan/distributed/pipeline_parallel.py (_generate_llm_fqn_per_model_part).

Every loop here is iterative and stopped by a deadline, so a huge model never
holds a plan past its budget.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.costs.model import ModelCosts, StageCost
from ppsim.pipeline.exports import DeepSpeedSpecs
from ppsim.plan.bounds import INF, MinMaxTable
from ppsim.plan.search import Deadline, SplitSearch


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
    found = _lowest_peak_dfs(search, total, deadline, seen)
    if seen is not None and (found is None or seen[0] <= found[0]):
        return seen
    return found or (0, 0)


def _lowest_peak_dfs(search: SplitSearch, total: Callable[[int, list[StageCost]], int],
                     deadline: Deadline, seen: tuple[int, int] | None = None
                     ) -> tuple[int, int] | None:
    """Branch and bound (explicit stack) for the lowest max-rank peak, several chunks,
    from the lowest `seen` (a split the planner evaluated); a partial split is cut when
    its floor (SplitSearch.floors.completion) reaches the lowest found."""
    S, L = search.S, search.L
    last_of_rank = {max(st): r for r, st in enumerate(search.rank_stages)}
    found: tuple[float, int] = (float(seen[0]), seen[1]) if seen else (INF, -1)
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
                if r is not None and c > 0:  # an empty stage holds its whole input
                    break  # from one layer on, more layers only need more memory
                continue
            if k < S - 1 and search.floors.completion(new, pos + c) >= found[0]:
                continue
            stack[-1][3] = c + 1 if k < S - 1 else -1
            stack.append([new, pos + c, v, 0])
            descended = True
            break
        if not descended:
            stack.pop()
    return (int(found[0]), found[1]) if found[1] >= 0 else None


# ------------------------------------------------------------ the frameworks' splits


@dataclass(frozen=True, kw_only=True)
class FrameworkSplit:
    """One framework's split of a model, by that framework's own rule."""

    key: str
    """Its JSON name: `plan --json` reports `speedup_vs_<key>`."""
    label: str
    """Its row in `plan`'s table."""
    counts: tuple[int, ...] | None
    """Layers per virtual stage; None when the framework makes no runnable split here."""
    note: str = ""
    """Why `counts` is None, in words."""


def partition_uniform(items: int, parts: int) -> list[int]:
    """DeepSpeed's partition_uniform: boundaries of `parts` runs of entries, the first
    items % parts runs one longer; with no more items than parts, one entry per run
    and empty runs after."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


def partition_balanced(weights: Sequence[int], parts: int,
                       deadline: Deadline | None = None) -> list[int] | None:
    """DeepSpeed's partition_balanced (v0.12.5 on): boundaries of `parts` non-empty
    contiguous runs, chosen entry by entry by DeepSpeed's dynamic program over
    (largest run - smallest run), ties to the latest cut, in float64 as DeepSpeed's
    numpy arrays hold them. The program is DeepSpeed's, not an exact minimiser of
    max - min: the answer is what DeepSpeed builds. None when the deadline passes."""
    n, m = len(weights), parts
    if n <= m:
        return partition_uniform(n, m)
    prefix, total = [0.0], 0
    for w in weights:
        total += int(w)
        prefix.append(float(total))  # numpy's int64 cumsum stored as float64
    hi = [[INF] * (n + 1) for _ in range(m + 1)]  # hi[j][i]: largest run, i entries, j runs
    lo = [[INF] * (n + 1) for _ in range(m + 1)]
    cut = [[0] * (n + 1) for _ in range(m + 1)]
    hi[0][0] = 0.0
    for i in range(1, n + 1):
        if deadline is not None and deadline.passed():
            return None
        p_i = prefix[i]
        hi[1][i] = lo[1][i] = p_i  # one run: entries 0..i-1 (cost 0, cut at 0)
        for j in range(2, min(i, m) + 1):
            # Cuts before j - 1 entries leave a run empty: infinite cost, and a finite
            # one always follows them, so DeepSpeed's loop ends on a cut from j - 1 on.
            best, h_j, l_j, at = INF, INF, INF, 0
            h_prev, l_prev = hi[j - 1], lo[j - 1]
            for k in range(j - 1, i):
                seg = p_i - prefix[k]
                h = h_prev[k] if h_prev[k] > seg else seg
                low = l_prev[k] if l_prev[k] < seg else seg
                if best >= h - low:
                    best, h_j, l_j, at = h - low, h, low, k
            hi[j][i], lo[j][i], cut[j][i] = h_j, l_j, at
    bounds = [n]
    for j in range(m, 0, -1):
        bounds.append(cut[j][bounds[-1]])
    return bounds[::-1]


def _spec_weights(costs: ModelCosts, specs: DeepSpeedSpecs) -> list[int]:
    """Each spec entry's parameters, as DeepSpeed's _count_layer_params counts them: the
    embedding first, decoder layers, the head last; the other entries before and after
    (lambdas, a final norm) carry none. Costs without parameter counts (uniform models,
    cost files without `params`) weigh entries by their static bytes instead."""
    pieces = [costs.embedding, *costs.layers, costs.head]
    field = "params" if any(p.params for p in pieces) else "static_bytes"
    w = [getattr(p, field) for p in pieces]
    return [w[0], *[0] * (specs.before - 1), *w[1:-1], *[0] * (specs.after - 1), w[-1]]


def counts_from_boundaries(bounds: Sequence[int], specs: DeepSpeedSpecs,
                           layers: int) -> tuple[int, ...] | None:
    """Decoder layers per stage of DeepSpeed boundaries over the spec list; None when a
    stage holds no entry at all (DeepSpeed would build an empty stage)."""
    out = []
    for a, b in itertools.pairwise(bounds):
        if b <= a:
            return None
        out.append(max(0, min(b, specs.before + layers) - max(a, specs.before)))
    return tuple(out)


def deepspeed_splits(costs: ModelCosts, pp: int, vpp: int, specs: DeepSpeedSpecs,
                     deadline: Deadline | None = None) -> list[FrameworkSplit]:
    """DeepSpeed's `parameters` and `uniform` splits of the spec list (one stage a rank)."""
    out = []
    entries = specs.before + costs.num_layers + specs.after
    for key, label in (("deepspeed_parameters", "DeepSpeed parameters"),
                       ("deepspeed_uniform", "DeepSpeed uniform")):
        counts, note = None, ""
        if vpp > 1:
            note = f"DeepSpeed runs one stage per rank, not vpp {vpp}"
        elif key == "deepspeed_uniform":
            counts = counts_from_boundaries(partition_uniform(entries, pp), specs,
                                            costs.num_layers)
        else:
            bounds = partition_balanced(_spec_weights(costs, specs), pp, deadline)
            if bounds is None:
                note = "the time budget ran out before DeepSpeed's partition did"
            else:
                counts = counts_from_boundaries(bounds, specs, costs.num_layers)
        if counts is None and not note:
            note = f"{entries} spec entries on {pp} stages leave a stage empty"
        out.append(FrameworkSplit(key=key, label=label, counts=counts, note=note))
    return out


def torchtitan_counts(layers: int, stages: int, input_weight: int = 1,
                      output_weight: int = 1) -> tuple[int, ...] | str:
    """torchtitan's default split (_generate_llm_fqn_per_model_part): the embedding counts
    as `input_weight` layers and norm + head as `output_weight`; the total is spread
    evenly, earlier stages one more. Its refusal in words when torchtitan raises."""
    if stages == 1:
        return (layers,)
    effective = layers + input_weight + output_weight
    per, extra = divmod(effective, stages)
    if per == 0:
        return (f"{stages} stages exceed torchtitan's {effective} effective layers "
                f"({layers} + {input_weight} + {output_weight})")
    if max(input_weight, output_weight) > per:
        return f"a weight exceeds torchtitan's {per} layers per stage"
    counts = [per + (s < extra) for s in range(stages)]
    counts[0] -= input_weight
    counts[-1] -= output_weight
    return tuple(counts)


def torchtitan_split(layers: int, stages: int, mtp: int) -> FrameworkSplit:
    """torchtitan's default split with its default weights (1 and 1)."""
    counts: tuple[int, ...] | str
    if mtp and stages > 1:
        counts = "torchtitan rejects MTP under pipeline parallelism (deepseek_v3/mtp.py)"
    else:
        counts = torchtitan_counts(layers, stages)
        if stages == 1 and not isinstance(counts, str):
            counts = (layers + mtp,)  # one stage holds everything
    if isinstance(counts, str):
        return FrameworkSplit(key="torchtitan", label="torchtitan default", counts=None,
                              note=counts)
    return FrameworkSplit(key="torchtitan", label="torchtitan default", counts=counts)
