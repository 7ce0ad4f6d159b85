"""The newer schedules run for real: 2 torchrun ranks over gloo, nothing mocked.

Interleaved 1F1B with a microbatch count that is not a multiple of pp, torch's
interleaved zero bubble, and an order read from the CSV torch's own DualPipeV
writes (OVERLAP_F_B, a whole B beside I/W, send/recv and REDUCE_GRAD cells)
each give the single-process loss and gradients. torch's engine runs every
schedule torch has on the same split, and a CSV's order through torch's
`_load_csv`, with the same losses as ppsim's engine.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launches import Pool  # noqa: E402

from ppsim.cli.main import main
from ppsim.config.schema import load_config  # noqa: E402
from ppsim.executor.builders.gpt import GPTShape  # noqa: E402
from ppsim.executor.reference import reference_step  # noqa: E402

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
