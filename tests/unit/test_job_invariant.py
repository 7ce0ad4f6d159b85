"""A job with tp = cp = ep = dp = 1 simulates exactly as a lone pipeline replica did.

tests/unit/job_baseline.json holds figures recorded from the code path before the job
layer existed (commit b2cbf7e) by simulating each preset below: the job's
topology, collectives and throughput must not move a single digit of them (the peaks
as the memory model counts a stage's input: once, held until its B; a MoE layer's
int64 routing indices, +0.003 % on the two MoE presets; and a gated MLP as Megatron's
fused SwiGLU keeps it, without the SiLU output: 0.5 to 10 % lower on the gated presets;
and what a backward holds while it runs, the head's logit gradient and a recomputed
module's tensors: up to +1.1 % here, on the last stage's rank; and a MoE pair's expert
output, which Megatron does not keep, weighing the experts' activation by the routing
probabilities instead: −1.5 % on the two MoE presets). The GPT-3 case names the model it
was recorded with: untied, 51,200 tokens, and no position table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

CASES = json.loads((Path(__file__).parent / "job_baseline.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["preset"] for c in CASES])
def test_one_way_job_equals_the_recorded_replica(case: dict) -> None:
    cfg = config_from_dict({"model": {"preset": case["preset"], **case["model"]},
                            "pipeline": {"pp": case["pp"], "vpp": case["vpp"],
                                         "microbatches": case["microbatches"],
                                         "schedule": case["schedule"]},
                            "hardware": {"preset": case["hardware"], "memory_bytes": 1e15}})
    s = simulate(build_problem(cfg)).summary
    assert s.iteration_time_ms == case["iteration_time_ms"]
    assert s.bubble_fraction == case["bubble_fraction"]
    assert s.peak_memory_bytes == case["peak_memory_bytes"]
