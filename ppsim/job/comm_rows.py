"""The collectives one microbatch of each layer kind runs, itemized: each one's message,
group, link, priced time and how often it runs, for `ppsim costs`.

The times come from the functions the layer costs are priced with (ppsim.job.traffic,
ppsim.job.layers, ppsim.job.collectives), at the bytes those functions move; the counts
follow them too (ppsim.job.layers.layer_collectives sums what these rows itemize), under
what the layer's backward recomputes (traffic.Recomputed); FSDP's units are in
ppsim.job.fsdp_rows. Whether a row's collective waits is the model's
choice: "exposed" (on the compute stream, or nothing beside it), "overlap" (behind the
layer's compute as far as it lasts: --tp-comm-overlap, Megatron's async backward
collectives of a column-parallel linear (the output layer's too), the K/V ring's
passes, the shared experts under --moe-shared-expert-overlap), "paired" (behind another microbatch's
compute in the combined 1F1B's pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ppsim.costs.arch import Architecture
from ppsim.costs.fp8 import fp8_bytes, mtp_precision
from ppsim.costs.kinds import piece_kinds
from ppsim.costs.kv_split import qkv_gather_bytes
from ppsim.costs.mixer_split import SSM_KINDS
from ppsim.costs.mixers import ATTENTION_KINDS, attention_arch
from ppsim.job.collectives import (
    Link,
    all_gather_ms,
    all_reduce_ms,
    all_to_all_ms,
    deepep_ms,
    reduce_scatter_ms,
    send_ms,
)
from ppsim.job.cp_traffic import cp_bytes, cp_mixer_bytes
from ppsim.job.ep_comm import ep_all_to_all_ms, ep_token_bytes
from ppsim.job.layers import MOE_KINDS
from ppsim.job.model import Job
from ppsim.job.shared_tp import beside_dispatcher
from ppsim.job.tp_async import runs_async
from ppsim.job.traffic import (
    Recomputed,
    dispatcher_gathers,
    dispatcher_tp_bytes,
    hidden_bytes,
    regathers,
    tp_sublayers,
)

EXPOSED, OVERLAPPED, PAIRED = "exposed", "overlap", "paired"


@dataclass(frozen=True, kw_only=True)
class CommRow:
    """One collective as the simulator prices it, and how often it runs."""

    collective: str
    """What it is and over which group, e.g. "tp all-gather", "p2p send"."""
    piece: str
    """Where it runs: a layer kind, "embedding", "head", "step", "boundary"."""
    nbytes: float
    """Its message: the gathered (or reduced) buffer, what a rank sends to all (an
    all-to-all, DeepEP's tokens once each), one message (a send)."""
    ranks: int
    """The group's size."""
    link: str
    """"NVLink" (inside a node) or "network" (across nodes)."""
    ms: float
    """Priced time of one."""
    count: float
    """How many run: per microbatch, forward and backward together (per iteration for
    "step" rows)."""
    per: str = "microbatch"
    """"microbatch" or "iteration"."""
    stages: tuple[int, ...] = ()
    """The virtual stages whose layers run it this often (a [memory] policy recomputes
    per stage); (): no policy, every layer alike."""
    pp_ranks: tuple[int, ...] = ()
    """The pipeline ranks whose step runs a "step" row's data-parallel collective so
    (ranks alike share rows); (): not a data-parallel step row."""
    exposure: str = EXPOSED
    """"exposed", "overlap", "paired", or "schedule" (a pipeline message: the
    schedule decides whether its receiver waits)."""


Priced = Callable[[float, Link], float]


def link_name(crosses_nodes: bool) -> str:
    return "network" if crosses_nodes else "NVLink"


@dataclass(frozen=True)
class _Rows:
    """Rows of one piece, gathered as they are priced (equal rows add their counts)."""

    job: Job
    piece: str
    out: dict[tuple[str, str, float], CommRow]

    def add(self, what: str, group: str, priced: Priced, nbytes: float, count: float,
            exposure: str = EXPOSED, ranks: int = 0) -> None:
        if not count or not nbytes:
            return
        g = self.job.link(group)
        key = (what, exposure, nbytes)
        if key in self.out:
            old = self.out[key]
            self.out[key] = replace(old, count=old.count + count)
            return
        self.out[key] = CommRow(
            collective=what, piece=self.piece, nbytes=nbytes, ranks=ranks or g.size,
            link=link_name(getattr(self.job.groups, group).crosses_nodes),
            ms=priced(nbytes, g), count=count, exposure=exposure)


def piece_rows(job: Job, a: Architecture, piece: str, kind: str,
               again: Recomputed) -> list[CommRow]:
    """The collectives of one layer of `kind` (a cost table's piece, labelled `piece`),
    each sublayer kind it runs in turn; `a`: one rank's view at the layer's precision."""
    rows = _Rows(job, piece, {})
    for k in piece_kinds(a, kind):
        _tp_rows(rows, a, k, again)
        _cp_rows(rows, a, k, again)
        _ep_rows(rows, a, k, again)
    if kind == "mtp":  # its own pass through the head and its projection, each way
        _mtp_rows(rows, a, again)
    return list(rows.out.values())


def _tp_rows(rows: _Rows, a: Architecture, k: str, again: Recomputed) -> None:
    """traffic.tp_layer_ms, the QKV gather above the kv groups and the dispatcher's."""
    job, tp_ex = rows.job, OVERLAPPED if rows.job.tp_comm_overlap else EXPOSED
    side, plain = beside_dispatcher(job, a, k), hidden_bytes(a)
    if a.tp > 1:
        s, share, rescatter = tp_sublayers(a, k, side), again.tp_share(a, k, side), \
            again.scatter_share(a, k, side)
        if a.sequence_parallel:
            inputs = hidden_bytes(a, fp8_bytes(a) if a.fp8_copies else 0)
            # Megatron's weight gradient's gather and the input gradient's scatter run
            # beside the backward's GEMMs (ppsim.job.tp_async)
            beside = OVERLAPPED if runs_async(job, a) else tp_ex
            rows.add("tp all-gather", "tp", all_gather_ms, inputs, s * (1 + share), tp_ex)
            rows.add("tp all-gather", "tp", all_gather_ms, inputs, s * regathers(a), beside)
            rows.add("tp all-gather", "tp", all_gather_ms, plain, s, tp_ex)
            rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, plain, s * (1 + rescatter),
                     tp_ex)
            rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, plain, s, beside)
        else:  # the input gradient's beside the weight gradient's GEMM (tp_async)
            rows.add("tp all-reduce", "tp", all_reduce_ms, plain, s * (1 + rescatter))
            rows.add("tp all-reduce", "tp", all_reduce_ms, plain, s,
                     OVERLAPPED if runs_async(job, a) else EXPOSED)
    if side:  # shared_tp.side_ms: beside the all-to-alls where there are some
        n, beside = 2 + again.dispatch, OVERLAPPED if ep_all_to_all_ms(job, a) else EXPOSED
        rows.add("tp all-gather", "tp", all_gather_ms, plain, n, beside)
        rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, plain, n, beside)
    if k in ATTENTION_KINDS:  # on the compute stream: never hidden
        qkv = qkv_gather_bytes(attention_arch(a, k))
        rows.add("qkv all-gather", "tp", all_gather_ms, qkv, 2 if again.full else 1)
        rows.add("qkv reduce-scatter", "tp", reduce_scatter_ms, qkv, 1)
    if k in MOE_KINDS and dispatcher_gathers(job, a):
        n = 1 + (2 if again.dispatch else 1)
        nbytes = dispatcher_tp_bytes(a)
        rows.add("etp all-gather", "etp", all_gather_ms, nbytes, n)
        rows.add("etp reduce-scatter", "etp", reduce_scatter_ms, nbytes, n)


def _cp_rows(rows: _Rows, a: Architecture, k: str, again: Recomputed) -> None:
    """cp_traffic.cp_comm (an attention's) and cp_traffic.cp_mixer_comm (a Mamba or GDN's)."""
    cp = rows.job.arch.cp
    if cp == 1:
        return
    if k in SSM_KINDS:
        for nbytes in cp_mixer_bytes(a, k):
            rows.add("cp all-to-all", "cp", all_to_all_ms, nbytes, 2 + again.full)
        return
    if k not in ATTENTION_KINDS:
        return
    x, kind = cp_bytes(attention_arch(a, k), k), a.cp_comm_type
    redo = 1 + again.attention  # the forward's, again in a recomputing backward
    if k == "dsa":  # cp_traffic.dsa_comm
        rows.add("cp all-gather", "cp", all_gather_ms, cp * x.kv, redo)
        rows.add("cp indexer-key all-gather", "cp", all_gather_ms, cp * x.index_keys, redo)
        rows.add("cp reduce-scatter", "cp", reduce_scatter_ms, cp * x.kv, 1)
        return
    if kind == "all_gather":
        rows.add("cp all-gather", "cp", all_gather_ms, cp * x.kv, 1 + redo)
        rows.add("cp reduce-scatter", "cp", reduce_scatter_ms, cp * x.kv, 1)
        return
    ring, group = cp, "cp"
    if kind in ("a2a", "a2a+p2p"):
        over = "cp" if kind == "a2a" else "cp_a2a"
        rows.add("cp all-to-all", over, all_to_all_ms, x.qkv, 1 + redo)
        rows.add("cp all-to-all", over, all_to_all_ms, x.out, 1 + redo)
        if kind == "a2a":
            return
        ring, group = cp // rows.job.arch.cp_a2a_size, "cp_p2p"
    rows.add("cp K/V send", group, send_ms, x.kv, (ring - 1) * redo, OVERLAPPED)
    rows.add("cp K/V send", group, send_ms, 2 * x.kv, ring - 1, OVERLAPPED)


def _ep_rows(rows: _Rows, a: Architecture, k: str, again: Recomputed) -> None:
    """layers.ep_all_to_all_ms: dispatch and combine each way, again where recomputed."""
    job = rows.job
    flex = job.moe_token_dispatcher_type == "flex"
    if k not in MOE_KINDS or (a.ep == 1 and not (flex and a.expert_tp > 1)):
        return
    n = 2 + 2 * (1 + again.dispatch)
    exposure = PAIRED if job.overlap_moe_expert_parallel_comm else (
        OVERLAPPED if job.moe_shared_expert_overlap and a.shared_width else EXPOSED)
    tokens = ep_token_bytes(a)
    if flex:
        def deepep(nbytes: float, g: Link) -> float:
            return deepep_ms(nbytes, g, a.num_experts, a.top_k, a.expert_tp)

        rows.add("ep DeepEP", "ep", deepep, tokens, n, exposure, a.expert_tp * a.ep)
    else:
        rows.add("ep all-to-all", "ep", all_to_all_ms, tokens * a.top_k, n, exposure)


def _mtp_rows(rows: _Rows, a: Architecture, again: Recomputed) -> None:
    """layers.mtp_edge_collectives: the embedding's and the head's, again, and the
    projection's (mtp_tp.eh_proj_traffic)."""
    for head in (False, True):
        _edge_rows(rows, a, head)
    if a.tp == 1:
        return
    plain = hidden_bytes(a)
    beside = OVERLAPPED if runs_async(rows.job, a) else EXPOSED
    rows.add("tp all-gather", "tp", all_gather_ms, plain, 1 + again.full + a.sequence_parallel)
    if not a.sequence_parallel:
        rows.add("tp all-reduce", "tp", all_reduce_ms, 2 * plain, 1, beside)
        return
    quantized = mtp_precision(a).fp8_copies
    inputs = 2 * hidden_bytes(a, fp8_bytes(a) if quantized else 0)
    rows.add("tp all-gather", "tp", all_gather_ms, inputs, 1 + again.full)
    rows.add("tp all-gather", "tp", all_gather_ms, inputs, int(regathers(a)), beside)
    rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, 2 * plain, 1, beside)


def edge_rows(job: Job, a: Architecture, head: bool) -> list[CommRow]:
    """traffic.edge_tp_traffic's collectives of the embedding (or the `head`)."""
    rows = _Rows(job, "head" if head else "embedding", {})
    _edge_rows(rows, a, head)
    return list(rows.out.values())


def _edge_rows(rows: _Rows, a: Architecture, head: bool) -> None:
    """The head's backward ones marked as layers.edge_tp_collectives prices them."""
    if a.tp == 1:
        return
    plain = hidden_bytes(a)
    beside = OVERLAPPED if head and runs_async(rows.job, a) else EXPOSED
    if not a.sequence_parallel:
        rows.add("tp all-reduce", "tp", all_reduce_ms, plain, 1, beside)
    elif head:
        rows.add("tp all-gather", "tp", all_gather_ms, plain, 1)
        rows.add("tp all-gather", "tp", all_gather_ms, plain, int(regathers(a)), beside)
        rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, plain, 1, beside)
    else:
        if a.learned_positions:
            rows.add("tp all-reduce", "tp", all_reduce_ms, plain, 1)
        else:
            rows.add("tp reduce-scatter", "tp", reduce_scatter_ms, plain, 1)
        rows.add("tp all-gather", "tp", all_gather_ms, plain, 1)
