"""Schedule generators: per-rank ordered action lists, the spine of ppsim.

An `Action` is (kind, virtual stage, microbatch). Kind F is the forward, B the
backward for inputs (the whole backward when the schedule does not split it),
W the backward for weights. The simulator times these lists, the executor runs
them, traces record them; a new schedule is added here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppsim.errors import UserError

F, B, W = "F", "B", "W"


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    """"F", "B" or "W"."""
    stage: int
    """Virtual stage index (Megatron order for loop placement)."""
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class Schedule:
    name: str
    pp: int
    vpp: int
    microbatches: int
    placement: str
    """"loop" (stage i on rank i % pp) or "v" (ZB-V / DualPipeV)."""
    split_backward: bool
    """True when W actions are separate from B."""
    actions: tuple[tuple[Action, ...], ...]
    """One ordered tuple of actions per rank."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def stage_rank(self, stage: int) -> int:
        return stage_rank(stage, self.pp, self.placement)

    def stage_chunk(self, stage: int) -> int:
        return stage // self.pp

    @property
    def num_ops(self) -> int:
        return sum(len(a) for a in self.actions)


def stage_rank(stage: int, pp: int, placement: str) -> int:
    """Rank that owns a virtual stage under a placement."""
    if placement == "v" and (stage // pp) % 2 == 1:
        return pp - 1 - stage % pp
    return stage % pp


# ---------------------------------------------------------------- generators


def gpipe(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards (looped BFS order when vpp > 1)."""
    out = []
    for r in range(pp):
        acts = [Action(F, c * pp + r, i) for c in range(vpp) for i in range(m)]
        acts += [Action(B, c * pp + r, i) for c in reversed(range(vpp)) for i in range(m)]
        out.append(acts)
    return out


def one_f_one_b(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Megatron's non-interleaved 1F1B: warmup min(p - r - 1, m) forwards."""
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action(F, r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action(F, r, warm + i), Action(B, r, i)]
        acts += [Action(B, r, i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def interleaved_order(m: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: (microbatch, chunk) for forward step k."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(i, c) for c in range(vpp) for i in range(lo, hi)]
    return table


def interleaved_1f1b(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B with microbatch groups of p."""
    table = interleaved_order(m, vpp, pp)
    total = m * vpp
    out = []
    for r in range(pp):
        warm = min(2 * (pp - r - 1) + (vpp - 1) * pp, total)

        def fwd(k: int, r: int = r) -> Action:
            i, c = table[k]
            return Action(F, c * pp + r, i)

        def bwd(k: int, r: int = r) -> Action:
            i, c = table[k]
            return Action(B, (vpp - 1 - c) * pp + r, i)

        acts = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            acts += [fwd(warm + k), bwd(k)]
        acts += [bwd(k) for k in range(total - warm, total)]
        out.append(acts)
    return out


def zb_h1(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """Zero Bubble ZB-H1 (Qi et al. 2024): 1F1B's order with W deferred into the bubbles.

    Rank r: p - r - 1 warm-up forwards; then for each microbatch i: the next
    forward (while any remain), B(i), and a W once i >= r; finally the r
    deferred W. Same activation memory as 1F1B.
    """
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action(F, r, i) for i in range(warm)]
        nf, nw = warm, 0
        for i in range(m):
            if nf < m:
                acts.append(Action(F, r, nf))
                nf += 1
            acts.append(Action(B, r, i))
            if i >= r:
                acts.append(Action(W, r, nw))
                nw += 1
        acts += [Action(W, r, i) for i in range(nw, m)]
        out.append(acts)
    return out


def _v_stages(pp: int, r: int) -> tuple[int, int]:
    """The two stages of rank r in V placement: going down, then coming back."""
    return r, 2 * pp - 1 - r


class _RankOrder:
    """One rank's action list, with the next microbatch of each (stage, kind)."""

    def __init__(self) -> None:
        self.acts: list[Action] = []
        self.next: dict[tuple[int, str], int] = {}
        self.pending_w: list[Action] = []

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
            self.acts.append(w)
            self.next[(stage, W)] = i + 1

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
        for _ in range(m - 2 * pp + r + 1):
            o.add(F, s0)
            o.backward(s1, split=False)
            o.add(F, s1)
            o.backward(s0, split=False)
        for _ in range(pp - r - 1):
            o.backward(s1, split=False)
            o.add(F, s1)
            o.backward(s0, split=False)
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
        out.append(o.acts)
    return out


@dataclass(frozen=True)
class ScheduleSpec:
    generate: Callable[[int, int, int], list[list[Action]]]
    placement: str
    split_backward: bool
    check: Callable[[int, int, int], None]


def _check_gpipe(pp: int, vpp: int, m: int) -> None:
    return None


def _check_1f1b(pp: int, vpp: int, m: int) -> None:
    if vpp != 1:
        raise UserError(
            "pipeline.schedule", f"1f1b runs one chunk per rank but vpp = {vpp}",
            "use schedule = \"interleaved-1f1b\" for virtual stages, or set vpp = 1")


def _check_interleaved(pp: int, vpp: int, m: int) -> None:
    if vpp < 2:
        raise UserError(
            "pipeline.vpp", "interleaved-1f1b needs at least 2 chunks per rank",
            "set vpp >= 2, or use schedule = \"1f1b\"")
    # Megatron: microbatch groups of N = p per virtual stage need p <= N <= m,
    # and a short last group (m mod N) must still hold at least p microbatches,
    # which with N = p means m must be a multiple of p.
    if m < pp:
        raise UserError(
            "pipeline.microbatches",
            f"interleaved-1f1b needs at least pp = {pp} microbatches, got {m} "
            "(Megatron: the contiguous microbatches per virtual stage must range in [PP, m])",
            f"set microbatches >= {pp}")
    if m % pp != 0:
        raise UserError(
            "pipeline.microbatches",
            f"{m} microbatches is not divisible by pp = {pp}, as Megatron's interleaved "
            "schedule requires",
            f"use a multiple of {pp}, e.g. {m - m % pp or pp} or {m + pp - m % pp}")


def _check_zb_h1(pp: int, vpp: int, m: int) -> None:
    if vpp != 1:
        raise UserError("pipeline.vpp", f"zb-h1 runs one chunk per rank but vpp = {vpp}",
                        "set vpp = 1, or use schedule = \"zbv\" for two chunks in a V")


def _check_v(name: str, need_m: int | None) -> Callable[[int, int, int], None]:
    def check(pp: int, vpp: int, m: int) -> None:
        if vpp != 2:
            raise UserError("pipeline.vpp", f"{name} places exactly 2 chunks per rank in a V, "
                            f"but vpp = {vpp}", "set vpp = 2")
        if need_m is not None and m < need_m * pp:
            raise UserError("pipeline.microbatches", f"{name} needs at least {need_m * pp} "
                            f"microbatches (2 x pp) but got {m}", f"set microbatches >= "
                            f"{need_m * pp}")
    return check


SCHEDULES: dict[str, ScheduleSpec] = {
    "gpipe": ScheduleSpec(gpipe, "loop", False, _check_gpipe),
    "1f1b": ScheduleSpec(one_f_one_b, "loop", False, _check_1f1b),
    "interleaved-1f1b": ScheduleSpec(interleaved_1f1b, "loop", False, _check_interleaved),
    "zb-h1": ScheduleSpec(zb_h1, "loop", True, _check_zb_h1),
    "zbv": ScheduleSpec(zbv, "v", True, _check_v("zbv", None)),
    "dualpipev": ScheduleSpec(dualpipev, "v", True, _check_v("dualpipev", 2)),
}


def schedule_placement(name: str) -> str:
    return _spec(name).placement


def _spec(name: str) -> ScheduleSpec:
    spec = SCHEDULES.get(name)
    if spec is None:
        raise UserError(
            "pipeline.schedule", f"unknown schedule {name!r}",
            "choose one of " + ", ".join(SCHEDULES))
    return spec


def build_schedule(name: str, pp: int, vpp: int, microbatches: int) -> Schedule:
    """Generate a named schedule; rejects what Megatron rejects, with its reason."""
    spec = _spec(name)
    for field, value in (("pipeline.pp", pp), ("pipeline.vpp", vpp),
                         ("pipeline.microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(field, f"must be a positive integer, got {value!r}",
                            "set it to 1 or more")
    spec.check(pp, vpp, microbatches)
    acts = spec.generate(pp, vpp, microbatches)
    return Schedule(name, pp, vpp, microbatches, spec.placement, spec.split_backward,
                    tuple(tuple(a) for a in acts))


# ---------------------------------------------------------------- validation


def dependencies(action: Action, num_stages: int) -> Action | None:
    """The action on another stage whose result this action must receive first."""
    if action.kind == F and action.stage > 0:
        return Action(F, action.stage - 1, action.microbatch)
    if action.kind == B and action.stage < num_stages - 1:
        return Action(B, action.stage + 1, action.microbatch)
    return None


def validate(schedule: Schedule) -> None:
    """Raise UserError unless the schedule is a complete, valid, deadlock-free order.

    Checks: every (stage, microbatch) has exactly one F and one B (and one W
    when backward is split) on the rank that owns the stage; on that rank F
    comes before B before W; and executing the lists with each action waiting
    for its cross-stage input never deadlocks.
    """
    n = schedule.num_stages
    m = schedule.microbatches
    where: dict[Action, tuple[int, int]] = {}
    for r, acts in enumerate(schedule.actions):
        for pos, a in enumerate(acts):
            if a.kind not in (F, B, W):
                raise UserError("schedule", f"rank {r} action {pos}: unknown kind {a.kind!r}",
                                "use F, B or W")
            if not (0 <= a.stage < n and 0 <= a.microbatch < m):
                raise UserError("schedule", f"rank {r} action {pos} ({a}) is out of range",
                                f"stages are 0..{n - 1}, microbatches 0..{m - 1}")
            if schedule.stage_rank(a.stage) != r:
                raise UserError("schedule", f"rank {r} action {pos} ({a}) belongs to rank "
                                f"{schedule.stage_rank(a.stage)}", "move it to its own rank")
            if a in where:
                raise UserError("schedule", f"rank {r} runs {a} twice", "keep one of them")
            where[a] = (r, pos)
    kinds = (F, B, W) if schedule.split_backward else (F, B)
    for s in range(n):
        for i in range(m):
            prev = None
            for k in kinds:
                a = Action(k, s, i)
                if a not in where:
                    raise UserError("schedule", f"{a} (kind {k}, stage {s}, microbatch {i}) "
                                    "is missing", "every stage needs each kind per microbatch")
                if prev is not None and where[prev][1] > where[a][1]:
                    raise UserError("schedule", f"{a} comes before {prev} on rank "
                                    f"{where[a][0]}", "order F before B before W")
                prev = a
            if not schedule.split_backward and Action(W, s, i) in where:
                raise UserError("schedule", f"{Action(W, s, i)} in a schedule without "
                                "separate W", "drop W or split the backward")
    stuck = _first_deadlock(schedule)
    if stuck is not None:
        raise UserError("schedule", f"deadlock: {stuck}", "reorder so every input can arrive")


def _first_deadlock(schedule: Schedule) -> str | None:
    """Run the lists with unit steps; describe where they block, or None."""
    n = schedule.num_stages
    done: set[Action] = set()
    pos = [0] * schedule.pp
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(schedule.actions):
            while pos[r] < len(acts):
                dep = dependencies(acts[pos[r]], n)
                if dep is not None and dep not in done:
                    break
                done.add(acts[pos[r]])
                pos[r] += 1
                progress = True
    blocked = [f"rank {r} waits at {acts[pos[r]]} for {dependencies(acts[pos[r]], n)}"
               for r, acts in enumerate(schedule.actions) if pos[r] < len(acts)]
    return "; ".join(blocked) if blocked else None


# ---------------------------------------------------------------- user orders


def parse_actions_csv(text: str, pp: int, vpp: int, microbatches: int,
                      placement: str = "loop") -> Schedule:
    """Read a torch.distributed.pipelining-style CSV: one row per rank.

    Cells look like `0F3` (stage 0, forward, microbatch 3); `I` is the
    backward for inputs (then `W` must appear too); `B` is a whole backward.
    Empty cells are idle slots and are skipped.
    """
    rows = [line for line in text.splitlines() if line.strip()]
    if len(rows) != pp:
        raise UserError("schedule csv", f"has {len(rows)} rows but pp = {pp}",
                        "write one row per rank")
    actions: list[list[Action]] = []
    seen_kinds: set[str] = set()
    for r, line in enumerate(rows):
        acts = []
        for col, cell in enumerate(c.strip() for c in line.split(",")):
            if not cell:
                continue
            kind = next((k for k in "FIBW" if k in cell), None)
            head, _, tail = cell.partition(kind or "?")
            if kind is None or not head.isdigit() or not tail.isdigit():
                raise UserError("schedule csv", f"row {r + 1} column {col + 1}: cannot read "
                                f"{cell!r}", "write cells like 0F3, 1I2, 1W2 or 0B0")
            seen_kinds.add(kind)
            acts.append(Action(B if kind in "IB" else kind, int(head), int(tail)))
        actions.append(acts)
    split = bool(seen_kinds & {"I", "W"})
    if split and "B" in seen_kinds:
        raise UserError("schedule csv", "mixes B (whole backward) with I/W (split backward)",
                        "use either B alone, or I together with W")
    sched = Schedule("csv", pp, vpp, microbatches, placement, split,
                     tuple(tuple(a) for a in actions))
    validate(sched)
    return sched
