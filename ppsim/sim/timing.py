"""What both timing engines share: per-op durations, messages and memory deltas.

The discrete-event simulator (`ppsim.sim.engine`) and the fast evaluator
(`ppsim.sim.evaluate`) take every duration, byte count and message delay from
the same `StageTable` and link, so they compute every time with the same
floating-point operations in the same order and agree to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ppsim.costs.model import StageCost
from ppsim.pipeline.messages import key_count, wiring
from ppsim.schedules.generators import B, F, Schedule, W
from ppsim.sim.copies import resident_bytes


@dataclass(frozen=True)
class CompiledSchedule:
    """The structure of a schedule, independent of costs (cached by the planner)."""

    schedule: Schedule
    kind: tuple[tuple[str, ...], ...]
    stage: tuple[tuple[int, ...], ...]
    wait_key: tuple[tuple[int, ...], ...]
    """Message an op must receive before it starts, or -1."""
    send_key: tuple[tuple[int, ...], ...]
    """Message an op sends when it ends, or -1."""
    send_stage: tuple[tuple[int, ...], ...]
    """Stage whose output_bytes size the message (the boundary it crosses)."""
    send_rank: tuple[tuple[int, ...], ...]
    """Receiving rank, or -1."""

    @property
    def messages(self) -> int:
        """The number of message keys (each key is below it)."""
        return key_count(self.schedule.num_stages, self.schedule.microbatches)


def compile_schedule(s: Schedule) -> CompiledSchedule:
    """Per op: the message it waits for and the one it sends (ppsim.pipeline.messages)."""
    n = s.num_stages
    wired = wiring(n, s.microbatches)
    owner = [s.stage_rank(i) for i in range(n)]
    kinds, stages, waits, sends, send_stages, send_ranks = [], [], [], [], [], []
    for acts in s.actions:
        k_, st_, w_, s_, ss_, sr_ = [], [], [], [], [], []
        for a in acts:
            kind, st, mb = a.kind, a.stage, a.microbatch
            wait, send, to = wired.waits[kind][st], wired.sends[kind][st], wired.to[kind][st]
            k_.append(kind)
            st_.append(st)
            w_.append(-1 if wait is None else wait[mb])
            s_.append(-1 if send is None else send[mb])
            ss_.append(wired.boundary[kind][st])
            sr_.append(-1 if to < 0 else owner[to])
        kinds.append(tuple(k_))
        stages.append(tuple(st_))
        waits.append(tuple(w_))
        sends.append(tuple(s_))
        send_stages.append(tuple(ss_))
        send_ranks.append(tuple(sr_))
    return CompiledSchedule(s, tuple(kinds), tuple(stages), tuple(waits), tuple(sends),
                            tuple(send_stages), tuple(send_ranks))


@dataclass(frozen=True)
class StageTable:
    """Per virtual stage, what one op of each kind costs: the op table before it is
    spread over the schedule. The simulator reads this directly (no per-op table),
    so its memory does not grow with the run.
    """

    duration: dict[str, tuple[float, ...]]
    """Kind -> per-stage duration of one op of that kind."""
    alloc: tuple[int, ...]
    """Activation bytes an F allocates when it starts."""
    transient: tuple[int, ...]
    """Bytes a B allocates when it starts and frees when it ends (StageCost.transient_bytes)."""
    free: dict[str, tuple[int, ...]]
    """Kind -> bytes released when the op ends (B: its transient and all W does not keep;
    W: the rest)."""
    boundary_bytes: tuple[int, ...]
    """Bytes crossing the boundary between stage s and s + 1 (activation and gradient)."""
    static: tuple[int, ...]
    """Static bytes per rank."""
    paired: dict[str, tuple[float, ...]]
    """Kind -> per-stage duration of an F or B that runs in a combined pair (its
    all-to-alls behind the other's compute; Schedule.pairs)."""

    def op_ms(self, kind: str, stage: int, paired: bool) -> float:
        """Duration of one op: alone, or in a combined pair."""
        return (self.paired if paired else self.duration)[kind][stage]


def stage_table(s: Schedule, costs: Sequence[StageCost]) -> StageTable:
    """Per-stage durations, memory deltas and message sizes of a schedule's stages."""
    dur_b = tuple(c.input_grad_ms(s.split_backward) for c in costs)
    if s.split_backward:
        # What W keeps: matmul inputs and their output gradients. The gradients are new
        # tensors, so this may exceed what B frees (B then raises memory).
        keep = tuple(c.weight_grad_bytes for c in costs)
    else:
        keep = (0,) * len(costs)
    static = [0] * s.pp
    for i, c in enumerate(costs):
        static[s.stage_rank(i)] += c.static_bytes
    act = tuple(resident_bytes(c) for c in costs)  # free offload copies keep off the device
    transient = tuple(c.transient_bytes for c in costs)
    dur_f = tuple(c.forward_ms for c in costs)
    dur_w = tuple(c.weight_grad_ms for c in costs)
    return StageTable(
        duration={F: dur_f, B: dur_b, W: dur_w},
        paired={F: tuple(d - c.pair_saving_ms for d, c in zip(dur_f, costs, strict=True)),
                B: tuple(d - c.pair_saving_ms for d, c in zip(dur_b, costs, strict=True)),
                W: dur_w},
        alloc=act, transient=transient,
        free={F: (0,) * len(costs),
              B: tuple(a - k + t for a, k, t in zip(act, keep, transient, strict=True)),
              W: keep},
        boundary_bytes=tuple(c.output_bytes for c in costs), static=tuple(static))


def in_pairs(s: Schedule, rank: int) -> frozenset[int]:
    """Positions of rank's ops that run in a combined pair: each paired F and its B."""
    firsts = s.paired(rank)
    return firsts | {i + 1 for i in firsts}


Link = Callable[[int, int, int], float]
"""link(src rank, dst rank, bytes) -> delay from send to arrival, in ms."""


def p2p_link(transfer_ms: Callable[[int], float]) -> Link:
    """Private links between ranks; a boundary inside one rank (V placement) is free."""
    cache: dict[int, float] = {}

    def link(src: int, dst: int, nbytes: int) -> float:
        if src == dst:
            return 0.0
        d = cache.get(nbytes)
        if d is None:
            d = cache[nbytes] = transfer_ms(nbytes)
        return d

    return link


@dataclass(frozen=True)
class OpTable:
    """Per rank, per op: duration, message (dst rank in `compiled`, bytes), memory change.

    Built for the fast evaluator and the TUI; `simulate` streams from a
    `StageTable` instead, so huge runs never materialise this.
    """

    compiled: CompiledSchedule
    duration: tuple[tuple[float, ...], ...]
    send_bytes: tuple[tuple[int, ...], ...]
    """Bytes of the message the op sends (0 for none, or inside one rank)."""
    alloc: tuple[tuple[int, ...], ...]
    """Bytes allocated when the op starts (activations at F, the transient at B)."""
    free: tuple[tuple[int, ...], ...]
    """Bytes released when the op ends (at B, and at W for what W kept)."""
    static: tuple[int, ...]
    """Static bytes per rank."""
    link: Link
    """Delay of a message from its (src, dst, bytes)."""

    def send_delays(self) -> list[list[float]]:
        """Per op: arrival delay of its message (0.0 when it sends none)."""
        link = self.link
        out = []
        for r, (dsts, nbs) in enumerate(zip(self.compiled.send_rank, self.send_bytes,
                                            strict=True)):
            out.append([link(r, d, nb) if d >= 0 else 0.0 for d, nb in zip(dsts, nbs,
                                                                         strict=True)])
        return out


def op_table(compiled: CompiledSchedule, costs: Sequence[StageCost],
             transfer_ms: Callable[[int], float]) -> OpTable:
    """Durations and bytes of every op; transfer_ms(nbytes) gives a message's delay."""
    s = compiled.schedule
    st = stage_table(s, costs)
    durations, nbytes, allocs, frees = [], [], [], []
    zero = (0,) * len(costs)
    for r in range(s.pp):
        kinds, stages = compiled.kind[r], compiled.stage[r]
        together = in_pairs(s, r)
        durations.append(tuple(st.op_ms(k, i, pos in together)
                               for pos, (k, i) in enumerate(zip(kinds, stages, strict=True))))
        starts = {F: st.alloc, B: st.transient}
        allocs.append(tuple(starts.get(k, zero)[i] for k, i in zip(kinds, stages, strict=True)))
        frees.append(tuple(st.free[k][i] for k, i in zip(kinds, stages, strict=True)))
        nbytes.append(tuple(st.boundary_bytes[ss] if ss >= 0 and dst != r else 0
                            for ss, dst in zip(compiled.send_stage[r], compiled.send_rank[r],
                                               strict=True)))
    return OpTable(compiled, tuple(durations), tuple(nbytes), tuple(allocs), tuple(frees),
                   st.static, p2p_link(transfer_ms))
