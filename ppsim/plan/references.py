"""Splits a plan is measured against: the frameworks' own and published splits.

The baseline is Megatron's even split when one exists; when the layers do not
divide, it is the fastest split Megatron's --decoder-first/last-pipeline-num-layers
can express, so the comparison is with what a Megatron user could launch today.
DeepSpeed's `parameters` and `uniform` splits and torchtitan's default split are
made by those frameworks' rules (ppsim.plan.baselines). References given with
`plan --compare` are layout strings or layer counts. All are timed by the
simulator under the same cost model as the plan. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ppsim.errors import UserError
from ppsim.pipeline.exports import DEFAULT_SPECS, DeepSpeedSpecs, megatron_refusal
from ppsim.pipeline.layout import is_layout, parse_layout
from ppsim.pipeline.problem import Problem
from ppsim.pipeline.split import Split, megatron_split, split_from_counts
from ppsim.plan.baselines import FrameworkSplit, deepspeed_splits, torchtitan_split
from ppsim.plan.search import Deadline
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import Summary

MAX_FIRST_LAST = 400
"""First/last pairs timed when looking for Megatron's best expressible split."""


@dataclass(frozen=True)
class Reference:
    label: str
    """What the user sees: "Megatron even", or the string given to --compare."""
    split: Split
    summary: Summary
    key: str = ""
    """A framework's JSON name (megatron, deepspeed_parameters, deepspeed_uniform,
    torchtitan: `speedup_vs_<key>`); "" for a --compare split."""


def framework_baselines(problem: Problem, specs: DeepSpeedSpecs = DEFAULT_SPECS,
                        deadline: Deadline | None = None
                        ) -> tuple[list[Reference], list[FrameworkSplit]]:
    """DeepSpeed's and torchtitan's splits of `problem`, timed; and those with none
    (their notes say why)."""
    sp, costs = problem.split, problem.costs
    wanted = [torchtitan_split(costs.num_layers - costs.mtp_layers, sp.num_stages,
                               costs.mtp_layers)]
    wanted = deepspeed_splits(costs, sp.pp, sp.vpp, specs, deadline) + wanted
    timed, missing = [], []
    for fw in wanted:
        if fw.counts is None:
            missing.append(fw)
            continue
        s = split_from_counts(fw.counts, sp.pp, sp.vpp, costs.num_layers, sp.placement,
                              costs.mtp_layers)
        timed.append(Reference(fw.label, s, time_split(problem, s), fw.key))
    return timed, missing


def time_split(problem: Problem, split: Split) -> Summary:
    """The simulated summary of `problem` with `split` (the simulator is the reference)."""
    return simulate(problem.with_split(split), record=False).summary


def _with_mtp(s: Split, problem: Problem) -> Split:
    """Megatron builds MTP layers on the last stage."""
    mtp = problem.costs.mtp_layers
    counts = list(s.counts)
    counts[-1] += mtp
    return Split(tuple(counts), s.pp, s.vpp, problem.split.placement, mtp)  # type: ignore[arg-type]


def megatron_baseline(problem: Problem) -> Reference | None:
    """Megatron's even split, or its best first/last split when there is no even one."""
    sp, mtp = problem.split, problem.costs.mtp_layers
    if sp.placement != "loop":
        return None
    decoder = problem.costs.num_layers - mtp
    try:
        even = _with_mtp(megatron_split(decoder, sp.pp, sp.vpp), problem)
    except UserError:
        pass
    else:
        return Reference("Megatron even", even, time_split(problem, even), "megatron")
    best: Reference | None = None
    for first, last in first_last_options(decoder, sp.pp, sp.vpp):
        try:
            s = _with_mtp(megatron_split(decoder, sp.pp, sp.vpp, first, last), problem)
        except UserError:
            continue
        summary = time_split(problem, s)
        key = (not summary.fits, summary.iteration_time_ms, summary.peak_memory_bytes)
        if best is None or key < (not best.summary.fits, best.summary.iteration_time_ms,
                                  best.summary.peak_memory_bytes):
            flags = " ".join(f"{n} {v}" for n, v in (("first", first), ("last", last)) if v)
            best = Reference(f"Megatron {flags}", s, summary, "megatron")
    return best


def megatron_missing(problem: Problem) -> FrameworkSplit:
    """Megatron as a framework with no split of `problem` (megatron_baseline gave none),
    and why."""
    sp = problem.split
    decoder = problem.costs.num_layers - problem.costs.mtp_layers
    note = megatron_refusal(sp) or (f"no even or first/last split of {decoder} layers over "
                                    f"pp={sp.pp} x vpp={sp.vpp}: only a layout says it")
    return FrameworkSplit(key="megatron", label="Megatron", counts=None, note=note)


def first_last_options(layers: int, pp: int, vpp: int) -> list[tuple[int | None, int | None]]:
    """(first, last) pairs near the even share, nearest first, at most MAX_FIRST_LAST."""
    if pp < 2:
        return []
    share = math.ceil(layers / pp)
    values = [v for v in range(vpp, min(layers, 2 * share + vpp) + 1, vpp)]
    pairs: list[tuple[int | None, int | None]] = [(f, None) for f in values]
    pairs += [(None, v) for v in values] + [(f, v) for f in values for v in values]
    pairs.sort(key=lambda p: abs((p[0] or share) - share) + abs((p[1] or share) - share))
    return pairs[:MAX_FIRST_LAST]


def parse_reference(text: str, problem: Problem) -> Split:
    """A --compare value: a Megatron layout string, or comma-separated layer counts;
    refused in --compare's name (the split rules speak of the config's fields)."""
    try:
        return _reference(text, problem)
    except UserError as e:
        if e.field == "--compare":
            raise
        raise UserError("--compare", f"{text!r}: {e.problem}", e.fix) from None


def _reference(text: str, problem: Problem) -> Split:
    sp = problem.split
    field = "--compare"
    body = text.strip()
    if is_layout(body):
        s = parse_layout(body, sp.pp, problem.costs.num_layers - problem.costs.mtp_layers,
                         problem.costs.mtp_layers)
        if s.vpp != sp.vpp:
            raise UserError(field, f"{text!r} has {s.num_stages} stages = vpp {s.vpp}, but the "
                            f"plan has vpp {sp.vpp}", f"plan with --vpp {s.vpp}")
        return replace(s, placement=sp.placement) if sp.placement != s.placement else s
    try:
        counts = [int(x) for x in body.split(",") if x.strip()]
    except ValueError:
        raise UserError(field, f"{text!r} is neither a layout nor comma-separated counts",
                        "give e.g. 7,8,8,7 or 'Et*7|(t*8|)*14t*7L'") from None
    return split_from_counts(counts, sp.pp, sp.vpp, problem.costs.num_layers, sp.placement,
                             problem.costs.mtp_layers)


def compare(problem: Problem, texts: list[str]) -> list[Reference]:
    """Each --compare value, parsed and timed."""
    out = []
    for text in texts:
        s = parse_reference(text, problem)
        out.append(Reference(text, s, time_split(problem, s)))
    return out


def why_faster(summary: Summary, ref: Reference) -> str:
    """How much faster the best (its summary) is than `ref`, and which rank held `ref` back."""
    t, r = summary.iteration_time_ms, ref.summary.iteration_time_ms
    if r <= t * (1 + 1e-9):
        return "as fast as the best"
    # The rank that gained the most work against the best split is where time was lost.
    gain = max(ref.summary.ranks, key=lambda x: x.busy_ms - summary.ranks[x.rank].busy_ms)
    mine = summary.ranks[gain.rank]
    busiest = max(ref.summary.ranks, key=lambda x: x.busy_ms)
    return (f"best is {r / t - 1:.1%} faster: {ref.label!r} loads rank {gain.rank} most "
            f"beyond the best split ({gain.layers} layers, busy {gain.busy_ms:.1f} ms, against "
            f"{mine.layers} layers, {mine.busy_ms:.1f} ms); its busiest rank is {busiest.rank} "
            f"({busiest.busy_ms:.1f} ms)")
