"""--overlap-param-gather-with-optimizer-step: the first model chunk's optimizer steps
first and that chunk's parameters, one bucket, gather beside the other chunks' steps;
no chunk is bucketed (Megatron's optimizer/optimizer.py ChainedOptimizer._step,
training.py per_chunk_disable_bucketing)."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.job.shapes import shapes
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

NIC, NIC_STEP = 50e6, 5e-3  # bytes per ms, ms: one 400 Gb/s NIC a GPU, its step latency
BUS = min(450e6, 8 * NIC)  # dp 16 over two nodes: rings through 8 NICs


def _ring_ms(n: float, nbytes: int) -> float:
    """A 16-rank reduce-scatter or all-gather of n parameters at `nbytes` each."""
    return 15 * NIC_STEP + 15 / 16 * n * nbytes / BUS


def _reduce(flag: bool) -> tuple[list[float], object]:
    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 8, "dp": 16,
                  "distributed_optimizer": True},
        "pipeline": {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "microbatches": 4,
                     "overlap_grad_reduce": True, "overlap_param_gather": True,
                     "overlap_param_gather_with_optimizer_step": flag},
        # no SM share for hidden collectives; a slow step (1 GB/s) hides the first gather
        "hardware": {"preset": "h100-80gb", "collective_sms": 0, "memory_bandwidth_gbps": 1}})
    problem = build_problem(cfg)
    return [r for _, r, _ in simulate(problem).timeline.step], problem


def test_the_first_chunks_gather_hides_behind_the_other_chunks_steps() -> None:
    """Rank 1 (chunks 1 and 3, unbucketed either way): without the flag its first
    chunk's gather waits whole at the first forward, the rest behind that forward; with
    it the first chunk's is behind the step and the rest behind the forward, so the
    difference is the first chunk's gather less what the forward window already hid."""
    (plain, problem), (with_step, _) = _reduce(False), _reduce(True)
    costs = problem.stage_costs
    first, both = costs[1].params, costs[1].params + costs[3].params
    window = costs[1].forward_ms + costs[3].forward_ms  # a microbatch's forward on rank 1
    first_ms, both_ms = _ring_ms(first, 2), _ring_ms(both, 2)  # bf16 weights
    without = max(first_ms, both_ms - window)
    rest = both_ms - first_ms
    assert plain[1] - with_step[1] == pytest.approx(
        without - min(rest, max(0.0, rest - window)), rel=1e-9)
    assert with_step[1] < plain[1]


def test_the_first_ranks_first_chunk_reduces_whole() -> None:
    """Rank 0 buckets its first chunk without the flag (the embedding's bucket waits);
    with it the whole chunk's fp32 gradients wait for its last backward."""
    (plain, problem), (with_step, _) = _reduce(False), _reduce(True)
    chunk = problem.stage_costs[0].params
    assert with_step[0] >= _ring_ms(chunk, 4) * (1 - 1e-9)
    assert plain[0] < _ring_ms(chunk, 4)


@pytest.mark.parametrize("argv, words", [
    ([], "only supported with distributed optimizer"),
    (["--use-distributed-optimizer", "--overlap-grad-reduce"],
     "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather"),
    (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
      "--vpp", "1"], "only supported with interleaved pipeline parallelism"),
    (["--fsdp"], "priced with the distributed optimizer alone"),
    (["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
      "--ckpt-format", "torch_dist"], "not supported with distributed checkpointing yet"),
])
def test_jobs_megatron_refuses_are_refused_in_its_words(argv, words, capsys) -> None:
    rc = main(["simulate", "--preset", "llama3-8b", "--gpus", "32", "--pp", "2", "--vpp", "2",
               "--global-batch-size", "64", "--overlap-param-gather-with-optimizer-step",
               *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and words in err, err
    assert "pipeline.overlap_param_gather_with_optimizer_step" in err or "--ckpt-format" in err


def test_the_job_search_tries_interleaved_shapes_alone() -> None:
    a = config_from_dict({"model": {"preset": "llama3-8b"}}).model.arch
    every = shapes(a, 64, 128, 8, a.num_layers)
    chunked = shapes(a, 64, 128, 8, a.num_layers, interleaved=True)
    assert chunked and all(s.vpp > 1 for s in chunked)
    assert set(chunked) == {s for s in every if s.vpp > 1}


def test_the_plans_megatron_line_carries_it(capsys) -> None:
    assert main(["plan", "--preset", "llama3-8b", "--gpus", "16", "--global-batch-size", "32",
                 "--tp", "8", "--pp", "2", "--use-distributed-optimizer",
                 "--overlap-grad-reduce", "--overlap-param-gather",
                 "--overlap-param-gather-with-optimizer-step", "--time-budget", "5"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Megatron")][0]
    # ... with the legacy checkpoints Megatron-LM runs it with
    assert "--overlap-param-gather-with-optimizer-step --ckpt-format torch" in line


def test_a_fully_sharded_shape_of_the_sharding_search_drops_it() -> None:
    """--search sharding: a shape that shards with FSDP drops Megatron DDP's knobs, this
    one with them (Megatron-FSDP gathers its own way): it was refused, not timed."""
    from ppsim.job.pending import pending_shape
    from ppsim.job.shapes import Shape

    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 8, "dp": 8,
                  "distributed_optimizer": True},
        "pipeline": {"pp": 2, "vpp": 2, "microbatches": 4, "overlap_grad_reduce": True,
                     "overlap_param_gather": True,
                     "overlap_param_gather_with_optimizer_step": True},
        "hardware": {"preset": "h100-80gb"}})
    s = Shape(tp=1, cp=1, ep=1, pp=2, dp=8, vpp=2, mbs=1, microbatches=4, etp=1,
              sharding="megatron-fsdp", dp_replicas=1)
    p = pending_shape(cfg, s, 32)
    assert p.cfg.model.arch.megatron_fsdp
    assert not p.cfg.pipeline.overlap_param_gather_with_optimizer_step
