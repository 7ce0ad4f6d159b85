"""The newer schedules run for real: 2 torchrun ranks over gloo, nothing mocked.

Interleaved 1F1B with a microbatch count that is not a multiple of pp, torch's
interleaved zero bubble, and an order read from the CSV torch's own DualPipeV
writes (OVERLAP_F_B, a whole B beside I/W, send/recv and REDUCE_GRAD cells)
each give the single-process loss and gradients. torch's engine runs every
schedule torch has on the same split, and a CSV's order through torch's
`_load_csv`, with the same losses as ppsim's engine, and records each op it runs
(alone, as the run's trace.json; alongside ppsim's engine, as torch/trace.json).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from helpers import run_main  # noqa: E402
from launch_cases import SPECS  # noqa: E402
from launches import Pool  # noqa: E402

from ppsim.cli.main import main
from ppsim.cli.run import load_problem  # noqa: E402
from ppsim.cli.run_flags import add_run_arguments  # noqa: E402
from ppsim.config.schema import load_config  # noqa: E402
from ppsim.executor.builders.gpt import GPTShape  # noqa: E402
from ppsim.executor.reference import reference_step  # noqa: E402
from ppsim.trace.read import read_trace  # noqa: E402

SHAPE = GPTShape.from_fields(load_config(None).model.fields())
PEERS = {"interleaved-zb": "interleaved-zb", "zbv": "zbv", "dualpipev": "dualpipev",
         "zb-h1": "zb-h1-full", "torch-dualpipev-csv": "torch-dualpipev-csv",
         "1f1b-recompute-full": "1f1b-full"}
"""Each torch peer case -> the pooled launch that runs it alongside ppsim's engine
(--alongside-torch: one launch for both engines). zb-h1 and 1F1B with full recompute
ride on test_executor's zb-h1 and 1F1B launches with full recompute; the peer of torch's
engine alone (--engine torch) is test_executor's test_torch_peer_runs_the_same_split."""
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("case", ["interleaved-m3", "interleaved-zb", "torch-dualpipev-csv"])
def test_loss_and_grads_match_single_process(case, launches: Pool) -> None:
    run = launches.get(case)
    tmp, summary = run.tmp, run.summary
    m = int(run.argv[run.argv.index("--microbatches") + 1])
    loss, grads = reference_step(SHAPE, m)
    got: dict[str, torch.Tensor] = {}
    for r in range(2):
        got.update(torch.load(tmp / f"grads.rank{r}.pt")["grads"])
    assert set(got) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert summary["losses"][0] == pytest.approx(loss, rel=1e-5)
    assert summary["losses"][1] < summary["losses"][0]


@pytest.mark.parametrize("case", list(PEERS))
def test_torch_engine_runs_the_schedule_with_equal_losses(case, launches: Pool) -> None:
    run = launches.get(PEERS[case])
    ours = run.summary
    peer = ours["peer"]
    assert peer["engine"] == "torch" and peer["iteration_time_ms"] > 0
    # Same weights, data and order: the losses agree before and after a step.
    assert peer["losses"] == pytest.approx(ours["losses"], rel=1e-5)
    # Both engines build the stages with the run's recompute mode.
    argv = run.argv
    want = argv[argv.index("--recompute") + 1] if "--recompute" in argv else "none"
    assert peer["recompute"] == [want]


def test_torch_engine_refuses_a_count_torch_refuses(tmp_path, capsys) -> None:
    rc = main(["run", "--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2", "--split",
               "2,2,2,2", "--microbatches", "5", "--engine", "torch",
               "--trace-dir", str(tmp_path / "t")])
    assert rc == 2
    line = capsys.readouterr().err.strip().splitlines()
    assert len(line) == 1 and "ScheduleInterleaved1F1B" in line[0] and "Megatron" in line[0]


TRACED = {"1f1b-torch": "trace.json",
          **{c: "torch/trace.json" for c, spec in SPECS.items() if "--alongside-torch" in
             spec.extra}}
"""Launches whose torch engine records a trace -> where it lies in the run folder: alone
(--engine torch, 1F1B), and alongside ppsim's engine (every pooled launch with
--alongside-torch: ZB-H1, ZB-V, DualPipeV, interleaved ZB, a CSV's order, and 1F1B with
a tied embedding, whose two copies' reduce is the step's R)."""


@pytest.mark.parametrize("case", list(TRACED))
def test_torch_engine_records_each_action_it_runs(case, launches: Pool, tmp_path) -> None:
    """Per rank and iteration, the torch engine's trace holds the F, B and W of ppsim's
    action list for that torch schedule, each once with its chunk, then the tied copies'
    reduce (R) where there is one and the optimizer step (S); a rank's ops do not overlap
    and lie inside the iteration's timed span; and `ppsim diff` of the simulation
    against the trace matches every op."""
    run = launches.get(case)
    peer = run.summary if case == "1f1b-torch" else run.summary["peer"]
    path = run.tmp / "out" / TRACED[case]
    assert peer["engine"] == "torch" and peer["trace"] == str(path)
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    problem = load_problem(parser.parse_args(run.argv))
    sched, split = problem.schedule, problem.split
    trace = read_trace(str(path))
    # the tied copies' reduce where the ends are on two ranks (one table where one holds both)
    tied = "tied" in case and split.stage_rank(0) != split.stage_rank(split.num_stages - 1)
    assert trace.info["engine"] == "torch"
    assert trace.iterations == list(range(SPECS[case].iterations))
    whole = trace.info["whole_iteration_ms"]
    for it in trace.iterations:
        for r in range(sched.pp):
            ops = sorted((o for o in trace.ops if o.rank == r and o.iteration == it),
                         key=lambda o: o.start_us)
            assert Counter((o.kind, o.stage, o.chunk, o.microbatch) for o in ops) == Counter(
                (a.kind, a.stage, split.stage_chunk(a.stage), a.microbatch)
                for a in sched.actions[r])
            step = sorted((o for o in trace.step_ops if o.rank == r and o.iteration == it),
                          key=lambda o: o.start_us)
            assert [o.kind for o in step] == (["R", "S"] if tied else ["S"])
            ops += step
            for a, b in zip(ops, ops[1:], strict=False):
                assert a.end_us <= b.start_us + 1e-3, f"rank {r}: {a} overlaps {b}"
            # timed from this rank's barrier exit on, within the slowest rank's time
            assert ops[-1].end_us - ops[0].start_us <= whole[it] * 1e3 + 1e-3
    sim = tmp_path / "sim.json"
    code, _, err = run_main(["simulate", *run.argv, "--trace", str(sim)])
    assert code == 0, err
    code, out, err = run_main(["diff", str(sim), str(path), "--json"])
    assert code == 0, err
    d = json.loads(out)
    assert d["ops_only_in"] == [0, 0]
    assert d["ops_matched"] == sum(len(a) for a in sched.actions)
