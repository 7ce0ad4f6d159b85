"""Zero-bubble schedules against the figures their sources give."""

from __future__ import annotations

import pytest
from helpers import uniform_problem
from hypothesis import given
from hypothesis import strategies as st

from ppsim.sim.simulate import simulate


@given(st.integers(2, 8), st.integers(1, 4), st.integers(1, 4))
def test_zb_h1_bubble_and_memory(pp, groups, unit):
    # Qi et al. 2024 (ICLR), section 3: with F = B = W and free transfers,
    # ZB-H1's bubble is (p - 1)(F + B - W) and its memory equals 1F1B's.
    f = b = w = float(unit)
    m = pp * groups
    zb = simulate(uniform_problem(pp, 1, m, "zb-h1", f=f, b=b + w, w=w)).summary
    one = simulate(uniform_problem(pp, 1, m, "1f1b", f=f, b=b + w, w=w)).summary
    assert zb.iteration_time_ms == m * (f + b + w) + (pp - 1) * (f + b - w)
    assert [r.peak_inflight for r in zb.ranks] == [r.peak_inflight for r in one.ranks]
    assert zb.iteration_time_ms < one.iteration_time_ms


@given(st.integers(2, 8), st.integers(2, 4))
def test_zbv_near_zero_bubble_at_1f1b_memory(pp, groups):
    # Qi et al. 2024, section 6 (ZB-V): two chunks per rank in a V; with
    # F = B = W the only idle time is the fill of one chunk forward per
    # stage above (p - 1) F_chunk, and the activation memory is 1F1B's:
    # 2p chunk activations = p stage activations, what 1F1B's rank 0 holds.
    m = pp * groups
    zbv = simulate(uniform_problem(pp, 2, m, "zbv", f=1.0, b=2.0, w=1.0)).summary
    busy = 2 * m * 3.0
    assert zbv.iteration_time_ms - busy == (pp - 1) * 1.0
    one = simulate(uniform_problem(pp, 1, m, "1f1b", layers_per_stage=2, f=1.0, b=2.0,
                                   w=1.0)).summary
    assert zbv.iteration_time_ms - busy < (one.iteration_time_ms - busy) / 5
    assert all(r.peak_inflight == 2 * pp for r in zbv.ranks)


@given(st.integers(2, 8), st.integers(2, 4))
def test_dualpipev_bubble_and_activation(pp, groups):
    # deepseek-ai/DualPipe README: DualPipeV on PP/2 devices has bubble
    # (PP/2 - 1)(F&B + B - 3W) and PP + 1 activations per device. Here PP/2 =
    # pp devices; an overlapped F&B runs as F then the whole backward.
    f = b = w = 1.0
    m = 2 * pp * groups
    s = simulate(uniform_problem(pp, 2, m, "dualpipev", f=f, b=b + w, w=w)).summary
    fb = f + b + w
    assert s.iteration_time_ms - s.ranks[0].busy_ms == (pp - 1) * (fb + b - 3 * w)
    assert all(r.peak_inflight == 2 * pp + 1 for r in s.ranks)


@pytest.mark.parametrize("schedule, paper", [("1f1b", 0.2431), ("zb-h1", 0.1585)])
def test_paper_measured_costs_reproduce_bubble_rates(schedule, paper):
    # Qi et al. 2024, table of measured costs for the 1.5B model, p = 8, m = 24
    # (Megatron's efficiency.py): F/B/W/comm = 18.522 / 18.086 / 9.337 / 0.601 ms;
    # bubble rate = (T - m (F + B + W)) / T.
    f, b, w, c = 18.522, 18.086, 9.337, 0.601
    s = simulate(uniform_problem(8, 1, 24, schedule, f=f, b=b + w, w=w,
                                 hw={"p2p_latency_ms": c})).summary
    rate = (s.iteration_time_ms - 24 * (f + b + w)) / s.iteration_time_ms
    assert abs(rate - paper) < 0.01


def test_w_keeps_its_inputs_until_it_runs():
    # ZB memory model: F allocates, B frees all but what W needs, W frees the rest.
    p = uniform_problem(2, 1, 4, "zb-h1", f=1.0, b=2.0, w=1.0, act=100, wg=30)
    sim = simulate(p)
    last = sim.problem.schedule.actions[1]
    assert last[-1].kind == "W"
    mem = sim.timeline.memory[1]
    # Just before the final W, its 30 kept bytes are still held; after it, nothing.
    assert mem[-2][1] == 30 and mem[-1][1] == 0


@pytest.mark.parametrize("pp, zb_time, zbv_time", [(2, 13, 14), (4, 27, 30), (8, 55, 62)])
def test_interleaved_zb_beats_zbv_at_m_equal_pp(pp, zb_time, zbv_time):
    # Issue #13, from torch 2.13's schedules with unit F = B = W per chunk and
    # m = pp: ScheduleInterleavedZeroBubble 13/27/55 time units, ZB-V 14/30/62.
    def t(name: str) -> float:
        p = uniform_problem(pp, 2, pp, name, f=1.0, b=2.0, w=1.0, act=1, out=0, static=0)
        return simulate(p).summary.iteration_time_ms

    assert (t("interleaved-zb"), t("zbv")) == (zb_time, zbv_time)


@given(st.integers(2, 6), st.integers(1, 3), st.integers(1, 12))
def test_interleaved_zb_is_never_slower_than_interleaved_1f1b(pp, extra_vpp, m):
    # Same table and warm-up shape, but the W runs off the critical path.
    vpp = 1 + extra_vpp
    zb = simulate(uniform_problem(pp, vpp, m, "interleaved-zb", f=1.0, b=2.0, w=1.0))
    one = simulate(uniform_problem(pp, vpp, m, "interleaved-1f1b", f=1.0, b=2.0, w=1.0))
    assert zb.summary.iteration_time_ms <= one.summary.iteration_time_ms + 1e-9
