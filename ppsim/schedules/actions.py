"""Actions and schedules: what every schedule generator produces.

An `Action` is (kind, virtual stage, microbatch). Kind F is the forward, B the
backward for inputs (the whole backward when the schedule does not split it),
W the backward for weights. A `Schedule` holds one ordered tuple of actions
per rank, or a compact sequence of them for an order read from a file
(ppsim.schedules.validate checks it is complete and deadlock-free).
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from ppsim.pipeline.messages import awaits

F, B, W = "F", "B", "W"
KINDS = (F, B, W)
"""The kinds in the order a (stage, microbatch) runs them."""


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

    overlaps: tuple[Set[int], ...]
    """Per rank, positions of the F actions that start an OVERLAP_F_B pair with the B
    after them (and that B's W, when the B is whole)."""
    whole: tuple[Set[int], ...]
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
    actions: tuple[Sequence[Action], ...]
    """One ordered sequence of actions per rank: a tuple, or PackedActions when read
    from a file (ppsim.schedules.packed)."""
    notes: tuple[str, ...] = ()
    """What reading a user's order left out or reinterpreted (see ppsim.torchcsv)."""
    microbatch_group: int = 0
    """Microbatches per group of an interleaved table (Megatron's
    microbatch_group_size_per_vp_stage); 0 when the order walks no such table."""
    cells: CellMarks | None = None
    """Which actions torch writes as pairs or whole backwards; None: ppsim's default
    (a B with its W right after is one whole backward)."""
    pairs: tuple[frozenset[int], ...] = ()
    """Per rank, positions of the F actions that run combined with the B right after
    them (Megatron's combined 1F1B, --overlap-moe-expert-parallel-comm): the pair
    starts once both inputs are in and both messages leave when the B ends; empty
    when no action is paired."""
    recipe: tuple[object, ...] | None = None
    """The arguments the order was generated from (ppsim.schedules.generators
    .build_schedule): equal recipes give equal actions. None for an order read from a
    file."""

    def paired(self, rank: int) -> frozenset[int]:
        """Positions of rank's F actions that start a combined pair."""
        return self.pairs[rank] if self.pairs else frozenset()

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


def dependencies(action: Action, num_stages: int) -> Action | None:
    """The action on another stage whose result this action must receive first."""
    msg = awaits(action, num_stages)
    return None if msg is None else Action(msg.kind, msg.sender, msg.microbatch)
