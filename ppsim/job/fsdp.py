"""Fully sharded data parallelism: torch's FSDP2 as torchtitan applies it, and
Megatron-FSDP.

torchtitan makes each transformer block, the embedding, and the final norm with the LM
head one unit each (torchtitan/distributed/fsdp.py, apply_fsdp_to_decoder), sharded
over the dp x cp ranks (its dp_shard x cp mesh), routed experts over the expert
data-parallel ranks, tp x dp x cp / ep (efsdp: each expert whole on its rank). Mixed
precision keeps the shards in fp32, gathers the weights in bf16 and reduces the gradients
in fp32 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)). FSDP2 gathers a unit one
ahead of the compute (implicit prefetch), so a unit's gather hides behind a unit's
compute and what outlasts it is exposed; the same holds for its gradient's
reduce-scatter in the backward.

When the collectives run:
- without pipeline parallelism torchtitan's loop syncs every microbatch (FSDP2's
  default): each forward gathers every unit, each backward gathers it again when it
  was freed after the forward and reduce-scatters its gradient;
- with it, torch.distributed.pipelining turns the sync off until the step's end
  (stage.py: backward_maybe_with_nosync, perform_reduce_grad): gradients accumulate
  unsharded in fp32 (FSDPParam.to_accumulated_grad_if_needed) and reduce once after
  the last backward, nothing left to hide them; by default the gathered weights stay
  to the end of the step (fsdp.py: get_fsdp_reshard_after_forward_policy gives False
  with pp), so they are gathered once, during the first forward.

Memory a parameter costs a rank: its shard of the fp32 weight, gradient and two Adam
moments (ppsim.costs.state.bytes_per_param; in host memory under torchtitan's
enable_cpu_offload, FSDP2's CPUOffloadPolicy, which copies a shard in before each gather
and a reduced gradient out after each reduce-scatter, and steps Adam on the host:
ppsim.job.host_optimizer), plus what is held unsharded: with pp > 1
the gathered weight and the accumulated fp32 gradient (6 bytes in bf16); with pp = 1,
"never" the gathered weights, else only the units in flight (two units' gathered
weights, the computing one and the prefetched one, and one unit's gradient).

Megatron-FSDP (--use-megatron-fsdp, its default optim_grads_params strategy; megatron/
core/distributed/fsdp) makes each decoder layer a unit over the same dp x cp ranks
(routed experts over the expert data-parallel ones), gathers it before its forward and
again before its backward, one unit prefetched, and reduce-scatters its gradient in every
backward (grad_reduce_every_bprop). The embedding and the output layer are in no unit:
gathered once, during the first forward, and held all step; their gradients too reduce
in every backward. It shards the model cast to the training dtype: weights gathered and
gradients kept and reduced in bf16 (main_grads_dtype auto), the fp32 master beside Adam's
moments (16 bytes a parameter, sharded); two layer units' gathered weights and one's
gradient are its buffers on every GPU (megatron_buffer_bytes), beside the model's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.fp8 import fp8_bytes, gathered_weight_bytes
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.costs.stack import layer_kinds
from ppsim.costs.state import grad_bytes, optimizer_shards
from ppsim.costs.transformer import held_params
from ppsim.job.collectives import all_gather_ms, sharded_reduce_ms
from ppsim.job.step_comm import NOTHING, Reduction, overlapped

if TYPE_CHECKING:
    from ppsim.job.model import Job


@dataclass(frozen=True, kw_only=True)
class FsdpSteps:
    """When FSDP's collectives run: each microbatch, or once a step."""

    forward_gather: bool
    """Every microbatch's forward gathers each unit (else once, during the first)."""
    backward_gather: bool
    """Every microbatch's backward gathers each unit again."""
    backward_reduce: bool
    """Every microbatch's backward reduce-scatters each unit's gradient (else once, after
    the last backward, exposed)."""
    root_once: bool = False
    """The embedding and the output layer, in no unit of their own (Megatron-FSDP's root
    parameters), are gathered once a step, during the first forward, and held to its
    end; their gradients still reduce-scatter in every backward."""

    @property
    def per_microbatch(self) -> bool:
        """Any collective runs inside the microbatches' forwards and backwards."""
        return self.forward_gather or self.backward_gather or self.backward_reduce


@dataclass(frozen=True, kw_only=True)
class UnitRuns:
    """Which of a unit's collectives run in each microbatch."""

    forward_gather: bool = False
    backward_gather: bool = False
    """Gathered again before its backward."""
    backward_reduce: bool = False


def unit_runs(job: Job, head: bool = False, edge: bool = False) -> UnitRuns:
    """A unit's collectives in each microbatch. The head's unit keeps its weights to the
    backward unless the policy is "always" (torchtitan); `edge`: the embedding's or the
    head's, which Megatron-FSDP gathers once a step (step_reduction), only reduced here."""
    steps = job.fsdp_steps
    if steps is None or not steps.per_microbatch:
        return UnitRuns()
    held = edge and steps.root_once
    again = steps.backward_gather and (not head or job.arch.fsdp_reshard_after_forward
                                       == "always")
    return UnitRuns(forward_gather=steps.forward_gather and not held,
                    backward_gather=again and not held, backward_reduce=steps.backward_reduce)


def reshards_after_forward(policy: str, pipelined: bool) -> bool:
    """torchtitan's get_fsdp_reshard_after_forward_policy: "default" reshards unless
    pipelined (a gather per microbatch would not overlap)."""
    return policy == "always" or (policy == "default" and not pipelined)


def fsdp_steps(policy: str, pipelined: bool, framework: str = "torchtitan") -> FsdpSteps:
    """When the collectives run for torchtitan's `policy` with or without pp; under
    Megatron-FSDP's optim_grads_params every microbatch, whatever the policy (its
    grad_reduce_every_bprop)."""
    if framework == "megatron-fsdp":
        return FsdpSteps(forward_gather=True, backward_gather=True, backward_reduce=True,
                         root_once=True)
    reshard = reshards_after_forward(policy, pipelined)
    return FsdpSteps(forward_gather=reshard or not pipelined, backward_gather=reshard,
                     backward_reduce=not pipelined)


def held_bytes(a: Architecture, pipelined: bool, experts: bool = False,
               wide: bool = False) -> float:
    """Bytes a parameter holds unsharded all the step (none when its shards are one
    rank's: nothing is gathered); `wide`: the embedding's or the output layer's, gathered
    in the training dtype under FP8 too. Megatron-FSDP holds those alone, gathered."""
    if optimizer_shards(a, experts) == 1:
        return 0
    if a.megatron_fsdp:
        return DTYPE_BYTES[a.dtype] if wide else 0
    weight = DTYPE_BYTES[a.dtype] if wide else gathered_weight_bytes(a, DTYPE_BYTES[a.dtype])
    if pipelined:
        return weight + grad_bytes(a)
    return 0 if reshards_after_forward(a.fsdp_reshard_after_forward, pipelined) else weight


def _buffers(params: float, expert_params: float) -> list[tuple[float, str]]:
    """A unit's dense and expert parameters with the group each shards over (an empty
    buffer runs no collective)."""
    return [(n, g) for n, g in ((params - expert_params, "dp"), (expert_params, "edp")) if n]


def _host_copy_ms(job: Job, params: float, group: str) -> float:
    """Under CPU offload, a unit's fp32 shard of `params` over the host link (its weights
    in before a gather, its reduced gradient out after a reduce-scatter); 0 without."""
    host = job.host_optimizer
    if host is None or host.copies:
        return 0.0
    return host.copy_ms(params / job.link(group + "_shard").size)


@dataclass(frozen=True, kw_only=True)
class UnitPart:
    """One buffer's collective of a unit: the group it runs on, what it moves, its price."""

    group: str
    """"dp_shard" (the dense parameters) or "edp_shard" (the routed experts')."""
    nbytes: float
    """The gathered weights, or the reduced gradients."""
    ms: float
    """Its price, with its host copy under CPU offload (HSDP: the replicas' all-reduce)."""


def gather_parts(job: Job, params: float, expert_params: float = 0,
                 wide: float = 0) -> list[UnitPart]:
    """All-gather of a unit's weights on one rank's groups: in the training dtype, the
    decoder layers' in FP8 under --fp8-param-gather (torchtitan's
    enable_fsdp_float8_all_gather); `wide` of the dense ones (the embedding's, the output
    layer's) in the training dtype all the same. Under CPU offload each shard is copied
    in first."""
    w16 = DTYPE_BYTES[job.arch.dtype]
    w = gathered_weight_bytes(job.arch, w16)
    out = []
    for n, g in _buffers(params, expert_params):
        nbytes = n * w + (wide if g == "dp" else 0) * (w16 - w)
        out.append(UnitPart(group=g + "_shard", nbytes=nbytes, ms=_host_copy_ms(job, n, g)
                            + all_gather_ms(nbytes, job.link(g + "_shard"))))
    return out


def gather_ms(job: Job, params: float, expert_params: float = 0, wide: float = 0) -> float:
    """gather_parts, summed."""
    return _ms(gather_parts(job, params, expert_params, wide))


def reduce_parts(job: Job, params: float, expert_params: float = 0) -> list[UnitPart]:
    """Reduce-scatter of a unit's gradients (fp32) on one rank's groups (HSDP: then
    the shards all-reduced across the copies); under CPU offload each reduced shard is
    copied out after."""
    b = grad_bytes(job.arch)
    return [UnitPart(group=g + "_shard", nbytes=n * b, ms=sharded_reduce_ms(
        n * b, job.link(g + "_shard"), job.link(g + "_replica")) + _host_copy_ms(job, n, g))
        for n, g in _buffers(params, expert_params)]


def reduce_ms(job: Job, params: float, expert_params: float = 0) -> float:
    """reduce_parts, summed."""
    return _ms(reduce_parts(job, params, expert_params))


def _held(a: Architecture, pipelined: bool, c: LayerCost, wide: bool = False) -> LayerCost:
    extra = (c.params - c.expert_params) * held_bytes(a, pipelined, wide=wide) \
        + c.expert_params * held_bytes(a, pipelined, experts=True)
    return replace(c, static_bytes=c.static_bytes + int(extra)) if extra else c


def in_flight_bytes(a: Architecture, costs: ModelCosts) -> int:
    """The units in flight without pp (resharding after the forward): the largest unit's
    gathered weights twice (the computing one and the prefetched one; a decoder layer's in
    FP8 under --fp8-param-gather) and its gradient."""
    if optimizer_shards(a) == 1:
        return 0
    w16 = DTYPE_BYTES[a.dtype]
    layer = 2 * gathered_weight_bytes(a, w16) + grad_bytes(a)
    units = [(c.params, layer) for c in costs.layers] + \
        [(c.params, 2 * w16 + grad_bytes(a)) for c in (costs.embedding, costs.head)]
    return int(max((n * b for n, b in units), default=0))


def with_held(job: Job, costs: ModelCosts) -> ModelCosts:
    """`costs` with what FSDP holds unsharded added to each piece's static bytes (the
    units in flight once, on the embedding: without pp one rank holds them all;
    Megatron-FSDP's are its buffers, on every rank: megatron_buffer_bytes)."""
    a, pipelined = job.arch, job.shape.sizes.pp > 1
    emb = _held(a, pipelined, costs.embedding, wide=True)
    if not pipelined and not a.megatron_fsdp and \
            reshards_after_forward(a.fsdp_reshard_after_forward, pipelined):
        emb = replace(emb, static_bytes=emb.static_bytes + in_flight_bytes(a, costs))
    return replace(costs, layers=tuple(_held(a, pipelined, c) for c in costs.layers),
                   embedding=emb, head=_held(a, pipelined, costs.head, wide=True),
                   tied=_held(a, pipelined, costs.tied, wide=True))


@lru_cache(maxsize=64)
def layer_unit_params(a: Architecture) -> int:
    """The largest decoder layer's parameters on one rank: the unit a stage without the
    embedding gathers first."""
    held = (held_params(a, kind) for kind in set(layer_kinds(a)))
    return max(int(h.dense + h.experts) for h in held)


def megatron_buffer_bytes(a: Architecture) -> int:
    """Megatron-FSDP's buffers on each GPU, whatever its stage: two layer units' gathered
    weights (the computing one and the prefetched one; --fsdp-double-buffer keeps them)
    and one unit's gradient before its reduce-scatter, the largest decoder layer's, and
    under --fp8-param-gather the FP8 transpose a backward makes of its unit
    (ppsim.costs.fp8); 0 without Megatron-FSDP or where nothing is sharded."""
    if not a.megatron_fsdp or optimizer_shards(a) == 1:
        return 0
    weight = gathered_weight_bytes(a, DTYPE_BYTES[a.dtype])
    transpose = fp8_bytes(a) if a.fp8 and a.fp8_param_gather else 0
    return int(layer_unit_params(a) * (2 * weight + transpose + grad_bytes(a)))


def step_reduction(job: Job, params: int, expert_params: int, forward_ms: float,
                   holds_embedding: bool, wide: int = 0) -> Reduction:
    """The collectives FSDP runs once a step on a rank holding `params` (`wide` of them
    the embedding's and the output layer's): the gather during the first forward
    (`forward_ms`, one microbatch's), never exposing less than its first unit's (the
    embedding on the first stage's rank, else a layer), and the gradients'
    reduce-scatter after the last backward; under Megatron-FSDP the gather of the
    embedding and the output layer during the first forward (the embedding's first)."""
    steps = job.fsdp_steps
    assert steps is not None  # an FSDP job's
    out = NOTHING
    share = job.collective_sm_share
    if steps.root_once and wide:
        first = job.embedding_params if holds_embedding else 0
        root = gather_parts(job, wide, wide=wide)
        out += overlapped("parameter all-gather", _ms(root),
                          gather_ms(job, first, wide=first) if first else 0.0, forward_ms,
                          True, share, "forward", _bytes(root))
    if not steps.forward_gather:
        first = min(job.embedding_params if holds_embedding else layer_unit_params(job.arch),
                    params)
        units = gather_parts(job, params, expert_params, wide)
        out += overlapped("parameter all-gather", _ms(units),
                          gather_ms(job, first, wide=first if holds_embedding else 0),
                          forward_ms, True, share, "forward", _bytes(units))
    if not steps.backward_reduce:
        grads = reduce_parts(job, params, expert_params)
        out += overlapped("gradient reduce-scatter", _ms(grads), 0.0, 0.0, False, share, "",
                          _bytes(grads))
    return out



def _ms(parts: list[UnitPart]) -> float:
    return sum(p.ms for p in parts)


def _bytes(parts: list[UnitPart]) -> float:
    return sum(p.nbytes for p in parts)
