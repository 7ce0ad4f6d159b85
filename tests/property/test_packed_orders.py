"""Orders read from files as codes (ppsim.schedules.packed) and the validator over them.

The validator is checked against a reference restated here as the plain rule: an index
of every action's position, then every (stage, microbatch) in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.errors import UserError
from ppsim.schedules.actions import Action, Schedule, dependencies
from ppsim.schedules.generators import build_schedule
from ppsim.schedules.packed import PackedActions, Positions
from ppsim.schedules.torchcsv import load_actions_csv, parse_actions_csv, to_torch_csv
from ppsim.schedules.validate import validate

SHAPES = st.sampled_from([("gpipe", 2, 1, 3), ("1f1b", 3, 1, 4), ("zb-h1", 2, 1, 3),
                          ("interleaved-1f1b", 2, 2, 4), ("zbv", 2, 2, 3)])


def reference_defect(s: Schedule) -> str | None:
    """The first defect's message, by the rule: index, then scan (stage, microbatch)."""
    n, m = s.num_stages, s.microbatches
    where: dict[Action, int] = {}
    for r, acts in enumerate(s.actions):
        for pos, a in enumerate(acts):
            if not (0 <= a.stage < n and 0 <= a.microbatch < m):
                return f"rank {r} action {pos} ({a}) is out of range"
            if s.stage_rank(a.stage) != r:
                return f"rank {r} action {pos} ({a}) belongs to rank {s.stage_rank(a.stage)}"
            if a in where:
                return f"rank {r} runs {a} twice"
            where[a] = pos
    kinds = "FBW" if s.split_backward else "FB"
    for st_ in range(n):
        for i in range(m):
            for k, kind in enumerate(kinds):
                a = Action(kind, st_, i)
                if a not in where:
                    return f"{a} (kind {kind}, stage {st_}, microbatch {i}) is missing"
                prev = Action(kinds[k - 1], st_, i)
                if k and where[prev] > where[a]:
                    return f"{a} comes before {prev} on rank {s.stage_rank(st_)}"
            if not s.split_backward and Action("W", st_, i) in where:
                return f"{Action('W', st_, i)} in a schedule without separate W"
    done: set[Action] = set()
    pos = [0] * s.pp
    moved = True
    while moved:
        moved = False
        for r, acts in enumerate(s.actions):
            while pos[r] < len(acts) and (dependencies(acts[pos[r]], n) in done
                                          or dependencies(acts[pos[r]], n) is None):
                done.add(acts[pos[r]])
                pos[r] += 1
                moved = True
    stuck = [f"rank {r} waits at {acts[pos[r]]} for {dependencies(acts[pos[r]], n)}"
             for r, acts in enumerate(s.actions) if pos[r] < len(acts)]
    return "deadlock: " + "; ".join(stuck) if stuck else None


@st.composite
def mutated(draw):
    """A generated order with a few random edits: drops, repeats, swaps, moves, strays."""
    name, pp, vpp, m = draw(SHAPES)
    good = build_schedule(name, pp, vpp, m)
    rows = [list(a) for a in good.actions]
    for _ in range(draw(st.integers(0, 3))):
        r = draw(st.integers(0, pp - 1))
        row = rows[r]
        edit = draw(st.sampled_from(["drop", "repeat", "swap", "move", "stray"]))
        if not row:
            continue
        k = draw(st.integers(0, len(row) - 1))
        if edit == "drop":
            row.pop(k)
        elif edit == "repeat":
            row.insert(draw(st.integers(0, len(row))), row[k])
        elif edit == "swap":
            j = draw(st.integers(0, len(row) - 1))
            row[k], row[j] = row[j], row[k]
        elif edit == "move":
            rows[(r + 1) % pp].append(row.pop(k))
        else:
            a = row[k]
            row.insert(k, Action(draw(st.sampled_from("FBW")), a.stage, a.microbatch))
    return Schedule(good.name, pp, vpp, m, good.placement, good.split_backward,
                    tuple(tuple(r) for r in rows))


def _verdict(s: Schedule) -> str | None:
    try:
        validate(s)
    except UserError as exc:
        return exc.problem
    return None


@given(mutated())
def test_the_validator_reports_the_first_defect_as_the_rule_does(s):
    want = reference_defect(s)
    assert _verdict(s) == want
    packed = Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.split_backward,
                      tuple(PackedActions.of(a) for a in s.actions))
    assert _verdict(packed) == want


@given(SHAPES, st.data())
def test_packed_actions_are_the_tuple_they_encode(shape, data):
    acts = build_schedule(*shape).actions[data.draw(st.integers(0, shape[1] - 1))]
    packed = PackedActions.of(acts)
    assert len(packed) == len(acts) and tuple(packed) == acts
    assert packed == acts and acts == packed and hash(packed) == hash(PackedActions.of(acts))
    k = data.draw(st.integers(0, len(acts) - 1))
    assert packed[k] == acts[k] and packed[k:] == acts[k:] and packed[-1] == acts[-1]
    picks = frozenset(data.draw(st.sets(st.integers(0, len(acts) - 1))))
    positions = Positions()
    positions.sorted.extend(sorted(picks))
    assert positions == picks and picks == positions
    assert all((p in positions) == (p in picks) for p in range(-1, len(acts) + 1))


@given(SHAPES)
def test_a_read_order_writes_back_byte_for_byte(shape):
    text = to_torch_csv(build_schedule(*shape))
    read = parse_actions_csv(text)
    assert all(isinstance(a, PackedActions) for a in read.actions)
    assert to_torch_csv(read) == text


def test_a_million_cell_order_is_refused_by_its_first_gap_not_a_table_of_it():
    # pp 1 and one action of stage 4,095 and microbatch 999,999: 4e9 (stage, microbatch)
    # pairs to check, one present.
    tracemalloc.start()
    with pytest.raises(UserError, match="0F0 .* is missing"):
        parse_actions_csv("4095F999999\n")
    top = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert top < 1e6


# A process reading a CSV: its resident memory before and its peak after (VmRSS and
# VmHWM: getrusage's ru_maxrss would also count the pytest process it was forked from).
_READ_IN_A_PROCESS = """
import json, sys
from ppsim.schedules.torchcsv import load_actions_csv

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

before, peak_before = status("VmRSS:"), status("VmHWM:")
sched = load_actions_csv(sys.argv[1])
print(json.dumps({"ops": sched.num_ops, "before": before, "peak_before": peak_before,
                  "peak": status("VmHWM:")}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_reading_a_csv_holds_less_than_twice_the_file(tmp_path):
    # 4 ranks x 120,000 microbatches of GPipe: 960,000 cells (near the 1M-cell limit),
    # 7.8 MB. As Action objects (~300 bytes a cell with the validator's index) this took
    # ~40x the file. Measured as the reading process's resident memory grows (its peak
    # over what it held before), so the read runs at full speed.
    path = tmp_path / "gpipe.csv"
    m = 120_000
    path.write_text("".join(",".join([f"{r}F{i}" for i in range(m)] + [f"{r}B{i}"
                                                                       for i in range(m)])
                            + "\n" for r in range(4)))
    out = subprocess.run([sys.executable, "-c", _READ_IN_A_PROCESS, str(path)],
                         capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert got["ops"] == 8 * m
    assert got["peak"] > got["peak_before"]  # the read set the peak, not the imports
    assert got["peak"] - got["before"] < 2 * path.stat().st_size


def _pieces(text: str, cuts: list[int]) -> list[str]:
    """The text's lines, each cut at the given offsets (as text_lines cuts long lines)."""
    out = []
    for line in text.splitlines(keepends=True):
        at = 0
        for cut in sorted(c for c in cuts if 0 < c < len(line)):
            out.append(line[at:cut])
            at = cut
        out.append(line[at:])
    return [p for p in out if p]


CELLS = st.sampled_from(["0F0", "0B0", "1F0", "1B0", "", " 0F1 ", '"0B1"', "0SEND_F0",
                         "(0F1;1B0)OVERLAP_F_B", "1W0", "1I0", '"1F1,', 'x"', "0F", "9"])


@given(st.lists(st.lists(CELLS, max_size=6), min_size=1, max_size=4),
       st.lists(st.integers(1, 30), max_size=6), st.sampled_from(["\n", "\r\n", "\r"]))
def test_lines_read_in_any_pieces_read_as_whole_lines(rows, cuts, end):
    from ppsim.schedules import torchcsv

    text = end.join(",".join(r) for r in rows) + end

    def read(pieces: list[str]) -> object:
        try:
            reader = torchcsv._read(pieces, "the CSV")
        except UserError as exc:
            return exc.problem
        return [tuple(a) for a in reader.actions], reader.overlaps, reader.comms

    assert read(_pieces(text, cuts)) == read(_pieces(text, []))


def test_a_csv_at_the_cell_limit_reads_and_one_more_cell_is_refused(tmp_path, monkeypatch):
    from ppsim.schedules import torchcsv

    monkeypatch.setattr(torchcsv, "MAX_CSV_CELLS", 8)
    for text, ok in (("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", True),
                     ("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1", True),
                     ("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1,\n", False),
                     ("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n\n", True)):
        path = tmp_path / "c.csv"
        path.write_text(text)
        if ok:
            assert load_actions_csv(str(path)).num_ops == 8
        else:
            with pytest.raises(UserError, match="more than 8 cells"):
                load_actions_csv(str(path))
