"""Align two traces op by op and say where one left the other.

Ops are matched by (rank, chunk, microbatch, kind) within one iteration of
each trace; times are taken relative to that iteration's first op, so a
simulated iteration (which starts at 0) and a real one (which starts
wherever the clock was) line up. Iterations are compared whole: from the first
op to the next iteration's first op (in a run that alternated with another split,
`ppsim run --versus`, to where the other split's iteration began), so the step's
ops (R: gradient reduce, S: optimizer step, reported per kind, not matched op by
op) and the boundary between iterations (the loss all-reduce; in a simulated trace
as measured by `ppsim profile`, in a real one the gap before the next iteration, or
the median gap for the last) are inside it. Signed differences are `b - a`: swapping
the traces negates them. Relative errors are relative to `a`, the reference.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ppsim.errors import UserError
from ppsim.sim.summary import bubble_fraction, busy_ms
from ppsim.trace.collectives import TraceCollective, collective_rows
from ppsim.trace.read import Trace, TraceOp

Key = tuple[int, int, int, str]


@dataclass(frozen=True)
class Window:
    """One iteration of one trace, times in ms from the iteration's first op."""

    trace: Trace
    iteration: int
    ops: dict[Key, TraceOp]
    origin_us: float
    step: tuple[TraceOp, ...] = ()
    """This iteration's R / S ops."""
    until_us: float | None = None
    """Where the next iteration starts (None: the trace holds no next iteration)."""
    boundary_ms: float = 0.0
    """Without a next iteration: the gap that ends this one."""

    def start(self, k: Key) -> float:
        return (self.ops[k].start_us - self.origin_us) / 1e3

    def dur(self, k: Key) -> float:
        return self.ops[k].dur_us / 1e3

    def end(self, k: Key) -> float:
        return self.start(k) + self.dur(k)

    def collectives(self) -> list[TraceCollective]:
        """This iteration's collectives inside the ops."""
        return [c for c in self.trace.collectives if c.iteration == self.iteration]

    @cached_property
    def span_ms(self) -> float:
        """First op to the last op's end (the step's ops included)."""
        ends = [self.end(k) for k in self.ops]
        ends += [(op.end_us - self.origin_us) / 1e3 for op in self.step]
        return max(ends) if ends else 0.0

    @cached_property
    def iteration_time_ms(self) -> float:
        """The whole iteration: to the next iteration's start."""
        if self.until_us is not None:
            return (self.until_us - self.origin_us) / 1e3
        return self.span_ms + self.boundary_ms

    def _longest_step(self, kind: str) -> tuple[float, float]:
        """(time in `kind` ops, of it waiting for the replicas) of the rank with the most."""
        per_rank: dict[int, tuple[float, float]] = {}
        for op in self.step:
            if op.kind == kind:
                t, w = per_rank.get(op.rank, (0.0, 0.0))
                per_rank[op.rank] = (t + op.dur_us / 1e3, w + op.wait_us / 1e3)
        return max(per_rank.values(), default=(0.0, 0.0))

    def step_ms(self, kind: str) -> float:
        """The most time a rank spends in R (or S) ops this iteration (0 when the trace
        has none): a distributed optimizer's rank reduces its gradients before the step
        and gathers its weights after it, two R ops."""
        return self._longest_step(kind)[0]

    def step_wait_ms(self, kind: str) -> float:
        """Of that rank's `kind` ops, the time they waited for the last replica to start
        them (a run's data-parallel skew; 0 in a simulated trace)."""
        return self._longest_step(kind)[1]

    @cached_property
    def by_rank(self) -> dict[int, list[Key]]:
        """Each rank's ops in start order (grouped once: a trace may hold 4,096 ranks)."""
        out: dict[int, list[Key]] = {}
        for k in sorted(self.ops, key=self.start):
            out.setdefault(k[0], []).append(k)
        return out

    def rank_ops(self, rank: int) -> list[Key]:
        return list(self.by_rank.get(rank, []))

    def peak_memory(self, rank: int) -> int | None:
        """Highest memory counter sample inside the iteration (None if not recorded)."""
        samples = self.trace.memory.get(rank)
        if not samples:
            return None
        lo = self.origin_us
        hi = lo + self.iteration_time_ms * 1e3
        inside = [b for t, b in samples if lo <= t <= hi]
        return max(inside) if inside else max(b for _, b in samples)


def _spans(trace: Trace) -> dict[int, tuple[float, float]]:
    """(first start, last end) in us of each iteration's ops, step ops included."""
    span: dict[int, tuple[float, float]] = {}
    for op in trace.ops + trace.step_ops:
        lo, hi = span.get(op.iteration, (float("inf"), float("-inf")))
        span[op.iteration] = (min(lo, op.start_us), max(hi, op.end_us))
    return span


def wholes(trace: Trace, span: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Each iteration's whole length in ms, first op to the next start, where known.

    The next start is the trace's next iteration's first op, or, for a run that
    alternated with another split in the same processes (`ppsim run --versus`), what
    the run recorded: the start of whichever ran next (`whole_iteration_ms`)."""
    given = trace.info.get("whole_iteration_ms")
    return listed_wholes(given, span) if isinstance(given, list) else consecutive_wholes(span)


def listed_wholes(given: list[Any], span: dict[int, tuple[float, float]]
                  ) -> dict[int, float]:
    """Recorded whole lengths (ms, one per iteration; None or junk where unknown)."""
    return {i: float(w) for i, w in enumerate(given) if i in span and
            isinstance(w, int | float) and not isinstance(w, bool) and w >= 0}


def consecutive_wholes(span: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Whole lengths (ms) when iterations follow one another: start to the next start."""
    return {i: (span[i + 1][0] - span[i][0]) / 1e3 for i in span if i + 1 in span}


def boundary_ms(trace: Trace, span: dict[int, tuple[float, float]]) -> float:
    """A simulated trace's modelled boundary; a real one's median gap between iterations."""
    if trace.info.get("source") == "simulator":
        b = trace.info.get("iteration_boundary_ms", 0.0)
        return float(b) if isinstance(b, int | float) and not isinstance(b, bool) else 0.0
    return median_gap_ms(span, wholes(trace, span))


def median_gap_ms(span: dict[int, tuple[float, float]], whole: dict[int, float]) -> float:
    """Median time (ms) from an iteration's last op to the next start (spans in us)."""
    gaps = [whole[i] - (span[i][1] - span[i][0]) / 1e3 for i in whole if i in span]
    return max(0.0, statistics.median(gaps)) if gaps else 0.0


def whole_ms(span: dict[int, tuple[float, float]], it: int, boundary: float,
             whole: dict[int, float]) -> float:
    """Iteration `it` whole: to the next start, else its span plus the boundary."""
    if it in whole:
        return whole[it]
    return (span[it][1] - span[it][0]) / 1e3 + boundary


def steady_iteration(trace: Trace, span: dict[int, tuple[float, float]] | None = None) -> int:
    """The typical steady-state iteration: of those after warm-up, the one whose
    length (whole, to the next start) is the median (lower median), so one hiccup does
    not decide a diff. `span`: the trace's iteration spans, when already computed."""
    its = trace.iterations
    warm = trace.info.get("warmup_iterations") or 0  # an int: checked by read_trace
    steady = [i for i in its if i >= warm] or its
    if len(steady) == 1:
        return steady[0]
    span = span if span is not None else _spans(trace)
    gap, whole = boundary_ms(trace, span), wholes(trace, span)
    ranked = sorted(steady, key=lambda i: (whole_ms(span, i, gap, whole), i))
    return ranked[(len(ranked) - 1) // 2]


def window(trace: Trace, iteration: int | None) -> Window:
    its = trace.iterations
    span = _spans(trace)
    if iteration is None:
        it = steady_iteration(trace, span)
    elif iteration in its:
        it = iteration
    elif len(its) == 1:
        it = its[0]  # a simulated trace holds one iteration; compare it with any
    else:
        raise UserError("--iteration", f"{trace.path} has no iteration {iteration}",
                        f"choose one of {its}")
    ops: dict[Key, TraceOp] = {}
    for op in trace.ops:
        if op.iteration == it:
            if op.key in ops:
                raise UserError("trace", f"{trace.path}: {op.kind} of rank {op.rank} chunk "
                                f"{op.chunk} microbatch {op.microbatch} appears twice in "
                                f"iteration {it}", "re-record the trace")
            ops[op.key] = op
    origin = min(op.start_us for op in ops.values())
    whole = wholes(trace, span)
    until = span[it][0] + whole[it] * 1e3 if it in whole else None
    return Window(trace, it, ops, origin,
                  tuple(op for op in trace.step_ops if op.iteration == it), until,
                  boundary_ms(trace, span))


def check_compatible(a: Trace, b: Trace) -> None:
    """Refuse to diff traces of different pipelines, naming the mismatch."""
    for field in ("pp", "vpp", "schedule", "microbatches"):
        va, vb = a.info.get(field), b.info.get(field)
        if va is not None and vb is not None and va != vb:
            raise UserError("diff", f"the traces differ in {field}: {va!r} in {a.path} vs "
                            f"{vb!r} in {b.path}", "diff traces of the same pipeline shape")
    ra = {op.rank for op in a.ops}
    rb = {op.rank for op in b.ops}
    if ra != rb:
        raise UserError("diff", f"the traces have different ranks: {_runs(ra)} in {a.path}, "
                        f"{_runs(rb)} in {b.path}", "diff traces of the same pipeline shape")
    _check_placement(a, b)
    ma = {op.microbatch for op in a.ops}
    mb = {op.microbatch for op in b.ops}
    if ma != mb:
        only = [f"{_runs(x - y)} only in {t.path}" for x, y, t in ((ma, mb, a), (mb, ma, b))
                if x - y]
        raise UserError("diff", f"the traces hold different microbatches ({len(ma)} in "
                        f"{a.path}, {len(mb)} in {b.path}): microbatch " + "; ".join(only),
                        "diff traces of the same microbatches, numbered alike")


def _check_placement(a: Trace, b: Trace) -> None:
    """Refuse traces that run a rank's chunk as different stages (loop vs V placement):
    ops are matched by (rank, chunk), so they would be compared across stages."""
    sa = {(op.rank, op.chunk): op.stage for op in a.ops}
    sb = {(op.rank, op.chunk): op.stage for op in b.ops}
    moved = sorted(k for k in sa.keys() & sb.keys() if sa[k] != sb[k])
    if moved:
        (rank, chunk), pa, pb = moved[0], a.info.get("placement"), b.info.get("placement")
        raise UserError("diff", f"the traces place stages on ranks differently: placement "
                        f"{pa or 'not recorded'} in {a.path}, {pb or 'not recorded'} in "
                        f"{b.path} (rank {rank} chunk {chunk} runs stage {sa[(rank, chunk)]} "
                        f"vs {sb[(rank, chunk)]})", "diff traces of the same placement")


def _runs(xs: set[int], most: int = 6) -> str:
    """Sorted numbers as runs, `0-3, 7`; past `most` runs, how many more numbers."""
    runs: list[list[int]] = []
    for x in sorted(xs):
        if runs and runs[-1][1] == x - 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    shown = [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs[:most]]
    rest = sum(hi - lo + 1 for lo, hi in runs[most:])
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    i = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[i]


def critical_path(w: Window) -> list[tuple[int, float]]:
    """Ranks along the critical path, as (rank, ms spent computing there), in time order.

    Walks back from the op that ends last; an op's predecessor is whichever of
    its rank's previous op and its cross-stage input ended later. Ends on any input:
    the walk stops where it would revisit an op.
    """
    if not w.ops:
        return []
    by_stage_mb = {(op.stage, op.microbatch, op.kind): k for k, op in w.ops.items()}
    prev_on_rank: dict[Key, Key | None] = {}
    for seq in w.by_rank.values():
        for i, k in enumerate(seq):
            prev_on_rank[k] = seq[i - 1] if i else None
    k: Key | None = max(w.ops, key=w.end)
    path: list[tuple[int, float]] = []
    seen: set[Key] = set()
    # In a consistent trace every step goes back in time; a hand-edited or clock-skewed
    # one can lead back to an op already walked, so each op is visited at most once.
    while k is not None and k not in seen:
        seen.add(k)
        op = w.ops[k]
        if path and path[-1][0] == k[0]:
            path[-1] = (k[0], path[-1][1] + w.dur(k))
        else:
            path.append((k[0], w.dur(k)))
        dep = None
        if op.kind == "F":
            dep = by_stage_mb.get((op.stage - 1, op.microbatch, "F"))
        elif op.kind == "B":
            dep = by_stage_mb.get((op.stage + 1, op.microbatch, "B"))
        cands = [c for c in (prev_on_rank.get(k), dep) if c is not None]
        k = max(cands, key=w.end) if cands else None
    path.reverse()
    return path


@dataclass(frozen=True)
class Diff:
    a: Window
    b: Window
    matched: list[Key]
    only_a: list[Key]
    only_b: list[Key]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        a, b = self.a, self.b
        ta, tb = a.iteration_time_ms, b.iteration_time_ms
        ranks = []
        drifts: dict[int, list[float]] = {}
        for k in self.matched:  # in start order per rank
            drifts.setdefault(k[0], []).append(b.start(k) - a.start(k))
        for r in sorted(set(a.by_rank) | set(b.by_rank)):
            busy_a = busy_ms(a.dur(k) for k in a.by_rank.get(r, ()))
            busy_b = busy_ms(b.dur(k) for k in b.by_rank.get(r, ()))
            bub_a, bub_b = bubble_fraction(busy_a, ta), bubble_fraction(busy_b, tb)
            mem_a, mem_b = a.peak_memory(r), b.peak_memory(r)
            drift = drifts.get(r, [])
            ranks.append({
                "rank": r, "busy_ms": [busy_a, busy_b], "busy_delta_ms": busy_b - busy_a,
                "busy_error": (busy_b - busy_a) / busy_a if busy_a else 0.0,
                "bubble_fraction": [bub_a, bub_b], "bubble_delta": bub_b - bub_a,
                "peak_memory_bytes": [mem_a, mem_b],
                "peak_memory_error": (mem_b - mem_a) / mem_a if mem_a and mem_b is not None
                else None,
                "final_start_drift_ms": drift[-1] if drift else 0.0,
                "max_start_drift_ms": max(drift, key=abs) if drift else 0.0,
            })
        per_kind: dict[str, Any] = {}
        for kind in ("F", "B", "W"):
            keys = [k for k in self.matched if k[3] == kind]
            if not keys:
                continue
            rel = [(b.dur(k) - a.dur(k)) / a.dur(k) for k in keys if a.dur(k) > 0]
            delta = [b.dur(k) - a.dur(k) for k in keys]
            per_kind[kind] = {
                "count": len(keys), "median": statistics.median(rel) if rel else 0.0,
                "p90": _quantile([abs(x) for x in rel], 0.9),
                "max": max((abs(x) for x in rel), default=0.0),
                "mean": statistics.fmean(rel) if rel else 0.0,
                "median_delta_ms": statistics.median(delta),
            }
        worst = sorted((k for k in self.matched if b.dur(k) != a.dur(k)),
                       key=lambda k: abs(b.dur(k) - a.dur(k)), reverse=True)
        divergent = [{"rank": k[0], "chunk": k[1], "microbatch": k[2], "kind": k[3],
                      "start_ms": [a.start(k), b.start(k)], "duration_ms": [a.dur(k), b.dur(k)],
                      "duration_delta_ms": b.dur(k) - a.dur(k)} for k in worst[:top]]
        cpa, cpb = critical_path(a), critical_path(b)
        return {
            "traces": [a.trace.path, b.trace.path], "iterations": [a.iteration, b.iteration],
            "iteration_time_ms": [ta, tb], "iteration_time_delta_ms": tb - ta,
            "iteration_time_error": (tb - ta) / ta if ta else 0.0,
            "ops_matched": len(self.matched), "ops_only_in": [len(self.only_a), len(self.only_b)],
            "ranks": ranks, "duration_error": per_kind, "largest_divergences": divergent,
            "step_ops_ms": {k: [a.step_ms(k), b.step_ms(k)] for k in ("R", "S")},
            "step_wait_ms": {"R": [a.step_wait_ms("R"), b.step_wait_ms("R")]},
            "critical_path": [[{"rank": r, "ms": t} for r, t in cpa],
                              [{"rank": r, "ms": t} for r, t in cpb]],
            "critical_path_changed": [r for r, _ in cpa] != [r for r, _ in cpb],
            "collectives": [row.to_dict() for row in collective_rows(
                a.collectives(), b.collectives())],
        }


def diff_traces(a: Trace, b: Trace, iteration: int | None = None) -> Diff:
    check_compatible(a, b)
    wa, wb = window(a, iteration), window(b, iteration)
    ka, kb = set(wa.ops), set(wb.ops)
    matched = sorted(ka & kb, key=lambda k: (k[0], wa.start(k)))
    return Diff(wa, wb, matched, sorted(ka - kb), sorted(kb - ka))
