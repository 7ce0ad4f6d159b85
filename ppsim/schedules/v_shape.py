"""Schedules with two chunks per rank in a V: ZB-V and DualPipeV.

Rank r holds stage r (going down) and stage 2p - 1 - r (coming back), so
the last stage sits on rank 0 next to the first and the loss needs no hop.
"""

from __future__ import annotations

from ppsim.schedules.actions import Action, B, CellMarks, F, W


def _v_stages(pp: int, r: int) -> tuple[int, int]:
    """The two stages of rank r in V placement: going down, then coming back."""
    return r, 2 * pp - 1 - r


class _RankOrder:
    """One rank's action list, with the next microbatch of each (stage, kind)."""

    def __init__(self) -> None:
        self.acts: list[Action] = []
        self.next: dict[tuple[int, str], int] = {}
        self.pending_w: list[Action] = []
        self.overlaps: set[int] = set()
        """Positions of F actions that start an OVERLAP_F_B pair (torch's cells)."""
        self.whole: set[int] = set()
        """Positions of whole backwards (B with its W at once)."""

    def add(self, kind: str, stage: int) -> int:
        i = self.next.get((stage, kind), 0)
        self.next[(stage, kind)] = i + 1
        self.acts.append(Action(kind, stage, i))
        return i

    def backward(self, stage: int, split: bool) -> None:
        """B, and its W at once (whole backward) or queued for later (split)."""
        i = self.add(B, stage)
        w = Action(W, stage, i)
        if split:
            self.pending_w.append(w)
        else:
            self.whole.add(len(self.acts) - 1)
            self.acts.append(w)
            self.next[(stage, W)] = i + 1

    def overlapped(self, forward: int, backward: int) -> None:
        """F of one chunk overlapped with the whole B of the other (an OVERLAP_F_B cell)."""
        self.overlaps.add(len(self.acts))
        self.add(F, forward)
        self.backward(backward, split=False)

    def deferred_w(self) -> None:
        if self.pending_w:
            self.acts.append(self.pending_w.pop(0))

    def count(self, kind: str, stage: int) -> int:
        return self.next.get((stage, kind), 0)


def zbv(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """ZB-V (Qi et al. 2024, section 6): two chunks per rank in a V.

    Phases per rank r: 2(p - r) - 1 forwards of chunk 0; r pairs (chunk-1
    forward, chunk-0 forward); p - r triples F/B/W of chunk 1; then the steady
    F/B/W of chunk 0 and of chunk 1; a cool-down of backwards with W of chunk
    0 interleaved; the remaining W last. Built for max(m, 2p - 1)
    microbatches (the construction's minimum), then the extra ones dropped.
    """
    n = max(m, 2 * pp - 1)
    out = []
    for r in range(pp):
        s0, s1 = _v_stages(pp, r)
        o = _RankOrder()
        for _ in range(2 * (pp - r) - 1):
            o.add(F, s0)
        for _ in range(r):
            o.add(F, s1)
            o.add(F, s0)
        for _ in range(pp - r):
            o.add(F, s1)
            o.backward(s1, split=False)
        while o.count(F, s1) < o.count(F, s0) or o.count(F, s0) < n:
            if o.count(F, s0) < n:
                o.add(F, s0)
            o.backward(s0, split=False)
            o.add(F, s1)
            o.backward(s1, split=False)
        for _ in range(r):
            o.backward(s0, split=True)
            o.backward(s1, split=True)
        # Cool-down: chunk-0 backwards, each followed by the oldest deferred
        # chunk-0 W; then all deferred W, chunk 1 first.
        for _ in range(pp - r):
            o.backward(s0, split=True)
            o.acts.append(Action(W, s0, o.count(W, s0)))
            o.next[(s0, W)] = o.count(W, s0) + 1
        done = {(a.stage, a.microbatch) for a in o.acts if a.kind == W}
        rest = [w for w in o.pending_w if (w.stage, w.microbatch) not in done]
        o.acts += sorted(rest, key=lambda a: (a.stage != s1, a.microbatch))
        out.append([a for a in o.acts if a.microbatch < m])
    return out


def dualpipev(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """DualPipeV (DeepSeek's DualPipe folded onto p devices, two chunks in a V).

    Eight phases per rank r (DualPipe README): forwards of chunk 0; chunk 0/1
    forward pairs; B/W/F of chunk 1; the main loop of overlapped
    forward-of-one-chunk with backward-of-the-other; then backwards that move
    from whole (B with its W at once) to split (W deferred) and the deferred
    W. An overlapped pair runs here as F then B (and W when whole): on one
    device the compute is sequential either way; the overlap hides transfers,
    which ppsim already treats as asynchronous.
    """
    return [o.acts for o in _dualpipev_orders(pp, m)]


def dualpipev_cells(pp: int, vpp: int, m: int) -> CellMarks:
    """Which of dualpipev's actions torch writes as OVERLAP_F_B pairs and whole B."""
    orders = _dualpipev_orders(pp, m)
    return CellMarks(overlaps=tuple(frozenset(o.overlaps) for o in orders),
                     whole=tuple(frozenset(o.whole) for o in orders))


def _dualpipev_orders(pp: int, m: int) -> list[_RankOrder]:
    """Each rank's DualPipeV order, with the pairs torch's ScheduleDualPipeV overlaps
    (its main step, except the last rank's first pair; step 5's pairs)."""
    out = []
    for r in range(pp):
        s0, s1 = _v_stages(pp, r)
        o = _RankOrder()
        for _ in range((pp - r - 1) * 2):
            o.add(F, s0)
        for _ in range(r + 1):
            o.add(F, s0)
            o.add(F, s1)
        for _ in range(pp - r - 1):
            o.backward(s1, split=True)
            o.deferred_w()
            o.add(F, s1)
        for i in range(m - 2 * pp + r + 1):
            if i == 0 and r == pp - 1:  # torch leaves this pair apart (a smaller bubble)
                o.add(F, s0)
                o.backward(s1, split=False)
            else:
                o.overlapped(s0, s1)
            o.overlapped(s1, s0)
        for _ in range(pp - r - 1):
            o.backward(s1, split=False)
            o.overlapped(s1, s0)
        split = False
        half = (r + 1) // 2
        for i in range(r + 1):
            if i == half and r % 2 == 1:
                split = True
            o.backward(s1, split)
            if i == half and r % 2 == 0:
                split = True
            o.backward(s0, split)
        for _ in range(pp - r - 1):
            o.deferred_w()
            o.backward(s0, split)
        while o.pending_w:
            o.deferred_w()
        out.append(o)
    return out
