"""Data-parallel collectives as a cost file timed them (ppsim.costs.grouptimes): the lines
fitted to the samples, the file's checks, and the step priced by them rather than by
the closed forms on the point-to-point link."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.costfile import cost_file_from_dict
from ppsim.costs.grouptimes import (
    GroupTimes,
    TimedCollective,
    TimedGroup,
    fit_line,
    group_times,
)
from ppsim.errors import UserError
from ppsim.job.collectives import Link, all_gather_ms, all_reduce_ms, reduce_scatter_ms
from ppsim.job.model import build_job

LAYER = {"forward_ms": 1.0, "backward_ms": 2.0, "params": 1000}


def doc(dp_collectives: object) -> dict:
    return {"format": "ppsim-costs", "version": 1, "source": "hand", "model": None,
            "layers": [LAYER], "embedding": LAYER, "head": LAYER,
            "dp_collectives": dp_collectives}


def samples(*rows: tuple[float, float, float, float]) -> list[dict]:
    return [{"bytes": b, "all_reduce_ms": ar, "reduce_scatter_ms": rs, "all_gather_ms": ag}
            for b, ar, rs, ag in rows]


@given(st.floats(0.0, 50.0), st.floats(0.01, 100.0),
       st.lists(st.integers(1_000, 10**9), min_size=2, max_size=6, unique=True))
def test_a_line_is_recovered_from_samples_on_it(fixed: float, gbps: float,
                                                sizes: list[int]) -> None:
    times = [fixed + n / (gbps * 1e6) for n in sizes]
    got = fit_line([float(n) for n in sizes], times)
    assert got.gbps == pytest.approx(gbps, rel=1e-6)
    assert got.fixed_ms == pytest.approx(fixed, rel=1e-6, abs=1e-9 * max(times))
    for n, t in zip(sizes, times, strict=True):
        assert got.ms(n) == pytest.approx(t, rel=1e-6)


@given(st.lists(st.tuples(st.integers(0, 10**9), st.floats(0.0, 1e3)), min_size=1,
                max_size=8))
def test_a_fitted_line_never_gives_a_negative_time_or_rate(points: list) -> None:
    got = fit_line([float(x) for x, _ in points], [y for _, y in points])
    assert got.fixed_ms >= 0 and got.gbps >= 0
    assert all(got.ms(x) >= 0 for x, _ in points)


def test_times_that_fall_with_size_are_all_fixed() -> None:
    assert fit_line([1e6, 2e6], [3.0, 1.0]) == TimedCollective(fixed_ms=2.0, gbps=0.0)


def test_a_negative_intercept_becomes_a_line_through_the_origin() -> None:
    got = fit_line([1e6, 2e6, 3e6], [0.5, 2.0, 3.5])  # least squares: -1 + 1.5 x
    assert got.fixed_ms == 0.0
    assert got.ms(1e6) == pytest.approx((1 * 0.5 + 2 * 2 + 3 * 3.5) / 14)


def test_each_kind_has_its_own_line() -> None:
    g = group_times(2, samples((1e6, 1.0, 2.0, 3.0), (2e6, 2.0, 4.0, 5.0)))
    assert (g.all_reduce.ms(3e6), g.reduce_scatter.ms(3e6), g.all_gather.ms(3e6)) == \
        pytest.approx((3.0, 6.0, 7.0))


def test_a_timed_link_prices_by_its_lines_and_a_group_of_one_by_nothing() -> None:
    timed = group_times(4, samples((1e6, 1.0, 2.0, 3.0), (2e6, 2.0, 4.0, 5.0)))
    link = Link(size=4, bus_bandwidth_gbps=100.0, latency_ms=0.001, timed=timed)
    assert all_reduce_ms(4e6, link) == pytest.approx(4.0)
    assert reduce_scatter_ms(4e6, link) == pytest.approx(8.0)
    assert all_gather_ms(4e6, link) == pytest.approx(9.0)
    alone = Link(size=1, bus_bandwidth_gbps=100.0, latency_ms=0.001, timed=timed)
    assert all_reduce_ms(4e6, alone) == reduce_scatter_ms(4e6, alone) == \
        all_gather_ms(4e6, alone) == 0.0


def _job_cfg(dp: int, distributed: bool = False):
    return config_from_dict({"model": {"preset": "tiny-gpt", "dp": dp,
                                       "distributed_optimizer": distributed},
                             "pipeline": {"pp": 2, "microbatches": 4}})


def test_the_job_times_its_data_parallel_groups_of_the_timed_size_only() -> None:
    timed = group_times(2, samples((1e6, 1.0, 2.0, 3.0), (2e6, 2.0, 4.0, 5.0)))
    job = build_job(_job_cfg(2), (TimedGroup(group="dp", times=timed),))
    assert job is not None
    assert job.link("dp").timed is timed and job.link("dp_shard").timed is timed
    assert job.link("tp").timed is None
    other = build_job(_job_cfg(4), (TimedGroup(group="dp", times=timed),))
    assert other is not None and other.link("dp").timed is None


@pytest.mark.parametrize("distributed", [False, True])
def test_the_step_reduces_as_timed(distributed: bool) -> None:
    timed = GroupTimes(size=2, all_reduce=TimedCollective(fixed_ms=1.0, gbps=2.0),
                       reduce_scatter=TimedCollective(fixed_ms=3.0, gbps=0.5),
                       all_gather=TimedCollective(fixed_ms=0.25, gbps=4.0))
    job = build_job(_job_cfg(2, distributed), (TimedGroup(group="dp", times=timed),))
    assert job is not None
    params = 1_000_000
    tail = job.tail(params, 1.0, 2.0, 0.0)
    nbytes = params * 4  # fp32 gradients and weights
    want = (3.0 + nbytes / 0.5e6) + (0.25 + nbytes / 4e6) if distributed \
        else 1.0 + nbytes / 2e6
    assert tail.reduce_ms == pytest.approx(want)


@pytest.mark.parametrize("raw, field", [
    ("x", "dp_collectives"),
    ({"size": 1, "samples": samples((1.0, 1.0, 1.0, 1.0))}, "dp_collectives.size"),
    ({"size": 2, "samples": []}, "dp_collectives.samples"),
    ({"size": 2, "samples": [3]}, "dp_collectives.samples[0]"),
    ({"size": 2, "samples": samples((-1.0, 1.0, 1.0, 1.0))}, "dp_collectives.samples[0].bytes"),
    ({"size": 2, "samples": [{"bytes": 1, "all_reduce_ms": 1, "reduce_scatter_ms": 1}]},
     "dp_collectives.samples[0].all_gather_ms"),
])
def test_a_bad_timing_is_refused_naming_its_field(raw: object, field: str) -> None:
    with pytest.raises(UserError) as err:
        cost_file_from_dict(doc(raw), "c.json")
    assert err.value.field == f"c.json: {field}"


def test_simulate_refuses_a_bad_timing_with_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc({"size": 2, "samples": samples((1.0, -2.0, 1.0, 1.0))})))
    assert main(["simulate", "--preset", "tiny-gpt", "--dp", "2", "--costs", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dp_collectives.samples[0].all_reduce_ms" in err[0]


def test_profile_refuses_more_processes_than_a_run_here_would_start(capsys) -> None:
    assert main(["profile", "--preset", "tiny-gpt", "--pp", "2", "--dp", "100000",
                 "--out", "never-written.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ppsim profile: error: --dp: ")
