"""`ppsim costs`' collectives table: what the simulation prices of each collective
(ppsim.pipeline.comm_table), drawn and as JSON."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ppsim.cli.render import compact_table, ms_text
from ppsim.job.comm_rows import CommRow
from ppsim.units import fmt_bytes

if TYPE_CHECKING:
    from rich.table import Table

COMM_NOTE = ("count: per microbatch (/mb, forward and backward together) or per iteration "
             "(/it); bytes: the gathered or reduced buffer, what a rank sends an "
             "all-to-all, one message; waits: exposed (nothing hides it), overlap "
             "(behind compute as far as it lasts), paired (behind another microbatch's "
             "compute in the combined 1F1B), schedule (the receiver waits only where the "
             "schedule makes it).")


def comm_table(rows: list[CommRow]) -> Table:
    """One row a collective: its message, group, link, time, count and exposure."""
    t = compact_table("collectives, as the simulation prices them")
    for col in ("collective", "piece", "bytes", "ranks", "link", "ms each", "count",
                "waits"):
        t.add_column(col, justify="left" if col in ("collective", "piece", "link", "waits")
                     else "right", no_wrap=True)
    stages = len({r.stages for r in rows if r.stages}) > 1
    ranks = len({r.pp_ranks for r in rows if r.pp_ranks}) > 1
    for r in rows:
        t.add_row(r.collective, piece_text(r, stages, ranks),
                  fmt_bytes(r.nbytes, figures=3) if r.nbytes else "-", str(r.ranks),
                  r.link, ms_text(r.ms), count_text(r), r.exposure)
    return t


def piece_text(r: CommRow, stages: bool, ranks: bool) -> str:
    """The piece, with the virtual stages (s) or pipeline ranks (r) it is of where those
    differ between rows: "dense s0-1", "step r3"."""
    if stages and r.stages:
        return f"{r.piece} s{spans(r.stages)}"
    if ranks and r.pp_ranks:
        return f"{r.piece} r{spans(r.pp_ranks)}"
    return r.piece


def spans(ids: tuple[int, ...]) -> str:
    """0,1,2,5 -> "0-2,5"."""
    out: list[tuple[int, int]] = []
    for i in sorted(ids):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def count_text(r: CommRow) -> str:
    return f"{r.count:g}/{'mb' if r.per == 'microbatch' else 'it'}"


def comm_lines(rows: list[CommRow], measured: bool) -> list[str]:
    """What to print beneath the collectives table (`measured`: the costs are a cost
    file's, whose layers' times hold their collectives)."""
    lines = [COMM_NOTE] if rows else ["collectives: none (no parallel group, and no "
                                      "pipeline boundary between two ranks)"]
    if len({r.pp_ranks for r in rows if r.pp_ranks}) > 1:
        lines.append("step rN: pipeline rank N's data-parallel step (ranks alike share rows)")
    if len({r.stages for r in rows if r.stages}) > 1:
        lines.append("sN: the virtual stages whose layers run it so, as their [memory] "
                     "policy recomputes")
    if measured:
        lines.append("the layers' own collectives are in the cost file's measured times")
    return lines


def comm_json(rows: list[CommRow]) -> list[dict[str, Any]]:
    """The rows for `costs --json`, under "priced_collectives"."""
    return [asdict(r) for r in rows]
