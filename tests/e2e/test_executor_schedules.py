"""The newer schedules run for real: 2 torchrun ranks over gloo, nothing mocked.

Interleaved 1F1B with a microbatch count that is not a multiple of pp, torch's
interleaved zero bubble, and an order read from the CSV torch's own DualPipeV
writes (OVERLAP_F_B, a whole B beside I/W, send/recv and REDUCE_GRAD cells)
each give the single-process loss and gradients. torch's engine runs every
schedule torch has on the same split, and a CSV's order through torch's
`_load_csv`, with the same losses as ppsim's engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ppsim.config.schema import load_config  # noqa: E402
from ppsim.executor.builders.gpt import GPTShape  # noqa: E402
from ppsim.executor.reference import reference_step  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPE = GPTShape.from_fields(load_config(None).model.fields())
V = ["--pp", "2", "--vpp", "2", "--split", "2,3,2,1"]
CASES = {
    "interleaved-m3": ["--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2",
                       "--split", "3,1,2,2", "--microbatches", "3"],
    "interleaved-zb": ["--schedule", "interleaved-zb", "--pp", "2", "--vpp", "2",
                       "--split", "2,2,1,3", "--microbatches", "4"],
    "torch-dualpipev-csv": [*V, "--microbatches", "4", "--actions-csv", "{tmp}/dualpipev.csv"],
    "zbv": ["--schedule", "zbv", *V, "--microbatches", "4"],
    "dualpipev": ["--schedule", "dualpipev", *V, "--microbatches", "4"],
    "zb-h1": ["--schedule", "zb-h1", "--pp", "2", "--split", "5,3", "--microbatches", "4"],
    "1f1b-recompute-full": ["--schedule", "1f1b", "--pp", "2", "--split", "4,4",
                            "--microbatches", "4", "--recompute", "full"],
}
PEERS = ["interleaved-zb", "zbv", "dualpipev", "zb-h1", "torch-dualpipev-csv",
         "1f1b-recompute-full"]


def _torch_dualpipev_csv(path: Path) -> None:
    """The CSV torch's ScheduleDualPipeV writes, with its send/recv actions."""
    from torch.distributed.pipelining import schedules as ts

    # Building an order reads only these fields of a stage; no process group talks.
    stages = [types.SimpleNamespace(group_size=2, group_rank=0, num_stages=4, stage_index=i,
                                    submod=torch.nn.Identity(), is_first=i == 0,
                                    is_last=i == 3) for i in range(2)]
    ts.ScheduleDualPipeV(stages, 4)._dump_csv(str(path), format="compute_comms")


def ppsim_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "ppsim.cli", "run", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)


_RUNS: dict[tuple[str, str], tuple[Path, dict]] = {}


def launched(case: str, engine: str, factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    if (case, engine) not in _RUNS:
        tmp = factory.mktemp(f"{case}-{engine}")
        _torch_dualpipev_csv(tmp / "dualpipev.csv")
        argv = [a.format(tmp=tmp) for a in CASES[case]]
        extra = ["--dump-grads", str(tmp / "grads")] if engine == "ppsim" else []
        res = ppsim_run(*argv, "--engine", engine, "--iterations", "2", "--warmup", "1",
                        "--trace-dir", str(tmp / "out"), "--json", *extra)
        assert res.returncode == 0, res.stderr
        _RUNS[(case, engine)] = (tmp, json.loads(res.stdout))
    return _RUNS[(case, engine)]


@pytest.mark.parametrize("case", ["interleaved-m3", "interleaved-zb", "torch-dualpipev-csv"])
def test_loss_and_grads_match_single_process(case, tmp_path_factory) -> None:
    tmp, summary = launched(case, "ppsim", tmp_path_factory)
    m = int(CASES[case][CASES[case].index("--microbatches") + 1])
    loss, grads = reference_step(SHAPE, m)
    got: dict[str, torch.Tensor] = {}
    for r in range(2):
        got.update(torch.load(tmp / f"grads.rank{r}.pt")["grads"])
    assert set(got) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert summary["losses"][0] == pytest.approx(loss, rel=1e-5)
    assert summary["losses"][1] < summary["losses"][0]


@pytest.mark.parametrize("case", PEERS)
def test_torch_engine_runs_the_schedule_with_equal_losses(case, tmp_path_factory) -> None:
    _, ours = launched(case, "ppsim", tmp_path_factory)
    _, peer = launched(case, "torch", tmp_path_factory)
    assert peer["engine"] == "torch" and peer["iteration_time_ms"] > 0
    # Same weights, data and order: the losses agree before and after a step.
    assert peer["losses"] == pytest.approx(ours["losses"], rel=1e-5)
    # Both engines build the stages with the run's recompute mode.
    want = CASES[case][CASES[case].index("--recompute") + 1] if "--recompute" in CASES[case] \
        else "none"
    assert peer["recompute"] == [want]


def test_torch_engine_refuses_a_count_torch_refuses(tmp_path) -> None:
    res = ppsim_run("--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2", "--split",
                    "2,2,2,2", "--microbatches", "5", "--engine", "torch",
                    "--trace-dir", str(tmp_path / "t"))
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "ScheduleInterleaved1F1B" in line[0] and "Megatron" in line[0]
