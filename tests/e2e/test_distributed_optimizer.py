"""Megatron's distributed optimizer for real (ppsim.executor.dataparallel.Sharded): two
replicas over gloo, each reduce-scattering the gradients, stepping its half of the
weights and gathering the other half, against DDP on the same model and batches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from launches import Pool  # noqa: E402

from ppsim.cli.main import main  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", ["1f1b-dp2-distopt", "1f1b-dp2-fsdp"])
def test_sharded_steps_train_exactly_as_ddp(launches: Pool, case: str) -> None:
    """AdamW is elementwise: half the weights on each replica step as the whole does, so
    three iterations' losses agree with DDP's to rounding."""
    ddp = launches.get("1f1b-dp2").summary
    sharded = launches.get(case).summary
    assert len(sharded["losses"]) == 3
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-6)
    assert sharded["losses"][2] != sharded["losses"][0]


@pytest.mark.parametrize("case", ["1f1b-dp2", "1f1b-dp2-distopt", "1f1b-dp2-fsdp"])
def test_each_step_reduce_says_how_long_it_waited_for_the_other_replica(
        launches: Pool, case: str) -> None:
    """The traced replica's R ops each carry the wait for the other replica to start the
    same collective (the clocks are one host's), never longer than the op."""
    doc = json.loads((launches.get(case).tmp / "out" / "trace.json").read_text())
    reduces = [e for e in doc["traceEvents"] if e.get("args", {}).get("kind") == "R"]
    per_iteration = 2 if case.endswith(("distopt", "fsdp")) else 1  # reduce, then gather
    assert len(reduces) == 2 * 3 * per_iteration  # 2 ranks, 3 iterations
    for e in reduces:
        assert 0.0 <= e["args"]["replica_wait_us"] <= e["dur"]


def test_sharded_state_is_predicted_from_a_sharded_profile(launches: Pool, tmp_path,
                                                           capsys) -> None:
    """The profile counts Adam's moments as a 1 / dp share, so the simulated peak of each
    rank is the run's to the 4 bytes of the shard's one step count; DDP's is larger. The
    reduce is priced by the collectives the profile timed in pp x dp gloo processes: the
    all-reduce's line (DDP), the reduce-scatter's and the all-gather's (sharded), each at
    the rank's gradient buffer (rank 0: the embedding and five layers, fp32)."""
    from ppsim.config.schema import load_config
    from ppsim.costs.costfile import read_cost_file, write_costs
    from ppsim.executor.measure import profile

    peaks = {}
    for case, cfg in (("1f1b-dp2", "ddp.toml"), ("1f1b-dp2-distopt", "distopt.toml"),
                      ("1f1b-dp2-fsdp", "fsdp.toml")):
        run = launches.get(case)
        fields = load_config(str(run.tmp / cfg)).model.fields()
        doc = profile({**fields, "dp": 2}, "cpu", repeats=1, warmup=0, p2p=True,
                      devices=[0])
        costs, sim = str(tmp_path / f"{case}.json"), str(tmp_path / f"{case}-sim.json")
        write_costs(costs, doc)
        # One pipeline position timed (devices=[0]): its two replicas.
        assert doc["dp_collectives"]["size"] == 2 and doc["dp_collectives"]["processes"] == 2
        # The cores unpinned ranks share: the simulator shares them among pp x dp.
        assert doc["conditions"]["cores"] == len(os.sched_getaffinity(0))
        assert all(v > 0 for sample in doc["dp_collectives"]["samples"]
                   for v in sample.values() if not isinstance(v, str))
        cf = read_cost_file(costs)
        timed = cf.dp_collectives
        rank0 = 4 * (cf.embedding.params + sum(c.params for c in cf.model_costs(8).layers[:5]))
        # FSDP's gather hides in part behind the first forward (ppsim.job.fsdp).
        reduce_ms = (timed.reduce_scatter.ms(rank0) + timed.all_gather.ms(rank0)
                     if case.endswith("distopt") else timed.all_reduce.ms(rank0)
                     if case.endswith("dp2") else None)
        assert main(["simulate", *run.argv, "--costs", costs, "--trace", sim]) == 0
        capsys.readouterr()
        # The run records its whole job, both replicas (it recorded one replica's tokens,
        # FLOPs and GPUs, so diff halved its tokens/s): the simulation's of the same flags.
        recorded = json.loads((run.tmp / "out" / "trace.json").read_text())["otherData"]
        assert recorded["job"] == json.loads(Path(sim).read_text())["otherData"]["job"]
        assert recorded["job"]["gpus"] == 4
        assert main(["diff", sim, str(run.tmp / "out" / "trace.json"), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        # Rank 0 holds the most parameters: its reduce is the simulation's longest.
        if reduce_ms is not None:
            assert doc["step_ops_ms"]["R"][0] == pytest.approx(reduce_ms, rel=1e-9)
        assert doc["step_ops_ms"]["R"][0] > 0 and doc["step_ops_ms"]["R"][1] > 0
        ranks = doc["ranks"]
        for r in ranks:
            pred, real = r["peak_memory_bytes"]
            assert 0 <= real - pred <= 4 + 2 * 16, (case, r["rank"], pred, real)
        peaks[case] = [r["peak_memory_bytes"][1] for r in ranks]
        assert main(["diff", sim, str(run.tmp / "out" / "trace.json")]) == 0
        out = capsys.readouterr().out
        assert reduce_ms is None or f"reduce (R) A {reduce_ms:.3f} ms" in out
        # Calibrating on the run refits the compute, not the timed collectives: they stay.
        fitted = str(tmp_path / f"{case}-calibrated.json")
        assert main(["calibrate", str(run.tmp / "out" / "trace.json"), *run.argv,
                     "--costs", costs, "--out", fitted]) == 0
        capsys.readouterr()
        assert read_cost_file(fitted).dp_collectives == timed
    assert all(s < d for s, d in zip(peaks["1f1b-dp2-distopt"], peaks["1f1b-dp2"],
                                     strict=True))
    # FSDP's shards also hold the fp32 weights and their gradients' shard.
    assert all(s < f for s, f in zip(peaks["1f1b-dp2-distopt"], peaks["1f1b-dp2-fsdp"],
                                     strict=True))
