"""The message rule: who feeds whom, what a message is called, what it costs on a link.

F of stage s sends its activation to F of stage s + 1; B of stage s sends its input
gradient to B of stage s - 1. The last stage's F feeds its own B through the loss, and
the first stage's B ends the chain, so neither sends a message; W never does. Stages
are virtual: under V placement (ZB-V, DualPipeV) stage s + 1 may sit on the rank of
stage s, and the message then stays on that rank (the simulators price it at 0).

Every engine (the event simulator, the shared-device engine, the fast evaluator, the
planner's bounds) and the executor's runtime and P2P read the rule from here.
Pure: this module imports nothing of ppsim, so the schedule validator can use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

ACTIVATION, GRADIENT = "F", "B"
"""Message kinds: named after the op that sends and the op that receives them."""


class Op(Protocol):
    """What the rule reads of an action (ppsim.schedules.actions.Action)."""

    @property
    def kind(self) -> str: ...
    @property
    def stage(self) -> int: ...
    @property
    def microbatch(self) -> int: ...


class Message(NamedTuple):
    """One message: its kind, the stage that receives it and the microbatch.

    A named tuple, so it orders and hashes as the (kind, stage, microbatch) the
    executor's runtime keys its buffers by."""

    kind: str
    """ACTIVATION ("F") or GRADIENT ("B")."""
    stage: int
    """The stage whose op of the same kind receives it."""
    microbatch: int

    @property
    def backward(self) -> bool:
        return self.kind == GRADIENT

    @property
    def sender(self) -> int:
        """The stage whose op of the same kind sends it."""
        return self.stage - 1 if self.kind == ACTIVATION else self.stage + 1

    @property
    def boundary(self) -> int:
        """Boundary b it crosses (between stage b and b + 1): its bytes are stage b's output."""
        return min(self.stage, self.sender)

    def key(self, microbatches: int) -> int:
        """Its id among all messages of a schedule with `microbatches` microbatches."""
        return key(self.stage, self.microbatch, self.backward, microbatches)


def target_stage(kind: str, stage: int, num_stages: int) -> int | None:
    """Stage whose op of the same kind an op (kind, stage) feeds; None: it sends nothing."""
    if kind == ACTIVATION and stage < num_stages - 1:
        return stage + 1
    if kind == GRADIENT and stage > 0:
        return stage - 1
    return None


def source_stage(kind: str, stage: int, num_stages: int) -> int | None:
    """Stage whose op of the same kind feeds an op (kind, stage); None: it waits for none."""
    if kind == ACTIVATION and stage > 0:
        return stage - 1
    if kind == GRADIENT and stage < num_stages - 1:
        return stage + 1
    return None


def feeds(action: Op, num_stages: int) -> Message | None:
    """The message `action` sends when it ends, or None."""
    to = target_stage(action.kind, action.stage, num_stages)
    return None if to is None else Message(action.kind, to, action.microbatch)


def awaits(action: Op, num_stages: int) -> Message | None:
    """The message `action` must receive before it starts, or None."""
    if source_stage(action.kind, action.stage, num_stages) is None:
        return None
    return Message(action.kind, action.stage, action.microbatch)


def key(stage: int, microbatch: int, backward: bool, microbatches: int) -> int:
    """The one message identity: the message feeding (stage, microbatch) in one direction.
    Distinct for distinct messages, >= 0, below key_count(stages, microbatches)."""
    return (stage * microbatches + microbatch) * 2 + int(backward)


def key_count(stages: int, microbatches: int) -> int:
    """How many keys `key` gives a schedule of `stages` stages: an engine holds the
    messages in a list of that length."""
    return 2 * stages * microbatches


def stage_keys(stage: int, backward: bool, microbatches: int) -> range:
    """key(stage, i, backward, microbatches) for every microbatch i: engines index it per
    op instead of computing each key."""
    first = key(stage, 0, backward, microbatches)
    step = key(stage, 1, backward, microbatches) - first
    return range(first, first + step * microbatches, step)


def wire_ms(bandwidth_gbps: float, nbytes: float) -> float:
    """Time the bytes take on the wire: bytes over bandwidth (GB/s = 10^6 bytes per ms);
    0 when the bandwidth is 0 (free transfers)."""
    return nbytes / (bandwidth_gbps * 1e6) if bandwidth_gbps > 0 else 0.0


def delay_ms(latency_ms: float, bandwidth_gbps: float, nbytes: float) -> float:
    """Send to arrival of one message on an idle link: latency plus bytes over bandwidth."""
    return latency_ms + wire_ms(bandwidth_gbps, nbytes)


@dataclass(frozen=True, kw_only=True)
class Wiring:
    """The rule laid out per (kind, stage) for a schedule's shape, so an engine looks a
    message up per op instead of deriving it."""

    waits: dict[str, tuple[range | None, ...]]
    """Kind -> per stage: keys (indexed by microbatch) of what its ops receive, or None."""
    sends: dict[str, tuple[range | None, ...]]
    """Kind -> per stage: keys (indexed by microbatch) of what its ops send, or None."""
    to: dict[str, tuple[int, ...]]
    """Kind -> per stage: the stage its ops feed, or -1."""
    boundary: dict[str, tuple[int, ...]]
    """Kind -> per stage: the boundary what its ops send crosses (sizes it), or -1."""


def wiring(num_stages: int, microbatches: int, kinds: tuple[str, ...] = ("F", "B", "W")
           ) -> Wiring:
    """Who feeds whom and the keys, for every kind and stage of a schedule's shape."""
    waits, sends, to, bound = {}, {}, {}, {}
    for kind in kinds:
        w, s, t, b = [], [], [], []
        for st in range(num_stages):
            src = source_stage(kind, st, num_stages)
            w.append(None if src is None else stage_keys(st, kind == GRADIENT, microbatches))
            dst = target_stage(kind, st, num_stages)
            s.append(None if dst is None else stage_keys(dst, kind == GRADIENT, microbatches))
            t.append(-1 if dst is None else dst)
            b.append(-1 if dst is None else Message(kind, dst, 0).boundary)
        waits[kind], sends[kind], to[kind], bound[kind] = tuple(w), tuple(s), tuple(t), tuple(b)
    return Wiring(waits=waits, sends=sends, to=to, boundary=bound)
