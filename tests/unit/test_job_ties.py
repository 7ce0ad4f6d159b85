"""Shapes tied at their default split (the same work a rank: cp 2 at half the
micro-batch of cp 1) are one candidate for the job search's split plans: the first is
planned, the others take its split, and the five plans go to five distinct groups."""

from __future__ import annotations

import json

from helpers import run_main

from ppsim.job.search import TOP_SEARCHED


def test_ties_share_a_plan_and_leave_room_for_other_shapes() -> None:
    code, out, err = run_main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                               "--gpus", "64", "--global-batch-size", "256", "--top", "40",
                               "--time-budget", "5", "--json"])
    assert code in (0, 3), err
    planned = [c for c in json.loads(out)["candidates"] if c["split_planned"]]
    groups: dict[tuple[str, float], list[dict]] = {}
    for c in planned:
        groups.setdefault((f"{c['iteration_time_ms']:.9g}", c["peak_memory_bytes"]),
                          []).append(c)
    # Before, ties took three of the five plans: two distinct shapes were planned.
    assert len(groups) >= TOP_SEARCHED
    assert any(len(g) > 1 for g in groups.values())
    for members in groups.values():  # one split a group, as planned for its first
        assert len({tuple(c["split"]) for c in members}) == 1
