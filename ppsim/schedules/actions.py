"""Actions, schedules and the validator: what every schedule generator produces.

An `Action` is (kind, virtual stage, microbatch). Kind F is the forward, B the
backward for inputs (the whole backward when the schedule does not split it),
W the backward for weights. A `Schedule` holds one ordered tuple of actions
per rank; `validate` checks it is complete and deadlock-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError
from ppsim.pipeline.messages import awaits

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


@dataclass(frozen=True, kw_only=True)
class CellMarks:
    """How torch writes some actions of an order as cells (see ppsim.schedules.torchcsv)."""

    overlaps: tuple[frozenset[int], ...]
    """Per rank, positions of the F actions that start an OVERLAP_F_B pair with the B
    after them (and that B's W, when the B is whole)."""
    whole: tuple[frozenset[int], ...]
    """Per rank, positions of the B actions torch writes as one whole backward (`B`),
    the W right after them included; every other B of a split order is torch's `I`."""


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
    notes: tuple[str, ...] = ()
    """What reading a user's order left out or reinterpreted (see ppsim.torchcsv)."""
    microbatch_group: int = 0
    """Microbatches per group of an interleaved table (Megatron's
    microbatch_group_size_per_vp_stage); 0 when the order walks no such table."""
    cells: CellMarks | None = None
    """Which actions torch writes as pairs or whole backwards; None: ppsim's default
    (a B with its W right after is one whole backward)."""

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


# ---------------------------------------------------------------- validation


def dependencies(action: Action, num_stages: int) -> Action | None:
    """The action on another stage whose result this action must receive first."""
    msg = awaits(action, num_stages)
    return None if msg is None else Action(msg.kind, msg.sender, msg.microbatch)


def validate(schedule: Schedule) -> None:
    """Raise UserError unless the schedule is a complete, valid, deadlock-free order.

    Checks: every (stage, microbatch) has exactly one F and one B (and one W
    when backward is split) on the rank that owns the stage; on that rank F
    comes before B before W; and executing the lists with each action waiting
    for its cross-stage input never deadlocks.
    """
    n = schedule.num_stages
    m = schedule.microbatches
    where: dict[Action, int] = {}
    """Each action's position on its rank (the rank is its stage's, checked first)."""
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
            where[a] = pos
    kinds = (F, B, W) if schedule.split_backward else (F, B)
    for s in range(n):
        for i in range(m):
            prev = None
            for k in kinds:
                a = Action(k, s, i)
                if a not in where:
                    raise UserError("schedule", f"{a} (kind {k}, stage {s}, microbatch {i}) "
                                    "is missing", "every stage needs each kind per microbatch")
                if prev is not None and where[prev] > where[a]:
                    raise UserError("schedule", f"{a} comes before {prev} on rank "
                                    f"{schedule.stage_rank(s)}", "order F before B before W")
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
