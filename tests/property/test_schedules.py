"""Schedule generators and the validator."""

from __future__ import annotations

import pytest
from helpers import schedule_args
from hypothesis import given
from hypothesis import strategies as st

from ppsim.errors import UserError
from ppsim.schedules.generators import (
    Action,
    Schedule,
    build_schedule,
    interleaved_group,
    interleaved_order,
    validate,
)
from ppsim.schedules.torchcsv import parse_actions_csv


@given(schedule_args())
def test_every_generated_schedule_is_valid(args):
    sched = build_schedule(*args)
    validate(sched)
    # Each rank runs exactly its stages' F and B (and W, when split) once per microbatch.
    name, pp, vpp, m = args
    assert sched.num_ops == (3 if sched.split_backward else 2) * pp * vpp * m


@given(st.integers(1, 8), st.integers(1, 20))
def test_1f1b_warmup_is_megatrons(pp, m):
    sched = build_schedule("1f1b", pp, 1, m)
    for r, acts in enumerate(sched.actions):
        first_b = next(i for i, a in enumerate(acts) if a.kind == "B")
        warm = min(pp - r - 1, m)
        # warmup forwards, then one more F before the first B (if any F is left)
        assert first_b == warm + (1 if m > warm else 0)
        forwards = [a.microbatch for a in acts if a.kind == "F"]
        assert forwards == list(range(m))


def test_interleaved_order_matches_reference_formula():
    # REFERENCE.md: forward step k runs chunk (k mod p·v) // p on microbatch
    # (k // (p·v))·p + k mod p, when m is a multiple of p.
    p, v, m = 4, 3, 8
    table = interleaved_order(m, v, p)
    for k, (mb, chunk) in enumerate(table):
        assert chunk == (k % (p * v)) // p
        assert mb == (k // (p * v)) * p + k % p


def test_interleaved_warmup_is_megatrons():
    p, v, m = 4, 2, 8
    sched = build_schedule("interleaved-1f1b", p, v, m)
    for r, acts in enumerate(sched.actions):
        first_b = next(i for i, a in enumerate(acts) if a.kind == "B")
        assert first_b == 2 * (p - r - 1) + (v - 1) * p + 1


@pytest.mark.parametrize("args, field", [
    (("1f1b", 2, 2, 4), "pipeline.schedule"),
    (("interleaved-1f1b", 2, 1, 4), "pipeline.vpp"),
    (("nope", 2, 1, 4), "pipeline.schedule"),
    (("1f1b", 0, 1, 4), "pipeline.pp"),
    (("1f1b", 2, 1, 0), "pipeline.microbatches"),
])
def test_rejected_configurations_name_the_field(args, field):
    with pytest.raises(UserError) as info:
        build_schedule(*args)
    assert info.value.field == field


def _with(sched: Schedule, actions) -> Schedule:
    return Schedule(sched.name, sched.pp, sched.vpp, sched.microbatches, sched.placement,
                    sched.split_backward, tuple(tuple(a) for a in actions))


def test_validator_rejects_missing_duplicate_misplaced_and_misordered():
    good = build_schedule("1f1b", 2, 1, 2)
    acts = [list(a) for a in good.actions]
    with pytest.raises(UserError, match="missing"):
        validate(_with(good, [acts[0][:-1], acts[1]]))
    with pytest.raises(UserError, match="twice"):
        validate(_with(good, [acts[0] + [acts[0][0]], acts[1]]))
    with pytest.raises(UserError, match="belongs to rank"):
        validate(_with(good, [acts[0] + [Action("F", 1, 0)], acts[1]]))
    rank1 = list(acts[1])
    rank1[0], rank1[1] = rank1[1], rank1[0]  # B0 before F0 on the last stage
    with pytest.raises(UserError, match="before"):
        validate(_with(good, [acts[0], rank1]))


def test_validator_finds_deadlock():
    # Rank 0 insists on B0 before sending F1; rank 1 insists on F1 before B0... no:
    # rank 1 waits for F1 before running B0, which rank 0 needs first.
    s = build_schedule("1f1b", 2, 1, 2)
    r0 = [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)]
    r1 = [Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0), Action("B", 1, 1)]
    with pytest.raises(UserError, match="deadlock"):
        validate(_with(s, [r0, r1]))


@given(st.integers(1, 8), st.integers(1, 40))
def test_interleaved_group_follows_megatron_else_torch(pp, m):
    n = interleaved_group(pp, m)
    if m < pp:
        assert n == m  # torch: one round of all m (Megatron refuses m < pp)
        return
    # Megatron: pp <= N <= m, and the last group is full or holds >= pp microbatches ...
    assert pp <= n <= m and (m % n == 0 or m % n >= pp)
    # ... the smallest such N (pp itself when pp divides m) ...
    assert all(not (m % k == 0 or m % k >= pp) for k in range(pp, n))
    # ... which is torch's microbatches per round whenever torch accepts m.
    rounds = max(1, m // pp)
    if m % rounds == 0:
        assert n == m // rounds


@given(st.integers(1, 6), st.integers(1, 20))
def test_interleaved_zb_on_one_chunk_is_zb_h1(pp, m):
    assert build_schedule("interleaved-zb", pp, 1, m).actions == \
        build_schedule("zb-h1", pp, 1, m).actions


def test_interleaved_runs_counts_megatron_refuses_with_short_warmup():
    # pp 4, vpp 2, m 6 (torch runs it: one round of 6) and m 10 (two rounds of 5).
    for m, group in ((6, 6), (10, 5), (9, 5), (3, 3)):
        assert interleaved_group(4, m) == group
        sched = build_schedule("interleaved-1f1b", 4, 2, m)
        validate(sched)
        acts = sched.actions[3]
        first_b = next(i for i, a in enumerate(acts) if a.kind == "B")
        assert first_b == min(group, 2 * m) + (1 if group < 2 * m else 0)


def test_csv_round_trip_and_split_backward():
    sched = build_schedule("1f1b", 3, 1, 4)
    text = "\n".join(",".join(str(a) for a in acts) for acts in sched.actions)
    back = parse_actions_csv(text, 3, 1, 4)
    assert back.actions == sched.actions and not back.split_backward
    split_text = "0F0,0I0,0W0\n1F0,1I0,1W0"
    zb = parse_actions_csv(split_text, 2, 1, 1)
    assert zb.split_backward and [a.kind for a in zb.actions[1]] == ["F", "B", "W"]
    # A whole B beside a separate W: B then its W, so this W is one too many.
    with pytest.raises(UserError, match="twice"):
        parse_actions_csv("0F0,0B0,0W0\n1F0,1B0", 2, 1, 1)
    with pytest.raises(UserError, match="cannot read"):
        parse_actions_csv("0F0,zz\n1F0,1B0", 2, 1, 1)
