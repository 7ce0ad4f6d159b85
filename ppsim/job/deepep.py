"""What DeepEP's normal kernels hold on each GPU under Megatron's flex dispatcher: SMs
while they run, and one communication buffer per process.

Megatron (megatron/core/transformer/moe/token_dispatcher.py, MoEFlexTokenDispatcher)
runs DeepEP over the tensor x expert parallel group with 20 SMs unless
--moe-flex-dispatcher-num-sms says otherwise, and sizes its one buffer
(fused_a2a.get_buffer) as the larger of DeepEP's size hints for its recommended
dispatch and combine configurations at the group's size (deepseek-ai/DeepEP,
deep_ep Buffer.get_dispatch_config / get_combine_config and csrc Config's
get_nvl_buffer_size_hint / get_rdma_buffer_size_hint): per channel (two SMs), receive
queues of whole tokens with their top-k indices, weights and scales for each NVLink peer
of the node, and, across nodes, twice that for each RDMA peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError

DEFAULT_SMS = 20
"""The SMs Megatron gives DeepEP when --moe-flex-dispatcher-num-sms is unset."""
NVL_PEERS = 8
"""GPUs of a node DeepEP reaches over NVLink (its LEGACY_NUM_MAX_NVL_PEERS)."""
MAX_TOPK = 128
"""Top-k entries a queue slot has room for (kNumMaxTopK)."""
MAX_SCALES = 128
"""Scales a queue slot has room for (kNumMaxScales)."""
INDEX_BYTES = 8
"""A top-k index (topk_idx_t: 64 bits unless DeepEP is built otherwise)."""
SOURCE_META_BYTES = 8
"""Where a forwarded token came from (two ints)."""


@dataclass(frozen=True)
class Queues:
    """One recommended configuration's receive queues, in tokens per channel and peer."""

    nvl_recv: int
    """num_max_nvl_chunked_recv_tokens."""
    rdma_send: int
    """num_max_rdma_chunked_send_tokens: the RDMA queue is rounded up to a multiple."""
    rdma_recv: int
    """num_max_rdma_chunked_recv_tokens, before that rounding."""


def _queues(nvl: int, rdma_send: int) -> Queues:
    return Queues(nvl_recv=nvl, rdma_send=rdma_send, rdma_recv=128)


DISPATCH = {2: _queues(256, 6), 4: _queues(256, 6), 8: _queues(256, 6), 16: _queues(288, 20),
            24: _queues(288, 8), 32: _queues(288, 8), 48: _queues(288, 8), 64: _queues(288, 8),
            96: _queues(480, 12), 128: _queues(560, 12), 144: _queues(720, 12),
            160: _queues(720, 12)}
"""DeepEP's recommended dispatch configuration by group size (the sizes it supports)."""
COMBINE = {2: _queues(256, 6), 4: _queues(256, 6), 8: _queues(256, 6), 16: _queues(288, 12),
           24: _queues(288, 8), 32: _queues(288, 8), 48: _queues(288, 8), 64: _queues(288, 8),
           96: _queues(480, 8), 128: _queues(560, 8), 144: _queues(720, 8),
           160: _queues(720, 8)}
"""And its combine configuration."""


def _round(n: int, to: int) -> int:
    return -(-n // to) * to


def nvl_bytes(q: Queues, hidden_bytes: int, ranks: int, sms: int) -> int:
    """The NVLink buffer: per channel and node peer, queue heads and tails, and the
    queue's tokens with their source, top-k indices and weights, and scales."""
    channels, peers = sms // 2, min(ranks, NVL_PEERS)
    rdma_ranks = max(ranks // NVL_PEERS, 1)
    slot = hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * (INDEX_BYTES + 4) + MAX_SCALES * 4
    total = channels * peers * ((2 * rdma_ranks + 3) * 4 + q.nvl_recv * slot)
    return _round(total, 128)


def rdma_bytes(q: Queues, hidden_bytes: int, ranks: int, sms: int) -> int:
    """The RDMA buffer (none inside one node): per channel and other node, send and
    receive halves of the queue, each token as in nvl_bytes plus a 16-byte tail."""
    if ranks <= NVL_PEERS:
        return 0
    channels, nodes = sms // 2, ranks // NVL_PEERS
    recv = _round(q.rdma_recv, q.rdma_send)
    slot = hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * (INDEX_BYTES + 4) + MAX_SCALES * 4 + 16
    total = channels * nodes * ((NVL_PEERS * 2 + 2) * 2 * 4 + 2 * recv * slot)
    return _round(total, 128)


def check(ranks: int, sms: int) -> None:
    """UserError for a group DeepEP has no configuration for, or an odd SM count across
    nodes (its channels pair the SMs)."""
    if ranks not in DISPATCH:
        raise UserError("model.ep", f"tp x ep = {ranks}: DeepEP has no configuration for "
                        f"that many ranks (Unsupported number of EP ranks: {ranks})",
                        "give tp x ep one of " + ", ".join(map(str, DISPATCH)) + ", or "
                        "--moe-token-dispatcher-type alltoall")
    if ranks > NVL_PEERS and sms % 2:
        raise UserError("pipeline.moe_flex_dispatcher_num_sms", f"{sms} SMs: across nodes "
                        "DeepEP pairs them into channels", f"give an even count, e.g. {sms + 1}")


def buffer_bytes(ranks: int, hidden: int, sms: int = DEFAULT_SMS) -> int:
    """The bytes Megatron's one DeepEP buffer takes on each GPU of a tensor x expert
    parallel group of `ranks` (tokens of `hidden` bf16 values; FP8 ones take no less,
    Megatron sizes them at 2 bytes a value); 0 for a group of one."""
    if ranks <= 1:
        return 0
    check(ranks, sms)
    hidden_bytes = 2 * hidden
    configs = (DISPATCH[ranks], COMBINE[ranks])
    return (max(nvl_bytes(q, hidden_bytes, ranks, sms) for q in configs)
            + max(rdma_bytes(q, hidden_bytes, ranks, sms) for q in configs))
