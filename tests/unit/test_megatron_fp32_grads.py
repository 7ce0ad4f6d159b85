"""Megatron's --accumulate-allreduce-grads-in-fp32: fp16 training keeps, accumulates and
reduces its gradients in an fp32 buffer (training.py passes the flag as the DDP config's
grad_reduce_in_fp32), as bf16 training does by default (arguments.py)."""

from __future__ import annotations

import json

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from tests.helpers import run_cli


def _problem(model: dict):
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "dp": 16,
                  "distributed_optimizer": True, **model},
        "pipeline": {"pp": 1, "microbatches": 4},
        "hardware": {"preset": "h100-80gb"}}))


def test_fp16_with_fp32_gradients_costs_what_bf16_costs() -> None:
    """An fp32 buffer's gradients are the step's own (optimizer.py's .float() copies
    nothing): 2 + 4 + 12 / dp bytes a parameter and 4-byte reductions and wgrad landings,
    bf16's default, where fp16's own buffer costs 4 + 16 / dp and moves 2 bytes."""
    fp16 = _problem({"dtype": "fp16", "grads_in_fp32": True})
    bf16 = _problem({"dtype": "bf16"})
    assert [c.static_bytes for c in fp16.stage_costs] == pytest.approx(
        [c.static_bytes for c in bf16.stage_costs], rel=1e-12)
    assert simulate(fp16).summary.iteration_time_ms == pytest.approx(
        simulate(bf16).summary.iteration_time_ms, rel=1e-12)


LINE = ["simulate", "--preset", "llama3-8b", "--num-layers", "4", "--hardware", "h100-80gb",
        "--gpus", "16", "--global-batch-size", "64", "--use-distributed-optimizer", "--json"]


def test_the_launch_flag_is_priced_not_dropped() -> None:
    """Pasted with an fp16 launch line, the flag prices the job as Megatron runs it: each
    rank's memory and the iteration as bf16's, not as fp16's own buffer."""
    got = [json.loads(run_cli([*LINE, *dtype]).stdout) for dtype in (
        ["--fp16", "--accumulate-allreduce-grads-in-fp32"], ["--bf16"], ["--fp16"])]
    fp32, bf16, fp16 = ([r["static_bytes"] for r in g["ranks"]] for g in got)
    assert fp32 == bf16 != fp16
    assert got[0]["iteration_time_ms"] == pytest.approx(got[1]["iteration_time_ms"], rel=1e-12)


def test_fp32_accumulation_beside_bf16_main_grads_is_refused_as_megatron_refuses_it() -> None:
    ran = run_cli(["simulate", "--preset", "llama3-8b", "--num-layers", "4", "--gpus", "16",
                   "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                   "--main-grads-dtype", "bf16", "--accumulate-allreduce-grads-in-fp32"])
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr
    assert "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32" \
        in ran.stderr
