"""Timeline geometry: lanes of ops, and which op each character cell shows.

Pure functions over plain tuples, so the Line-API widget only asks "what is in
cells x0..x0+width of lane y" and the answer is tested without a terminal.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ppsim.tui.compare import compared_iteration

IDLE = -1
"""`Lane.overlapping` of a cell no op touches."""
PARTLY_BUSY = -2
"""`Lane.overlapping` of a cell the rank works in for less than half of its time."""


class LaneOp(NamedTuple):
    start: float
    """ms from the start of the iteration."""
    end: float
    kind: str
    """F, B or W."""
    chunk: int
    microbatch: int
    stage: int


class LaneOps(Sequence[LaneOp]):
    """A lane's ops in a few flat arrays, read as a sequence of `LaneOp`.

    A pp 64 x 1024 run has 131,072 ops: as tuples that is about a million objects,
    and freeing a replaced result of them holds the GIL in one go (150 ms and more,
    a key press waits behind it); arrays free at once and pickle as bytes (the
    simulation child, ppsim.tui.child, sends them)."""

    __slots__ = ("start", "end", "codes", "kinds", "chunk", "microbatch", "stage")

    def __init__(self, ops: Iterable[LaneOp] = ()) -> None:
        self.start, self.end = array("d"), array("d")
        self.codes = array("B")
        self.chunk, self.microbatch, self.stage = array("l"), array("l"), array("l")
        kinds: dict[str, int] = {}
        for o in ops:
            self.start.append(o.start)
            self.end.append(o.end)
            self.codes.append(kinds.setdefault(o.kind, len(kinds)))
            self.chunk.append(o.chunk)
            self.microbatch.append(o.microbatch)
            self.stage.append(o.stage)
        self.kinds = tuple(kinds)
        """The distinct kinds; `codes` index into them."""

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return LaneOp(self.start[i], self.end[i], self.kinds[self.codes[i]], self.chunk[i],
                      self.microbatch[i], self.stage[i])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LaneOps({list(self)!r})"


@dataclass(frozen=True)
class Lane:
    label: str
    ops: Sequence[LaneOp]
    """Sorted by start (stored as `LaneOps`)."""
    rank: int = -1
    source: str = "sim"
    """"sim" (the current split), "real" (a loaded trace) or "pinned"."""

    def __post_init__(self) -> None:
        ops = self.ops if isinstance(self.ops, LaneOps) else LaneOps(self.ops)
        object.__setattr__(self, "ops", ops)
        # Zero-length ops (a stage without layers, embedding or head) do no work:
        # they are never drawn, so such a rank shows idle, not busy.
        work = array("l", (i for i, (a, b) in enumerate(zip(ops.start, ops.end, strict=True))
                                   if b > a))
        object.__setattr__(self, "_work", work)
        object.__setattr__(self, "_starts", array("d", (ops.start[i] for i in work)))
        object.__setattr__(self, "_ends", array("d", (ops.end[i] for i in work)))
        busy_before = array("d", [0.0])  # busy ms of the work ops before each one
        for i in work:
            busy_before.append(busy_before[-1] + ops.end[i] - ops.start[i])
        object.__setattr__(self, "_busy_before", busy_before)
        object.__setattr__(self, "_all_starts", ops.start)

    @property
    def end(self) -> float:
        return max(self._ends, default=0.0)  # type: ignore[attr-defined]

    def overlapping(self, t0: float, t1: float) -> int:
        """Index of the op to show in [t0, t1): the op covering the midpoint, else of
        the two ops either side of it the one with more of the cell; `IDLE` when no op
        touches it, `PARTLY_BUSY` when the rank works for less than half of it (as
        `ppsim simulate`'s text timeline). By busy time, so a zoomed-out cell that a
        short op merely touches does not read as busy."""
        starts: array = self._starts  # type: ignore[attr-defined]
        ends: array = self._ends  # type: ignore[attr-defined]
        i = bisect_right(ends, t0)  # ops end in start order (one rank runs one op at a time)
        j = bisect_left(starts, t1)  # ops i..j-1 overlap [t0, t1)
        if i >= j:
            return IDLE
        if 2 * self._busy(t0, t1, i, j) < t1 - t0:
            return PARTLY_BUSY
        mid = (t0 + t1) / 2
        k = min(max(bisect_right(starts, mid) - 1, i), j - 1)  # the last op to start by mid
        if ends[k] <= mid and k + 1 < j:  # mid is idle: the neighbour with more of the cell
            after = min(ends[k + 1], t1) - starts[k + 1]
            k += after > ends[k] - max(starts[k], t0)
        return self._work[k]  # type: ignore[attr-defined, no-any-return]

    def _busy(self, t0: float, t1: float, i: int, j: int) -> float:
        """ms of [t0, t1) the rank spends in work ops i..j-1 (those overlapping it)."""
        starts: array = self._starts  # type: ignore[attr-defined]
        ends: array = self._ends  # type: ignore[attr-defined]
        whole = self._busy_before[j] - self._busy_before[i]  # type: ignore[attr-defined]
        return whole - max(0.0, t0 - starts[i]) - max(0.0, ends[j - 1] - t1)  # type: ignore[no-any-return]

    def at_time(self, t: float) -> int:
        """Index of the op nearest to time t (for moving the cursor between lanes)."""
        if not self.ops:
            return -1
        j = bisect_right(self._all_starts, t) - 1  # type: ignore[attr-defined]
        cands = [k for k in (j, j + 1) if 0 <= k < len(self.ops)]
        return min(cands, key=lambda k: abs((self.ops[k].start + self.ops[k].end) / 2 - t))


def sim_lanes(sim: Any) -> list[Lane]:
    """One lane per rank of a `ppsim.simulator.Simulation`."""
    lanes = []
    for r, ops in enumerate(sim.timeline.ops):
        lane_ops = LaneOps(LaneOp(o.start, o.end, o.action.kind, o.chunk, o.action.microbatch,
                                  o.action.stage) for o in ops)
        lanes.append(Lane(f"r{r}", lane_ops, r, "sim"))
    return lanes


def trace_lanes(trace: Any, iteration: int | None = None, prefix: str = "real") -> list[Lane]:
    """One lane per rank of a `ppsim.trace.Trace`, one iteration (by default the one
    `ppsim diff` compares), times in ms from that iteration's first op."""
    if iteration is None:
        iteration = compared_iteration(trace)
    it = iteration
    ops = [o for o in trace.ops if o.iteration == it]
    t0 = min((o.start_us for o in ops), default=0.0)
    ranks = sorted({o.rank for o in ops})
    lanes = []
    for r in ranks:
        mine = sorted((o for o in ops if o.rank == r), key=lambda o: o.start_us)
        lanes.append(Lane(f"{prefix}{r}", LaneOps(
            LaneOp((o.start_us - t0) / 1e3, (o.end_us - t0) / 1e3, o.kind, o.chunk,
                   o.microbatch, o.stage) for o in mine), r, "real"))
    return lanes


def pinned_lanes(sim: Any, lanes: list[Lane] | None = None) -> list[Lane]:
    """The pinned split's lanes, labelled "pin0", "pin1", ...; `lanes`: its lanes
    already built (the pinned split is the current one), relabelled only."""
    return [Lane(f"pin{lane.rank}", lane.ops, lane.rank, "pinned")
            for lane in (lanes if lanes is not None else sim_lanes(sim))]


def interleave(main: list[Lane], *others: list[Lane]) -> list[Lane]:
    """Each rank's other lanes right under its main lane (real under simulated), then
    any lane whose rank the main lanes lack."""
    by_rank: dict[int, list[Lane]] = {}
    for group in others:
        for lane in group:
            by_rank.setdefault(lane.rank, []).append(lane)
    out: list[Lane] = []
    for lane in main:
        out.append(lane)
        out += by_rank.pop(lane.rank, [])
    for rest in by_rank.values():
        out += rest
    return out


class Cell(NamedTuple):
    text: str
    op: int
    """Index into the lane's ops, or -1 where none is shown (idle or partly busy)."""


def lane_cells(lane: Lane, ms_per_cell: float, x0: int, width: int,
               force: int = -1) -> list[Cell]:
    """Runs of cells for columns x0..x0+width of a lane (merged where the op is the same).

    A run wide enough shows the op's label ("F12" = forward of microbatch 12), a
    narrower one the kind; odd microbatches are lower case ("f13") so neighbours
    stay apart; idle cells are '·', cells busy for less than half their time '░'.
    Op `force` (the cursor) always gets at least its first cell, even when it is too
    short to win one at this zoom.
    """
    ops: LaneOps = lane.ops  # type: ignore[assignment]  # read as arrays: no tuple per run
    owners = []
    for x in range(x0, x0 + width):
        owners.append(lane.overlapping(x * ms_per_cell, (x + 1) * ms_per_cell))
    if 0 <= force < len(ops) and force not in owners and ms_per_cell > 0:
        cx = int(ops.start[force] / ms_per_cell) - x0
        if 0 <= cx < width:
            owners[cx] = force
    runs: list[Cell] = []
    i = 0
    while i < width:
        j = i
        while j + 1 < width and owners[j + 1] == owners[i]:
            j += 1
        n = j - i + 1
        k = owners[i]
        if k < 0:
            runs.append(Cell(("·" if k == IDLE else "░") * n, -1))
        else:
            kind, mb = ops.kinds[ops.codes[k]], ops.microbatch[k]
            ch = kind if mb % 2 == 0 or mb < 0 else kind.lower()
            label = f"{ch}{mb}" if mb >= 0 else ch  # the step's ops have no microbatch
            text = (label + " " * n)[:n] if n >= len(label) + 1 else ch * n
            runs.append(Cell(text, k))
        i = j + 1
    return runs


def ruler(ms_per_cell: float, x0: int, width: int, step: int = 10) -> str:
    """A time axis: a tick label every `step` columns, with as many digits as the
    tick spacing needs (deep zoom into a long iteration keeps neighbours apart)."""
    out = [" "] * width
    last = (x0 + width) * ms_per_cell
    for _ in range(3):  # widen the tick spacing until the labels fit between ticks
        longest = len(fmt_tick(last, step * ms_per_cell, last)) + 2
        if longest <= step:
            break
        step = -(-longest // 10) * 10
    first = ((x0 + step - 1) // step) * step
    for x in range(first, x0 + width, step):
        label = f"|{fmt_tick(x * ms_per_cell, step * ms_per_cell, last)}"
        for k, ch in enumerate(label):
            if x - x0 + k < width:
                out[x - x0 + k] = ch
    return "".join(out)


_UNITS = ((1e-3, "us", 1e-3), (1.0, "ms", 1.0), (1e3, "s", 1e3), (6e4, "min", 6e4),
          (3.6e6, "h", 3.6e6))


def fmt_tick(ms: float, spacing_ms: float, largest_ms: float) -> str:
    """A tick label in the unit of the axis' largest value, with enough decimals that
    ticks `spacing_ms` apart read differently (12.5ms, 10.000123s, ...)."""
    unit, scale = "us", 1e-3
    for lo, name, sc in _UNITS:
        if largest_ms >= lo:
            unit, scale = name, sc
    spacing = spacing_ms / scale
    decimals = next((d for d in range(10) if abs(round(spacing, d) - spacing)
                     <= 0.05 * spacing), 9)
    return f"{ms / scale:.{decimals}f}{unit}"


def fmt_ms(ms: float) -> str:
    """A short time label without exponents: 850us, 12.5ms, 3.2s, 36min, 1.5h."""
    if ms == 0:
        return "0ms"
    if ms < 1:
        return f"{ms * 1e3:.3g}us"
    if ms < 1e3:
        return f"{ms:.3g}ms"
    if ms < 1e6:
        return f"{ms / 1e3:.3g}s"
    if ms < 3.6e7:
        return f"{ms / 6e4:.3g}min"
    return f"{ms / 3.6e6:.3g}h"


def parse_find(query: str) -> tuple[int | None, str | None, int | None]:
    """A find query as (rank, kind, microbatch), each None when not given:
    "r3" rank 3, "F12"/"f12" forward of microbatch 12, "12" microbatch 12."""
    import re

    given: dict[str, int | str] = {}

    def put(what: str, value: int | str, tok: str) -> None:
        if given.setdefault(what, value) != value:  # "r3 r4" would find r4 alone
            raise ValueError(f"find: {tok!r} gives a second {what}; give one")

    for tok in query.replace(",", " ").split():
        m = re.fullmatch(r"r(\d+)", tok, re.IGNORECASE)
        k = re.fullmatch(r"([fbwFBW])(\d*)", tok)
        if m:
            put("rank", int(m.group(1)), tok)
        elif k:
            put("kind", k.group(1).upper(), tok)
            if k.group(2):
                put("microbatch", int(k.group(2)), tok)
        elif tok.isdigit():
            put("microbatch", int(tok), tok)
        else:
            raise ValueError(f"find: {tok!r} is not r<rank>, <F|B|W><microbatch> or a "
                             f"microbatch number")
    rank, kind, mb = (given.get(w) for w in ("rank", "kind", "microbatch"))
    return rank, kind, mb  # type: ignore[return-value]


def find_op(lanes: list[Lane], query: str, after: tuple[int, int] = (-1, -1)
            ) -> tuple[int, int] | None:
    """The first (lane, op) after `after` (in lane, then time order, wrapping) matching
    the query; None when nothing matches."""
    rank, kind, mb = parse_find(query)
    hits = [(li, oi) for li, lane in enumerate(lanes)
            if rank is None or lane.rank == rank
            for oi, op in enumerate(lane.ops)
            if (kind is None or op.kind == kind) and (mb is None or op.microbatch == mb)]
    if not hits:
        return None
    return next((h for h in hits if h > after), hits[0])


def fit_scale(end_ms: float, width: int) -> float:
    """ms per cell so that the whole iteration fits `width` cells."""
    return end_ms / max(1, width - 1) if end_ms > 0 else 1.0


def zoomed_scale(ms_per_cell: float, factor: float, fit_ms: float, finest_ms: float) -> float:
    """The scale after a zoom by `factor`: never coarser than `fit_ms` (the whole
    iteration in view) nor finer than `finest_ms` (the widget's cell limit)."""
    new = ms_per_cell * factor
    return min(fit_ms, max(new, finest_ms))


def zoom_scroll(anchor_ms: float, old_ms_per_cell: float, new_ms_per_cell: float,
                scroll_x: int, view_cells: int) -> int:
    """The first visible column after a zoom that keeps time `anchor_ms` (the cursor)
    at the same screen column; an anchor that was out of view is put a third in."""
    screen_x = anchor_ms / old_ms_per_cell - scroll_x
    if not 0 <= screen_x < view_cells:
        screen_x = view_cells / 3
    return max(0, round(anchor_ms / new_ms_per_cell - screen_x))
