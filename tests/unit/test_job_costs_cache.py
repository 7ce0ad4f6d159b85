"""ppsim.job.layers.job_costs is cached on its frozen arguments: shapes of a job search
that differ only in their chunks per rank (vpp) build equal jobs and share one
computation, whose result is what computing it afresh gives."""

from __future__ import annotations

from dataclasses import replace

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.costs.transformer import accelerator
from ppsim.job.layers import job_costs
from ppsim.job.model import build_job
from ppsim.job.pending import shape_config
from ppsim.job.shapes import Shape


def _job(vpp: int) -> object:
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "mixtral-8x7b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    s = Shape(tp=2, cp=1, ep=4, pp=2, dp=4, vpp=vpp, mbs=1, microbatches=8)
    c = shape_config(cfg, s, 32)
    return build_job(c), accelerator(c.hardware)


def test_shapes_differing_in_vpp_share_one_computation_equal_to_a_fresh_one() -> None:
    (one, acc), (two, _) = _job(1), _job(2)
    assert one == two and one is not two
    job_costs.cache_clear()
    first = job_costs(one, acc)
    assert job_costs(two, acc) is first
    assert job_costs.cache_info().hits == 1
    assert job_costs.__wrapped__(two, acc) == first  # what it computes afresh
    # another job is another entry
    other = replace(one, tp_comm_overlap=not one.tp_comm_overlap)
    assert job_costs(other, acc) is not first
