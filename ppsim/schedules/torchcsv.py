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
import itertools
import re
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import closing

from ppsim.config.files import text_lines
from ppsim.config.limits import check_shape
from ppsim.errors import UserError
from ppsim.schedules.actions import Action, B, CellMarks, Schedule, W, stage_rank
from ppsim.schedules.packed import KIND_INDEX, PackedActions, Positions, encode
from ppsim.schedules.validate import validate

MAX_CSV_BYTES = 64 * 2**20
"""A torch CSV of pp 256 x 4096 microbatches is ~40 MB; beyond this, refuse unread."""
MAX_CSV_CELLS = 1_000_000
"""Cells (commas and rows) read at most, counted on each piece of a line as it is read.
Reading and validating takes ~3 us and ~14 B a cell on a 2-core machine (8 B of code
per action, the validator's bytes per stage x microbatch; the text is streamed), so a
CSV at the limit takes ~3 s and less than twice its own size in memory
(benchmarks/bench_hostile.py); pp 64 x 4,096 microbatches of a split backward is ~790k
cells."""
FIELD = "pipeline.actions_csv"
COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
SHARDING = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
# ASCII digits only, at most 9 of them: superscripts or a 5,000-digit count are
# unreadable cells, never a ValueError from int().
_CELL = re.compile(r"([0-9]{1,9})(F|I|B|W|" + "|".join(COMMS + SHARDING) + r")([0-9]{0,9})",
                   re.ASCII)
_OVERLAP = re.compile(r"\(([^()]*)\)OVERLAP_F_B")
_KIND = {"I": KIND_INDEX[B], **KIND_INDEX}
"""Torch kind -> ppsim's kind index (torch's I is ppsim's B)."""


class _Reader:
    """Turns rows of cells into each rank's actions as they are read, counting what it
    leaves out for the notes. Actions and cell marks are kept as codes
    (ppsim.schedules.packed), ~8 bytes a cell: about the file's own size."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self.comms = 0
        self.sharding = 0
        self.overlaps = 0
        self.actions: list[PackedActions] = []
        """Per rank, its actions so far (torch's I and B both as ppsim's B)."""
        self.pairs: list[Positions] = []
        """Per rank, positions of the F that starts an OVERLAP_F_B pair."""
        self.wholes: list[Positions] = []
        """Per rank, positions of the B cells written as a whole backward."""
        self.stages = 0
        self.microbatches = 0

    def row(self, cells: Iterable[str]) -> None:
        """One rank's row; a row of empty cells is no rank."""
        r = len(self.actions)
        acts, pairs, wholes = PackedActions(), Positions(), Positions()
        codes, seen = acts.codes, False
        for col, text in enumerate(cells):
            text = text.strip()
            if not text:
                continue
            seen = True
            found = self.cell(text, r, col)
            if len(found) == 2:  # only an OVERLAP_F_B cell reads as two actions
                pairs.sorted.append(len(codes))
            for kind, stage, mb in found:
                if kind == B:
                    wholes.sorted.append(len(codes))
                codes.append(encode(_KIND[kind], stage, mb))
                self.stages = max(self.stages, stage + 1)
                self.microbatches = max(self.microbatches, mb + 1)
        if seen:
            self.actions.append(acts)
            self.pairs.append(pairs)
            self.wholes.append(wholes)

    def cell(self, text: str, row: int, col: int) -> list[tuple[str, int, int]]:
        """(torch kind, stage, microbatch) of one cell at (row, column), both from 0: none,
        one, or an overlapped pair. (Where it is, is written only into an error: a
        million-cell file would build a million of those texts.)"""
        m = _CELL.fullmatch(text)
        if m is None:
            over = _OVERLAP.fullmatch(text)
            if over is None:
                raise UserError(FIELD, f"{_where(row, col)}: cannot read {text[:40]!r}",
                                "write cells like 0F3, 1I2, 1W2, 0B0 or (0F3;3B1)OVERLAP_F_B")
            self.overlaps += 1
            subs = [s.strip() for s in over.group(1).split(";") if s.strip()]
            return [a for s in subs for a in self.cell(s, row, col)]
        stage, kind, mb = m.groups()
        if kind in COMMS:
            self.comms += 1
            return []
        if kind in SHARDING:
            self.sharding += 1
            return []
        if not mb:
            raise UserError(FIELD, f"{_where(row, col)}: {text!r} names no microbatch",
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

    def schedule_actions(self, split: bool
                         ) -> tuple[tuple[PackedActions, ...], CellMarks | None]:
        """Each rank's ppsim actions, and which cells were pairs and whole backwards: in
        a split order a whole B is followed at once by its W."""
        actions, pairs, wholes = self.actions, self.pairs, self.wholes
        if split:
            for r, whole in enumerate(wholes):
                if whole:
                    actions[r], pairs[r], wholes[r] = _with_w(actions[r], pairs[r], whole)
        out = tuple(actions)
        self.actions = []
        if not split and not any(pairs):
            return out, None
        return out, CellMarks(overlaps=tuple(pairs), whole=tuple(wholes))


def _where(row: int, col: int) -> str:
    return f"row {row + 1} column {col + 1}"


def _with_w(acts: PackedActions, pairs: Positions, wholes: Positions
            ) -> tuple[PackedActions, Positions, Positions]:
    """A rank's actions with a W right after each whole B, and the positions moved: the
    action at k moves by the whole backwards before it."""
    out, whole_at = array("Q"), Positions()
    wholes_iter = iter(wholes.sorted)
    next_whole = next(wholes_iter, -1)
    for k, code in enumerate(acts.codes):
        out.append(code)
        if k == next_whole:
            whole_at.sorted.append(k + len(whole_at.sorted))
            out.append(code & ~(3 << 32) | (_KIND[W] << 32))  # the same action, kind W
            next_whole = next(wholes_iter, -1)
    pair_at = Positions(array("I", (k + bisect_left(wholes.sorted, k) for k in pairs)))
    return PackedActions(out), pair_at, whole_at


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


def _ends(piece: str) -> bool:
    return piece.endswith(("\n", "\r"))


def _counted(pieces: Iterable[str], where: str) -> Iterator[str]:
    """The pieces of the lines (see text_lines), refused once their cells (commas and
    rows) pass MAX_CSV_CELLS: counted on each piece as it comes, so a runaway line is
    refused before it is all read."""
    cells, started = 0, False  # started: the line being read has text (an empty one no cell)
    for piece in pieces:
        body = piece.rstrip("\r\n")
        started = started or bool(body)
        cells += piece.count(",") + (started and len(body) < len(piece))
        started = started and len(body) == len(piece)
        # A started line at the limit has one more cell to come, at its end.
        if cells > MAX_CSV_CELLS or (started and cells == MAX_CSV_CELLS):
            raise UserError(FIELD, f"{where} has more than {MAX_CSV_CELLS:,} cells",
                            "pass a schedule of fewer ranks or microbatches")
        yield piece


def _read(pieces: Iterable[str], where: str) -> _Reader:
    """Every row read into actions, one piece of a line at a time."""
    reader = _Reader()
    rest = iter(_counted(pieces, where))
    try:
        for piece in rest:
            reader.row(_line_cells(piece, rest))
    except csv.Error as exc:
        raise UserError(FIELD, f"is not CSV: {exc}", "write one row of cells per rank, "
                        "separated by commas") from None
    return reader


def _line_cells(piece: str, rest: Iterator[str]) -> Iterator[str]:
    """The cells of the line that starts with `piece`, taking its other pieces from
    `rest`: split at commas piece by piece (a cell cut by a piece's end carried over), so
    a long row is never one string. From a piece with a quote on (torch writes none),
    csv reads the rest of the record, as it would the whole line."""
    carry = ""
    while True:
        if '"' in piece:
            tail = carry + piece + ("" if _ends(piece) else "".join(_line_end(rest)))
            yield from next(csv.reader(itertools.chain([tail], _lines(rest))), [])
            return
        cells = piece.rstrip("\r\n").split(",")
        cells[0] = carry + cells[0]
        if _ends(piece):
            yield from cells
            return
        carry = cells.pop()
        yield from cells
        following = next(rest, None)
        if following is None:
            yield carry
            return
        piece = following


def _line_end(rest: Iterator[str]) -> Iterator[str]:
    """The pieces up to and with the next line end."""
    for piece in rest:
        yield piece
        if _ends(piece):
            return


def _lines(rest: Iterator[str]) -> Iterator[str]:
    """Whole lines from pieces, for csv to read a quoted cell across lines."""
    for piece in rest:
        yield piece if _ends(piece) else piece + "".join(_line_end(rest))


def parse_actions_csv(text: str, pp: int | None = None, vpp: int | None = None,
                      microbatches: int | None = None,
                      placement: str | None = None) -> Schedule:
    """Read a torch.distributed.pipelining schedule CSV (any format torch writes).

    pp, vpp and microbatches, when given, must match the CSV (rows, stages /
    rows, microbatches); placement (loop or V) is inferred from where the
    stages run unless given. The result is validated: complete, ordered,
    deadlock-free.
    """
    lines = io.StringIO(text.removeprefix("\ufeff"), newline="")
    return _schedule(_read(lines, "the CSV"), pp, vpp, microbatches, placement)


def _schedule(reader: _Reader, pp: int | None, vpp: int | None, microbatches: int | None,
              placement: str | None) -> Schedule:
    """The read rows as a validated schedule of the shape asked for."""
    if not reader.actions:
        raise UserError(FIELD, "has no actions", "write one row of actions per rank")
    n_pp, stages, n_m = len(reader.actions), reader.stages, reader.microbatches
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
    notes = reader.notes(split)
    actions, marks = reader.schedule_actions(split)
    if placement is None:
        placement = _placement(_stage_ranks(actions), n_pp, n_vpp)
    sched = Schedule("csv", n_pp, n_vpp, n_m, placement, split, actions, notes, cells=marks)
    validate(sched)
    return sched


def _stage_ranks(actions: tuple[PackedActions, ...]) -> dict[int, int]:
    """The rank each stage runs on; UserError when one runs on two."""
    stage_of: dict[int, int] = {}
    for r, acts in enumerate(actions):
        for _, stage, _ in acts.triples():
            if stage_of.setdefault(stage, r) != r:
                raise UserError(FIELD, f"stage {stage} runs on ranks {stage_of[stage]}"
                                f" and {r}", "run each stage on one rank")
    return stage_of


def load_actions_csv(path: str, pp: int | None = None, vpp: int | None = None,
                     microbatches: int | None = None) -> Schedule:
    """Read and validate a torch schedule CSV file (see parse_actions_csv), streamed: a
    FIFO or device is refused unread (it could block forever), the file's size is
    capped by MAX_CSV_BYTES and its cells by MAX_CSV_CELLS as each 64 kB piece of a
    line comes, and cells become actions as they are split, so no copy of the text,
    nor of a whole row, is kept."""
    with closing(text_lines(FIELD, path, MAX_CSV_BYTES, "schedule CSV (one row per rank)",
                            piece=2**16)) as pieces:
        reader = _read(pieces, path)
    return _schedule(reader, pp, vpp, microbatches, None)


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
