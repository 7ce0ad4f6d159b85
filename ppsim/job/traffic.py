"""A layer's tensor-parallel traffic, as the job's collectives price it: sequence-parallel
gathers and scatters, or all-reduces without sequence parallelism (and the all-to-all
dispatcher's over etp), and what of a layer's forward traffic a recomputing backward runs
again (Recomputed; context parallelism's: ppsim.job.cp_traffic). ppsim.job.layers adds
them to a layer's compute; ppsim.job.lanes draws them.

With tensor parallelism (sequence parallel) each layer all-gathers before attention and
before the MLP and reduce-scatters after each, in the forward (under FP8 the gathers move
the quantized input) and mirrored in the backward, where Megatron gathers each block's
input a second time (`regathers`); a MoE layer does so for its attention and its shared
experts (tp_sublayers): its routed experts' tokens travel by the dispatcher, which with
the all-to-all one gathers over etp every token copy the rank's experts received and
scatters their outputs (`dispatcher_tp_ms`, on the compute stream, never hidden); a
hybrid block is one sublayer (SP_SUBLAYERS). Without sequence parallelism each sublayer
all-reduces its output in the forward and its input's gradient in the backward instead
(Megatron's row- and column-parallel linears).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.fp8 import fp8_bytes
from ppsim.costs.kv_split import qkv_gather_bytes
from ppsim.costs.modules import SHORTHAND, applies
from ppsim.costs.op_sac import OP_SAC_MODULE
from ppsim.job.collectives import (
    all_gather_ms,
    all_reduce_ms,
    reduce_scatter_ms,
)
from ppsim.job.model import Job
from ppsim.job.userbuffers import TpTraffic


def hidden_bytes(a: Architecture, element_bytes: float = 0) -> float:
    """One microbatch's hidden states, `element_bytes` an element (0: the training
    dtype's)."""
    return a.seq_length * a.micro_batch_size * a.hidden_size \
        * (element_bytes or DTYPE_BYTES[a.dtype])


def regathers(a: Architecture) -> bool:
    """Whether a sequence-parallel backward all-gathers each column-parallel linear's
    input again, for its weight gradient: Megatron's linears (LinearWithGradAccumulation
    AndAsyncCommunication) and Transformer Engine's save the rank's own tokens, and
    gather them beside the input-gradient GEMM (under FP8 the quantized copy, as in the
    forward; recomputed or not, the forward's gather feeds only the forward's GEMM).
    torchtitan's ColwiseParallel saves the gathered input (DTensor's matmul), so its
    backward gathers none."""
    return a.sequence_parallel and a.tp > 1 and not a.saves_gathered_inputs


def tp_collectives_ms(job: Job, a: Architecture, collectives: int,
                      element_bytes: float = 0, scatter: bool = False) -> float:
    """`collectives` all-gathers (or with `scatter` reduce-scatters) of one microbatch's
    hidden states, `element_bytes` an element (0: the training dtype's)."""
    if a.tp == 1:
        return 0.0
    priced = reduce_scatter_ms if scatter else all_gather_ms
    return collectives * priced(hidden_bytes(a, element_bytes), job.link("tp"))


def tp_reduces_ms(job: Job, a: Architecture, collectives: float) -> float:
    """`collectives` all-reduces of one microbatch's hidden states over tp."""
    if a.tp == 1:
        return 0.0
    return collectives * all_reduce_ms(hidden_bytes(a), job.link("tp"))


def edge_tp_traffic(job: Job, a: Architecture, head: bool) -> tuple[TpTraffic, TpTraffic]:
    """(forward, backward) tensor-parallel collectives of the embedding (or the `head`,
    Megatron's output layer, a ColumnParallelLinear): with sequence parallelism the
    embedding's output is reduce-scattered and the head's input gathered, the mirror in
    the backward, where Megatron's output layer gathers its input again (`regathers`);
    without it the embedding all-reduces its output and the head its input's gradient
    (the column-parallel linear's `allreduce_dgrad`). Beside learned positions Megatron's
    embedding all-reduces the words' lookup before adding them, then takes this rank's
    tokens (LanguageModelEmbedding.reduce_scatter_embeddings is off), gathered back in
    the backward."""
    gather, reduce = tp_collectives_ms(job, a, 1), tp_reduces_ms(job, a, 1)
    scatter = tp_collectives_ms(job, a, 1, scatter=True)
    if not a.sequence_parallel:
        none, reduced = TpTraffic(gathers_ms=0.0, scatters_ms=0.0), \
            TpTraffic(gathers_ms=0.0, scatters_ms=0.0, reduces_ms=reduce,
                      dgrad_reduces_ms=reduce if head else 0.0)
        return (none, reduced) if head else (reduced, none)
    if head:
        regather = gather if regathers(a) else 0.0
        return TpTraffic(gathers_ms=gather, scatters_ms=0.0), \
            TpTraffic(gathers_ms=regather, scatters_ms=scatter, regathers_ms=regather)
    lookup = TpTraffic(gathers_ms=0.0, scatters_ms=0.0, reduces_ms=reduce) \
        if a.learned_positions else TpTraffic(gathers_ms=0.0, scatters_ms=scatter)
    return lookup, TpTraffic(gathers_ms=gather, scatters_ms=0.0)


MOE_KINDS = ("moe", "moe-mlp")
"""Layer kinds whose routed tokens cross the expert-parallel group: a MoE decoder layer
and a hybrid stack's MoE block ('E')."""
SP_SUBLAYERS = {"dense": 2, "moe": 1, "moe-mlp": 0}
"""Sublayers that gather the sequence before them and scatter it after, by kind: a dense
layer's attention and MLP, a MoE layer's attention (its routed experts' tokens travel by
the dispatcher: `dispatcher_tp_ms`; its shared experts: tp_sublayers), a hybrid stack's
MoE block none; every other hybrid block (Mamba, GatedDeltaNet, attention, MLP) is one
sublayer."""


def shared_gathers(a: Architecture, kind: str) -> bool:
    """Whether a layer of `kind` is a Megatron MoE block whose shared experts gather its
    input over tp > 1 and scatter their output (SharedExpertMLP, an MLP of TE's column-
    and row-parallel linears fc1 and fc2, not expert linears: a dense MLP's collectives,
    userbuffers' under --tp-comm-overlap; under --moe-shared-expert-overlap explicit ones
    beside the dispatcher instead: ppsim.job.shared_tp)."""
    return kind in MOE_KINDS and a.shared_width > 0 and a.tp > 1 and not a.torchtitan_fsdp


def tp_sublayers(a: Architecture, kind: str, beside_dispatcher: bool = False) -> int:
    """Sublayers of a layer of `kind` that gather the sequence before them and scatter it
    after (SP_SUBLAYERS); a Megatron MoE block's shared experts are one more
    (shared_gathers) unless they run `beside_dispatcher` (--moe-shared-expert-overlap);
    under torchtitan a MoE block at tp > 1 is one more where its experts take the
    gathered tokens (Architecture.routes_gathered_tokens) or its shared experts do (their
    FeedForward's input to Replicate, w2's Partial output scattered: moe_sharding.py),
    and its dispatcher gathers nothing (dispatcher_gathers)."""
    n = SP_SUBLAYERS.get(kind, 1)
    if kind in MOE_KINDS and a.torchtitan_fsdp and a.tp > 1 and (
            a.routes_gathered_tokens or a.shared_width):
        n += 1
    return n + (shared_gathers(a, kind) and not beside_dispatcher)


def dispatcher_gathers(job: Job, a: Architecture) -> bool:
    """The all-to-all dispatcher gathers its tokens over etp > 1 (dispatcher_tp_ms):
    Megatron's; DeepEP runs over etp x ep, and torchtitan's MoE gathers the block's
    input instead (tp_sublayers)."""
    return a.expert_tp > 1 and job.moe_token_dispatcher_type != "flex" \
        and not a.torchtitan_fsdp


def tp_layer_ms(job: Job, a: Architecture, sublayers: int = 2, again: float = 0.0,
                again_scatters: float | None = None) -> tuple[TpTraffic, TpTraffic]:
    """The tensor-parallel collectives of a layer of `sublayers`, forward and
    backward: one all-gather (under FP8 of the quantized input) and one reduce-scatter
    each way per sublayer, or without sequence parallelism one all-reduce; in the
    backward the input's gather again where Megatron runs it (`regathers`), and the
    forward's share of them the recompute runs again: `again` of the gathers,
    `again_scatters` (default `again`) of the scatters and all-reduces
    (Recomputed.tp_share, scatter_share)."""
    rescatter = again if again_scatters is None else again_scatters
    if not a.sequence_parallel:
        each = tp_reduces_ms(job, a, sublayers)
        return TpTraffic(gathers_ms=0.0, scatters_ms=0.0, reduces_ms=each), \
            TpTraffic(gathers_ms=0.0, scatters_ms=0.0, reduces_ms=each * (1 + rescatter),
                      dgrad_reduces_ms=each)
    inputs = tp_collectives_ms(job, a, sublayers, fp8_bytes(a) if a.fp8_copies else 0)
    # one a sublayer, in the training dtype
    each = tp_collectives_ms(job, a, sublayers)
    scatters = tp_collectives_ms(job, a, sublayers, scatter=True)
    forward = TpTraffic(gathers_ms=inputs, scatters_ms=scatters, pipelined_ms=scatters)
    regather = inputs if regathers(a) else 0.0
    backward = TpTraffic(gathers_ms=each + inputs * again + regather,
                         scatters_ms=scatters * (1 + rescatter),
                         pipelined_ms=scatters * rescatter, regathers_ms=regather)
    return forward, backward


def dispatcher_tp_ms(job: Job, a: Architecture) -> float:
    """The all-to-all dispatcher's expert tensor-parallel step in one direction of a MoE
    layer at etp > 1 (Megatron's dispatch_postprocess and combine_preprocess, over the
    expt_tp group): an all-gather of the tokens the rank's experts received, from each of
    the etp ranks, and a reduce-scatter of their outputs; each buffer etp ranks' routed
    copies, s x top_k x etp / tp tokens (the whole sequence's at etp = tp). DeepEP runs
    over the etp x ep group and needs neither."""
    if not dispatcher_gathers(job, a):
        return 0.0
    nbytes = dispatcher_tp_bytes(a)
    return all_gather_ms(nbytes, job.link("etp")) + reduce_scatter_ms(nbytes, job.link("etp"))


def dispatcher_tp_bytes(a: Architecture) -> float:
    """The buffer of each of dispatcher_tp_ms's gather and scatter: the routed copies of
    the etp ranks, at the dispatcher's width, in the training dtype."""
    return a.expert_copies * (a.moe_latent_size or a.hidden_size) * DTYPE_BYTES[a.dtype]


def qkv_gather_ms(job: Job, a: Architecture) -> tuple[float, float]:
    """(forward, backward) ms of the all-gather of the QKV projection's output in one
    attention layer at tp above the key/value groups, and its gradient's reduce-scatter
    (ppsim.costs.kv_split): on the compute stream between the projection and the core,
    outside Transformer Engine's userbuffers, so never hidden."""
    nbytes = qkv_gather_bytes(a)
    if not nbytes:
        return 0.0, 0.0
    return all_gather_ms(nbytes, job.link("tp")), reduce_scatter_ms(nbytes, job.link("tp"))


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One group's collectives in one piece and direction, ms per microbatch."""

    group: str
    """tp, cp, ep, or dp (FSDP's gathers and reduce-scatters)."""
    total_ms: float
    """Time on the group's links."""
    exposed_ms: float
    """Of it, what no compute hides: it joins the piece's time."""


@dataclass(frozen=True, kw_only=True)
class PieceCollectives:
    """A piece's collectives, per direction (empty for tp = cp = ep = 1)."""

    forward: tuple[Collective, ...] = ()
    backward: tuple[Collective, ...] = ()


@dataclass(frozen=True)
class Recomputed:
    """The forward traffic a layer's backward runs again, because it recomputes it."""

    full: bool = False
    """The whole layer: every collective of its forward."""
    attention: bool = False
    """The attention (its core, or the whole layer): context parallelism's traffic, and
    the other chunks' attention."""
    mlp: bool = False
    """A dense MLP (`mlp`): its sequence-parallel gather and scatter, inside Transformer
    Engine's fc1 and fc2."""
    dispatch: bool = False
    """The MoE block (`moe`, or the whole layer): the dispatcher's all-to-alls and gathers
    (and the shared experts' collectives beside them, ppsim.job.shared_tp)."""
    shared: bool = False
    """A MoE block's shared experts (`shared_experts`, `moe`, or the whole layer): their
    sublayer's gather and scatter (shared_gathers)."""
    gathers: bool = False
    """Every sublayer's sequence-parallel all-gather, not its reduce-scatter: torchtitan's
    SelectiveAC saves the reduce-scatters' outputs alone (ppsim.costs.op_sac)."""

    def tp_share(self, a: Architecture, kind: str, beside_dispatcher: bool = False) -> float:
        """The share of a layer of `kind`'s sequence-parallel gathers run again (its
        shared experts' not among them `beside_dispatcher`: tp_sublayers)."""
        if self.full or self.gathers:
            return 1.0
        sublayers = tp_sublayers(a, kind, beside_dispatcher)
        again = (self.mlp and applies("mlp", a, kind)) + (
            self.shared and shared_gathers(a, kind) and not beside_dispatcher)
        return again / sublayers if sublayers else 0.0

    def scatter_share(self, a: Architecture, kind: str,
                      beside_dispatcher: bool = False) -> float:
        """The share of its reduce-scatters (or, without sequence parallelism, all-reduces,
        which SelectiveAC does not save) run again."""
        return 0.0 if self.gathers and a.sequence_parallel \
            else self.tp_share(a, kind, beside_dispatcher)


def recomputed(a: Architecture, recompute: tuple[str, ...] | None = None) -> Recomputed:
    """What the backward runs again of a layer recomputing `recompute` (Megatron's modules;
    default the global mode's, selective: core_attn) or, under full recompute, whole."""
    modules = SHORTHAND.get(a.recompute, ()) if recompute is None else recompute
    full = a.recompute == "full"
    return Recomputed(full=full, attention=full or "core_attn" in modules,
                      mlp="mlp" in modules, dispatch=full or "moe" in modules,
                      shared=full or bool({"moe", "shared_experts"} & set(modules)),
                      gathers=OP_SAC_MODULE in modules)


def with_forward_again(forward: Collective, backward: Collective, again: bool) -> Collective:
    """The backward's collective, with the forward's run again inside it when `again`."""
    if not again:
        return backward
    return replace(backward, total_ms=backward.total_ms + forward.total_ms,
                   exposed_ms=backward.exposed_ms + forward.exposed_ms)
