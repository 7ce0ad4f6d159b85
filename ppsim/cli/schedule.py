"""`ppsim schedule`: show a schedule's per-rank order, or write it as torch's CSV.

The CSV is what torch.distributed.pipelining's `_PipelineScheduleRuntime._load_csv`
reads, so an order planned or edited here runs under torch's runtime as is;
`--actions-csv` reads one back (any format torch writes) and can rewrite it
in the compute-only form.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cautions import csv_notes
from ppsim.cli.flags import (
    add_config_flags,
    add_split_flags,
    config_from_args,
    emit_json,
    outputs_apart,
)
from ppsim.config import limits
from ppsim.errors import UserError
from ppsim.fileio import write_text_atomic
from ppsim.pipeline.problem import resolve_split, split_schedule_name
from ppsim.schedules.actions import Schedule
from ppsim.schedules.generators import build_schedule, interleaved_rule
from ppsim.schedules.torchcsv import load_actions_csv, to_torch_csv, torch_cells

HELP = "show a schedule's per-rank order, or write it as a torch.distributed.pipelining CSV"


def config_schedule(cfg: Any) -> Schedule:
    """The order a config asks for: its actions CSV, else its named schedule."""

    limits.check_request(cfg, limits.SIMULATE)
    p = cfg.pipeline
    if p.actions_csv:
        return load_actions_csv(p.actions_csv, p.pp, p.vpp, p.microbatches)
    split = resolve_split(cfg)  # a launch line's layout gives the chunks a rank runs
    return build_schedule(split_schedule_name(cfg, split), p.pp, split.vpp, p.microbatches,
                          p.microbatch_group_size, combined=p.overlap_moe_expert_parallel_comm)


def order_rule(schedule: Schedule, group: int | None) -> str | None:
    """Whose microbatch-group rule shaped an interleaved order, in words; else None.
    `group`: the configured --microbatch-group-size (None: unset, so the rule is
    Megatron's or torch's, not the flag's, whatever group the order resolved to)."""

    if schedule.name in ("interleaved-1f1b", "interleaved-zb") and schedule.vpp > 1:
        return interleaved_rule(schedule.pp, schedule.microbatches, group)
    return None


def print_notes(schedule: Schedule, command: str) -> None:
    """What reading a CSV left out, one line each on stderr (stdout stays clean for --json)."""
    for line in csv_notes(schedule):
        sys.stderr.write(f"ppsim {command}: {line}\n")


def cmd_schedule(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    outputs_apart(args, {"--csv": args.csv}, cfg=cfg)
    sched = config_schedule(cfg)
    print_notes(sched, "schedule")
    if args.csv:
        try:
            write_text_atomic(args.csv, to_torch_csv(sched))
        except OSError as exc:

            raise UserError("--csv", f"cannot write {args.csv}: {exc.strerror}",
                            "pass a writable file path") from None
    cells = torch_cells(sched)
    rule = order_rule(sched, cfg.pipeline.microbatch_group_size)
    if args.json:
        emit_json({"schedule": sched.name, "pp": sched.pp, "vpp": sched.vpp,
                   "microbatches": sched.microbatches, "placement": sched.placement,
                   "split_backward": sched.split_backward, "rule": rule,
                   "ranks": cells, "notes": list(sched.notes), "csv": args.csv})
        return 0
    print(f"{sched.name}  pp={sched.pp} vpp={sched.vpp} microbatches={sched.microbatches}  "
          f"placement={sched.placement}" + (f"  {rule}" if rule else ""))
    for r, row in enumerate(cells):
        print(f"rank {r}: " + " ".join(row))
    if args.csv:
        print(f"torch CSV written to {args.csv} "
              "(torch: _PipelineScheduleRuntime._load_csv reads it)")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, split_flags=False)
    add_split_flags(p, counts=False)  # a pasted launch line's: its layout sets vpp
    p.add_argument("--csv", metavar="OUT.csv",
                   help="write the order as torch.distributed.pipelining's compute-only CSV")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def register(commands: dict[str, Any]) -> None:
    commands["schedule"] = (HELP, add_arguments, cmd_schedule)
