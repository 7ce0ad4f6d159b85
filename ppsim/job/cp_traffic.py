"""Context parallelism's traffic, as the job's collectives price it (a.cp_comm_type): a
rank holds seq_length / cp tokens of each sequence, so a layer costs the model's at that
length plus the attention it computes against the other ranks' keys (causal load
balancing gives every rank 1/cp of the s x s work: cp times a chunk's own) and the
traffic its type moves; a Mamba or GatedDeltaNet mixer's all-to-alls. ppsim.job.layers
adds them to a layer's compute; ppsim.job.lanes draws them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.kv_split import held_attention_shape
from ppsim.costs.layerops import attention_ops, window_share
from ppsim.costs.mixer_split import cp_exchange
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import Accelerator
from ppsim.job.collectives import Link, all_gather_ms, all_to_all_ms, reduce_scatter_ms, send_ms
from ppsim.job.model import Job
from ppsim.job.traffic import Collective, with_forward_again


def cp_comm(job: Job, a: Architecture, acc: Accelerator, backward: bool,
            kind: str = "attention") -> Collective:
    """Context parallelism's traffic in one direction of a layer (a.cp_comm_type):
    - p2p: the K/V ring (dK, dV too in the backward), each pass hidden by one chunk's
      attention;
    - all_gather: K and V gathered before the attention, again in the backward with
      dK and dV reduce-scattered after it, all exposed (Transformer Engine's
      AttnFuncWithCPAndKVAllGather);
    - a2a: Q, K and V exchanged by all-to-all before the attention and its output
      after, the mirror in the backward, all exposed (AttnFuncWithCPAndQKVOA2A);
    - a2a+p2p: those all-to-alls over cp_a2a_size consecutive ranks, exposed, then the
      ring over cp / cp_a2a_size of them: each rank then holds cp_a2a_size times the
      tokens for 1 / cp_a2a_size of the heads, the same K/V bytes a pass, each hidden by
      cp_a2a_size chunks' attention (AttnFuncWithCPAndKVP2P with an all-to-all group).
    A DSA layer (`kind` "dsa", its cp_comm_type all_gather) gathers its own (dsa_comm)."""
    x = cp_bytes(a, kind)
    kv, cp, link, hide = x.kv, job.arch.cp, job.link("cp"), 1
    if kind == "dsa":
        return dsa_comm(x, cp, link, backward)

    def qkvo_a2a_ms(over: Link) -> float:
        """Q, K and V to 1 / (its size) of the heads, the output back."""
        return all_to_all_ms(x.qkv, over) + all_to_all_ms(x.out, over)

    if a.cp_comm_type == "all_gather":
        total = all_gather_ms(cp * kv, link) + (reduce_scatter_ms(cp * kv, link)
                                                if backward else 0.0)
        return Collective(group="cp", total_ms=total, exposed_ms=total)
    if a.cp_comm_type == "a2a":
        total = qkvo_a2a_ms(link)
        return Collective(group="cp", total_ms=total, exposed_ms=total)
    exposed = 0.0
    if a.cp_comm_type == "a2a+p2p":
        hide = job.arch.cp_a2a_size
        cp, link = cp // hide, job.link("cp_p2p")
        exposed = qkvo_a2a_ms(job.link("cp_a2a"))
    core = chunk_core(a, acc)  # each pass hides behind a chunk's core
    one = send_ms(2 * kv if backward else kv, link)
    return Collective(group="cp", total_ms=exposed + (cp - 1) * one,
                      exposed_ms=exposed + (cp - 1) * max(0.0, one - hide * (
                          core.backward_ms if backward else core.forward_ms)))


def dsa_comm(x: CpBytes, cp: int, link: Link, backward: bool) -> Collective:
    """DSAttention's context parallelism (Megatron's dsa.py): the forward all-gathers the
    absorbed MLA key, the compressed KV latent and its rotary part, and the lightning
    indexer's keys (gather_from_sequence_parallel_region over cp); the backward
    reduce-scatters the latent's gradient alone: the gathered key is kept for it, not
    gathered again, and the indexer's keys take no gradient (computed under no_grad
    without the indexer loss, which ppsim does not price). All exposed."""
    if backward:
        total = reduce_scatter_ms(cp * x.kv, link)
    else:
        total = all_gather_ms(cp * x.kv, link) + all_gather_ms(cp * x.index_keys, link)
    return Collective(group="cp", total_ms=total, exposed_ms=total)


@dataclass(frozen=True, kw_only=True)
class CpBytes:
    """What a context-parallel rank's attention moves of one microbatch (cp_comm)."""

    kv: float
    """Its K and V, as the tensor ranks hold them: one ring pass, one gathered share."""
    qkv: float
    """Its Q, K and V: what the a2a types' first all-to-all sends."""
    out: float
    """Its attention output: what their second all-to-all sends."""
    index_keys: float = 0.0
    """A DSA layer's lightning-indexer keys (dsa_comm)."""


def cp_bytes(a: Architecture, kind: str = "attention") -> CpBytes:
    """CpBytes of a layer of `kind` attending as `a` (one context-parallel rank's view),
    in the training dtype, per tensor rank. A DSA layer's K/V is MLA's absorbed key, one
    head of kv_lora_rank + qk_rope_head_dim, and its indexer's keys one head of
    dsa_indexer_head_dim, both whole on every tensor rank (gathered over tp first under
    sequence parallelism: DSAttention.forward, DSAIndexer.forward_before_topk)."""
    sh, w = held_attention_shape(a), DTYPE_BYTES[a.dtype]  # K and V as the ranks hold them
    tokens = a.seq_length * a.micro_batch_size / a.tp  # this rank's, per tensor rank
    if kind == "dsa":
        whole = a.seq_length * a.micro_batch_size * w
        return CpBytes(kv=whole * (a.kv_lora_rank + a.qk_rope_head_dim), qkv=0.0, out=0.0,
                       index_keys=whole * a.dsa_indexer_head_dim)
    return CpBytes(kv=tokens * (sh.k + sh.v) * w, qkv=tokens * (sh.q + sh.k + sh.v) * w,
                   out=tokens * sh.out * w)


@dataclass(frozen=True, kw_only=True)
class ChunkCore:
    """One context-parallel chunk's attention core, all the keys before each query."""

    forward_ms: float
    backward_ms: float


@lru_cache(maxsize=1024)
def chunk_core(a: Architecture, acc: Accelerator) -> ChunkCore:
    """The attention core of one rank's chunk of `a` (cached: a layer's traffic reads it
    once a pass and direction)."""
    att = next(op for op in attention_ops(a) if op.attention)
    f, b, _, _, _ = op_times(acc.roofline(), att)
    return ChunkCore(forward_ms=f, backward_ms=b)


def cp_traffic(job: Job, a: Architecture, acc: Accelerator, again: bool,
               kind: str = "attention") -> tuple[Collective, Collective]:
    """Context parallelism's forward and backward traffic of a layer of `kind`; the
    backward's holds the forward's again where the attention is recomputed (`again`)."""
    f = cp_comm(job, a, acc, False, kind)
    return f, with_forward_again(f, cp_comm(job, a, acc, True, kind), again)


def cp_attention_ms(job: Job, a: Architecture, acc: Accelerator, window: int = 0,
        again: bool = False, kind: str = "attention") -> tuple[float, float]:
    """(forward, backward) ms the rest of the attention and the exposed traffic add to a
    layer attending over `window`: every rank does 1 / cp of the whole sequence's work
    (its chunks, or with a2a its heads), of which its own chunk's is priced already; a
    recomputed attention (`again`) runs the rest's forward in the backward too."""
    cp = job.arch.cp
    if cp == 1:
        return 0.0, 0.0
    core = chunk_core(a, acc)
    f, b = core.forward_ms, core.backward_ms
    # f, b: a chunk's full causal core; the whole sequence's is cp x cp chunks' worth / cp.
    rest = cp * window_share(a.seq_length * cp, window) - window_share(a.seq_length, window)
    fwd, bwd = cp_traffic(job, a, acc, again, kind)
    return rest * f + fwd.exposed_ms, rest * (b + f * again) + bwd.exposed_ms



def cp_mixer_comm(job: Job, a: Architecture, kind: str) -> Collective:
    """A Mamba or GatedDeltaNet mixer's context-parallel all-to-alls in one direction of
    a microbatch (the backward mirrors the forward's): its in_proj output to the whole
    sequence at 1 / cp of the heads before the conv and the scan, the gated output back
    after (ppsim.costs.mixer_split), in the training dtype, on the compute stream, so all
    of it exposed. `a`: one context-parallel rank's view (seq_length / cp)."""
    ms = sum(all_to_all_ms(nbytes, job.link("cp")) for nbytes in cp_mixer_bytes(a, kind))
    return Collective(group="cp", total_ms=ms, exposed_ms=ms)


def cp_mixer_bytes(a: Architecture, kind: str) -> tuple[float, float]:
    """What each of cp_mixer_comm's two all-to-alls sends: the rank's tokens at the
    exchanged widths before and after the scan, in the training dtype."""
    x = cp_exchange(a, kind)
    channel_bytes = a.seq_length * a.micro_batch_size * DTYPE_BYTES[a.dtype]  # its tokens'
    return channel_bytes * x.before, channel_bytes * x.after
