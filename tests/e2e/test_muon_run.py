"""Megatron's --optimizer muon for real: two DDP replicas over gloo whose decoder layers'
2-D weights step by Muon (ppsim.executor.optim), the rest by AdamW; the simulated peaks
hold Muon's one momentum where Adam keeps two moments."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from launches import Pool  # noqa: E402

from ppsim.cli.main import main  # noqa: E402

pytestmark = pytest.mark.e2e


def test_muon_trains_its_own_way_from_the_same_start(launches: Pool) -> None:
    adam = launches.get("1f1b-dp2").summary["losses"]
    muon = launches.get("1f1b-dp2-muon").summary["losses"]
    assert len(muon) == 3
    assert muon[0] == pytest.approx(adam[0], rel=1e-6)  # one model, one batch, no step yet
    assert muon[2] != pytest.approx(adam[2], rel=1e-6)
    assert muon[2] != muon[0]


def test_muons_state_is_predicted_from_a_profile_of_it(launches: Pool, tmp_path,
                                                       capsys) -> None:
    """The profile steps each layer piece as the run does (Muon on its matrices, AdamW on
    the norms, the embedding and the head), so the simulated peak of each rank is the
    run's (as DDP's, to a few step counts), and below Adam's."""
    from ppsim.config.schema import load_config
    from ppsim.costs.costfile import write_costs
    from ppsim.executor.measure import profile

    peaks = {}
    for case, cfg in (("1f1b-dp2", "ddp.toml"), ("1f1b-dp2-muon", "muon.toml")):
        run = launches.get(case)
        fields = load_config(str(run.tmp / cfg)).model.fields()
        doc = profile({**fields, "dp": 2}, "cpu", repeats=1, warmup=0, p2p=True,
                      devices=[0])
        # The step is timed as the run takes it (the simulation prices it so).
        assert doc["conditions"]["optimizer"]["kind"] == case.rpartition("-")[2].replace(
            "dp2", "adam")
        costs, sim = str(tmp_path / f"{case}.json"), str(tmp_path / f"{case}-sim.json")
        write_costs(costs, doc)
        assert main(["simulate", *run.argv, "--costs", costs, "--trace", sim]) == 0
        capsys.readouterr()
        assert main(["diff", sim, str(run.tmp / "out" / "trace.json"), "--json"]) == 0
        ranks = json.loads(capsys.readouterr().out)["ranks"]
        for r in ranks:
            pred, real = r["peak_memory_bytes"]
            assert 0 <= real - pred <= 4 + 2 * 16, (case, r["rank"], pred, real)
        peaks[case] = [r["peak_memory_bytes"][1] for r in ranks]
    assert all(m < a for m, a in zip(peaks["1f1b-dp2-muon"], peaks["1f1b-dp2"], strict=True))
