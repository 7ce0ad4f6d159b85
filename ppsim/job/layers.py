"""A job's layer costs: one rank's share of the work plus the collectives it waits for.

A layer's tensor- and context-parallel traffic is priced in ppsim.job.traffic; here it
joins the layer with the rest: --tp-comm-overlap hides the sequence-parallel collectives
behind the layer's compute as far as it lasts, as Transformer Engine's userbuffers run
them (ppsim.job.userbuffers); without it Megatron's linears still run two of the
backward's beside its GEMMs (ppsim.job.tp_async); the gather of QKV at tp above the key/value groups
(traffic.qkv_gather_ms) it leaves exposed. Expert parallelism's dispatch and combine are
all-to-alls over the expert group's links (ppsim.job.ep_comm; --moe-shared-expert-overlap
hides them behind the shared experts' compute as far as it lasts, and runs the shared
experts' tp collectives beside them: ppsim.job.shared_tp; Megatron's combined 1F1B hides
them behind another microbatch's compute in the pairs it runs,
--overlap-moe-expert-parallel-comm: `pair_saving_ms`). The head gathers once before the
vocabulary projection, the embedding scatters once after the lookup, an MTP depth's
projection gathers and scatters around it (ppsim.job.mtp_tp). FSDP without pp gathers
and reduce-scatters each unit in every microbatch (ppsim.job.fsdp), and keeps what it
holds unsharded in the static bytes.
A recomputing backward runs its forward's traffic again (traffic.Recomputed). With
tp = cp = ep = 1 and no FSDP the costs are the model's, untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.fp8 import fp8_layers, layer_precision, mtp_layers_fp8
from ppsim.costs.kinds import (
    gathered_gemm_windows,
    head_gemm_window,
    kind_ops,
    mtp_kinds,
    piece_kinds,
)
from ppsim.costs.mixer_split import SSM_KINDS
from ppsim.costs.mixers import ATTENTION_KINDS, attention_arch
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.costs.ops import Op, op_times, piece_times
from ppsim.costs.stack import layer_windows
from ppsim.costs.transformer import Accelerator, transformer_costs
from ppsim.job import fsdp
from ppsim.job.collectives import (
    behind_compute_ms,
)
from ppsim.job.cp_traffic import cp_attention_ms, cp_mixer_comm, cp_traffic
from ppsim.job.ep_comm import ep_all_to_all_ms, ep_collectives
from ppsim.job.model import Job
from ppsim.job.mtp_tp import eh_proj_collectives
from ppsim.job.shared_tp import beside_dispatcher
from ppsim.job.tp_async import beside_gemms_ms, linear_collectives, runs_async
from ppsim.job.traffic import (
    MOE_KINDS,
    Collective,
    PieceCollectives,
    Recomputed,
    dispatcher_tp_ms,
    edge_tp_traffic,
    qkv_gather_ms,
    recomputed,
    tp_layer_ms,
    tp_sublayers,
    with_forward_again,
)
from ppsim.job.userbuffers import overlapped_ms


@dataclass(frozen=True, kw_only=True)
class Exposed:
    """Communication a piece waits for, ms per microbatch."""

    forward_ms: float = 0.0
    """Added to the forward."""
    backward_ms: float = 0.0
    """Added to the backward (its input-gradient part)."""
    pair_saving_ms: float = 0.0
    """What each of the forward and the backward saves in a combined pair (LayerCost)."""


def per_rank_arch(a: Architecture) -> Architecture:
    """The model as one context-parallel rank sees it: seq_length / cp tokens."""
    return a if a.cp == 1 else replace(a, seq_length=a.seq_length // a.cp)


def piece_fp8(a: Architecture, pieces: int) -> tuple[bool, ...]:
    """Whether each decoder layer, then each MTP layer, runs quantized (ppsim.costs.fp8;
    an MTP depth whose layers differ priced wholly as its first)."""
    layers = fp8_layers(a)
    depth = mtp_layers_fp8(a, len(mtp_kinds(a)))
    return layers + depth[:1] * (pieces - len(layers))


def pair_saving_ms(job: Job, a: Architecture, acc: Accelerator, kind: str = "moe") -> float:
    """What each of a MoE layer's forward and backward saves when Megatron's combined
    1F1B runs it beside another microbatch's backward or forward of a layer like it
    (--overlap-moe-expert-parallel-comm).

    Megatron's per-layer overlap (TransformerLayerSchedulePlan.run), one all-to-all c
    on the comm stream beside compute on the other: the backward's combine beside the
    forward's attention and router (before the dispatch); the forward's dispatch, then
    the backward's, beside the backward's experts (input and weight gradients), then
    the forward's; the backward's dispatch waits for the experts' weight gradients too,
    unless --delay-wgrad-compute runs them beside it; the forward's combine beside the
    backward's attention. What the pair still waits for, split evenly between its
    forward and backward, replaces the 2c each waits for alone. Priced from the layer's
    own ops without recompute (a repeated forward would hide a little more), so a memory
    policy never changes it and the planner's bounds stay bounds; attention over the
    whole sequence (a sliding window computes less beside the all-to-alls). Compute
    beside DeepEP's kernels runs on the SMs they leave: each hidden millisecond costs
    the dispatcher's SM share of one (Job.dispatcher_sm_share)."""
    c = ep_all_to_all_ms(job, a) / 2
    if c == 0.0:
        return 0.0
    ops = kind_ops(a, kind)  # a decoder layer, or a hybrid stack's MoE block alone
    experts = [op for op in ops if op.name.startswith(("experts.", "shared."))]
    rest = [op for op in ops if not op.name.startswith(("experts.", "shared."))]
    mf, mb, mw = piece_times(acc.roofline(), experts)
    af, ab, aw = piece_times(acc.roofline(), rest)
    before_dispatch = mb if job.delay_wgrad_compute else mb + mw
    experts_slot = max(max(c, before_dispatch) + c, max(mb + mw, c) + mf) - (mb + mw + mf)
    waits = max(0.0, c - af) + experts_slot + max(0.0, c - ab - aw)
    return (2 * c - waits / 2) * (1 - job.dispatcher_sm_share)


def fsdp_collectives(job: Job, cost: LayerCost, head: bool = False,
                     edge: bool = False) -> PieceCollectives:
    """FSDP's collectives of one unit (`cost`: its compute alone) in each microbatch:
    hidden behind a unit's compute as far as it lasts (ppsim.job.fsdp; which run:
    fsdp.unit_runs); `edge`: the embedding's or the head's unit, gathered in the
    training dtype under FP8 too. What the unit's compute hides costs it NCCL's SMs
    (Job.collective_sm_share)."""
    runs = fsdp.unit_runs(job, head, edge)
    gather = fsdp.gather_ms(job, cost.params, cost.expert_params,
                            cost.params - cost.expert_params if edge else 0) \
        if runs.forward_gather or runs.backward_gather else 0.0
    f = gather if runs.forward_gather else 0.0
    b = (gather if runs.backward_gather else 0.0) \
        + (fsdp.reduce_ms(job, cost.params, cost.expert_params) if runs.backward_reduce
           else 0.0)
    share = job.collective_sm_share
    return PieceCollectives(
        forward=(Collective(group="dp", total_ms=f, exposed_ms=behind_compute_ms(
            f, cost.forward_ms, share)),) if f else (),
        backward=(Collective(group="dp", total_ms=b, exposed_ms=behind_compute_ms(
            b, cost.backward_ms, share)),) if b else ())


def edge_collectives(job: Job, a: Architecture, acc: Accelerator, cost: LayerCost,
                     head: bool = False) -> PieceCollectives:
    """The embedding's (or the head's) collectives: its tensor-parallel ones
    (edge_tp_collectives), and its FSDP unit's."""
    tp = edge_tp_collectives(job, a, acc, head)
    own = fsdp_collectives(job, cost, head, edge=True)
    return PieceCollectives(forward=tp.forward + own.forward,
                            backward=tp.backward + own.backward)


def edge_tp_collectives(job: Job, a: Architecture, acc: Accelerator,
                        head: bool) -> PieceCollectives:
    """The embedding's (or the head's) tensor-parallel collectives (traffic.
    edge_tp_traffic): the head's backward ones beside its GEMMs where Megatron runs
    them async (ppsim.job.tp_async; its output layer is no userbuffer linear, so
    --tp-comm-overlap leaves it so), the rest exposed."""
    f, b = edge_tp_traffic(job, a, head)
    window = head_gemm_window(a, acc.roofline()) if head and runs_async(job, a) else None
    return linear_collectives(job, f, b, window)


def mtp_edge_collectives(job: Job, a: Architecture, acc: Accelerator,
                         again: Recomputed | None = None) -> PieceCollectives:
    """An MTP module's own tensor-parallel collectives (`again`: what its backward
    recomputes, by default as the global mode says): its pass through the embedding and
    the head (Megatron's MultiTokenPredictionLayer embeds the shifted tokens,
    process_mtp_loss runs the output layer again), priced as the model's own, and its
    projection's (ppsim.job.mtp_tp)."""
    again = recomputed(a) if again is None else again
    parts = [*(edge_tp_collectives(job, a, acc, h) for h in (False, True)),
             eh_proj_collectives(job, a, acc, again.full)]
    return PieceCollectives(forward=tuple(c for p in parts for c in p.forward),
                            backward=tuple(c for p in parts for c in p.backward))


def piece_collectives(job: Job, a: Architecture, acc: Accelerator, kind: str,
                      cost: LayerCost, again: Recomputed | None = None) -> PieceCollectives:
    """layer_collectives of each layer a piece runs, its FSDP unit's once (what an
    overlap hides behind compute, each hides behind the piece's)."""
    parts = [layer_collectives(job, a, acc, k, cost, again, own=i == 0)
             for i, k in enumerate(piece_kinds(a, kind))]
    return PieceCollectives(forward=tuple(c for p in parts for c in p.forward),
                            backward=tuple(c for p in parts for c in p.backward))


def layer_collectives(job: Job, a: Architecture, acc: Accelerator, kind: str,
                      cost: LayerCost, again: Recomputed | None = None,
                      own: bool = True) -> PieceCollectives:
    """Each group's collectives in one decoder layer of `kind`: what they take on the
    links and what of it the layer waits for (`cost`: the layer's compute alone;
    `again`: what its backward recomputes, by default as the global mode says; `own`:
    with its FSDP unit's)."""
    again = recomputed(a) if again is None else again
    pairs = [*tp_collectives(job, a, acc, kind, cost, again)]
    if job.arch.cp > 1 and kind in ATTENTION_KINDS:
        pairs.append(cp_traffic(job, attention_arch(a, kind), acc, again.attention, kind))
    elif job.arch.cp > 1 and kind in SSM_KINDS:
        cp_f = cp_mixer_comm(job, a, kind)
        pairs.append((cp_f, with_forward_again(cp_f, cp_f, again.full)))
    pairs += ep_collectives(job, a, acc, kind, again)
    unit = fsdp_collectives(job, cost) if own else PieceCollectives()
    return PieceCollectives(forward=(*(f for f, _ in pairs), *unit.forward),
                            backward=(*(b for _, b in pairs), *unit.backward))


def tp_collectives(job: Job, a: Architecture, acc: Accelerator, kind: str, cost: LayerCost,
                   again: Recomputed) -> list[tuple[Collective, Collective]]:
    """A layer's tp collectives, forward and backward (none at tp = etp = 1): its
    sublayers' (traffic.tp_layer_ms; a MoE block's shared experts among them unless they
    run beside the dispatcher: ppsim.job.shared_tp), the dispatcher's gathers over etp
    and the gathers of QKV at tp above the key/value groups."""
    side = beside_dispatcher(job, a, kind)
    tp_f, tp_b = tp_layer_ms(job, a, tp_sublayers(a, kind, side),
                             again.tp_share(a, kind, side), again.scatter_share(a, kind, side))
    # The dispatcher's gathers run on the compute stream, beside no userbuffer overlap.
    d_f = dispatcher_tp_ms(job, a) if kind in MOE_KINDS else 0.0
    d_b = d_f * (2 if again.dispatch else 1)
    # So do the gathers of QKV at tp above the key/value groups.
    q_f, q_b = qkv_gather_ms(job, attention_arch(a, kind)) if kind in ATTENTION_KINDS \
        else (0.0, 0.0)
    q_b += q_f if again.full else 0.0
    if not (a.tp > 1 or d_f):  # the dispatcher's gathers draw in the tp lane (etp > tp = 1 too)
        return []
    # Megatron's linears' async backward collectives (ppsim.job.tp_async)
    gemms = gathered_gemm_windows(a, acc.roofline(), kind, not side) \
        if runs_async(job, a) else ()
    out = []
    for t, d, compute, beside in ((tp_f, d_f + q_f, cost.forward_ms, ()),
                                  (tp_b, d_b + q_b, cost.backward_ms, gemms)):
        waits = overlapped_ms(t, compute, job.sm_count) if job.tp_comm_overlap \
            else beside_gemms_ms(t, beside, job.collective_sm_share)
        out.append(Collective(group="tp", total_ms=t.total_ms + d, exposed_ms=waits + d))
    return [(out[0], out[1])]


def piece_exposed(job: Job, a: Architecture, acc: Accelerator, kind: str, cost: LayerCost,
                  window: int = 0, again: Recomputed | None = None) -> Exposed:
    """layer_exposed of each layer a piece runs, summed (its FSDP unit's once)."""
    parts = [layer_exposed(job, a, acc, k, cost, window, again, own=i == 0)
             for i, k in enumerate(piece_kinds(a, kind))]
    return Exposed(forward_ms=sum(e.forward_ms for e in parts),
                   backward_ms=sum(e.backward_ms for e in parts),
                   pair_saving_ms=sum(e.pair_saving_ms for e in parts))


def layer_exposed(job: Job, a: Architecture, acc: Accelerator, kind: str,
                  cost: LayerCost, window: int = 0,
                  again: Recomputed | None = None, own: bool = True) -> Exposed:
    """What one decoder layer of `kind` attending over `window` waits for beyond its
    compute (`again`: what its backward recomputes, by default as the global mode says;
    `own`: with its FSDP unit's collectives)."""
    again = recomputed(a) if again is None else again
    comm = layer_collectives(job, a, acc, kind, cost, again, own)
    attends = kind in ATTENTION_KINDS  # its cp traffic is in cp_attention_ms's
    cp_f, cp_b = cp_attention_ms(job, attention_arch(a, kind), acc, window,
                                 again.attention, kind) if attends else (0.0, 0.0)
    paired = job.overlap_moe_expert_parallel_comm and kind in MOE_KINDS
    return Exposed(
        forward_ms=sum(c.exposed_ms for c in comm.forward if not (attends and c.group == "cp"))
        + cp_f,
        backward_ms=sum(c.exposed_ms for c in comm.backward
                        if not (attends and c.group == "cp")) + cp_b,
        pair_saving_ms=pair_saving_ms(job, a, acc, kind) if paired else 0.0)


def _exposed(comm: PieceCollectives) -> Exposed:
    return Exposed(forward_ms=sum(c.exposed_ms for c in comm.forward),
                   backward_ms=sum(c.exposed_ms for c in comm.backward))


def _add(c: LayerCost, e: Exposed) -> LayerCost:
    if e.forward_ms == 0.0 and e.backward_ms == 0.0:
        return c
    return replace(c, forward_ms=c.forward_ms + e.forward_ms,
                   backward_ms=c.backward_ms + e.backward_ms,
                   split_backward_ms=c.split_backward_ms + e.backward_ms
                   if c.split_backward_ms else 0.0, pair_saving_ms=e.pair_saving_ms)


def compute_costs(job: Job, acc: Accelerator, recompute: tuple[str, ...] | None = None,
                  full: bool | None = None) -> ModelCosts:
    """One rank's layer costs without the job's collectives; `recompute` and `full` as
    transformer_costs takes them (a memory policy's variant), by default the global mode."""
    a = per_rank_arch(job.arch)
    quiet = replace(acc, a2a_bandwidth_gbps=0.0) if a.ep > 1 else acc  # EP priced here
    plain = replace(a, cp_comm_type="p2p", cp_a2a_size=0)  # no compute cost reads them
    return _with_sorts(job, a, acc, _rank_costs(plain, quiet, recompute, full), recompute,
                       full)


@lru_cache(maxsize=1024)
def _rank_costs(a: Architecture, acc: Accelerator, recompute: tuple[str, ...] | None,
                full: bool | None) -> ModelCosts:
    """transformer_costs once per rank's model: a job search builds a config per shape,
    and shapes that differ only in pipeline chunks, the split or context parallelism's
    traffic cost alike."""
    return transformer_costs(a, acc, recompute, full)


def dispatcher_sort_ms(job: Job, a: Architecture, acc: Accelerator) -> float:
    """The all-to-all dispatcher's second permutation in one direction of a MoE layer
    (megatron/core/transformer/moe/token_dispatcher.py: dispatch_postprocess and
    combine_preprocess, sort_chunks_by_idxs): with more than one local expert, the
    copies a rank received are sorted by local expert after the dispatch and back before
    the combine, each sort a read and a write of them, on the compute stream (the
    backward's sorts mirror them): compute, added to the layer's (_with_sorts). DeepEP's
    flex dispatcher permutes once, with the layer's own permutation; at ep 1 ppsim prices
    no dispatch (Megatron's default there gathers, and sorts nothing)."""
    if job.moe_token_dispatcher_type != "alltoall" or a.ep == 1 or a.num_experts // a.ep < 2:
        return 0.0
    # the copies a rank's experts take, gathered over the expert tp group
    nbytes = 2 * 2 * a.expert_copies * (a.moe_latent_size or a.hidden_size) \
        * DTYPE_BYTES[a.dtype]
    return op_times(acc.roofline(), Op("dispatch.sort", nbytes=nbytes))[0]


def _with_sorts(job: Job, a: Architecture, acc: Accelerator, costs: ModelCosts,
                recompute: tuple[str, ...] | None, full: bool | None) -> ModelCosts:
    """The costs with the all-to-all dispatcher's sorts in each MoE layer: compute-stream
    work, once each way, and in the backward again where the MoE block is recomputed."""
    sort = dispatcher_sort_ms(job, a, acc)
    if not sort or not costs.kinds:
        return costs
    if full is not None:
        a = replace(a, recompute="full" if full else "none")
    again = 2 if recomputed(a, recompute).dispatch else 1
    sorted_: dict[tuple[str, LayerCost], LayerCost] = {}  # one entry per distinct piece
    for kind, c in zip(costs.kinds, costs.layers, strict=True):
        if (kind, c) not in sorted_:
            n = sum(k in MOE_KINDS for k in piece_kinds(a, kind))
            sorted_[kind, c] = _add(c, Exposed(forward_ms=n * sort,
                                               backward_ms=n * sort * again)) if n else c
    return replace(costs, layers=tuple(sorted_[k, c] for k, c in zip(
        costs.kinds, costs.layers, strict=True)))


@lru_cache(maxsize=4096)
def job_costs(job: Job, acc: Accelerator, recompute: tuple[str, ...] | None = None,
              full: bool | None = None) -> ModelCosts:
    """Per-layer costs of one rank of the job (the model's own when tp = cp = ep = 1),
    every layer recomputing `recompute` (or whole, `full`; default the global mode).
    Cached (its arguments are frozen): a job search builds a job per shape, and shapes
    that differ only in their chunks per rank (vpp) make equal jobs."""
    a = per_rank_arch(job.arch)
    if full is not None:  # a policy's variant: a whole-layer recompute repeats the forward's
        a = replace(a, recompute="full" if full else "none")  # collectives in the backward
    costs = compute_costs(job, acc, recompute, full)
    if job.arch.fsdp:
        costs = fsdp.with_held(job, costs)
    if not job.in_microbatches:
        return costs
    again = recomputed(a, recompute)
    kinds = costs.kinds or ("dense",) * len(costs.layers)
    mtp = _exposed(mtp_edge_collectives(job, a, acc, again)) if "mtp" in kinds else None
    # One entry per distinct piece: layers of a kind differ where a window applies.
    by_piece: dict[tuple[str, LayerCost, int], LayerCost] = {}
    layers = []
    wins = layer_windows(a) + (0,) * (len(kinds) - a.num_layers)  # MTP: full attention
    for kind, c, fp8, w in zip(kinds, costs.layers, piece_fp8(a, len(kinds)), wins,
                               strict=True):
        if (kind, c, w) not in by_piece:
            e = piece_exposed(job, layer_precision(a, fp8), acc, kind, c, w, again)
            if mtp is not None and kind == "mtp":  # and its own pass through the head
                e = replace(e, forward_ms=e.forward_ms + mtp.forward_ms,
                            backward_ms=e.backward_ms + mtp.backward_ms)
            by_piece[kind, c, w] = _add(c, e)
        layers.append(by_piece[kind, c, w])
    head = _add(costs.head, _exposed(edge_collectives(job, a, acc, costs.head, head=True)))
    emb = _add(costs.embedding, _exposed(edge_collectives(job, a, acc, costs.embedding)))
    return replace(costs, layers=tuple(layers), head=head, embedding=emb)
