"""How big a request is, estimated from its inputs alone, and what we refuse.

Every command (and the TUI) asks here before doing work, so a request that
cannot finish in this machine's time and memory is refused in well under a
second with the estimate, the limit and a way out, instead of hanging or
dying with MemoryError. Pure: no I/O, no imports beyond the error type.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError

MAX_LAYERS = 100_000
"""Decoder layers; per-layer cost lists are built eagerly."""
MAX_STAGES = 4_096
"""pp x vpp; schedules, bounds and tables are per stage."""
MAX_MICROBATCHES = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How many compute ops one request may time (F, B and W each count one)."""

    ops: int
    """Upper limit on ops in one simulated iteration."""
    where: str
    """Who is asking, for the message: "simulate", "the TUI", ..."""
    way_out: str
    """What the user can do instead, e.g. "use fewer microbatches"."""


SIMULATE = Budget(ops=20_000_000, where="simulate",
                  way_out="use fewer microbatches or a smaller pp")
"""About 60 s of simpy on this machine class (0.71 s per 131k ops measured)."""
TRACE = Budget(ops=2_000_000, where="a trace or picture",
               way_out="drop --trace/--png, or use fewer microbatches")
"""Per-op records are kept only for traces and pictures (~100 B each in JSON)."""
INTERACTIVE = Budget(ops=300_000, where="the TUI",
                     way_out="use fewer microbatches or a smaller pp (the TUI redraws on "
                     "every key; ppsim simulate takes larger runs)")
"""What simulates in a second or two, so a key press never freezes the screen."""


def schedule_ops(pp: int, vpp: int, microbatches: int, split_backward: bool) -> int:
    """Compute ops in one iteration: every stage runs F and B (and W) per microbatch."""
    return pp * vpp * microbatches * (3 if split_backward else 2)


def check_shape(num_layers: int | None, pp: int, vpp: int, microbatches: int) -> None:
    """Refuse counts no command can handle, before anything is built from them."""
    for field, value, limit in (("model.num_layers", num_layers, MAX_LAYERS),
                                ("pipeline.pp", pp, MAX_STAGES),
                                ("pipeline.microbatches", microbatches, MAX_MICROBATCHES)):
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise UserError(field, f"is {value:,}, above the limit of {limit:,}",
                            f"use at most {limit:,}")
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
                        f"pp {pp} x vpp {vpp} x {microbatches:,} microbatches = {ops:,} ops, "
                        f"more than {budget.where} handles ({budget.ops:,})", budget.way_out)
    return ops
