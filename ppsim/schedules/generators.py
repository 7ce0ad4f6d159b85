"""Schedule generators: per-rank ordered action lists, the spine of ppsim.

The simulator times these lists, the planner searches splits under them, the
executor runs them and traces record them; a new schedule is added here once
(in `SCHEDULES`) and every command gets it. Types and the validator live in
ppsim.actions, the V-shaped schedules in ppsim.schedules_v; both are
re-exported here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from threading import Lock
from typing import Any

from ppsim.errors import UserError, one_of
from ppsim.pipeline.megatron_rules import group_refusal
from ppsim.schedules.actions import (
    Action,
    B,
    CellMarks,
    F,
    Schedule,
    W,
    dependencies,
    stage_rank,
)
from ppsim.schedules.v_shape import dualpipev, dualpipev_cells, zbv
from ppsim.schedules.validate import validate

__all__ = ["B", "F", "W", "Action", "Schedule", "SCHEDULES", "build_schedule", "dependencies",
           "dualpipev", "gpipe", "interleaved_1f1b", "interleaved_group", "interleaved_order",
           "interleaved_zb", "one_f_one_b", "schedule_placement", "stage_rank", "validate",
           "zb_h1", "zbv"]


# ---------------------------------------------------------------- generators


def gpipe(pp: int, vpp: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards (looped BFS order when vpp > 1)."""
    out = []
    for r in range(pp):
        acts = [Action(F, c * pp + r, i) for c in range(vpp) for i in range(m)]
        acts += [Action(B, c * pp + r, i) for c in reversed(range(vpp)) for i in range(m)]
        out.append(acts)
    return out


def one_f_one_b(pp: int, vpp: int, m: int, extra: int = 0) -> list[list[Action]]:
    """Megatron's non-interleaved 1F1B: warmup min(p - r - 1, m) forwards (`extra` more:
    the combined 1F1B's one)."""
    out = []
    for r in range(pp):
        warm = min(pp - r - 1 + extra, m)
        acts = [Action(F, r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action(F, r, warm + i), Action(B, r, i)]
        acts += [Action(B, r, i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def interleaved_group(pp: int, m: int, group: int | None = None) -> int:
    """Microbatches N per group of the interleaved table (a group runs on one chunk, then
    the next chunk; the backward walks the table with chunks reversed).

    `group` given (--microbatch-group-size): that N. Otherwise, m >= pp: the smallest
    N >= pp that Megatron accepts (ppsim.pipeline.megatron_rules: the last group full
    or at least pp; N = pp, Megatron's default, when m is a multiple of pp). Whenever
    torch accepts m this N is torch's m // (m // pp) too. m < pp, torch's rule
    (Megatron refuses): one group of all m microbatches.
    """
    if group is not None:
        return group
    if m < pp:
        return m
    return next(n for n in range(pp, m + 1) if m % n == 0 or m % n >= pp)


def interleaved_rule(pp: int, m: int, group: int | None = None) -> str:
    """Which rule shaped the groups of the interleaved table, in words."""
    n = interleaved_group(pp, m, group)
    if group is not None:
        return f"groups of {n} microbatches (--microbatch-group-size {n})"
    if m < pp:
        return f"torch's rule (m < pp: one group of {m})"
    return f"Megatron's rule (groups of {n} microbatches)"


def interleaved_order(m: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: (microbatch, chunk) for forward step k."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(i, c) for c in range(vpp) for i in range(lo, hi)]
    return table


def _interleaved(pp: int, vpp: int, m: int, zero_bubble: bool,
                 group: int | None = None, extra: int = 0) -> list[list[Action]]:
    """Interleaved 1F1B, or torch's interleaved zero bubble (ZB1P) when `zero_bubble`.

    Forward step k and backward step k both walk the table (backward with the
    chunks reversed). Rank r warms up with (vpp - 1) N forwards plus 2 per hop to
    the last rank (1 per hop for zero bubble, whose B is shorter), then one
    forward and one backward per step. Zero bubble queues each B's W and runs
    the oldest one after every backward from step r on, the rest at the end. `extra`
    more warm-up forwards: the combined 1F1B's one.
    """
    group = interleaved_group(pp, m, group)
    table = interleaved_order(m, vpp, group)
    total = m * vpp
    hop = 1 if zero_bubble else 2
    out = []
    for r in range(pp):
        warm = min((vpp - 1) * group + hop * (pp - r - 1) + extra, total)
        fwd = [Action(F, c * pp + r, i) for i, c in table]
        bwd = [Action(B, (vpp - 1 - c) * pp + r, i) for i, c in table]
        acts = fwd[:warm]
        pending: list[Action] = []
        for k in range(total):
            if warm + k < total:
                acts.append(fwd[warm + k])
            acts.append(bwd[k])
            if zero_bubble:
                pending.append(bwd[k])
                if k >= r:
                    b = pending.pop(0)
                    acts.append(Action(W, b.stage, b.microbatch))
        acts += [Action(W, b.stage, b.microbatch) for b in pending]
        out.append(acts)
    return out


def interleaved_1f1b(pp: int, vpp: int, m: int, group: int | None = None,
                     extra: int = 0) -> list[list[Action]]:
    """Megatron's interleaved 1F1B (torch's ScheduleInterleaved1F1B: the same order);
    `extra` more warm-up forwards per rank (the combined 1F1B's one)."""
    return _interleaved(pp, vpp, m, zero_bubble=False, group=group, extra=extra)


def combined_pairs(acts: Sequence[Action]) -> frozenset[int]:
    """Positions of the F actions a combined 1F1B runs with the B right after them: in
    its order every F followed by a B is a steady-phase step (warm-up runs forwards
    alone, cool-down backwards alone), unless the warm-up ran every forward."""
    lead = next((i for i, a in enumerate(acts) if a.kind != F), len(acts))
    if lead == sum(a.kind == F for a in acts):
        return frozenset()
    return frozenset(i for i in range(len(acts) - 1)
                     if acts[i].kind == F and acts[i + 1].kind == B)


def interleaved_zb(pp: int, vpp: int, m: int, group: int | None = None) -> list[list[Action]]:
    """torch's ScheduleInterleavedZeroBubble (ZB1P of Qi et al. 2024) for any vpp."""
    return _interleaved(pp, vpp, m, zero_bubble=True, group=group)

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


@dataclass(frozen=True)
class ScheduleSpec:
    generate: Callable[..., list[list[Action]]]
    """(pp, vpp, m) -> each rank's actions; with `grouped`, also group=N."""
    placement: str
    split_backward: bool
    check: Callable[[int, int, int], None]
    grouped: bool = False
    """The order walks a table of microbatch groups (the interleaved schedules)."""
    cells: Callable[[int, int, int], CellMarks] | None = None
    """Which actions torch writes as OVERLAP_F_B pairs and whole backwards."""


def _check_any(pp: int, vpp: int, m: int) -> None:
    return None


def _check_1f1b(pp: int, vpp: int, m: int) -> None:
    if vpp != 1:
        raise UserError(
            "pipeline.schedule", f"1f1b runs one chunk per rank but vpp = {vpp}",
            "use schedule = \"interleaved-1f1b\" for virtual stages, or set vpp = 1")


def _check_interleaved(pp: int, vpp: int, m: int) -> None:
    # Any microbatch count runs: see interleaved_group for whose rule applies.
    if vpp < 2:
        raise UserError(
            "pipeline.vpp", "interleaved-1f1b needs at least 2 chunks per rank",
            "set vpp >= 2, or use schedule = \"1f1b\" (or \"interleaved-zb\", which takes any vpp)")


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
    "gpipe": ScheduleSpec(gpipe, "loop", False, _check_any),
    "1f1b": ScheduleSpec(one_f_one_b, "loop", False, _check_1f1b),
    "interleaved-1f1b": ScheduleSpec(interleaved_1f1b, "loop", False, _check_interleaved,
                                     grouped=True),
    "zb-h1": ScheduleSpec(zb_h1, "loop", True, _check_zb_h1),
    "interleaved-zb": ScheduleSpec(interleaved_zb, "loop", True, _check_any, grouped=True),
    "zbv": ScheduleSpec(zbv, "v", True, _check_v("zbv", None)),
    "dualpipev": ScheduleSpec(dualpipev, "v", True, _check_v("dualpipev", 2),
                              cells=dualpipev_cells),
}


def schedule_placement(name: str) -> str:
    return _spec(name).placement


def chunks_for_schedule(name: str) -> int | None:
    """The chunks a rank runs where the schedule fixes them: two on a V schedule (as
    torchtitan builds ZBVZeroBubble's and DualPipeV's stages); None where vpp is free."""
    return 2 if schedule_placement(name) == "v" else None


def schedule_refusal(name: str, pp: int, vpp: int, m: int) -> UserError | None:
    """Why the schedule `name` does not take pp ranks of vpp chunks over m microbatches
    (its own check, as building it would say); None where it does."""
    try:
        _spec(name).check(pp, vpp, m)
    except UserError as exc:
        return exc
    return None


def schedule_for_vpp(name: str, vpp: int) -> str:
    """Megatron's 1F1B as the chunks per rank call it: interleaved with more than one
    (`--virtual-pipeline-model-parallel-size`), plain with one; any other schedule as
    named. A vpp given without a schedule, or changed in the TUI, goes through this."""
    if vpp > 1 and name == "1f1b":
        return "interleaved-1f1b"
    if vpp == 1 and name == "interleaved-1f1b":
        return "1f1b"
    return name


TORCH_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
               "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble",
               "dualpipev": "DualPipeV"}
"""ppsim's schedules by the names torch.distributed.pipelining's get_schedule_class takes
(torchtitan's `pipeline_parallel_schedule`); zb-h1 has none."""


def schedule_name(text: str) -> str:
    """ppsim's name for a schedule named as ppsim or as torch, in any case and with or
    without the class's `Schedule` (as get_schedule_class, case-blind): "Interleaved1F1B"
    and "ScheduleInterleaved1F1B" are "interleaved-1f1b"; other text is kept, for the
    schedule's check to name."""
    key = text.strip().lower()
    if key in SCHEDULES:
        return key
    by_torch = {torch.lower(): name for name, torch in TORCH_NAMES.items()}
    return by_torch.get(key.removeprefix("schedule"), text)


def _spec(name: str) -> ScheduleSpec:
    spec = SCHEDULES.get(name)
    if spec is None:
        raise UserError(
            "pipeline.schedule", f"unknown schedule {name!r}",
            one_of(name, SCHEDULES) + " (or torch's name, e.g. Interleaved1F1B)")
    return spec


COMBINED = ("1f1b", "interleaved-1f1b")
"""The schedules Megatron runs as a combined 1F1B (--overlap-moe-expert-parallel-comm):
1F1B without pipelining, interleaved 1F1B with it."""


def _check_combined(name: str, pp: int) -> None:
    if name not in COMBINED:
        raise UserError("pipeline.schedule", f"{name} has no combined 1F1B: Megatron "
                        "overlaps expert-parallel all-to-alls in its own 1F1B only",
                        "use schedule = \"interleaved-1f1b\" (or \"1f1b\" with pp = 1)")
    if name == "1f1b" and pp > 1:
        raise UserError("pipeline.vpp", "If enabling EP A2A overlap, "
                        "virtual_pipeline_model_parallel_size must be specified when "
                        "pipeline_model_parallel_size > 1", "set vpp >= 2 "
                        "(--num-virtual-stages-per-pipeline-rank), or pp = 1")


KEPT_ACTIONS = 1 << 19
"""Actions of the latest generated orders kept for reuse (about 40 MB): a job search
builds thousands of shapes over a few dozen orders."""
_kept: OrderedDict[tuple[object, ...], Schedule] = OrderedDict()
_kept_lock = Lock()


def build_schedule(name: str, pp: int, vpp: int, microbatches: int,
                   group: int | None = None, combined: bool = False) -> Schedule:
    """Generate a named schedule; rejects what it cannot build, with the reason (what
    Megatron alone refuses is ppsim.pipeline.megatron_rules' to say). `group`: the
    microbatches per group of an interleaved order (None: interleaved_group's choice).
    `combined`: Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm): one
    more warm-up forward per rank, each steady-phase F run with the B after it. An
    order is immutable: the latest ones (KEPT_ACTIONS) are reused by their recipe."""
    spec = _spec(name)
    if combined:
        _check_combined(name, pp)
    for field, value in (("pipeline.pp", pp), ("pipeline.vpp", vpp),
                         ("pipeline.microbatches", microbatches),
                         ("pipeline.microbatch_group_size", 1 if group is None else group)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(field, f"must be a positive integer, got {value!r}",
                            "set it to 1 or more")
    recipe = (name, pp, vpp, microbatches, group, bool(combined))
    with _kept_lock:
        hit = _kept.get(recipe)
        if hit is not None:
            _kept.move_to_end(recipe)
            return hit
    made = _generate(spec, recipe)
    with _kept_lock:
        _kept[recipe] = made
        while sum(_size(s) for s in _kept.values()) > KEPT_ACTIONS and len(_kept) > 1:
            _kept.popitem(last=False)
    return made


def _size(s: Schedule) -> int:
    return sum(len(a) for a in s.actions)


def _generate(spec: ScheduleSpec, recipe: tuple[Any, ...]) -> Schedule:
    """The order of `recipe` (build_schedule's checked arguments), checked by `spec`."""
    name, pp, vpp, microbatches, group, combined = recipe
    spec.check(pp, vpp, microbatches)
    if group is not None and group != interleaved_group(pp, microbatches):
        # Groups Megatron refuses deadlock this order (a short last group, or fewer
        # than pp): only torch's one group of m < pp microbatches runs below pp.
        reason = group_refusal(pp, microbatches, group)
        if reason is not None:
            raise UserError("pipeline.microbatch_group_size", f"is {group}: {reason}",
                            f"leave it unset, or set it to {interleaved_group(pp, microbatches)}")
    grouped = spec.grouped and vpp > 1
    more = {"extra": 1} if combined else {}
    acts = spec.generate(pp, vpp, microbatches, group=group, **more) if grouped \
        else spec.generate(pp, vpp, microbatches, **more)
    pairs = tuple(combined_pairs(a) for a in acts) if combined else ()
    cells = spec.cells(pp, vpp, microbatches) if spec.cells else None
    if combined:  # torch's CSV writes each pair as one OVERLAP_F_B
        cells = CellMarks(overlaps=pairs, whole=(frozenset(),) * pp)
    return Schedule(name, pp, vpp, microbatches, spec.placement, spec.split_backward,
                    tuple(tuple(a) for a in acts),
                    microbatch_group=interleaved_group(pp, microbatches, group) if grouped
                    else 0, cells=cells, pairs=pairs, recipe=recipe)
