"""torch.distributed.pipelining's schedule CSV, read and written.

torch's `_dump_csv` writes one row per rank and one cell per action:
`0F3` (stage 0, forward, microbatch 3), `1I2` / `1W2` (backward for inputs /
for weights), `0B0` (the whole backward), empty cells for idle slots; with
its default "compute_comms" format also `0SEND_F1`, `1RECV_F1`, `0UNSHARD`,
`0RESHARD`, `0REDUCE_GRAD`; DualPipeV writes `(0F3;3B1)OVERLAP_F_B`.

ppsim reads every one of these. Transfers and FSDP/data-parallel actions are
left out (ppsim models transfers itself) and said so in the schedule's notes;
an overlapped pair runs as its sub-actions in the order written; a whole `B`
in an order that also splits backwards (DualPipeV does) becomes ppsim's B
followed at once by its W. Writing is the inverse: where the schedule marks its
cells (`Schedule.cells`: dualpipev, and every order read from a CSV) the pairs
are written as `(F;B)OVERLAP_F_B` and the whole backwards as `B`, so a
registered overlap function still sees its pairs; elsewhere a B with its W
right after becomes torch's `B`, as torch's own `_merge_bw` does. A round trip
gives back the same order and the same cells.
"""

from __future__ import annotations

import csv
import io
import re

from ppsim.config.limits import check_shape
from ppsim.config.validate import read_text as read_small_text
from ppsim.errors import UserError
from ppsim.schedules.actions import Action, B, CellMarks, Schedule, W, stage_rank, validate

MAX_CSV_BYTES = 64 * 2**20
"""A torch CSV of pp 256 x 4096 microbatches is ~40 MB; beyond this, refuse unread."""
MAX_CSV_CELLS = 4_000_000
"""Cells (commas and rows) read at most: ~5 s and ~620 MB to parse on a 2-core machine
(~1.3 us and ~150 B a cell), as many ops as `ppsim plan` times (limits.PLAN)."""
FIELD = "pipeline.actions_csv"
COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
SHARDING = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
# ASCII digits only, at most 9 of them: superscripts or a 5,000-digit count are
# unreadable cells, never a ValueError from int().
_CELL = re.compile(r"([0-9]{1,9})(F|I|B|W|" + "|".join(COMMS + SHARDING) + r")([0-9]{0,9})",
                   re.ASCII)
_OVERLAP = re.compile(r"\(([^()]*)\)OVERLAP_F_B")


class _Reader:
    """Turns cells into actions, counting what it leaves out for the notes."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.comms = 0
        self.sharding = 0
        self.overlaps = 0

    def cell(self, text: str, where: str) -> list[tuple[str, int, int]]:
        """(torch kind, stage, microbatch) of one cell: none, one, or an overlapped pair."""
        over = _OVERLAP.fullmatch(text)
        if over:
            self.overlaps += 1
            subs = [s.strip() for s in over.group(1).split(";") if s.strip()]
            return [a for s in subs for a in self.cell(s, where)]
        m = _CELL.fullmatch(text)
        if m is None:
            raise UserError(FIELD, f"{where}: cannot read {text[:40]!r}",
                            "write cells like 0F3, 1I2, 1W2, 0B0 or (0F3;3B1)OVERLAP_F_B")
        stage, kind, mb = m.groups()
        if kind in COMMS:
            self.comms += 1
            return []
        if kind in SHARDING:
            self.sharding += 1
            return []
        if not mb:
            raise UserError(FIELD, f"{where}: {text!r} names no microbatch",
                            f"write e.g. {stage}{kind}0")
        self.kinds.add(kind)
        return [(kind, int(stage), int(mb))]

    def notes(self, split: bool) -> tuple[str, ...]:
        out = []
        if self.comms:
            out.append(f"left out {self.comms} SEND/RECV actions: ppsim times transfers itself")
        if self.sharding:
            out.append(f"left out {self.sharding} UNSHARD/RESHARD/REDUCE_GRAD actions: ppsim "
                       "does not model FSDP or the gradient reduction")
        if self.overlaps:
            out.append(f"ran {self.overlaps} OVERLAP_F_B pairs as their actions in order "
                       "(F then B)")
        if split and B in self.kinds:
            out.append("a whole backward (B) in a split-backward order runs as B then its W")
        return tuple(out)


def _rows(text: str) -> list[list[str]]:
    try:
        rows = [[c.strip() for c in row] for row in csv.reader(text.splitlines())]
    except csv.Error as exc:
        raise UserError(FIELD, f"is not CSV: {exc}", "write one row of cells per rank, "
                        "separated by commas") from None
    return [row for row in rows if any(row)]


def _placement(stage_of: dict[int, int], pp: int, vpp: int) -> str:
    """The placement that puts every stage on the rank the CSV runs it on."""
    for placement in ("loop", "v"):
        if placement == "v" and vpp != 2:
            continue
        if all(stage_rank(s, pp, placement) == r for s, r in stage_of.items()):
            return placement
    s, r = next((s, r) for s, r in sorted(stage_of.items())
                if stage_rank(s, pp, "loop") != r)
    raise UserError(FIELD, f"stage {s} runs on rank {r}, which neither the loop placement "
                    f"(stage s on rank s mod {pp}) nor the V placement puts there",
                    "keep each stage on the rank its placement gives it")


def _check_shape(got: int, want: int | None, what: str, field: str, flag: str) -> None:
    if want is not None and got != want:
        raise UserError(field, f"is {want} but the actions CSV has {got} {what}",
                        f"set {field.split('.')[-1]} = {got} ({flag} {got})")


Cell = list[tuple[str, int, int]]
"""One cell's (torch kind, stage, microbatch) actions: none, one, or an overlapped pair."""


def _actions(cell_rows: list[list[Cell]], split: bool
             ) -> tuple[list[tuple[Action, ...]], CellMarks | None]:
    """Each rank's ppsim actions, and which cells were pairs and whole backwards."""
    actions, overlaps, whole = [], [], []
    for row in cell_rows:
        acts: list[Action] = []
        pairs, wholes = set(), set()
        for cell in row:
            if len(cell) == 2:  # only an OVERLAP_F_B cell reads as two actions
                pairs.add(len(acts))
            for kind, s, i in cell:
                if kind == B:
                    wholes.add(len(acts))
                acts.append(Action(B if kind in "IB" else kind, s, i))
                if kind == B and split:
                    acts.append(Action(W, s, i))
        actions.append(tuple(acts))
        overlaps.append(frozenset(pairs))
        whole.append(frozenset(wholes))
    if not split and not any(overlaps):
        return actions, None
    return actions, CellMarks(overlaps=tuple(overlaps), whole=tuple(whole))


def parse_actions_csv(text: str, pp: int | None = None, vpp: int | None = None,
                      microbatches: int | None = None,
                      placement: str | None = None) -> Schedule:
    """Read a torch.distributed.pipelining schedule CSV (any format torch writes).

    pp, vpp and microbatches, when given, must match the CSV (rows, stages /
    rows, microbatches); placement (loop or V) is inferred from where the
    stages run unless given. The result is validated: complete, ordered,
    deadlock-free.
    """
    rows = _rows(text)
    if not rows:
        raise UserError(FIELD, "has no actions", "write one row of actions per rank")
    reader = _Reader()
    cell_rows = [[reader.cell(cell, f"row {r + 1} column {col + 1}")
                  for col, cell in enumerate(row) if cell] for r, row in enumerate(rows)]
    parsed = [[a for cell in row for a in cell] for row in cell_rows]
    n_pp = len(rows)
    stages = 1 + max((s for row in parsed for _, s, _ in row), default=-1)
    n_m = 1 + max((i for row in parsed for _, _, i in row), default=-1)
    if not stages:
        raise UserError(FIELD, "has no compute actions (F, I, B, W)",
                        "write one row of actions per rank, e.g. 0F0,0B0")
    check_shape(None, n_pp, max(1, stages // n_pp), n_m)
    _check_shape(n_pp, pp, "rows (ranks)", "pipeline.pp", "--pp")
    if stages % n_pp:
        raise UserError(FIELD, f"runs {stages} stages on {n_pp} ranks", "give every rank the "
                        "same number of stages (pp x vpp stages in all)")
    n_vpp = stages // n_pp
    _check_shape(n_vpp, vpp, f"stages per rank ({stages} stages / {n_pp} ranks)",
                 "pipeline.vpp", "--vpp")
    _check_shape(n_m, microbatches, "microbatches", "pipeline.microbatches", "--microbatches")
    split = bool(reader.kinds & {"I", W})
    actions, marks = _actions(cell_rows, split)
    if placement is None:
        stage_of: dict[int, int] = {}
        for r, acts in enumerate(actions):
            for a in acts:
                if stage_of.setdefault(a.stage, r) != r:
                    raise UserError(FIELD, f"stage {a.stage} runs on ranks {stage_of[a.stage]}"
                                    f" and {r}", "run each stage on one rank")
        placement = _placement(stage_of, n_pp, n_vpp)
    sched = Schedule("csv", n_pp, n_vpp, n_m, placement, split, tuple(actions),
                     reader.notes(split), cells=marks)
    validate(sched)
    return sched


def read_text(path: str, field: str = FIELD) -> str:
    """A small UTF-8 text file's contents; any problem is a one-line UserError. A FIFO or
    device is refused unread (it could block forever), and so is a file of more cells
    than MAX_CSV_CELLS, counted before any is parsed."""
    text = read_small_text(field, path, MAX_CSV_BYTES, "schedule CSV (one row per rank)")
    cells = text.count(",") + text.count("\n") + 1
    if cells > MAX_CSV_CELLS:
        raise UserError(field, f"{path} has up to {cells:,} cells, above the limit of "
                        f"{MAX_CSV_CELLS:,}", "pass a schedule of fewer ranks or microbatches")
    return text.removeprefix("\ufeff")


def load_actions_csv(path: str, pp: int | None = None, vpp: int | None = None,
                     microbatches: int | None = None) -> Schedule:
    """Read and validate a torch schedule CSV file (see parse_actions_csv)."""
    return parse_actions_csv(read_text(path), pp, vpp, microbatches)


def torch_cells(schedule: Schedule) -> list[list[str]]:
    """Each rank's actions as torch cells.

    With the schedule's cell marks: its OVERLAP_F_B pairs and whole backwards as
    marked. Without: a B with its W right after becomes torch's B; when every
    backward would merge, I and W are written apart instead, so the CSV still
    reads back as a split-backward order.
    """
    marks = schedule.cells
    if marks is not None:
        return [_marked_cells(acts, schedule.split_backward, marks.overlaps[r], marks.whole[r])
                for r, acts in enumerate(schedule.actions)]
    cells = [_cells(acts, schedule.split_backward, merge=True) for acts in schedule.actions]
    if schedule.split_backward and not any(c.find("I") > 0 for row in cells for c in row):
        cells = [_cells(acts, True, merge=False) for acts in schedule.actions]
    return cells


def _marked_cells(acts: tuple[Action, ...], split: bool, overlaps: frozenset[int],
                  whole: frozenset[int]) -> list[str]:
    """Cells of one rank as its marks say: pairs as (F;B)OVERLAP_F_B, whole B as B."""
    out: list[str] = []
    k = 0
    while k < len(acts):
        subs = []
        for _ in range(2 if k in overlaps else 1):
            a = acts[k]
            kind = a.kind
            if a.kind == B and split:
                kind = B if k in whole else "I"
                k += 1 if k in whole else 0  # the W right after is part of this B
            subs.append(f"{a.stage}{kind}{a.microbatch}")
            k += 1
        out.append(subs[0] if len(subs) == 1 else f"({';'.join(subs)})OVERLAP_F_B")
    return out


def _cells(acts: tuple[Action, ...], split: bool, merge: bool) -> list[str]:
    out = []
    k = 0
    while k < len(acts):
        a = acts[k]
        kind = a.kind
        if kind == B and split:
            whole = merge and k + 1 < len(acts) and acts[k + 1] == Action(W, a.stage,
                                                                            a.microbatch)
            kind = B if whole else "I"
            k += 1 if whole else 0
        out.append(f"{a.stage}{kind}{a.microbatch}")
        k += 1
    return out


def to_torch_csv(schedule: Schedule) -> str:
    """The schedule as torch's compute-only CSV, byte for byte as its csv.writer writes."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for cells in torch_cells(schedule):
        writer.writerow(cells)
    return buf.getvalue()
