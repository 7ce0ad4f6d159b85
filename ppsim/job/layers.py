"""A job's layer costs: one rank's share of the work plus the collectives it waits for.

With context parallelism a rank holds seq_length / cp tokens of each sequence, so its
costs are the model's at that length (ppsim.costs.transformer), plus the attention it
computes against the other ranks' keys (causal load balancing gives every rank 1/cp of
the s x s work: cp times a chunk's own) while the K/V chunks pass around the ring, each
pass hidden by one chunk's attention. With tensor parallelism (sequence parallel) each
layer all-gathers before attention and before the MLP and reduce-scatters after each,
in the forward and mirrored in the backward (again in the backward under full
recompute); --tp-comm-overlap hides them behind the layer's compute as far as it lasts.
Expert parallelism's dispatch and combine are all-to-alls over the expert group's links.
The head gathers once before the vocabulary projection, the embedding scatters once
after the lookup. With tp = cp = ep = 1 the costs are the model's, untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture, attention_shape, layer_kinds
from ppsim.costs.layerops import attention_ops
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import Accelerator, transformer_costs
from ppsim.job.collectives import all_gather_ms, all_to_all_ms, send_ms
from ppsim.job.model import Job


@dataclass(frozen=True, kw_only=True)
class Exposed:
    """Communication a piece waits for, ms per microbatch."""

    forward_ms: float = 0.0
    """Added to the forward."""
    backward_ms: float = 0.0
    """Added to the backward (its input-gradient part)."""


def per_rank_arch(a: Architecture) -> Architecture:
    """The model as one context-parallel rank sees it: seq_length / cp tokens."""
    return a if a.cp == 1 else replace(a, seq_length=a.seq_length // a.cp)


def _tp(job: Job, a: Architecture, collectives: int) -> float:
    """`collectives` all-gathers or reduce-scatters of one microbatch's hidden states."""
    if a.tp == 1:
        return 0.0
    nbytes = a.seq_length * a.micro_batch_size * a.hidden_size * DTYPE_BYTES[a.dtype]
    return collectives * all_gather_ms(nbytes, job.link("tp"))


def _cp(job: Job, a: Architecture, acc: Accelerator) -> tuple[float, float]:
    """(forward, backward) ms the other chunks' attention and the exposed ring add."""
    cp = job.arch.cp
    if cp == 1:
        return 0.0, 0.0
    att = next(op for op in attention_ops(a) if op.attention)
    f, b, _, _, _ = op_times(acc.roofline(), att)
    sh = attention_shape(a)
    kv = a.seq_length * a.micro_batch_size * (sh.k + sh.v) / a.tp * DTYPE_BYTES[a.dtype]
    g = job.link("cp")
    f_exposed = max(0.0, send_ms(kv, g) - f)
    b_exposed = max(0.0, send_ms(2 * kv, g) - b)  # K, V forward; dK, dV back
    return (cp - 1) * (f + f_exposed), (cp - 1) * (b + b_exposed)


def _ep(job: Job, a: Architecture) -> float:
    """Dispatch and combine of one microbatch: two all-to-alls."""
    if a.ep == 1:
        return 0.0
    nbytes = (a.seq_length * a.micro_batch_size * a.top_k * a.hidden_size
              * DTYPE_BYTES[a.dtype] / a.tp)
    return 2 * all_to_all_ms(nbytes, job.link("ep"))


def _hidden(comm: float, compute: float, overlap: bool) -> float:
    return max(0.0, comm - compute) if overlap else comm


def layer_exposed(job: Job, a: Architecture, acc: Accelerator, kind: str,
                  cost: LayerCost) -> Exposed:
    """What one decoder layer of `kind` waits for beyond its compute."""
    tp_f = _tp(job, a, 4)
    tp_b = tp_f + (tp_f if a.recompute == "full" else 0.0)
    cp_f, cp_b = _cp(job, a, acc)
    ep = _ep(job, a) if kind == "moe" else 0.0
    over = job.tp_comm_overlap
    return Exposed(forward_ms=_hidden(tp_f, cost.forward_ms, over) + cp_f + ep,
                   backward_ms=_hidden(tp_b, cost.backward_ms, over) + cp_b + ep)


def _add(c: LayerCost, e: Exposed) -> LayerCost:
    if e.forward_ms == 0.0 and e.backward_ms == 0.0:
        return c
    return replace(c, forward_ms=c.forward_ms + e.forward_ms,
                   backward_ms=c.backward_ms + e.backward_ms,
                   split_backward_ms=c.split_backward_ms + e.backward_ms
                   if c.split_backward_ms else 0.0)


def job_costs(job: Job, acc: Accelerator) -> ModelCosts:
    """Per-layer costs of one rank of the job (the model's own when tp = cp = ep = 1)."""
    a = per_rank_arch(job.arch)
    quiet = replace(acc, a2a_bandwidth_gbps=0.0) if a.ep > 1 else acc  # EP priced here
    costs = transformer_costs(a, quiet)
    if a.tp == 1 and a.cp == 1 and a.ep == 1:
        return costs
    kinds = costs.kinds or ("dense",) * len(costs.layers)
    last = layer_kinds(a)[-1]  # an MTP module's decoder layer is of the last layer's kind
    one = _tp(job, a, 1)
    by_kind: dict[str, Exposed] = {}
    layers = []
    for kind, c in zip(kinds, costs.layers, strict=True):
        if kind not in by_kind:
            e = layer_exposed(job, a, acc, last if kind == "mtp" else kind, c)
            if kind == "mtp":  # and its own pass through the head
                e = Exposed(forward_ms=e.forward_ms + one, backward_ms=e.backward_ms + one)
            by_kind[kind] = e
        layers.append(_add(c, by_kind[kind]))
    head = _add(costs.head, Exposed(forward_ms=one, backward_ms=one))
    emb = _add(costs.embedding, Exposed(forward_ms=one, backward_ms=one))
    return replace(costs, layers=tuple(layers), head=head, embedding=emb)
