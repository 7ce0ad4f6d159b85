"""Every generated schedule against the pipeline's rules restated here from first
principles, and the validator against the same rules on broken orders.

The rules (GPipe / 1F1B / ZB papers; Megatron's schedules.py): stage s of a loop
placement runs on rank s mod pp, and a V placement walks the ranks back on every odd
chunk; each (stage, microbatch) runs one F and one B (and one W when the backward is
split) on its stage's rank, F before B before W; F of stage s takes the activation F of
stage s - 1 sent, B of stage s the gradient B of stage s + 1 sent (the last stage's B
takes its own F's loss). Running every rank's list in order, each op waiting only for
those inputs, must finish. Nothing here calls ppsim's validator or message rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import schedule_args
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.errors import UserError
from ppsim.schedules.generators import Action, Schedule, build_schedule, validate


def owner(stage: int, pp: int, placement: str) -> int:
    chunk, pos = divmod(stage, pp)
    return pp - 1 - pos if placement == "v" and chunk % 2 else pos


def inputs(a: Action, stages: int) -> list[tuple[str, int, int]]:
    """The (kind, stage, microbatch) ops whose results `a` needs before it starts."""
    if a.kind == "F":
        return [("F", a.stage - 1, a.microbatch)] if a.stage > 0 else []
    if a.kind == "B":
        up = [("B", a.stage + 1, a.microbatch)] if a.stage < stages - 1 else []
        return [("F", a.stage, a.microbatch), *up]
    return [("B", a.stage, a.microbatch)]


@dataclass(frozen=True)
class Verdict:
    defect: str
    """Empty when the order keeps every rule; else the first rule it breaks."""


def check(s: Schedule) -> Verdict:
    """The rules above, applied to the order as written."""
    stages, kinds = s.pp * s.vpp, ("F", "B", "W") if s.split_backward else ("F", "B")
    want = {(k, st_, i) for k in kinds for st_ in range(stages) for i in range(s.microbatches)}
    got = [(a.kind, a.stage, a.microbatch) for acts in s.actions for a in acts]
    if len(got) != len(set(got)) or set(got) != want:
        return Verdict("not each op exactly once")
    for r, acts in enumerate(s.actions):
        if any(owner(a.stage, s.pp, s.placement) != r for a in acts):
            return Verdict(f"rank {r} runs another rank's stage")
    done: set[tuple[str, int, int]] = set()
    at = [0] * len(s.actions)
    moved = True
    while moved:  # each rank runs its next op once every input is done
        moved = False
        for r, acts in enumerate(s.actions):
            while at[r] < len(acts) and all(d in done for d in inputs(acts[at[r]], stages)):
                a = acts[at[r]]
                done.add((a.kind, a.stage, a.microbatch))
                at[r] += 1
                moved = True
    return Verdict("" if len(done) == len(want) else "deadlock or misordered")


@settings(max_examples=150, deadline=None)
@given(schedule_args())
def test_every_generated_schedule_keeps_the_rules(args):
    assert check(build_schedule(*args)) == Verdict("")


def _mutated(s: Schedule, rank: int, i: int, j: int, how: str) -> Schedule:
    acts = [list(a) for a in s.actions]
    row = acts[rank]
    i, j = i % len(row), j % len(row)
    if how == "swap":
        row[i], row[j] = row[j], row[i]
    elif how == "move":
        row.insert(j, row.pop(i))
    elif how == "drop":
        row.pop(i)
    else:  # another rank's copy, or this rank's own twice
        acts[(rank + 1) % s.pp].insert(0, row[i])
    return Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.split_backward,
                    tuple(tuple(a) for a in acts))


@settings(max_examples=200, deadline=None)
@given(schedule_args(), st.integers(0, 99), st.integers(0, 999), st.integers(0, 999),
       st.sampled_from(["swap", "move", "drop", "copy"]))
def test_the_validator_refuses_exactly_the_orders_that_break_a_rule(args, rank, i, j, how):
    s = build_schedule(*args)
    broken = _mutated(s, rank % s.pp, i, j, how)
    if check(broken).defect:
        with pytest.raises(UserError):
            validate(broken)
    else:  # a reordering that keeps every rule is one the validator runs
        validate(broken)
