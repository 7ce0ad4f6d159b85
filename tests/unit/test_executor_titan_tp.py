"""The executor's column-parallel linears under sequence parallelism over two real gloo
ranks: Megatron's keep this rank's tokens and gather them again in the backward;
torchtitan's (TensorGroup.saves_gathered) keep the gathered input and gather nothing
there (the flag set from the config's architecture, Architecture.saves_gathered_inputs:
torchtitan's FSDP2 at tp above 1). Both give the same outputs and gradients, and the
comm clock times only the collectives that ran. So do torchtitan's latent attention
(the input gathered once, the latents whole on every rank) and MoE without expert
parallelism (every rank routing the gathered tokens), beside Megatron's."""

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
from ppsim.executor.builders.llama import LlamaShape
from ppsim.executor.builders.mla import LatentAttention
from ppsim.executor.builders.moe import MoE, init_experts
from ppsim.executor.builders.tensor import (
    TensorGroup,
    column_parallel,
    current,
    set_group,
    sliced,
)
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
    out[rank] = _layers()
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
        return dict(out)


def test_both_give_the_same_outputs_and_gradients(ran) -> None:
    megatron, titan = ran["results"][False], ran["results"][True]
    for a, b in zip(megatron["ys"] + megatron["grads"], titan["ys"] + titan["grads"],
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_torchtitans_backward_gathers_nothing(ran) -> None:
    """Forward: the input's all-gather, each way. Backward: Megatron's gathers the input
    again and reduce-scatters its gradient; torchtitan's only reduce-scatters."""
    assert ran["results"][False]["seen"] == {"forward": ["tp"], "backward": ["tp", "tp"]}
    assert ran["results"][True]["seen"] == {"forward": ["tp"], "backward": ["tp"]}


def test_torchtitan_keeps_the_gathered_input(ran) -> None:
    assert ran["results"][False]["saved"] == [(1, TOKENS, HIDDEN)]
    assert ran["results"][True]["saved"] == [(1, 2 * TOKENS, HIDDEN)]


LAYER_FIELDS = {"preset": "tiny-gpt", "tp": 2, "gated_mlp": True, "norm": "rmsnorm",
                "position": "rotary", "attention": "mla", "q_lora_rank": 32,
                "kv_lora_rank": 24, "qk_rope_head_dim": 8, "head_dim": 16, "v_head_dim": 12,
                "layers": "dense, moe", "num_experts": 4, "top_k": 2,
                "moe_ffn_hidden_size": 96, "shared_expert_ffn_hidden_size": 40}
"""Latent attention and a MoE layer (its shared-expert MLP 40 wide) at tp 2."""


def _layer_step(make: Any, tokens: torch.Tensor, g: TensorGroup) -> dict[str, Any]:
    """A layer built whole from its seed and sliced (ppsim.executor.builders.tensor.sliced)
    on this rank's tokens: the collectives each way, whether autograd kept every token
    of a hidden-wide activation, the output and the input's gradient."""
    torch.manual_seed(1)
    layer = sliced(make())
    n = tokens.shape[1] // g.size
    x = tokens[:, g.rank * n:(g.rank + 1) * n].clone().requires_grad_(True)
    clock, widths = _Clock(), set()
    set_sink(clock)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: widths.add(tuple(t.shape[-2:])) or t, lambda t: t):
        y = layer(x)
    clock.phase = "backward"
    (y * y).sum().backward()
    set_sink(None)
    whole = (tokens.shape[1], tokens.shape[2]) in widths
    return {"seen": clock.seen, "whole": whole, "y": y.detach(), "grad": x.grad}


def _layers() -> dict[bool, dict[str, Any]]:
    """MLA and the MoE layer, Megatron's and torchtitan's, stepped on this rank."""
    results = {}
    for titan in (False, True):
        a = config_from_dict({"model": {**LAYER_FIELDS, "fsdp": titan}}).model.arch
        rank_groups(dist.get_rank(), 1, 1, a)
        g = current()
        assert g is not None
        s = LlamaShape(a, (), ())
        tokens = torch.randn(1, 2 * TOKENS, a.hidden_size,
                             generator=torch.Generator().manual_seed(2))

        def moe(s: LlamaShape = s) -> MoE:
            m = MoE(s)
            init_experts(m, 2)
            return m

        results[titan] = {"mla": _layer_step(lambda s=s: LatentAttention(s), tokens, g),
                          "moe": _layer_step(moe, tokens, g)}
    return results


@pytest.fixture(scope="module")
def layers(ran) -> dict[int, dict[bool, dict[str, Any]]]:
    """Each rank's layer results (the same two processes as `ran`)."""
    return {rank: ran[rank] for rank in (0, 1)}


@pytest.mark.parametrize("kind", ["mla", "moe"])
def test_torchtitans_layers_give_megatrons_outputs_and_gradients(layers, kind) -> None:
    for rank in (0, 1):
        megatron, titan = layers[rank][False][kind], layers[rank][True][kind]
        torch.testing.assert_close(titan["y"], megatron["y"])
        torch.testing.assert_close(titan["grad"], megatron["grad"])


def test_torchtitans_mla_gathers_its_input_once_and_keeps_the_latents_whole(layers) -> None:
    """Megatron's gathers the query latent, the key/value latent and the rotary key for
    the up projections (each again in the backward but the rotary key), its down
    projections on this rank's tokens; torchtitan's gathers the layer's input once and
    runs them on every token (ppsim.costs.saved.GATHERED)."""
    megatron, titan = layers[0][False]["mla"], layers[0][True]["mla"]
    assert megatron["seen"]["forward"] == ["tp"] * 4 and not megatron["whole"]
    assert titan["seen"] == {"forward": ["tp", "tp"], "backward": ["tp", "tp"]}
    assert titan["whole"]


def test_torchtitans_moe_routes_the_gathered_tokens(layers) -> None:
    """Without expert parallelism torchtitan's MoE gathers the layer's input and routes
    all of it on every rank through its slice of each expert, the partial sums
    reduce-scattered back (Architecture.routes_gathered_tokens): a dense MLP's two
    collectives, no dispatcher's (Megatron's gathers the counts and the pairs)."""
    megatron, titan = layers[0][False]["moe"], layers[0][True]["moe"]
    assert len(megatron["seen"]["forward"]) > 2 and not megatron["whole"]
    assert titan["seen"] == {"forward": ["tp", "tp"], "backward": ["tp", "tp"]}
    assert titan["whole"]
