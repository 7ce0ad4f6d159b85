"""The executor's column-parallel linears under sequence parallelism over two real gloo
ranks: Megatron's keep this rank's tokens and gather them again in the backward;
torchtitan's (TensorGroup.saves_gathered) keep the gathered input and gather nothing
there (the flag set from the config's architecture, Architecture.saves_gathered_inputs:
torchtitan's FSDP2 at tp above 1). Both give the same outputs and gradients, and the
comm clock times only the collectives that ran."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ppsim.config.schema import config_from_dict
from ppsim.executor.builders.comm_clock import set_sink
from ppsim.executor.builders.tensor import TensorGroup, column_parallel, current, set_group
from ppsim.executor.groups import rank_groups

TOKENS, HIDDEN = 32, 16  # this rank's tokens of 64


class _Clock:
    """A recorder's part the comm clock reports to: each collective's group, by phase."""

    def __init__(self) -> None:
        self.phase = "forward"
        self.seen: dict[str, list[str]] = {"forward": [], "backward": []}

    def mark(self) -> float:
        return time.perf_counter()

    def collective(self, group: str, start: Any, end: Any) -> None:
        self.seen[self.phase].append(group)


def _step(g: TensorGroup) -> dict[str, Any]:
    """Two column-parallel linears of one input on this rank's tokens: what autograd
    saved (shapes), the collectives each way, the outputs and the gradients."""
    torch.manual_seed(0)
    lins = tuple(torch.nn.Linear(HIDDEN, 8) for _ in range(2))
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    clock, saved = _Clock(), []
    set_sink(clock)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        ys = column_parallel(x, g, *lins)
    clock.phase = "backward"
    sum((y * y).sum() for y in ys).backward()
    set_sink(None)
    return {"saved": saved, "seen": clock.seen, "ys": [y.detach() for y in ys],
            "grads": [x.grad, *(p.grad for lin in lins for p in lin.parameters())]}


def _arch(titan: bool) -> Any:
    """tiny-gpt at tp 2 (sequence parallel), torchtitan's with --fsdp."""
    return config_from_dict({"model": {"preset": "tiny-gpt", "tp": 2, "fsdp": titan}}
                            ).model.arch


def _both(rank: int, port: int, out: Any) -> None:
    """Each config's tensor group as a run builds it (ppsim.executor.groups), stepped."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    for titan in (False, True):
        rank_groups(rank, 1, 1, _arch(titan))
        g = current()
        assert g is not None and g.sequence_parallel
        results[titan] = _step(g)
    set_group(None)
    if rank == 0:
        out["results"] = results
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ran() -> dict[bool, dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_both, args=(port, out), nprocs=2)
        return dict(out["results"])


def test_both_give_the_same_outputs_and_gradients(ran) -> None:
    megatron, titan = ran[False], ran[True]
    for a, b in zip(megatron["ys"] + megatron["grads"], titan["ys"] + titan["grads"],
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_torchtitans_backward_gathers_nothing(ran) -> None:
    """Forward: the input's all-gather, each way. Backward: Megatron's gathers the input
    again and reduce-scatters its gradient; torchtitan's only reduce-scatters."""
    assert ran[False]["seen"] == {"forward": ["tp"], "backward": ["tp", "tp"]}
    assert ran[True]["seen"] == {"forward": ["tp"], "backward": ["tp"]}


def test_torchtitan_keeps_the_gathered_input(ran) -> None:
    assert ran[False]["saved"] == [(1, TOKENS, HIDDEN)]
    assert ran[True]["saved"] == [(1, 2 * TOKENS, HIDDEN)]
