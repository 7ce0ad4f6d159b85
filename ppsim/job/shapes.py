"""The job shapes `ppsim plan --gpus N --global-batch-size B` tries (ppsim.job.search):
every split of N GPUs into tp, cp, ep, pp and dp that Megatron accepts, with the chunks
per rank and micro-batch sizes the batch allows, and the shardings when they are searched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from ppsim.costs.experts import (
    expert_bias_refusal,
    expert_data_parallel,
    torchtitan_expert_tp,
)
from ppsim.costs.kv_split import kv_split_problem, rank_kv_heads
from ppsim.costs.layerops import (
    loss_chunks_problem,
    sequence_split_problem,
    vocab_split_problem,
)
from ppsim.costs.mixer_split import split_problem
from ppsim.errors import UserError
from ppsim.job.context_parallel import cp_refusal
from ppsim.job.shape import microbatches_for
from ppsim.pipeline.megatron_rules import MEGATRON_INTERLEAVED, group_refusal
from ppsim.pipeline.torch_rules import torch_refusal
from ppsim.schedules.generators import interleaved_group, schedule_for_vpp

MAX_PP = 64
"""The most pipeline ranks the search tries (any size up to it that divides the world:
Megatron takes pp 6 or 12 as it takes 8; the weak-scaling table's 177B ran at pp 6)."""
MAX_CP = 8
"""The most context-parallel ranks the search tries for any sequence (a power of two)."""
LONG_CP_TOKENS = 8192
"""Beyond MAX_CP it tries each power of two that leaves a context-parallel rank this many
tokens of a sequence or more: Llama 3's 128K-token phase ran cp 16 (8,192 tokens a rank,
tp 8, pp 16, dp 8 on 16,384 GPUs; the paper's Table 4)."""
MBS_CHOICES = (1, 2, 4)
VPP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One job shape: parallel sizes, chunks per rank, micro-batch and microbatches."""

    tp: int
    """Tensor-parallel size (within a node)."""
    cp: int
    """Context-parallel size."""
    ep: int
    """Expert-parallel size (1 for a dense model)."""
    pp: int
    """Pipeline ranks."""
    dp: int
    """Data-parallel size: GPUs / (tp x cp x pp)."""
    vpp: int
    """Chunks per pipeline rank."""
    mbs: int
    """Sequences per microbatch."""
    microbatches: int
    """Per replica: global batch / (mbs x dp)."""
    sharding: str = ""
    """How the replicas keep their state when the search varies it ("distributed
    optimizer", "fsdp": FSDP as configured, torchtitan's by default, or "megatron-fsdp");
    "": as configured."""
    dp_replicas: int = 1
    """Copies of the sharded state (with `sharding`)."""
    dispatcher: str = ""
    """How routed tokens travel when the search varies it ("alltoall" or "flex":
    DeepEP); "": as configured."""
    cp_comm: str = ""
    """Context parallelism's traffic when the search varies it (p2p, all_gather, a2a or
    a2a+p2p: Architecture.cp_comm_type); "": as configured."""
    cp_a2a: int = 0
    """Under a2a+p2p, its all-to-all's ranks (Architecture.cp_a2a_size)."""
    host_optimizer: float = 0.0
    """Share of each rank's optimizer shard on the host where the search put it there
    (ppsim.job.pending.host_variant); 0: as configured."""
    etp: int = 0
    """Expert tensor-parallel size (each expert's matmuls split over etp ranks, etp x ep
    of the tp x cp x dp ranks: Megatron's MoE parallel folding); 0: tp. The search
    gives every shape its own."""

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def fully_sharded(self) -> bool:
        """The searched sharding is an FSDP (either kind)."""
        return self.sharding in ("fsdp", "megatron-fsdp")

    def label(self) -> str:
        return f"{self.sizes_label()} {self.batch_label()}"

    def sizes_label(self) -> str:
        """"tp8 cp1 ep8 etp1 pp16 dp32": the parallel sizes (etp only where the experts'
        tensor-parallel size is not tp's)."""
        folded = f" etp{self.etp}" if self.etp and self.etp != self.tp else ""
        return f"tp{self.tp} cp{self.cp} ep{self.ep}{folded} pp{self.pp} dp{self.dp}"

    def batch_label(self) -> str:
        """"vpp2 mbs1 m480 a2a": chunks, micro-batch, microbatches and the searched axes."""
        return f"vpp{self.vpp} mbs{self.mbs} m{self.microbatches}" + self.searched_label()

    def searched_label(self) -> str:
        """" fsdp", " mfsdp" (Megatron-FSDP), " distopt/4" (4 copies), " deepep", " a2a",
        " cp-a2a", " host0.5" (half the optimizer on the host): the searched axes' values
        ("" for those not searched)."""
        parts = []
        if self.sharding:
            name = {"fsdp": "fsdp", "megatron-fsdp": "mfsdp"}.get(self.sharding, "distopt")
            parts.append(name + (f"/{self.dp_replicas}" if self.dp_replicas > 1 else ""))
        if self.dispatcher:
            parts.append({"alltoall": "a2a", "flex": "deepep"}[self.dispatcher])
        if self.cp_comm:
            parts.append(f"cp-{self.cp_comm}" + (f"/{self.cp_a2a}" if self.cp_a2a else ""))
        if self.host_optimizer:
            parts.append(f"host{self.host_optimizer:g}")
        return "".join(" " + p for p in parts)


def _powers(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    return [1 << i for i in range(max(0, limit).bit_length())]


FIXABLE = ("tp", "cp", "ep", "etp", "pp", "dp", "vpp", "mbs")
"""The sizes a user may fix (`plan --gpus N --tp 8 ...`); the search varies the rest."""


def _grid_fits(a: Any, gpus: int, layers: int, tp: int, cp: int, pp: int) -> bool:
    """tp divides the heads (and divides the key/value heads or is a multiple of them
    but under MLA: ppsim.costs.kv_split), a vocabulary taken as it is, and under sequence
    parallelism a rank's tokens, Megatron takes cp (ppsim.job.context_parallel.cp_refusal), a hybrid
    stack's mixers split over both (ppsim.costs.mixer_split), pp has layers and divides
    the world with them."""
    return not (a.num_heads % tp
                or (a.attention != "mla" and kv_split_problem(a.num_kv_heads, tp) is not None)
                or (cp > 1 and cp_refusal(a, cp) is not None)
                or pp > layers or gpus % (tp * cp * pp) or split_problem(a, tp, cp)
                or vocab_split_problem(a.vocab_size, a.pad_vocab, tp)
                or loss_chunks_problem(a.seq_length, cp, a.loss_chunks)
                or (not a.torchtitan_fsdp
                    and sequence_split_problem(a.seq_length, cp, tp, a.sequence_parallel)))


def _ep_fits(a: Any, tp: int, group: int, etp: int, ep: int, copies: int) -> bool:
    """etp x ep divides the tp x (dp x cp `group`) ranks, ep the experts (1 for a dense
    model) and etp their width, and the sharded state's `copies` divide both the group
    and the expert data-parallel one, tp x group / (etp x ep)."""
    ranks, folded = tp * group, etp * ep
    if not a.num_experts:
        return ep == 1 and group % copies == 0
    return not (ranks % folded or a.num_experts % ep or a.moe_ffn_hidden_size % etp
                or group % copies or expert_data_parallel(tp, 1, group, etp, ep) % copies)


def _etp_choices(a: Any, tp: int, pin: dict[str, int]) -> tuple[int, ...]:
    """The expert tensor-parallel sizes tried at `tp`: the one held (--etp, or the
    model's own), else tp and, for routed experts at tp > 1, 1 (MoE parallel folding, as
    Megatron's large-MoE recipes run; torchtitan's is one of them at each ep:
    _folds_as_torchtitan). A dense model's is tp (none where another is held)."""
    held = pin.get("etp") or (getattr(a, "etp", 0) if a.num_experts else 0)
    if not a.num_experts:
        return (tp,) if held in (0, tp) else ()
    if not a.torchtitan_fsdp and expert_bias_refusal(a.linear_bias, a.num_experts,
                                                     held or tp):
        # Megatron splits no biased expert
        return (1,) if held in (0, 1) else ()
    if held:
        return (held,)
    return (tp, 1) if tp > 1 else (tp,)


def _folds_as_torchtitan(a: Any, tp: int, etp: int, ep: int) -> bool:
    """A torchtitan job's experts split as torchtitan splits them at tp and ep
    (torchtitan_expert_tp); any other job's as searched."""
    return not a.num_experts or not a.torchtitan_fsdp or etp == torchtitan_expert_tp(tp, ep)


def _schedule_runs(layers: int, pp: int, vpp: int, ep: int, combined: bool,
                   interleaved: bool) -> bool:
    """Each chunk has a layer; interleaving needs pp > 1; Megatron's combined 1F1B needs
    ep > 1 and, with pp > 1, interleaving; `interleaved`
    (--overlap-param-gather-with-optimizer-step) needs interleaving. The microbatches
    are microbatch_refusal's."""
    chunked = vpp > 1
    if layers < pp * vpp or (chunked and pp == 1):
        return False
    if interleaved and not chunked:
        return False
    return not (combined and (ep == 1 or (pp > 1 and not chunked)))


def launches_with_torch(a: Any, s: Shape) -> bool:
    """The shape runs as a torchtitan job, on torch.distributed.pipelining's schedules:
    it shards with torchtitan's FSDP (searched, or as configured)."""
    if s.sharding:
        return s.sharding == "fsdp" and a.fsdp_framework == "torchtitan"
    return a.torchtitan_fsdp


def microbatch_refusal(a: Any, s: Shape, schedule: str,
                       any_sharding: bool = False) -> str | None:
    """Why the framework that launches the shape refuses its microbatches per replica
    under `schedule` (as configured); None where it runs them. Megatron's 1F1B takes any
    count (warm-up min(pp - rank - 1, m): schedules.py,
    forward_backward_pipelining_without_interleaving), its interleaved order a
    microbatch group within [pp, m] (megatron_rules.group_refusal at ppsim's group, the
    flag exported where it is not pp); torch's classes their own
    (ppsim.pipeline.torch_rules). `any_sharding`: before the searched sharding is
    chosen, where either framework may launch it."""
    name = schedule_for_vpp(schedule, s.vpp)
    m = s.microbatches
    megatron = None if name not in MEGATRON_INTERLEAVED or s.vpp == 1 else \
        group_refusal(s.pp, m, interleaved_group(s.pp, m))
    if megatron is not None:
        megatron = f"Megatron refuses m = {m} at pp {s.pp}: {megatron}"
    torch = torch_refusal(name, s.pp, s.vpp, m)
    if any_sharding:
        return None if torch is None and a.fsdp_framework == "torchtitan" else megatron
    return torch if launches_with_torch(a, s) else megatron


def shapes(a: Any, gpus: int, gbs: int, gpus_per_node: int, layers: int,
           fixed: dict[str, int] | None = None, any_copies: bool = False,
           combined: bool = False, interleaved: bool = False,
           schedule: str | None = "1f1b") -> list[Shape]:
    """Every shape the model, the world and the global batch allow, with the sizes in
    `fixed` (keys of FIXABLE) held at their values; the configured copies of the sharded
    state divide each one's data-parallel groups unless `any_copies` (the sharding is
    searched). `combined`: only shapes Megatron's combined 1F1B runs (ep > 1; vpp > 1
    when pp > 1: ppsim.job.combined); `interleaved`: only interleaved ones (vpp > 1,
    --overlap-param-gather-with-optimizer-step); each with microbatches `schedule` (the
    configured one) runs (microbatch_refusal; None: any count)."""
    copies = 1 if any_copies else a.dp_replicas
    pin = fixed or {}

    def choices(name: str, free: Any) -> Any:
        return (pin[name],) if name in pin else free

    # any ep dividing the experts (Megatron's check): 384 experts take ep 3, 6, 12, ...
    experts = [e for e in range(1, a.num_experts + 1) if a.num_experts % e == 0] \
        if a.num_experts else [1]
    out = []
    sizes = [p for p in range(1, MAX_PP + 1) if gpus % p == 0]
    contexts = _powers(max(MAX_CP, a.seq_length // LONG_CP_TOKENS))
    for tp, cp, pp in product(choices("tp", _powers(gpus_per_node)),
                              choices("cp", contexts), choices("pp", sizes)):
        dp = gpus // (tp * cp * pp)
        if not _grid_fits(a, gpus, layers, tp, cp, pp) or pin.get("dp", dp) != dp:
            continue
        for etp, ep, mbs in product(_etp_choices(a, tp, pin), choices("ep", experts),
                                    choices("mbs", MBS_CHOICES)):
            if not _ep_fits(a, tp, dp * cp, etp, ep, copies) or gbs % (mbs * dp) \
                    or not _folds_as_torchtitan(a, tp, etp, ep):
                continue
            m = gbs // (mbs * dp)
            made = (Shape(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, vpp=vpp, mbs=mbs,
                          microbatches=m, etp=etp)
                    for vpp in choices("vpp", VPP_CHOICES if pp > 1 else (1,))
                    if _schedule_runs(layers, pp, vpp, ep, combined, interleaved))
            out += [s for s in made if schedule is None
                    or microbatch_refusal(a, s, schedule, any_copies) is None]
    return out


def held_batch_refusal(a: Any, gpus: int, gbs: int, gpus_per_node: int, layers: int,
                       fixed: dict[str, int], **rules: Any) -> UserError | None:
    """Megatron's own refusal (microbatches_for) where the held sizes leave one dp for
    the world and the model and the global batch does not divide into mbs x dp (at the
    smallest mbs tried); None where dp is still searched or the batch is not the cause.
    `rules`: shapes()'s other arguments."""
    mbs = (fixed["mbs"],) if "mbs" in fixed else MBS_CHOICES
    # a batch every mbs x dp divides: the shapes the world and the model allow
    loose = shapes(a, gpus, gpus * math.lcm(*mbs), gpus_per_node, layers, fixed,
                   schedule=None, **rules)
    if len({s.dp for s in loose}) != 1:
        return None
    s = min(loose, key=lambda s: s.mbs)
    try:
        microbatches_for(gbs, s.mbs, s.dp)
    except UserError as e:
        return e
    return None


def sharding_choices(s: Shape, gpus_per_node: int, experts: bool,
                     combined: bool = False, framework: str = "torchtitan") -> list[Shape]:
    """`s` under each sharding the search tries: the distributed optimizer and FSDP as
    configured (`framework`; not with Megatron's `combined` 1F1B), each over the whole
    data-parallel group and, where it spans nodes with more than one of its ranks on
    each, with one copy a node (its shards then reduce and gather over NVLink, the
    copies all-reduce across); and Megatron-FSDP, over the whole group (its hybrid
    sharding is not priced), where FSDP as configured is another."""
    group = s.dp * s.cp
    per_node = max(1, gpus_per_node // s.tp)  # dp x cp ranks on a node (tp innermost)
    expert_dp = expert_data_parallel(s.tp, s.cp, s.dp, s.expert_tp, s.ep)
    copies = [1]
    if group > per_node > 1 and group % per_node == 0 and \
            (not experts or expert_dp % (group // per_node) == 0):
        copies.append(group // per_node)
    kinds = ["distributed optimizer"]
    # torchtitan's FSDP splits the experts its own way
    if not combined and not (experts and framework == "torchtitan"
                             and s.expert_tp != torchtitan_expert_tp(s.tp, s.ep)):
        kinds.append("fsdp")
    out = [replace(s, sharding=kind, dp_replicas=n) for kind in kinds for n in copies]
    if not combined and framework != "megatron-fsdp":
        out.append(replace(s, sharding="megatron-fsdp", dp_replicas=1))
    return out


def cp_comm_choices(s: Shape, a: Any, gpus_per_node: int = 8) -> list[Shape]:
    """`s` with each context-parallel traffic the search tries where cp > 1: the p2p ring,
    the all-gather, the Ulysses all-to-alls where cp divides a tensor rank's query and
    key/value heads (Transformer Engine's condition), and where the cp group spans nodes,
    a2a+p2p: the all-to-all over the cp ranks of a node (tp innermost, cp next), the
    ring across nodes, where that many divide the heads."""
    if s.cp == 1:
        return [s]
    kv = rank_kv_heads(a, s.tp)

    def splits_heads(n: int) -> bool:
        return (a.num_heads // s.tp) % n == 0 and kv % n == 0

    kinds = ("p2p", "all_gather", "a2a") if splits_heads(s.cp) else ("p2p", "all_gather")
    out = [replace(s, cp_comm=kind) for kind in kinds]
    inner = max(1, gpus_per_node // s.tp)
    if 1 < inner < s.cp and s.cp % inner == 0 and splits_heads(inner):
        out.append(replace(s, cp_comm="a2a+p2p", cp_a2a=inner))
    return out


def dispatcher_choices(s: Shape) -> list[Shape]:
    """`s` with each token dispatcher the search tries: the all-to-all, and DeepEP where
    its etp x ep group has more than one rank (Megatron's flex dispatcher requires it)."""
    kinds = ("alltoall", "flex") if s.expert_tp * s.ep > 1 else ("alltoall",)
    return [replace(s, dispatcher=kind) for kind in kinds]
