"""How big a request is, estimated from its inputs alone, and what we refuse.

Every command (and the TUI) asks here before doing work, so a request that
cannot finish in this machine's time and memory is refused in well under a
second with the estimate, the limit and a way out, instead of hanging or
dying with MemoryError. Pure: no I/O.

The budgets are for this machine class (2 cores): measured when it was quiet,
the schedule costs ~1.1 us and ~110 bytes per op to build and the simulator
~1.8 us per op to run, so SIMULATE keeps a whole `ppsim simulate` near 35 s
and 1.4 GB. Memory holds at any load; time does not: with the cores shared
four ways the same run takes 4-5 times as long (benchmarks/bench_scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppsim.errors import UserError
from ppsim.schedules.generators import SCHEDULES

MAX_LAYERS = 100_000
"""Decoder layers; per-layer cost lists are built eagerly."""
MAX_STAGES = 4_096
"""pp x vpp; schedules, bounds and tables are per stage."""
MAX_MICROBATCHES = 1_000_000
MAX_GPUS = 1_000_000
"""World size of `--gpus`: ten times the largest jobs run."""
MAX_GLOBAL_BATCH = 1_000_000_000
"""Sequences per iteration of `--global-batch-size`."""
MAX_BUCKET = 10**15
"""Parameters per gradient bucket, or buckets per rank: beyond any model's count."""


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How many compute ops one request may time (F, B and W each count one)."""

    ops: int
    """Upper limit on ops in one simulated iteration."""
    where: str
    """Who is asking, for the message: "simulate", "the TUI", ..."""
    way_out: str
    """What the user can do instead, e.g. "use fewer microbatches"."""


SIMULATE = Budget(ops=12_000_000, where="simulate (60 s, 2 GB)",
                  way_out="use fewer microbatches or a smaller pp")
"""About 35 s and 1.4 GB on this machine class (~2.9 us, ~110 B per op measured)."""
TRACE = Budget(ops=400_000, where="a trace or picture (2 GB)",
               way_out="drop --trace/--png, or use fewer microbatches")
"""Per-op records are kept only for traces and pictures: measured ~3.4 kB per op in
memory while the Chrome JSON is built (450 MB for 131k ops), ~520 B per op on disk."""
TIMELINE_OPS = 1_000_000
"""Above this, `simulate` prints no text timeline (it would need every op's record)."""
PLAN = Budget(ops=4_000_000, where="plan (each split timed is one pass over every op)",
              way_out="plan with fewer microbatches (the best split rarely depends on them) "
              "or a smaller pp")
"""One evaluation of 4M ops takes ~8 s here: fewer than ten in a minute's budget."""
PLAN_SETUP_S_PER_OP = 15e-6
"""Schedule, compiled schedule and the first timed split, per op (measured here under
load: ~31 s for 2.1M ops; about a third of that on an idle machine)."""
INTERACTIVE = Budget(ops=300_000, where="the TUI",
                     way_out="use fewer microbatches or a smaller pp (the TUI redraws on "
                     "every key; ppsim simulate takes larger runs)")
"""What simulates in a second or two, so a key press never freezes the screen."""


def schedule_ops(pp: int, vpp: int, microbatches: int, split_backward: bool) -> int:
    """Compute ops in one iteration: every stage runs F and B (and W) per microbatch."""
    return pp * vpp * microbatches * (3 if split_backward else 2)


def check_shape(num_layers: int | None, pp: int, vpp: int, microbatches: int,
                mtp_layers: int = 0) -> None:
    """Refuse counts no command can handle, before anything is built from them; MTP
    layers are placed as layers are, so they count against MAX_LAYERS with the others."""
    for field, value, limit in (("model.num_layers", num_layers, MAX_LAYERS),
                                ("pipeline.pp", pp, MAX_STAGES),
                                ("pipeline.microbatches", microbatches, MAX_MICROBATCHES)):
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise UserError(field, f"is {value:,}, above the limit of {limit:,}",
                            f"use at most {limit:,}")
    if (isinstance(mtp_layers, int) and isinstance(num_layers, int) and mtp_layers > 0
            and num_layers + mtp_layers > MAX_LAYERS):
        raise UserError("model.mtp_layers", f"{num_layers:,} decoder + {mtp_layers:,} MTP "
                        f"layers are above the limit of {MAX_LAYERS:,} layers",
                        f"use at most {MAX_LAYERS - num_layers:,} MTP layers")
    if (isinstance(pp, int) and isinstance(vpp, int) and not isinstance(vpp, bool)
            and pp * vpp > MAX_STAGES):
        raise UserError("pipeline.vpp", f"pp x vpp = {pp * vpp:,} virtual stages, above the "
                        f"limit of {MAX_STAGES:,}", "use fewer virtual stages")


def check_ops(pp: int, vpp: int, microbatches: int, split_backward: bool,
              budget: Budget) -> int:
    """The op count of one iteration; UserError when it exceeds `budget`."""
    ops = schedule_ops(pp, vpp, microbatches, split_backward)
    if ops > budget.ops:
        raise UserError("pipeline.microbatches",
                        f"pp {pp} x vpp {vpp} x {microbatches:,} microbatches x "
                        f"{'3 kinds (F, B, W)' if split_backward else '2 kinds (F, B)'} = "
                        f"{ops:,} ops, "
                        f"more than {budget.where} handles ({budget.ops:,})", budget.way_out)
    return ops


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_request(cfg: Any, budget: Budget | None) -> int | None:
    """Refuse a config whose counts or op count exceed the limits, before any work.

    Returns the op count (None when the counts are not all valid integers:
    the config's own checks name those).
    """
    p = cfg.pipeline
    check_shape(cfg.model.num_layers, p.pp, p.vpp, p.microbatches,
                getattr(cfg.model, "mtp_layers", 0))
    # An unknown schedule has no op count here; the config's own check names it.
    spec = SCHEDULES.get(p.schedule) if isinstance(p.schedule, str) else None
    if budget is None or spec is None or not all(_count(v) for v in (p.pp, p.vpp, p.microbatches)):
        return None
    return check_ops(p.pp, p.vpp, p.microbatches, spec.split_backward, budget)


def check_plan_budget(ops: int, time_budget_s: float) -> None:
    """Refuse a plan whose fixed setup alone would overrun its time budget."""
    setup = ops * PLAN_SETUP_S_PER_OP
    if setup > time_budget_s:
        raise UserError("--time-budget", f"{time_budget_s:g} s is less than the ~{setup:.0f} s "
                        f"needed only to prepare {ops:,} ops for the search",
                        f"use --time-budget {2 * setup:.0f} or more, or fewer microbatches")
