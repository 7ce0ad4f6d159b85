"""What Megatron-LM refuses that ppsim simulates, each with Megatron's own reason. Pure.

ppsim simulates orders Megatron will not launch (torch runs some of them), so
`simulate`, `plan` and `split` warn on stderr when a configuration is one of those
(the TUI shows the line under its headline, its export as a comment), and the Megatron
export carries the flag an order needs. Read at Megatron-LM d98e8a6:

- megatron/training/arguments.py: an interleaved schedule (vpp > 1) needs
  pipeline-model-parallel size > 1.
- megatron/core/model_parallel_config.py: microbatch_group_size_per_vp_stage
  (--microbatch-group-size-per-virtual-pipeline-stage) defaults to pp.
- megatron/core/pipeline_parallel/schedules.py,
  forward_backward_pipelining_with_interleaving: the group size must lie in
  [pp, m] (ValueError), and m % group must be 0 or at least pp (RuntimeError).
"""

from __future__ import annotations

from ppsim.pipeline.split import Split
from ppsim.schedules.actions import Schedule

GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"
"""Megatron's flag for the microbatches per group of the interleaved table."""
MEGATRON_INTERLEAVED = ("interleaved-1f1b",)
"""ppsim schedules whose order is Megatron's interleaved one (and so its group rule)."""


def group_refusal(pp: int, microbatches: int, group: int) -> str | None:
    """Megatron's two checks of the interleaved group size; None when both pass."""
    if group > microbatches or group < pp:
        return (f"a microbatch group of {group} is outside [pp={pp}, m={microbatches}] "
                "(schedules.py raises ValueError)")
    rest = microbatches % group
    if 0 < rest < pp:
        return (f"the last microbatch group would hold {rest} < pp={pp} microbatches "
                f"({microbatches} % {group}; schedules.py raises RuntimeError)")
    return None


def needs_group_flag(schedule: Schedule) -> bool:
    """The order's group size is not Megatron's default (pp): the export must pass it."""
    return schedule.vpp > 1 and schedule.microbatch_group not in (0, schedule.pp)


def refusals(schedule: Schedule, group_given: bool) -> list[str]:
    """Why Megatron would not run this configuration, one line each; [] when it would.

    `group_given`: the group size was configured (--microbatch-group-size); when it
    was not, Megatron's default group (pp) is what a launch without the flag gets.
    """
    out = []
    pp, vpp, m = schedule.pp, schedule.vpp, schedule.microbatches
    if schedule.placement == "loop" and vpp > 1 and pp == 1:
        out.append(f"Megatron refuses vpp {vpp} on pp 1: an interleaved schedule needs "
                   "pipeline-model-parallel size > 1 (arguments.py)")
    if schedule.name not in MEGATRON_INTERLEAVED or vpp < 2 or pp < 2:
        return out
    return out + interleaved_refusals(pp, m, schedule.microbatch_group, group_given)


def interleaved_refusals(pp: int, m: int, group: int, group_given: bool) -> list[str]:
    """Why Megatron's interleaved schedule would not run `m` microbatches over `pp` ranks
    in groups of `group` (the order ppsim simulates and its exports pass), one line
    each; [] when it would. `group_given`: as for refusals."""
    reason = group_refusal(pp, m, group)
    if reason is not None:
        return [f"Megatron refuses this interleaved order: {reason}"]
    default = group_refusal(pp, m, pp)
    if not group_given and default is not None:
        return [f"Megatron refuses {m} microbatches with its default group size "
                f"(pp = {pp}): {default}; the simulated order groups {group}: pass "
                f"{GROUP_FLAG} {group} (the exported flags do)"]
    return []


def split_refusals(split: Split, microbatches: int, group: int,
                   group_given: bool) -> list[str]:
    """Why Megatron would not run the order a split's flags give it (Megatron runs every
    looped vpp > 1 split interleaved, whatever ppsim simulates), as `ppsim split` and the
    TUI's export say it; [] when it would. `group`: the group the flags pass."""
    if split.vpp < 2 or split.pp < 2 or split.placement != "loop":
        return []
    return interleaved_refusals(split.pp, microbatches, group, group_given)
