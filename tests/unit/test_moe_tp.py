"""Tensor parallelism in MoE layers and hybrid blocks, as Megatron runs it with sequence
parallelism: a MoE layer gathers the sequence before its attention and scatters it after,
but its experts' tokens travel by the dispatcher, which with the all-to-all dispatcher
all-gathers over tp the tokens each rank's experts received (s x top_k of them, Megatron's
dispatch_postprocess) and reduce-scatters their outputs (combine_preprocess); DeepEP,
over the tp x ep group, needs neither. Each hybrid block is one sublayer (one gather and
one scatter); a hybrid MoE block has only the dispatcher's. Priced against the closed form
(nccl-tests' all-gather: (n - 1) alpha + (n - 1) / n x S / B, here inside one node:
450 GB/s and 1 us a step on the H100 preset)."""

from __future__ import annotations

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.layers import layer_collectives
from ppsim.job.model import build_job


def gather_ms(nbytes: float, n: int = 2) -> float:
    return (n - 1) * 1e-3 + (n - 1) / n * nbytes / 450e6


def _tp(model: dict, dispatcher: str = "alltoall", kind: str = "moe") -> tuple[float, float]:
    cfg = config_from_dict({
        "model": {**model, "tp": 2, "dp": 8, "micro_batch_size": 1},
        "pipeline": {"pp": 1, "global_batch_size": 8, "moe_token_dispatcher_type": dispatcher},
        "hardware": {"preset": "h100-80gb"}})
    job, acc = build_job(cfg), accelerator(cfg.hardware)
    layer = transformer_costs(job.arch, acc).layers[0]
    comm = layer_collectives(job, job.arch, acc, kind, layer)
    f, b = ([c.total_ms for c in side if c.group == "tp"] for side in (comm.forward,
                                                                      comm.backward))
    return f[0] if f else 0.0, b[0] if b else 0.0


QWEN = {"preset": "qwen3-235b-a22b", "num_layers": 2, "ep": 4, "seq_length": 4096}


def test_a_moe_layer_gathers_for_its_attention_and_its_dispatcher() -> None:
    s, h, k = 4096, 4096, 8
    attention = 2 * gather_ms(s * h * 2)  # one all-gather and one reduce-scatter
    again = gather_ms(s * h * 2)  # the backward's gather of QKV's input, for its wgrad
    dispatcher = 2 * gather_ms(s * k * h * 2)  # the experts' linears gather nothing again
    f, b = _tp(QWEN)
    assert f == pytest.approx(attention + dispatcher, rel=1e-9)
    assert b == pytest.approx(attention + again + dispatcher, rel=1e-9)


def test_deepep_gathers_only_for_the_attention() -> None:
    f, b = _tp(QWEN, dispatcher="flex")
    assert f == pytest.approx(2 * gather_ms(4096 * 4096 * 2), rel=1e-9)
    assert b == pytest.approx(3 * gather_ms(4096 * 4096 * 2), rel=1e-9)  # QKV's input again


def test_a_dense_layer_keeps_its_two_sublayers() -> None:
    f, _ = _tp({"preset": "llama3-8b", "num_layers": 2, "seq_length": 4096}, kind="dense")
    assert f == pytest.approx(4 * gather_ms(4096 * 4096 * 2), rel=1e-9)


@pytest.mark.parametrize("kind, sublayers, routed", [("mamba", 1, False), ("attention", 1, False),
                                                     ("mlp", 1, False), ("moe-mlp", 0, True)])
def test_a_hybrid_block_is_one_sublayer(kind: str, sublayers: int, routed: bool) -> None:
    model = {"preset": "tiny-hybrid", "seq_length": 2048, "ep": 1}
    cfg = config_from_dict({"model": model})
    a = cfg.model.arch
    f, _ = _tp(model, kind=kind)
    e = {"fp32": 4, "bf16": 2}[a.dtype]
    want = 2 * sublayers * gather_ms(2048 * a.hidden_size * e)
    if routed:
        want += 2 * gather_ms(2048 * a.top_k * a.hidden_size * e * a.expert_load)
    assert f == pytest.approx(want, rel=1e-9)


def _job(ep: int, dispatcher: str = "flex"):
    cfg = config_from_dict({
        "model": {**QWEN, "ep": ep, "tp": 2, "dp": 8, "micro_batch_size": 1},
        "pipeline": {"pp": 1, "global_batch_size": 8, "moe_token_dispatcher_type": dispatcher},
        "hardware": {"preset": "h100-80gb"}})
    return build_job(cfg)


@pytest.mark.parametrize("ep", [1, 4])
def test_deepep_reaches_every_tensor_parallel_piece_of_a_tokens_experts(ep: int) -> None:
    """Megatron runs DeepEP over the tp x ep group (here 2 x ep GPUs of one node), each
    expert in tp pieces: a rank's s / tp tokens each reach the GPUs of the tensor-parallel
    groups holding its top-8 of 128 experts, over NVLink: (2 ep - 1) x P(a group holds
    one) copies, P = 1 - C(128 - 128 / ep, 8) / C(128, 8), each way and direction."""
    from math import comb

    from ppsim.job.layers import ep_all_to_all_ms
    job = _job(ep)
    hit = 1 - comb(128 - 128 // ep, 8) / comb(128, 8)
    token_bytes = 4096 // 2 * 4096 * 2
    one = (2 * ep - 1) * 1e-3 + token_bytes * (2 * ep - 1) * hit / 450e6
    assert ep_all_to_all_ms(job, job.arch) == pytest.approx(2 * one, rel=1e-9)
