"""The tensor-, context- and expert-parallel collectives inside a trace's F and B ops, and
`ppsim diff`'s comparison of them: what each op waited for on each group's links, the
simulator's priced figure (args exposed_ms) beside the executor's measured one (the
collectives a rank timed inside the op, ppsim.executor.builders.comm_clock).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ppsim.config import validate
from ppsim.errors import UserError

GROUP_ORDER = ("tp", "cp", "ep", "dp")
"""The groups in the order a table lists them."""


@dataclass(frozen=True, slots=True)
class TraceCollective:
    """One group's collectives inside one op."""

    rank: int
    group: str
    op: str
    """The op's kind: F or B; R for the step's data-parallel collectives (stage and
    microbatch -1)."""
    stage: int
    microbatch: int
    iteration: int
    exposed_ms: float
    """What the op waited for on the group's links."""
    start_us: float = 0.0
    dur_us: float = 0.0
    """Where the trace draws it (from the op's start, the groups one after another)."""

    @property
    def key(self) -> tuple[int, str, int, int, str]:
        return (self.rank, self.op, self.stage, self.microbatch, self.group)


def read_collective(ev: dict, n: int, path: str, max_rank: int) -> TraceCollective:
    """A collective event of a trace (ppsim.trace.schema.collective_events), checked."""
    where = f"{path}: collective event {n}"
    args = ev.get("args")
    if not isinstance(args, dict):
        raise UserError("trace", f"{where}: args must be an object", "re-record the trace")
    group, op = args.get("group"), args.get("op")
    if group not in GROUP_ORDER or op not in ("F", "B", "R") or (op == "R" and group != "dp"):
        raise UserError("trace", f"{where}: group must be one of {', '.join(GROUP_ORDER)} "
                        f"and op F or B (R: the step's, dp only), got {group!r}, {op!r}"[:200],
                        "re-record the trace")
    least = -1 if op == "R" else 0  # the step's: no stage, no microbatch

    def count(name: str, value: Any, hi: int, lo: int = 0) -> int:
        return validate.count(f"{where}: {name}", value, lo=lo, hi=hi,
                              fix="re-record the trace")

    return TraceCollective(
        count("pid", ev.get("pid"), max_rank), group, op,
        count("args.stage", args.get("stage"), max_rank, least),
        count("args.microbatch", args.get("microbatch"), validate.MAX_INDEX, least),
        count("args.iteration", args.get("iteration", 0), validate.MAX_INDEX),
        validate.number(f"{where}: args.exposed_ms", args.get("exposed_ms"), lo=0.0,
                        hi=validate.MAX_MS, fix="times are finite ms"),
        validate.number(f"{where}: ts", ev.get("ts"), lo=-1e18, hi=1e18,
                        fix="times are finite microseconds"),
        validate.number(f"{where}: dur", ev.get("dur"), lo=0.0, hi=validate.MAX_MS * 1e3,
                        fix="times are finite microseconds"))


@dataclass(frozen=True, kw_only=True)
class CollectiveRow:
    """One group's collectives in one kind of op, the ops both traces have them in."""

    group: str
    op: str
    count: int
    """Ops of this kind with this group's collectives in both traces."""
    ms: tuple[float, float]
    """The median op's wait, A and B."""
    error: float | None
    """The median of each op's (B - A) / A (None where A waited for nothing)."""

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "op": self.op, "count": self.count,
                "ms": list(self.ms), "error": self.error}


def collective_rows(a: list[TraceCollective], b: list[TraceCollective]
                    ) -> list[CollectiveRow]:
    """Per group and op kind, the ops whose collectives both lists hold (each one
    iteration's), compared: their median waits and the median relative error."""
    in_a, in_b = {c.key: c.exposed_ms for c in a}, {c.key: c.exposed_ms for c in b}
    rows = []
    for group in GROUP_ORDER:
        for op in ("F", "B"):
            keys = [k for k in in_a if k in in_b and k[1] == op and k[4] == group]
            if not keys:
                continue
            rel = [(in_b[k] - in_a[k]) / in_a[k] for k in keys if in_a[k] > 0]
            rows.append(CollectiveRow(
                group=group, op=op, count=len(keys),
                ms=(statistics.median(in_a[k] for k in keys),
                    statistics.median(in_b[k] for k in keys)),
                error=statistics.median(rel) if rel else None))
    return rows
