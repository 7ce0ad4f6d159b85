"""ppsim.executor.peertrace on one process (a gloo group of one): torch's own 1F1B on one
stage, its F and B timed through the stage's methods, the loss inside the F.
Two ranks and every op kind for real: tests/e2e/test_executor_schedules.py."""

from __future__ import annotations

import time
import types

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from ppsim.executor.peertrace import OpTrace  # noqa: E402
from ppsim.executor.recorder import Recorder  # noqa: E402

LOSS_S = 0.03
"""How long the loss takes: torch computes it outside the stage's forward."""
M = 3


def _slow_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    time.sleep(LOSS_S)
    return nn.functional.mse_loss(out, target)


SPLIT = types.SimpleNamespace(stage_chunk=lambda stage: 0)
"""One stage, chunk 0 (the OpTrace reads only this of a ppsim split)."""


def _one_step(stage_cls: type) -> tuple[Recorder, OpTrace]:
    from torch.distributed import pipelining

    torch.manual_seed(0)
    stage = stage_cls(nn.Linear(4, 4), 0, 1, torch.device("cpu"))
    runner = pipelining.Schedule1F1B(stage, M, loss_fn=_slow_loss)
    rec = Recorder(0, torch.device("cpu"), 0, 0, memory=False)
    trace = OpTrace(rec, SPLIT, [stage], runner)
    rec.begin_iteration(0)
    runner.step(torch.randn(M * 2, 4), target=torch.randn(M * 2, 4), losses=[],
                return_outputs=False)
    rec.end_iteration()
    return rec, trace


def test_each_forward_and_backward_is_recorded_with_its_loss(group) -> None:
    from torch.distributed import pipelining

    rec, trace = _one_step(pipelining.PipelineStage)
    assert trace.hooked
    ops = sorted((e for e in rec.events if e.get("cat") == "compute"), key=lambda e: e["ts"])
    assert sorted((e["args"]["kind"], e["args"]["microbatch"]) for e in ops) == \
        sorted((k, i) for k in "FB" for i in range(M))
    assert all(e["args"]["chunk"] == 0 and e["args"]["stage"] == 0 for e in ops)
    for e in ops:
        if e["args"]["kind"] == "F":  # the last stage's F ends after its loss
            assert e["dur"] >= LOSS_S * 1e6
    for a, b in zip(ops, ops[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    assert not [e for e in rec.events if e.get("cat") == "memory"]


def test_a_stage_without_a_method_is_timed_whole(group, capsys) -> None:
    """A torch whose stages lack one of the methods: nothing hooked, a note, the step
    still runs."""
    from torch.distributed import pipelining

    class Older(pipelining.PipelineStage):
        backward_weight_one_chunk = None

    rec, trace = _one_step(Older)
    assert not trace.hooked and not rec.events
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "backward_weight_one_chunk" in err[0] and "per iteration" in err[0]
