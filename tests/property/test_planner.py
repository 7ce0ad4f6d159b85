"""The planner is exact: it agrees with brute force over every split, simulated."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import all_counts, every_split, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.pipeline.split import split_from_counts
from ppsim.plan.bounds import PathBounds
from ppsim.plan.planner import plan
from ppsim.plan.prefix import prefix_time
from ppsim.plan.ranking import Rank, ordered
from ppsim.plan.search import SplitSearch
from ppsim.sim.simulate import simulate


@st.composite
def small_problems(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
                                 "dualpipev", "interleaved-zb"]))
    if name == "interleaved-1f1b":
        pp, vpp = 2, 2
        m = draw(st.integers(1, 6))  # any count: odd ones follow Megatron's groups or torch's
    elif name == "interleaved-zb":
        pp, vpp = 2, draw(st.integers(1, 2))
        m = draw(st.integers(1, 6))
    elif name in ("zbv", "dualpipev"):
        pp, vpp = 2, 2
        m = draw(st.integers(4, 6))
    else:
        pp, vpp = draw(st.integers(1, 4)), 1
        m = draw(st.integers(1, 8))
    layers = draw(st.integers(pp * vpp, 9 if pp * vpp <= 3 else 8))
    costs = st.integers(1, 20).map(lambda x: x / 4)
    memory = draw(st.sampled_from([1e12, 6000.0, 9000.0, 15000.0]))
    counts = [layers] + [0] * (pp * vpp - 1)
    b = draw(costs)
    # A measured split path (B then W apart) may take longer than the one-pass backward.
    split_b = draw(st.sampled_from([0.0, b, b * 1.25]))
    problem = uniform_problem(
        pp, vpp, m, name, counts=counts, f=draw(costs), b=b, w=b / 2, wg=40, act=100,
        split_b=split_b,
        static=300,
        out=draw(st.sampled_from([0, 10**6])),
        hw={"p2p_latency_ms": draw(st.sampled_from([0.0, 0.25])), "p2p_bandwidth_gbps": 2.0},
        head={"forward_ms": draw(costs), "backward_ms": draw(costs),
              "activation_bytes": draw(st.integers(0, 800)), "static_bytes": 900,
              "transient_bytes": draw(st.sampled_from([0, 0, 500, 2500]))},
        emb={"forward_ms": draw(costs), "static_bytes": draw(st.integers(0, 2000))},
        memory=memory)
    # What a backward holds while it runs (a recompute's tensors) differs by layer.
    transients = [draw(st.sampled_from([0, 0, 50, 700])) for _ in range(layers)]
    return replace(problem, costs=replace(problem.costs, layers=tuple(
        replace(c, transient_bytes=t) for c, t in zip(problem.costs.layers, transients,
                                                      strict=True))))


def test_an_empty_stage_that_does_not_fit_does_not_end_the_search():
    """An empty stage holds its whole input (1 MB here) where one layer keeps 100 bytes:
    the search once stopped at the empty stage ("more layers only need more memory")
    and missed the best split, (1, 1, 3, 2), while calling (2, 1, 3, 1) optimal."""
    problem = uniform_problem(
        2, 2, 4, "zbv", counts=[7, 0, 0, 0], f=1.25, b=1.25, w=0.625, wg=40, act=100,
        static=300, out=10**6, hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 2.0},
        head={"forward_ms": 0.25, "backward_ms": 0.25, "activation_bytes": 0,
              "static_bytes": 900},
        emb={"forward_ms": 0.5, "static_bytes": 0}, memory=6000.0)
    best_t, best = min((s.iteration_time_ms, c) for c, s in every_split(problem) if s.fits)
    res = plan(problem, top_k=3)
    assert res.best is not None and res.best.split.counts == best == (1, 1, 3, 2)
    assert res.best.summary.iteration_time_ms == pytest.approx(best_t, rel=1e-9)


def draw_split(problem, data):
    """Any split of the problem's layers over its stages, as counts and as a Split."""
    s = problem.split
    counts = data.draw(st.sampled_from(list(all_counts(s.num_layers, s.num_stages))))
    return counts, split_from_counts(counts, s.pp, s.vpp, s.num_layers, s.placement)


@settings(max_examples=40)
@given(small_problems())
def test_plan_matches_every_split(problem):
    results = every_split(problem)
    fitting = [(s.iteration_time_ms, s.peak_memory_bytes, c) for c, s in results if s.fits]
    res = plan(problem, top_k=3)
    if not fitting:
        assert res.best is None
        peak = min(s.peak_memory_bytes for _, s in results)
        assert res.smallest_peak is not None and res.smallest_peak[0] == peak
        return
    best = ordered([Rank.of(c, t, p) for t, p, c in fitting], lambda r: r)[0]
    assert res.best is not None and res.proven_optimal
    assert res.best.summary.iteration_time_ms == pytest.approx(best.time_ms, rel=1e-9)
    # Among equal times: the fewest empty stages, then the lowest peak.
    assert (res.best.rank.empty, res.best.rank.peak_bytes) == (best.empty, best.peak_bytes)
    assert res.lower_bound_ms == res.best.summary.iteration_time_ms  # proven: no gap
    # The reported summary is the simulator's, not an estimate.
    assert res.best.summary == simulate(problem.with_split(res.best.split)).summary


@settings(max_examples=40)
@given(small_problems(), st.data())
def test_search_evaluator_equals_simulator(problem, data):
    search = SplitSearch(problem)
    counts, split = draw_split(problem, data)
    assert search.evaluate(counts) == simulate(problem.with_split(split)).summary


@settings(max_examples=60)
@given(small_problems(), st.data())
def test_path_bounds_never_exceed_the_simulated_time(problem, data):
    search = SplitSearch(problem)
    paths = PathBounds(search)
    s = problem.split
    counts, split = draw_split(problem, data)
    spans, at = {}, 0
    for i, n in enumerate(counts):
        spans[i] = (at, n)
        at += n
    t = simulate(problem.with_split(split)).summary.iteration_time_ms
    for r in range(s.pp):
        assert paths.rank_term(r, spans) <= t
    for k in range(1, s.num_stages):  # the placed prefix simulated, the rest a free delay
        assert prefix_time(paths, list(counts[:k])) <= t


def test_time_budget_reports_a_valid_lower_bound_and_no_optimality_claim():
    problem = uniform_problem(2, 2, 4, "interleaved-1f1b", counts=[24, 0, 0, 0], f=1.0, b=2.0,
                              head={"forward_ms": 7.0, "backward_ms": 9.0})
    full = plan(problem, top_k=1, time_budget_s=60)
    cut = plan(problem, top_k=1, time_budget_s=1e-9)
    assert full.proven_optimal
    assert not cut.proven_optimal
    assert cut.lower_bound_ms <= full.best.summary.iteration_time_ms
    assert cut.best.summary.iteration_time_ms >= full.best.summary.iteration_time_ms


def test_heavy_head_moves_layers_off_the_last_stage():
    problem = uniform_problem(4, 1, 16, "1f1b", counts=[16, 0, 0, 0], f=1.0, b=2.0,
                              head={"forward_ms": 3.0, "backward_ms": 6.0})
    res = plan(problem)
    assert res.proven_optimal
    assert res.best.split.counts[-1] < 4 and sum(res.best.split.counts) == 16
    assert res.best.summary.iteration_time_ms < res.baseline.summary.iteration_time_ms


UNIFORM = """
[model]
kind = "uniform"
num_layers = 12
forward_ms = 1.0
backward_ms = 2.0
static_bytes = 1000
activation_bytes = 100
[model.head]
forward_ms = 4.0
backward_ms = 8.0
[pipeline]
pp = 4
microbatches = 8
schedule = "1f1b"
[hardware]
memory_bytes = 1e9
"""


def test_plan_json_contract_and_exports_parse_back(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(UNIFORM)
    assert main(["plan", "--config", str(cfg), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    best = data["best"]
    assert sum(best["split"]) == 12 and len(best["peak_memory_bytes"]) == 4
    assert data["baseline"]["split"] == [3, 3, 3, 3]
    assert best["iteration_time_ms"] <= data["baseline"]["iteration_time_ms"]
    assert data["proven_optimal"] is True
    # The layout string round-trips through `ppsim split`.
    assert main(["split", "--config", str(cfg), "--layout", best["megatron_layout"],
                 "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert [s["layers"] for s in back["stages"]] == best["split"]


def test_no_fit_exits_3_naming_peak_and_rank(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(UNIFORM.replace("memory_bytes = 1e9", "memory_bytes = 2000"))
    assert main(["plan", "--config", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert "smallest peak" in err and "rank" in err and err.count("\n") == 1


def test_search_axes_include_the_configured_point(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    # pp 2 over 6 layers: every schedule and interleaved vpp variants, as pp 4 over 12
    # gives, planned in well under a second (the planner proves each tie-heavy uniform
    # stack optimal: 8 layers take 5 s, 12 on pp 4 take 27).
    cfg.write_text(UNIFORM.replace("num_layers = 12", "num_layers = 6").replace(
        "pp = 4", "pp = 2"))
    assert main(["plan", "--config", str(cfg), "--search", "schedule,vpp", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    labels = [v["variant"] for v in data["variants"]]
    assert "as configured" in labels and any("interleaved" in v for v in labels)
    assert data["best"]["iteration_time_ms"] <= min(
        v["best"]["iteration_time_ms"] for v in data["variants"] if v["best"])
    assert main(["plan", "--config", str(cfg), "--search", "colour"]) == 2


def _prefix_time_by_hand(paths: PathBounds, counts: list[int]) -> float:
    """The relaxation scheduled op by op, as its docstring defines it: stages 0..k-1 on
    their ranks, each later stage's ops dropped, stage k-1's forward messages sent
    straight back to its own backward after the rest's F and B and the hops there and
    back."""
    from ppsim.pipeline import messages
    from ppsim.plan.bounds import ROUNDING
    from ppsim.sim.evaluate import list_schedule

    s, k = paths.s, len(counts)
    costs, pos = [], 0
    for i, n in enumerate(counts):
        costs.append(s.stage(pos, n, i))
        pos += n
    trip = (paths.pre_f[-1] - paths.pre_f[pos] + s.costs.head.forward_ms
            + paths.pre_b[-1] - paths.pre_b[pos] + paths.bpart(s.costs.head)
            + 2 * (paths.pre_d[-1] - paths.pre_d[k - 1]))
    kinds, waits, sends, durations, delays = [], [], [], [], []
    for r in range(s.pp):
        rows = [(a, kd, wk, sk, d) for a, kd, wk, sk, d in zip(
            s.sched.actions[r], s.compiled.kind[r], s.compiled.wait_key[r],
            s.compiled.send_key[r], s.send_delay[r], strict=True) if a.stage < k]
        kinds.append(tuple(kd for _, kd, *_ in rows))
        waits.append(tuple(wk for _, _, wk, *_ in rows))
        back = [a.stage == k - 1 and kd == "F" for a, kd, *_ in rows]
        sends.append(tuple(messages.key(a.stage, a.microbatch, True, s.m) if b else sk
                           for (a, _, _, sk, _), b in zip(rows, back, strict=True)))
        delays.append([trip if b else d for (*_, d), b in zip(rows, back, strict=True)])
        c = [costs[a.stage] for a, *_ in rows]
        durations.append([
            x.forward_ms - x.pair_saving_ms if kd == "F"
            else paths.bpart(x) - x.pair_saving_ms if kd == "B"
            else (x.weight_grad_ms if s.split_bw else 0.0)
            for x, (_, kd, *_) in zip(c, rows, strict=True)])

    count = messages.key_count(s.sched.num_stages, s.m)

    class Sub:  # what list_schedule reads of a compiled schedule
        kind, wait_key, send_key, messages = kinds, waits, sends, count

    _, ends = list_schedule(Sub, durations, delays)  # type: ignore[arg-type]
    return max((e[-1] for e in ends if e), default=0.0) * ROUNDING


@settings(max_examples=40)
@given(small_problems(), st.data())
def test_prefix_times_from_kept_templates_equal_the_relaxation_scheduled_by_hand(problem, data):
    """The planner's prefix times reuse each k's ops (PrefixTimes) across splits: to the
    last digit what the relaxation gives built afresh, in any order of k."""
    from ppsim.plan.prefix import PrefixTimes

    paths = PathBounds(SplitSearch(problem))
    times = PrefixTimes(paths)
    for _ in range(3):  # other splits through the same templates
        counts, _ = draw_split(problem, data)
        ks = data.draw(st.permutations(range(1, problem.split.num_stages)))
        for k in ks:
            assert times(list(counts[:k])) == _prefix_time_by_hand(paths, list(counts[:k]))
