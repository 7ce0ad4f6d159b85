"""The step's tail: data-parallel gradient all-reduce (R) and optimizer step (S)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.state import ADAM_BYTES_PER_PARAM
from ppsim.pipeline.problem import build_problem
from ppsim.pipeline.split import split_from_counts
from ppsim.plan.search import SplitSearch
from ppsim.sim.simulate import simulate
from ppsim.sim.summary import GRAD_BYTES


def _problem(dp: int, pp: int = 1, split: list[int] | None = None, gpus_per_node: int = 8):
    pipe = {"pp": pp, "microbatches": 4}
    if split:
        pipe["split"] = split
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 8, "dp": dp},
        "hardware": {"preset": "h100-80gb", "gpus_per_node": gpus_per_node},
        "pipeline": pipe}))


@pytest.mark.parametrize("gpus_per_node,bus_gbps,step_us", [(8, 450.0, 1.0), (4, 200.0, 5.0)])
def test_all_reduce_and_optimizer_follow_the_ring_and_bandwidth_formulas(
        gpus_per_node, bus_gbps, step_us):
    # dp 8 on one 8-GPU node rings over NVLink (450 GB/s each way, 1 us a step); on
    # 4-GPU nodes it crosses two, each node's ring through its 4 NICs (4 x 50 GB/s).
    one, eight = _problem(1), _problem(8, gpus_per_node=gpus_per_node)
    hw = eight.hardware
    params = sum(c.params for c in eight.stage_costs)
    assert params > 2.7e9  # 8 layers (218M each), embedding and head (525M each), one rank
    step = params * ADAM_BYTES_PER_PARAM / (hw.memory_bandwidth_gbps * 1e6)
    ring = 2 * 7 * step_us / 1e3 + 2 * 7 / 8 * params * GRAD_BYTES / (bus_gbps * 1e6)
    base = simulate(one).summary.iteration_time_ms
    assert simulate(eight).summary.iteration_time_ms == pytest.approx(base + ring, rel=1e-12)
    # dp 1 still pays the optimizer step, after the pipeline's last op.
    sim = simulate(one)
    last = max(op.end for ops in sim.timeline.ops for op in ops)
    assert sim.summary.iteration_time_ms == pytest.approx(last + step, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=4, max_size=4).filter(lambda c: sum(c) == 8),
       st.sampled_from([1, 2, 8]))
def test_the_fast_evaluator_includes_the_same_tail(counts, dp):
    p = _problem(dp, pp=4, split=[2, 2, 2, 2])
    split = split_from_counts(counts, 4, 1, 8)
    assert SplitSearch(p).evaluate(tuple(counts)) == simulate(p.with_split(split)).summary


def test_the_simulated_trace_records_the_tail_as_the_executor_does(tmp_path, capsys):
    trace = tmp_path / "sim.json"
    argv = ["simulate", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--pp", "2", "--microbatches", "4", "--trace", str(trace), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e.get("args", {}).get("kind") in ("R", "S")]
    assert {e["pid"] for e in steps} == {0, 1} and {e["args"]["kind"] for e in steps} == {"S"}
    end = max(e["ts"] + e["dur"] for e in steps) / 1e3
    assert end == pytest.approx(summary["iteration_time_ms"], rel=1e-9)
    # The diff reads them as step ops and a trace against itself is exact.
    assert main(["diff", str(trace), str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["iteration_time_delta_ms"] == 0


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 10**10), st.integers(1, 10**10), st.sampled_from([1, 2]))
def test_a_larger_gradient_bucket_never_exposes_less(small, large, pp):
    """--ddp-bucket-size: the last bucket stays exposed whatever the backward hides, so
    each rank's exposed reduction grows with the bucket (never shrinks)."""
    small, large = sorted((small, large))

    def reduce(bucket: int) -> list[float]:
        problem = build_problem(config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": 4, "dp": 16,
                      "distributed_optimizer": True},
            "hardware": {"preset": "h100-80gb"},
            "pipeline": {"pp": pp, "microbatches": 4, "overlap_grad_reduce": True,
                         "overlap_param_gather": True, "ddp_bucket_size": bucket}}))
        return [r for _, r, _ in simulate(problem).timeline.step]

    for a, b in zip(reduce(small), reduce(large), strict=True):
        assert a <= b * (1 + 1e-12)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([2, 3]), st.sampled_from([2, 4, 16]),
       st.sampled_from([0.05, 1.0, 3000.0]), st.sampled_from([0, 16]))
def test_gathering_the_first_chunk_with_the_step_never_slows_a_later_rank(
        pp, vpp, dp, membw, sms):
    """--overlap-param-gather-with-optimizer-step: on every pipeline rank but the first
    (whose first chunk was one bucket already) the tail is at most what it was, whatever
    the step's length (the window the first chunk's gather hides in) and NCCL's SMs."""
    def reduce(flag: bool) -> list[float]:
        cfg = config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": pp * vpp * 2, "dp": dp,
                      "distributed_optimizer": True},
            "hardware": {"preset": "h100-80gb", "memory_bandwidth_gbps": membw,
                         "collective_sms": sms},
            "pipeline": {"pp": pp, "vpp": vpp, "schedule": "interleaved-1f1b",
                         "microbatches": 2 * pp, "overlap_grad_reduce": True,
                         "overlap_param_gather": True,
                         "overlap_param_gather_with_optimizer_step": flag}})
        return [r for _, r, _ in simulate(build_problem(cfg)).timeline.step]

    plain, with_step = reduce(False), reduce(True)
    assert all(w <= p * (1 + 1e-12) for w, p in zip(with_step[1:], plain[1:], strict=True))
