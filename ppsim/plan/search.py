"""What stays fixed while the planner varies the split, and the exact evaluator of one split.

`SplitSearch.evaluate` returns exactly what `simulate` reports for a split
(tests/property/test_planner.py proves it; activation offload excepted, whose copies
it prices per stage by ppsim.sim.copies.estimated) by list scheduling over a schedule
compiled once. Imports go one way: search -> bounds -> branch -> planner.
"""

from __future__ import annotations

import time
from functools import cached_property, lru_cache

from ppsim.costs.model import (
    StageCost,
    held_by_rank,
    held_input_bytes,
    least_busy_ms,
    less_held,
    receives_input,
    stage_cost,
    stage_transient,
)
from ppsim.pipeline.problem import Problem
from ppsim.plan.floor import MemoryFloor, MemoryFloors, memory_floors
from ppsim.schedules.generators import B, F, W
from ppsim.sim.copies import estimated
from ppsim.sim.evaluate import list_schedule
from ppsim.sim.summary import Summary, busy_ms, step_parts, summarize
from ppsim.sim.timing import compile_schedule, in_pairs, p2p_link

STAGE_CACHE = 1 << 16
"""Stage costs kept (offset, count, stage): bounded, the search may visit millions."""
SUMMARY_CACHE_RANKS = 1 << 21
"""Evaluated splits kept, counted in per-rank records; beyond it the cache starts over."""


class Deadline:
    """A wall-clock limit that callers check before work they can estimate."""

    def __init__(self, at: float) -> None:
        self.at = at

    def passed(self) -> bool:
        return time.perf_counter() > self.at

    def affords(self, seconds: float) -> bool:
        """True when work expected to take `seconds` ends before the deadline."""
        return time.perf_counter() + seconds <= self.at


class SplitSearch:
    """Everything that stays fixed while the split varies, precomputed once."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.costs = problem.costs
        self.sched = problem.schedule
        self.compiled = compile_schedule(problem.schedule)
        self.pp, self.vpp, self.m = self.sched.pp, self.sched.vpp, self.sched.microbatches
        self.S = self.sched.num_stages
        self.L = self.costs.num_layers
        self.memory = problem.hardware.memory_bytes
        self.split_bw = self.sched.split_backward
        self.together = [in_pairs(self.sched, r) for r in range(self.pp)]
        """Per rank: positions of the ops a combined 1F1B runs in pairs (none: empty);
        they take pair_saving_ms less (0 unless the job runs the combined order)."""
        self.evaluated = 0
        # The simulator's link model; every boundary carries the hidden state.
        link = p2p_link(problem.hardware.transfer_ms)
        rank, hidden = self.sched.stage_rank, self.costs.hidden_bytes
        self.delay = [link(rank(s), rank(s + 1), hidden) for s in range(self.S - 1)]
        # Per-op message delays do not depend on the split (hidden size is fixed).
        self.send_delay = [[self.delay[ss] if ss >= 0 else 0.0 for ss in stages]
                           for stages in self.compiled.send_stage]
        self.eval_s = 0.0
        """Wall time of the latest evaluation: what one more is expected to cost."""
        self.patterns = [self._memory_pattern(r) for r in range(self.pp)]
        self._maximal = [maximal(recs) for recs in self.patterns]
        """Per rank: the records no other record matches or exceeds in every count, the
        only ones a peak of non-negative bytes can come from (_peak)."""
        self._inflight = [max((sum(rec[:self.vpp]) for rec in recs), default=0)
                          for recs in self.patterns]
        """Per rank: the most microbatches it holds at once, whatever the split."""
        self._caps = [tuple(map(max, zip(*recs, strict=True))) if recs else (0,) * 3 * self.vpp
                      for recs in self.patterns]
        """Per rank: each count's largest value over its records (rank_peak_cap)."""
        self.rank_stages = [[s for s in range(self.S) if self.sched.stage_rank(s) == r]
                            for r in range(self.pp)]
        self.receives = [receives_input(problem.split, s) for s in range(self.S)]
        """Stage s takes hidden states from the stage before (held until its B)."""
        self._stage = lru_cache(maxsize=STAGE_CACHE)(self._stage_cost)
        self._evaluated: dict[tuple[int, ...], Summary] = {}
        # Integer prefix sums of the byte fields: exact, so a stage's bytes in O(1).
        self._pre_bytes = []
        for name in ("static_bytes", "activation_bytes", "weight_grad_bytes"):
            pre = [0]
            for lc in self.costs.layers:
                pre.append(pre[-1] + getattr(lc, name))
            self._pre_bytes.append(pre)

    # ------------------------------------------------------------ costs

    def _stage_cost(self, offset: int, count: int, index: int) -> StageCost:
        twice = held_by_rank(self.costs, self.problem.split, index)
        if self.problem.memory is not None:  # a memory policy prices the stage
            # Offload copies by their per-stage estimate (re-simulated where reported).
            return self.problem.held(less_held(estimated(self.problem.memory.stage_cost(
                offset, count, index, index == 0, index == self.S - 1, self.receives[index],
                self.fits)), twice))
        return self.problem.held(less_held(stage_cost(
            self.costs, offset, count, index == 0, index == self.S - 1,
            self.receives[index]), twice))

    def fits(self, index: int, c: StageCost) -> bool:
        """Stage `index` with cost c keeps its rank within memory, one chunk per rank."""
        wg = c.weight_grad_bytes if self.split_bw else 0
        return c.static_bytes + self._peak(index, [c.activation_bytes], [wg],
                                           [c.transient_bytes]) <= self.memory

    def stage(self, offset: int, count: int, index: int) -> StageCost:
        return self._stage(offset, count, index)

    def work(self, c: StageCost) -> float:
        """Least busy time of one microbatch on a stage (F + B + W, as short as in a
        combined pair)."""
        return least_busy_ms(c)

    def _memory_pattern(self, r: int) -> list[tuple[int, ...]]:
        """Per-chunk (full, kept, in B) counts at every op start on rank r.

        A rank's peak activation bytes is the max over these records of
        sum(full_c * activation_c + kept_c * weight_grad_c + inb_c * transient_c),
        integer-exact (inb_c: 1 while a B of chunk c runs).
        """
        chunks = self.vpp
        full = [0] * chunks
        kept = [0] * chunks
        records = set()
        for kind, stage in zip(self.compiled.kind[r], self.compiled.stage[r], strict=True):
            c = stage // self.pp
            if kind == F:
                full[c] += 1
            inb = tuple(int(kind == B and i == c) for i in range(chunks))
            records.add(tuple(full) + tuple(kept) + inb)
            if kind == B:
                full[c] -= 1
                if self.split_bw:
                    kept[c] += 1
            elif kind == W:
                kept[c] -= 1
        return sorted(records)

    def stage_bytes(self, pos: int, count: int, k: int) -> tuple[int, int, int]:
        """(static, activation, weight-grad) bytes of stage k holding layers pos..pos+count-1:
        what `stage(pos, count, k)` holds, in O(1)."""
        if self.problem.memory is not None:
            c = self.stage(pos, count, k)
            return c.static_bytes, c.activation_bytes, c.weight_grad_bytes
        out = []
        for pre, name in zip(self._pre_bytes, ("static_bytes", "activation_bytes",
                                               "weight_grad_bytes"), strict=True):
            v = pre[pos + count] - pre[pos]
            if k == 0:
                v += getattr(self.costs.embedding, name)
            if k == self.S - 1:
                v += getattr(self.costs.head, name)
            v -= getattr(self.costs.held_twice(k == 0, k == self.S - 1,
                                               self.costs.holds_first_mtp(pos, count)), name)
            v -= getattr(held_by_rank(self.costs, self.problem.split, k), name)
            if name == "activation_bytes":
                v += held_input_bytes(self.costs, count, k == self.S - 1, self.receives[k])
            out.append(v)
        return out[0], out[1], out[2]

    def stage_transient(self, pos: int, count: int, k: int) -> int:
        """What stage k's B holds beyond its activations (StageCost.transient_bytes), O(1)."""
        if not self.problem.transients:
            return 0
        if self.problem.memory is not None:
            return self.stage(pos, count, k).transient_bytes
        return stage_transient(self.costs, pos, count, k == 0, k == self.S - 1)

    def one_chunk_total(self, pos: int, count: int, k: int) -> int:
        """Peak memory of rank k when it holds only stage k (one chunk per rank)."""
        static, act, wg = self.stage_bytes(pos, count, k)
        return static + self._peak(k, [act], [wg if self.split_bw else 0],
                                   [self.stage_transient(pos, count, k)])

    def rank_peak(self, r: int, costs: list[StageCost]) -> int:
        """Peak activation bytes on rank r given its stages' costs (chunk order)."""
        act = [c.activation_bytes for c in costs]
        keep = [c.weight_grad_bytes if self.split_bw else 0
                for c in costs]
        return self._peak(r, act, keep, [c.transient_bytes for c in costs])

    def rank_peak_cap(self, r: int, costs: list[StageCost]) -> int:
        """An upper bound on rank_peak: each chunk at its own fullest, as if at once."""
        cap, n = self._caps[r], self.vpp
        keep = self.split_bw
        return sum(cap[i] * c.activation_bytes + (cap[n + i] * c.weight_grad_bytes if keep
                                                  else 0) + cap[2 * n + i] * c.transient_bytes
                   for i, c in enumerate(costs))

    def held_peak(self, r: int, per_chunk: list[int]) -> int:
        """Peak on rank r of bytes each in-flight microbatch of a chunk holds until its
        backward (activations, or what a memory policy keeps on the host)."""
        zeros = [0] * len(per_chunk)
        return self._peak(r, per_chunk, zeros, zeros)

    def _peak(self, r: int, act: list[int], keep: list[int], transient: list[int]) -> int:
        n = len(act)
        best = 0
        records = self._maximal[r] if min((*act, *keep, *transient), default=0) >= 0 \
            else self.patterns[r]
        for rec in records:
            v = 0
            for i in range(n):
                v += rec[i] * act[i] + rec[n + i] * keep[i] + rec[2 * n + i] * transient[i]
            if v > best:
                best = v
        return best

    # ------------------------------------------------------------ evaluation

    def stage_costs(self, counts: tuple[int, ...]) -> list[StageCost]:
        out, offset = [], 0
        for i, n in enumerate(counts):
            out.append(self.stage(offset, n, i))
            offset += n
        return out

    def evaluate(self, counts: tuple[int, ...]) -> Summary:
        """Exactly what simulate() reports for this split (tests prove it)."""
        hit = self._evaluated.get(counts)
        if hit is not None:
            return hit
        self.evaluated += 1
        t0 = time.perf_counter()
        costs = self.stage_costs(counts)
        f = [c.forward_ms for c in costs]
        b = [c.input_grad_ms(self.split_bw) for c in costs]
        w = [c.weight_grad_ms for c in costs]
        by_kind = {"F": f, "B": b, "W": w}
        durations = [[by_kind[k][s] for k, s in zip(kinds, stages, strict=True)]
                     for kinds, stages in zip(self.compiled.kind, self.compiled.stage,
                                              strict=True)]
        for r, together in enumerate(self.together):  # as StageTable.paired prices them
            stages = self.compiled.stage[r]
            for i in together:
                durations[r][i] = durations[r][i] - costs[stages[i]].pair_saving_ms
        _, ends = list_schedule(self.compiled, durations, self.send_delay, self.sched.pairs)
        busy = [busy_ms(durs) for durs in durations]
        statics = [0] * self.pp
        peaks = []
        layers = []
        for r in range(self.pp):
            rc = [costs[s] for s in self.rank_stages[r]]
            statics[r] = sum(c.static_bytes for c in rc)
            peaks.append((self.rank_peak(r, rc), self._inflight[r]))
            layers.append(sum(counts[s] for s in self.rank_stages[r]))
        last = [e[-1] if e else 0.0 for e in ends]
        hw = self.problem.hardware
        parts = step_parts(self.sched, costs, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps,
                           hw.memory_bandwidth_gbps, hw.dp, hw.optimizer_fixed_ms, hw.job)
        summary = summarize(statics, last, busy, layers, self.memory, peaks, parts,
                            hw.iteration_boundary_ms)
        if (len(self._evaluated) + 1) * self.pp > SUMMARY_CACHE_RANKS:
            self._evaluated.clear()
        self._evaluated[counts] = summary
        self.eval_s = time.perf_counter() - t0
        return summary

    @cached_property
    def floors(self) -> MemoryFloors:
        """The memory floor of this schedule and model, whole and for partial splits."""
        return memory_floors(self.problem)

    @property
    def floor(self) -> MemoryFloor:
        """Lower bounds on the fullest rank's peak over every split (MemoryFloor)."""
        return self.floors.floor

    def smallest_peak_seen(self) -> tuple[int, int] | None:
        """(bytes, rank) of the lowest highest-rank peak among the splits evaluated."""
        best = None
        for s in self._evaluated.values():
            worst = max(s.ranks, key=lambda r: r.peak_memory_bytes)
            if best is None or worst.peak_memory_bytes < best[0]:
                best = (worst.peak_memory_bytes, worst.rank)
        return best


def maximal(records: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The records no other one matches or exceeds in every count (one of equal ones
    kept): a weighted sum with weights >= 0 takes its maximum over these alone. Largest
    total first, so a record is only checked against those that could cover it."""
    kept: list[tuple[int, ...]] = []
    for rec in sorted(set(records), key=sum, reverse=True):
        if not any(all(a >= b for a, b in zip(k, rec, strict=True)) for k in kept):
            kept.append(rec)
    return kept
