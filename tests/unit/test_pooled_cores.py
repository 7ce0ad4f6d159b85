"""Unpinned CPU ranks and their data-parallel replicas share the profile's cores: a cost
file's `conditions.cores` makes the simulator pool them (ppsim.pipeline.placement)."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem

LAYER = {"forward_ms": 1.0, "backward_ms": 2.0, "params": 1000, "output_bytes": 0}


def costs(tmp_path, cores: object) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({
        "format": "ppsim-costs", "version": 1, "source": "hand", "model": None,
        "layers": [LAYER], "embedding": LAYER, "head": LAYER,
        "conditions": {"devices": [0, 1], "processes": 2, "cores": cores}}))
    return str(path)


def problem(path: str, dp: int, devices: list[int] | None = None):
    cfg = {"model": {"preset": "tiny-gpt", "dp": dp},
           "pipeline": {"pp": 2, "microbatches": 4}, "costs_file": path}
    if devices is not None:
        cfg["placement"] = {"devices": devices}
    return build_problem(config_from_dict(cfg))


@pytest.mark.parametrize(("cores", "dp", "pooled"), [(2, 2, True), (2, 1, False),
                                                     (4, 2, False), (1, 1, True)])
def test_ranks_and_replicas_beyond_the_cores_share_them(tmp_path, cores: int, dp: int,
                                                        pooled: bool) -> None:
    topo = problem(costs(tmp_path, cores), dp).topology
    assert (topo is not None and topo.pooled) == pooled
    if pooled:
        assert (topo.cores, topo.copies) == (cores, dp)


def test_pinned_ranks_keep_their_devices(tmp_path) -> None:
    """An explicit placement pins each rank to its core (the executor does so with dp 1);
    its devices, not a pool, share the work."""
    topo = problem(costs(tmp_path, 1), 1, devices=[0, 1]).topology
    assert topo is None or not topo.pooled


def test_sharing_the_cores_slows_the_iteration(tmp_path) -> None:
    from ppsim.sim.simulate import simulate

    roomy = simulate(problem(costs(tmp_path, 4), 2)).summary.iteration_time_ms
    shared = simulate(problem(costs(tmp_path, 2), 2)).summary.iteration_time_ms
    assert shared > roomy


def test_a_bad_core_count_is_refused_naming_its_field(tmp_path, capsys) -> None:
    path = costs(tmp_path, -1)
    assert main(["simulate", "--preset", "tiny-gpt", "--costs", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "conditions.cores" in err[0]


def test_one_rank_with_its_twins_on_one_core_takes_twice_as_long() -> None:
    """pp 1, dp 2 on one core: the rank's every op shares the core with its twin."""
    from dataclasses import replace

    from helpers import uniform_problem

    from ppsim.pipeline.placement import PlacementConfig, topology
    from ppsim.sim.simulate import simulate

    p = uniform_problem(1, 1, 2, "1f1b", counts=[1], f=1.0, b=2.0,
                        head={"forward_ms": 0.0, "backward_ms": 0.0},
                        emb={"forward_ms": 0.0, "backward_ms": 0.0})
    twins = replace(p, topology=topology(PlacementConfig(), 1, 0.0, 0.0, 1, 2))
    alone, shared = simulate(p).summary, simulate(twins).summary
    assert shared.iteration_time_ms == pytest.approx(alone.iteration_time_ms + 6.0)
    # Busy is wall time spent in ops: the shared core's, not the work's.
    assert shared.ranks[0].busy_ms == pytest.approx(2 * alone.ranks[0].busy_ms)
