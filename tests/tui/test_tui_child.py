"""The simulation child (ppsim.tui.child): a large state simulated in a process of its
own gives the screen the same numbers, lanes and comparison as the worker thread."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ppsim.tui.child
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import load_config
from ppsim.trace.read import trace_from_json
from ppsim.trace.schema import simulation_trace
from ppsim.tui.app import PPSimApp
from ppsim.tui.child import SimChild, evaluate_views, uses_child
from ppsim.tui.headline import headline_text
from ppsim.tui.lanes import Lane, LaneOp, LaneOps
from ppsim.tui.session import evaluate_state, state_from_config
from ppsim.tui.testing import settle

SIZE = (160, 45)


def llama(pp: int = 4, microbatches: int = 8):
    return with_overrides(load_config(None), preset="llama3-70b", hardware="h100-80gb",
                          pipeline={"pp": pp, "microbatches": microbatches}, split={})


def lane_rows(lanes: list[Lane]) -> list[tuple]:
    return [(lane.label, lane.rank, lane.source, list(lane.ops), lane.end) for lane in lanes]


@pytest.fixture(scope="module")
def child():
    c = SimChild()
    yield c
    c.close()


def test_the_child_gives_the_worker_threads_numbers_lanes_and_comparison(child) -> None:
    base = llama()
    state = state_from_config(base)
    state = replace(state, counts=(21, 20, 20, 19))  # uneven: the pinned even split differs
    here = evaluate_views(base, state, None)
    trace = trace_from_json(simulation_trace(here.result.sim), "self")
    here = evaluate_views(base, state, None, trace)
    there = child.evaluate(base, state, None, trace)
    a, b = here.result, there.result
    assert b.sim.timeline is None  # the records stayed in the child
    assert b.sim.summary == a.sim.summary
    assert b.pinned.summary == a.pinned.summary
    assert (b.pinned_counts, b.pinned_is_even) == ((20, 20, 20, 20), True)
    assert b.sim.problem.split == a.sim.problem.split
    assert b.sim.problem.hardware == a.sim.problem.hardware
    assert lane_rows(there.lanes) == lane_rows(here.lanes)
    assert lane_rows(there.pinned_lanes) == lane_rows(here.pinned_lanes)
    # the preset's tp 8 collectives, built where the records are (none reach the screen)
    assert [lane.label for lane in there.under_lanes] == [f"comm{r}" for r in range(4)]
    assert lane_rows(there.under_lanes) == lane_rows(here.under_lanes)
    assert there.comparison == here.comparison
    assert there.comparison is not None and there.comparison.matched > 0
    assert str(headline_text(b, width=160)) == str(headline_text(a, width=160))


def test_the_childs_refusal_is_the_cores_own_text(child) -> None:
    base = llama()
    state = replace(state_from_config(base), memory_bytes=float("nan"))
    with pytest.raises(Exception) as here:
        evaluate_state(base, state)
    with pytest.raises(ppsim.tui.child.ChildRefused) as there:
        child.evaluate(base, state, None)
    assert str(there.value) == str(here.value)


def test_only_large_states_go_to_the_child() -> None:
    s = state_from_config(llama(16, 256))
    assert not uses_child(s)
    assert uses_child(replace(s, pp=64, microbatches=1024))


async def test_the_app_shows_the_childs_result_as_the_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = llama()
    expected = evaluate_state(base, state_from_config(base))
    monkeypatch.setattr(ppsim.tui.child, "CHILD_MICROBATCH_STAGES", 0)  # every state
    app = PPSimApp(base)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.result is not None and app.result.sim.timeline is None  # from the child
        assert app.result.sim.summary == expected.sim.summary
        assert str(headline_text(app.result, width=150)) == \
            str(headline_text(expected, width=150))
        await pilot.press("3", "right", "right")  # the timeline reads the child's lanes
        await settle(pilot)
        assert app.query_one("#cursor-info").render().plain.startswith("r0")


ops_strategy = st.lists(st.builds(
    LaneOp, st.floats(0, 1e6), st.floats(0, 1e6), st.sampled_from("FBW"),
    st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), max_size=30)


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy)
def test_lane_ops_read_and_pickle_as_the_ops_they_hold(ops: list[LaneOp]) -> None:
    packed = LaneOps(ops)
    assert list(packed) == ops and len(packed) == len(ops)
    assert [packed[i] for i in range(-len(ops), len(ops))] == ops + ops
    assert packed == tuple(ops)
    assert list(pickle.loads(pickle.dumps(packed))) == ops


def test_a_lane_of_tuples_reads_as_the_same_lane_of_arrays() -> None:
    ops = (LaneOp(0.0, 1.0, "F", 0, 0, 0), LaneOp(1.0, 1.0, "B", 0, 0, 0),
           LaneOp(2.0, 3.5, "B", 0, 1, 0))
    lane = Lane("r0", ops)
    assert isinstance(lane.ops, LaneOps) and lane.ops == ops
    assert lane.end == 3.5
    assert lane.overlapping(0.0, 0.5) == 0
    assert lane.overlapping(1.0, 1.9) == -1  # the zero-length op is idle
    assert lane.overlapping(2.5, 2.6) == 2


def test_a_cancelled_job_stops_and_the_next_one_runs(child) -> None:
    import threading
    import time

    base = llama(16, 2048)  # a run of seconds
    state = state_from_config(base)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            child.evaluate(base, state, None)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reads which one
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    while child.running is None:
        time.sleep(0.001)
    child.cancel()
    worker.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ppsim.tui.child.ChildCancelled)
    small = state_from_config(llama())
    assert child.evaluate(llama(), small, None).result.sim.summary == \
        evaluate_state(llama(), small).sim.summary


def test_closing_after_a_cancel_mid_write_raises_nothing() -> None:
    """A job cancelled while its frame was still in the pipe's buffer: closing the pipe
    flushed it into the killed process and a BrokenPipeError reached the app where
    ChildCancelled belonged (seen once in a full run)."""
    import subprocess
    import sys

    from ppsim.tui.child import SimChild

    child = SimChild()
    child._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child._proc.stdin.write(b"x" * 100)  # buffered, not yet flushed
    child.close()
    assert child._proc is None
