"""What `ppsim split` and `ppsim simulate` say on stderr about the configuration they are
given, beside its numbers: the notes and warnings, one line each, worded without the
command's name. One home for the list, so the TUI shows the lines the CLI prints."""

from __future__ import annotations

from ppsim.config.schema import Config
from ppsim.job.combined import unpaired_note
from ppsim.pipeline.megatron_rules import refusals, split_refusals
from ppsim.pipeline.problem import Problem, placement_warning
from ppsim.pipeline.split import Split
from ppsim.policy.report import host_warning, policy_json
from ppsim.schedules.actions import Schedule
from ppsim.schedules.generators import interleaved_group


def csv_notes(schedule: Schedule) -> list[str]:
    """What reading an actions CSV left out."""
    return [f"note: actions CSV: {note}" for note in schedule.notes]


def flags_group(cfg: Config, split: Split) -> int:
    """The microbatch group a split's Megatron flags pass: Megatron runs a vpp > 1 split
    interleaved, so the simulated order's group rides on them; 0 for vpp 1."""
    p = cfg.pipeline
    return interleaved_group(p.pp, p.microbatches, p.microbatch_group_size) \
        if split.vpp > 1 else 0


def split_cautions(cfg: Config, split: Split) -> list[str]:
    """`ppsim split`'s warnings: where Megatron refuses the order the flags give."""
    p = cfg.pipeline
    return [f"warning: {line}" for line in
            split_refusals(split, p.microbatches, flags_group(cfg, split),
                           p.microbatch_group_size is not None)]


def simulate_cautions(cfg: Config, problem: Problem) -> list[str]:
    """`ppsim simulate`'s lines before it simulates `problem` (built from `cfg`): what an
    actions CSV left out, a cost file measured for another placement, an order Megatron
    refuses, a combined 1F1B that pairs nothing on some ranks."""
    schedule = problem.schedule
    out = csv_notes(schedule)
    out += [line for line in (placement_warning(cfg),) if line]
    out += [f"warning: {line}" for line in
            refusals(schedule, cfg.pipeline.microbatch_group_size is not None)]
    return out + [line for line in (unpaired_note(schedule),) if line]


def host_caution(cfg: Config, problem: Problem) -> str | None:
    """`ppsim simulate`'s line after its numbers: the host memory a rank needs passes its
    share (ppsim.policy.report.host_warning)."""
    return host_warning(policy_json(problem), cfg.hardware)
