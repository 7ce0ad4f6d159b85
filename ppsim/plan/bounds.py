"""Lower bounds on the iteration time of any split, for the planner's pruning.

Every bound is the length of a real path in the schedule's dependency graph
(ops on one rank run in order; an F needs the previous stage's F, a B the
next stage's B), so it can never exceed the simulated time. Under a combined 1F1B
every F and B is taken as short as in a pair (pair_saving_ms less) and the pairs'
own waits are dropped, which only shortens the paths. The paths run
through one rank; their lengths are linear in stage costs with counts read
off the action lists, and prefix sums depend only on where a stage starts,
so with one chunk per rank each term depends on one stage alone and a
min-max dynamic program over the split finds the best bound any completion
can reach. (Paths through two neighbouring ranks were tried: valid, but no
tighter on the instances that matter — there the critical path zigzags
between several ranks of equal load.)
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from ppsim.costs.model import LayerCost, StageCost, least_busy_ms
from ppsim.plan.search import Deadline, SplitSearch

INF = float("inf")
ROUNDING = 1 - 1e-12  # stay below the float-rounded true time
TERM_CACHE = 1 << 21
"""Stage terms kept; beyond it the cache starts over (memory stays bounded)."""


class MinMaxTable:
    """min over splits of the largest per-stage term, for every suffix, bottom up.

    value(pos, k): the best for layers pos..L-1 on stages k..S-1, where
    term(pos, c, k) is stage k's term holding c layers from pos. The term
    must not decrease with c (more layers: more work, more memory; INF when
    it cannot fit), which lets each scan stop early. Iterative (no recursion
    depth growing with the stages) and stopped by a deadline.
    """

    def __init__(self, stages: int, layers: int,
                 term: Callable[[int, int, int], float]) -> None:
        self.S, self.L, self.term = stages, layers, term
        self.values: list[array] = []
        self.choices: list[array] = []

    def solve(self, deadline: Deadline | None = None) -> bool:
        """Fill the table; False (and nothing kept) when the deadline passed first."""
        S, L, term = self.S, self.L, self.term
        values: list[array | None] = [None] * S
        choices: list[array | None] = [None] * S
        for k in range(S - 1, -1, -1):
            val = array("d", [INF]) * (L + 1)
            ch = array("q", [0]) * (L + 1)
            nxt = values[k + 1] if k + 1 < S else None
            for pos in range(L + 1) if k > 0 else (0,):
                if deadline is not None and deadline.passed():
                    return False
                if nxt is None:
                    val[pos], ch[pos] = term(pos, L - pos, k), L - pos
                    continue
                best, arg = INF, 0
                for c in range(L - pos + 1):
                    if c & 255 == 255 and deadline is not None and deadline.passed():
                        return False
                    t = term(pos, c, k)
                    if t >= best:
                        if c == 0:  # an empty stage may not fit where one layer does
                            continue  # (held_input_bytes): only from c = 1 on does
                        break  # the term only grow with c (INF: no more fits)
                    x = nxt[pos + c]
                    v = t if t > x else x
                    if v < best:
                        best, arg = v, c
                val[pos], ch[pos] = best, arg
            values[k], choices[k] = val, ch
        self.values = values  # type: ignore[assignment]
        self.choices = choices  # type: ignore[assignment]
        return True

    def value(self, pos: int, k: int) -> float:
        return self.values[k][pos]

    def argmin(self) -> tuple[int, ...] | None:
        """The split reaching value(0, 0), or None when none fits."""
        if self.values[0][0] == INF:
            return None
        counts, pos = [], 0
        for k in range(self.S):
            c = self.choices[k][pos]
            counts.append(c)
            pos += c
        return tuple(counts)

class PathBounds:
    """Path lengths through one rank, for any placement."""

    def __init__(self, s: SplitSearch) -> None:
        self.s = s
        c = s.costs
        self.pre_f, self.pre_b, self.pre_w = [0.0], [0.0], [0.0]
        for lc in c.layers:
            cut = lc.pair_saving_ms  # every op as short as in a pair
            self.pre_f.append(self.pre_f[-1] + lc.forward_ms - cut)
            self.pre_b.append(self.pre_b[-1] + self.bpart(lc) - cut)
            self.pre_w.append(self.pre_w[-1] + lc.backward_ms - cut)
        self.total_f = c.embedding.forward_ms + self.pre_f[-1] + c.head.forward_ms
        self.total_b = self.bpart(c.embedding) + self.pre_b[-1] + self.bpart(c.head)
        self.emb_f, self.emb_b = c.embedding.forward_ms, self.bpart(c.embedding)
        self.pre_d = [0.0]
        for d in s.delay:
            self.pre_d.append(self.pre_d[-1] + d)
        # Per rank: stage of its first op, of its first B (and how many forwards of
        # each chunk precede it), and of its last op when that is a B.
        self.first_stage, self.first_b, self.fwd_before_b, self.tail_stage = [], [], [], []
        for kinds, stages in zip(s.compiled.kind, s.compiled.stage, strict=True):
            self.first_stage.append(stages[0])
            i = kinds.index("B")
            self.first_b.append(stages[i])
            per_chunk = [0] * s.vpp
            for st in stages[:i]:
                per_chunk[st // s.pp] += 1
            self.fwd_before_b.append(per_chunk)
            self.tail_stage.append(stages[-1] if kinds[-1] == "B" else -1)

    def bpart(self, c: LayerCost | StageCost) -> float:
        """The B op's share of a backward: all of it, or the input-gradient part."""
        return c.input_grad_ms(self.s.split_bw)

    def before_f(self, pos: int, st: int) -> float:
        """Forward time of all stages before stage st, which starts at layer pos."""
        return self.emb_f + self.pre_f[pos] if st > 0 else 0.0

    def before_b(self, pos: int, st: int) -> float:
        return self.emb_b + self.pre_b[pos] if st > 0 else 0.0

    def sums(self, st: int, pos: int, count: int) -> tuple[float, float, float]:
        """(forward, backward, B part) of stage st holding layers pos..pos+count-1, from
        prefix sums in O(1) (rounding differs from a sum by far less than ROUNDING)."""
        c, s = self.s.costs, self.s
        f = self.pre_f[pos + count] - self.pre_f[pos]
        b = self.pre_w[pos + count] - self.pre_w[pos]
        bp = self.pre_b[pos + count] - self.pre_b[pos]
        for part, there in ((c.embedding, st == 0), (c.head, st == s.S - 1)):
            if there:
                f += part.forward_ms
                b += part.backward_ms
                bp += self.bpart(part)
        return f, b, bp

    # ------------------------------------------------------------ one rank

    def rank_term(self, r: int, placed: dict[int, tuple[int, int]]) -> float:
        """Bound from two paths through rank r, once its stages are placed.

        `placed` maps stage -> (first layer, layer count). Path 1: microbatch
        0's forward reaches rank r's first stage, then every op of rank r,
        then (if the rank ends with B) the last gradient returns to stage 0.
        Path 2: the forward of the microbatch whose B rank r runs first goes
        all the way down, its gradient comes back, then every op of rank r
        from that B on, then the same return.
        """
        s = self.s
        stages = s.rank_stages[r]
        costs = {st: self.sums(st, *placed[st]) for st in stages}  # (F, B, B part)
        work = 0.0
        for st in stages:
            work += costs[st][0] + costs[st][1]
        work *= s.m
        ts = self.tail_stage[r]
        tail = self.before_b(placed[ts][0], ts) + self.pre_d[ts] if ts >= 0 else 0.0
        s0 = self.first_stage[r]
        best = self.before_f(placed[s0][0], s0) + self.pre_d[s0] + work + tail
        sb = self.first_b[r]
        if sb < s.S - 1:
            skipped = sum(costs[st][0] * self.fwd_before_b[r][st // s.pp] for st in stages)
            back = self.total_b - self.before_b(placed[sb][0], sb) - costs[sb][2]
            delays = 2 * self.pre_d[-1] - self.pre_d[sb]
            best = max(best, self.total_f + back + delays + work - skipped + tail)
        return best * ROUNDING

    def stage_term(self, pos: int, count: int, k: int) -> float:
        """rank_term for one chunk per rank, where stage k is rank k's only stage."""
        return self.rank_term(k, {k: (pos, count)})


class OneChunkBound:
    """Exact min over completions of the largest stage term, one chunk per rank.

    value(pos, k): layers pos..L-1 on stages k..S-1. Stages that cannot fit
    memory are excluded (infinite). `solve` must succeed before `value`.
    """

    def __init__(self, search: SplitSearch, paths: PathBounds) -> None:
        self.s, self.paths = search, paths
        self._term: dict[tuple[int, int, int], float] = {}
        self.table = MinMaxTable(search.S, search.L, self.term)

    def fits(self, pos: int, c: int, k: int) -> bool:
        return self.s.one_chunk_total(pos, c, k) <= self.s.memory

    def term(self, pos: int, c: int, k: int) -> float:
        key = (pos, c, k)
        t = self._term.get(key)
        if t is None:
            t = self.paths.stage_term(pos, c, k) if self.fits(pos, c, k) else INF
            if len(self._term) >= TERM_CACHE:
                self._term.clear()
            self._term[key] = t
        return t

    def solve(self, deadline: Deadline | None = None) -> bool:
        return self.table.solve(deadline)

    def value(self, pos: int, k: int) -> float:
        return self.table.value(pos, k)

    def argmin(self) -> tuple[int, ...] | None:
        return self.table.argmin()


CHUNKED_BOUND_NOTE = (
    "with several chunks per rank the lower bound is loose: it pours the work of the "
    "stages not yet placed continuously over the ranks that still have one (water-filling), "
    "as if layers split into fractions and a rank's two chunks could share one load, and "
    "it leaves out that each chunk's ops wait on the other ranks' chunks; the gap is an "
    "upper limit on how much faster any split could be, not a measure of the plan's loss")
"""Why a plan over chunks is rarely proven: what `plan` says beside its gap."""


class WaterFill:
    """Bound for several chunks per rank: per rank, head + m x placed work, and
    the unplaced work poured (continuously) onto the ranks that still have stages."""

    def __init__(self, search: SplitSearch) -> None:
        self.s = search
        layers = search.costs.layers
        self.suffix_work = [0.0] * (len(layers) + 1)
        for i in range(len(layers) - 1, -1, -1):
            self.suffix_work[i] = self.suffix_work[i + 1] + least_busy_ms(layers[i])
        head = search.costs.head
        self.head_work = head.forward_ms + head.backward_ms

    def head(self, costs: list[StageCost], upto: int) -> float:
        """Time before stage `upto`'s first op can start, plus its return trip."""
        s = self.s
        t = 0.0
        for j in range(upto):
            cut = costs[j].pair_saving_ms
            t += costs[j].forward_ms - cut + s.delay[j]
            if not s.split_bw:
                t += costs[j].backward_ms - cut + s.delay[j]
        return t

    def bound(self, costs: list[StageCost], k: int, remaining: int) -> float:
        s = self.s
        m, pp = s.m, s.pp
        level = [0.0] * pp
        open_ranks = set()
        for r in range(pp):
            w = sum(s.work(costs[j]) for j in s.rank_stages[r] if j < k)
            level[r] = self.head(costs, min(r, k)) + m * w
            if any(j >= k for j in s.rank_stages[r]):
                open_ranks.add(r)
        pour = m * (self.suffix_work[s.L - remaining] + (self.head_work if k < s.S else 0.0))
        placed_max = max(level)
        if not open_ranks or pour <= 0:
            return placed_max
        lv = sorted(level[r] for r in open_ranks)
        # Raise the lowest open levels together until the poured work is used up.
        total, n = 0.0, 0
        for i, x in enumerate(lv):
            n = i + 1
            total += x
            nxt = lv[i + 1] if i + 1 < len(lv) else INF
            h = (pour + total) / n
            if h <= nxt:
                return max(placed_max, h)
        return max(placed_max, (pour + total) / n)


def least_largest_fitting_run(work: Sequence[float], kept: Sequence[tuple[int, int]],
                              held: Sequence[int], limit: float) -> float | None:
    """The least, over every cut of `work` into len(held) contiguous runs in order (some
    may be empty) where run r's pieces keep their static bytes and held[r] times their
    activation bytes (`kept`) within `limit`, of the largest run's sum: how even a split
    of those pieces over the ranks can get; None when no cut fits. Bisection over the
    largest sum, each tried by cutting greedily (a rank takes pieces while both fit:
    taking fewer never helps the ranks after it)."""
    if not work:
        return 0.0

    def fits(most: float) -> bool:
        i = 0
        for h in held:
            busy, nbytes = 0.0, 0
            while i < len(work) and busy + work[i] <= most \
                    and nbytes + kept[i][0] + h * kept[i][1] <= limit:
                busy, nbytes = busy + work[i], nbytes + kept[i][0] + h * kept[i][1]
                i += 1
        return i == len(work)

    lo, hi = max(work), sum(work)
    if not fits(hi):
        return None
    for _ in range(64):  # hi stays feasible; 64 halvings leave it exact to the float
        mid = (lo + hi) / 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= hi * 1e-12:
            break
    return hi
