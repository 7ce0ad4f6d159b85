"""Cost model: per-layer time and bytes, and their sums per virtual stage.

Two sources fill a `ModelCosts`: a uniform synthetic model (numbers given
directly) and a transformer architecture on a hardware preset (FLOPs and
Korthikanti et al. 2022 activation formulas). Measured cost files
(`ppsim profile`) produce the same object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from itertools import accumulate
from typing import Any

from ppsim.errors import UserError
from ppsim.pipeline.split import Split


def input_grad_ms(c: LayerCost | StageCost, split: bool) -> float:
    """B's duration: the whole backward, or (split) the measured split path without W."""
    if not split:
        return c.backward_ms
    return (c.split_backward_ms or c.backward_ms) - c.weight_grad_ms


def least_busy_ms(c: LayerCost | StageCost) -> float:
    """F + B of one microbatch with each as short as in a combined pair (pair_saving_ms
    less): the least time a rank spends on the piece under any schedule."""
    return c.forward_ms + c.backward_ms - 2 * c.pair_saving_ms


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    forward_ms: float = 0.0
    """Forward time of one microbatch."""
    backward_ms: float = 0.0
    """Whole backward time (input gradients + weight gradients)."""
    weight_grad_ms: float = 0.0
    """Part of backward_ms that computes weight gradients (deferrable as W)."""
    static_bytes: int = 0
    """Bytes held all iteration: weights, gradients, optimizer states."""
    activation_bytes: int = 0
    """Bytes one microbatch's forward stores until its backward."""
    weight_grad_bytes: int = 0
    """Part of activation_bytes that W still needs after B (ZB's M_W)."""
    transient_bytes: int = 0
    """Bytes its backward holds beyond activation_bytes while it runs and frees before it
    ends: what a recompute brings back, the head's logit gradient."""
    output_bytes: int = 0
    """Bytes of the tensor sent to the next stage (and of its gradient back)."""
    params: int = 0
    """Parameters one rank holds for this piece (after tp/ep sharding): the optimizer
    step and the data-parallel gradient all-reduce at the end of a step scale with it."""
    expert_params: int = 0
    """Routed experts' among `params`: their gradients reduce over the expert
    data-parallel group, their optimizer state shards over it (ppsim.job.tail)."""
    split_backward_ms: float = 0.0
    """Whole backward when W runs apart from B (weight-gradient deferral costs a little
    more than one pass, as `ppsim profile` measures); 0: backward_ms."""
    pair_saving_ms: float = 0.0
    """What each of a forward and a backward saves when Megatron's combined 1F1B runs
    them as a pair (--overlap-moe-expert-parallel-comm): the all-to-all time the other's
    compute hides (ppsim.job.layers); 0 for a layer without them."""

    def input_grad_ms(self, split: bool) -> float:
        """B's duration: the whole backward, or without W when the schedule splits it."""
        return input_grad_ms(self, split)


PRICED_FIELDS = ("pair_saving_ms",)
"""LayerCost fields the job prices and no table or cost file gives."""
LAYER_FIELDS = tuple(f.name for f in fields(LayerCost) if f.name not in PRICED_FIELDS)
"""The keys of a layer's costs: a uniform [model] table, its embedding/head, a cost file."""
INTEGER_FIELDS = frozenset(f for f in LAYER_FIELDS if f.endswith(("bytes", "params")))
"""The keys among them that count (bytes, parameters); the rest are times."""


@dataclass(frozen=True, kw_only=True)
class ModelCosts:
    layers: tuple[LayerCost, ...]
    """One entry per layer, in order: the decoder layers, then the MTP layers."""
    embedding: LayerCost = field(default_factory=LayerCost)
    """On the first virtual stage."""
    head: LayerCost = field(default_factory=LayerCost)
    """Final norm, LM head and loss, on the last virtual stage."""
    kinds: tuple[str, ...] = ()
    """Each layer's kind ("dense", "moe", "mtp", ...), aligned with `layers`; empty when
    every layer is of one unnamed kind (uniform models, cost files)."""
    mtp_layers: int = 0
    """How many of the last `layers` are MTP layers (Megatron's 'm')."""
    tied: LayerCost = field(default_factory=LayerCost)
    """What the head shares with the embedding when they are tied (the table's weights,
    gradient and optimizer states: static_bytes and params): one copy on a stage that
    holds both, as Megatron's one shared weight on a single stage."""
    mtp_embedding: LayerCost = field(default_factory=LayerCost)
    """The embedding table's copy the first MTP layer's stage keeps (its static_bytes,
    counted in that layer): Megatron's GPTModel builds an embedding on an MTP stage too and
    keeps its weights in step with the first stage's. One table on a stage that holds the
    embedding and that layer both."""

    @cached_property
    def _experts_before(self) -> tuple[int, ...]:
        """Routed-expert parameters of the layers before each index (prefix sums: the
        planner asks for many stages)."""
        return (0, *accumulate(c.expert_params for c in self.layers))

    def experts_in(self, offset: int, count: int) -> int:
        """Routed-expert parameters of the layers [offset, offset + count)."""
        before = self._experts_before
        return before[offset + count] - before[offset]

    @cached_property
    def _transients(self) -> RangeMax:
        return RangeMax([c.transient_bytes for c in self.layers])

    def transient_in(self, offset: int, count: int) -> int:
        """The largest transient_bytes of the layers [offset, offset + count)."""
        return self._transients.max(offset, offset + count)

    def held_twice(self, first: bool, last: bool, first_mtp: bool = False) -> LayerCost:
        """What adding the embedding (`first`) and the head (`last`) to one stage counts
        twice: the tied table when the stage holds both, and MTP's copy of the table when
        it holds the embedding and the first MTP layer (`first_mtp`)."""
        tied = self.tied if first and last else _NOTHING
        if not (first and first_mtp and self.mtp_embedding.static_bytes):
            return tied
        return LayerCost(static_bytes=tied.static_bytes + self.mtp_embedding.static_bytes,
                         params=tied.params)

    def holds_first_mtp(self, offset: int, count: int) -> bool:
        """Whether the layers [offset, offset + count) hold the first MTP layer."""
        first = self.num_layers - self.mtp_layers
        return bool(self.mtp_layers) and offset <= first < offset + count

    @property
    def num_layers(self) -> int:
        """All layers a split covers, MTP included."""
        return len(self.layers)

    def kind_of(self, index: int) -> str:
        """The kind of layer `index`; "layer" when the model names none."""
        return self.kinds[index] if self.kinds else "layer"

    @property
    def hidden_bytes(self) -> int:
        """Bytes crossing a stage boundary (a stage with no layers passes its input on)."""
        if self.layers:
            return self.layers[0].output_bytes
        return self.embedding.output_bytes


@dataclass(frozen=True, slots=True)
class StageCost:
    """Everything the simulator needs about one virtual stage."""

    forward_ms: float
    backward_ms: float
    weight_grad_ms: float
    static_bytes: int
    activation_bytes: int
    weight_grad_bytes: int
    output_bytes: int
    params: int = 0
    split_backward_ms: float = 0.0
    offload_bytes: int = 0
    """Bytes of one microbatch's saved tensors copied to host memory after its F and
    back before its B (part of activation_bytes; ppsim.sim.copies)."""
    copy_ms: float = 0.0
    """Time of one such copy each way over the host link."""
    expert_params: int = 0
    """Routed-expert parameters among `params`."""
    pair_saving_ms: float = 0.0
    """What its F and its B each save in a combined pair (LayerCost.pair_saving_ms)."""
    transient_bytes: int = 0
    """What its B holds beyond activation_bytes while it runs: the largest of its
    pieces' (LayerCost.transient_bytes), as their backwards run one after another."""

    def input_grad_ms(self, split: bool) -> float:
        """B's duration: the whole backward, or without W when the schedule splits it."""
        return input_grad_ms(self, split)


_NOTHING = LayerCost()


class RangeMax:
    """The largest of a list's values over any index range in O(1) (a sparse table:
    row j holds the maxima of the spans of 2**j values)."""

    def __init__(self, values: list[int]) -> None:
        self.rows = [list(values)]
        span = 1
        while 2 * span <= len(values):
            prev = self.rows[-1]
            self.rows.append([max(prev[i], prev[i + span]) for i in range(len(prev) - span)])
            span *= 2

    def max(self, lo: int, hi: int) -> int:
        """max(values[lo:hi]); 0 for an empty range."""
        if hi <= lo:
            return 0
        j = (hi - lo).bit_length() - 1
        row = self.rows[j]
        return max(row[lo], row[hi - (1 << j)])


@dataclass(frozen=True, kw_only=True)
class PartSums:
    """A stage's pieces summed in their order (the embedding, the layers, the head)."""

    forward_ms: float
    backward_ms: float
    weight_grad_ms: float
    split_backward_ms: float
    """0 where it equals the backward (no split path measured)."""
    static_bytes: int
    activation_bytes: int
    weight_grad_bytes: int
    params: int
    pair_saving_ms: float


def sum_parts(parts: Sequence[LayerCost]) -> PartSums:
    """Sum `parts` in order: every stage cost, under a memory policy or not, sums its
    pieces here, so one stage priced two ways agrees to the last digit (float addition
    depends on its order)."""
    f = b = w = sb = paired = 0.0
    st = act = wg = n = 0
    for p in parts:
        f += p.forward_ms
        b += p.backward_ms
        w += p.weight_grad_ms
        sb += p.split_backward_ms or p.backward_ms
        st += p.static_bytes
        act += p.activation_bytes
        wg += p.weight_grad_bytes
        n += p.params
        paired += p.pair_saving_ms
    return PartSums(forward_ms=f, backward_ms=b, weight_grad_ms=w,
                    split_backward_ms=0.0 if sb == b else sb, static_bytes=st,
                    activation_bytes=act, weight_grad_bytes=wg, params=n,
                    pair_saving_ms=paired)


def held_input_bytes(costs: ModelCosts, layers: int, last: bool, receives: bool) -> int:
    """Bytes of a stage's input it keeps per microbatch beyond what its layers count.

    The runtime holds a stage's input until the backward (Megatron's `input_tensors`),
    and its first layer saves that same tensor (the norm's input, or a recomputed
    layer's checkpoint input), so the layers already count it once; only a stage with
    no layers that passes it on holds it on its own. (The output a stage sends is
    freed after the send, Megatron's `deallocate_output_tensor`: no stage keeps it.)"""
    return costs.hidden_bytes if receives and not layers and not last else 0


def stage_cost(costs: ModelCosts, offset: int, layers: int, first: bool, last: bool,
               receives: bool = False) -> StageCost:
    """Sum the layers [offset, offset + layers) plus embedding/head where they sit; a
    stage that `receives` hidden states holds its input as `held_input_bytes` says."""
    parts = list(costs.layers[offset:offset + layers])
    if first:
        parts.insert(0, costs.embedding)
    if last:
        parts.append(costs.head)
    s = sum_parts(parts)
    twice = costs.held_twice(first, last, costs.holds_first_mtp(offset, layers))
    return StageCost(s.forward_ms, s.backward_ms, s.weight_grad_ms,
                     s.static_bytes - twice.static_bytes,
                     s.activation_bytes + held_input_bytes(costs, layers, last, receives),
                     s.weight_grad_bytes, 0 if last else costs.hidden_bytes,
                     s.params - twice.params, s.split_backward_ms,
                     expert_params=costs.experts_in(offset, layers),
                     pair_saving_ms=s.pair_saving_ms,
                     transient_bytes=stage_transient(costs, offset, layers, first, last))


def stage_transient(costs: ModelCosts, offset: int, layers: int, first: bool,
                    last: bool) -> int:
    """A stage's transient_bytes: its pieces' largest (their backwards run in turn)."""
    return max(costs.transient_in(offset, layers), ends_transient(costs, first, last))


def ends_transient(costs: ModelCosts, first: bool, last: bool) -> int:
    """The largest transient of the embedding (`first`) and the head (`last`) a stage
    holds: what its layers' transients are compared with."""
    return max(costs.embedding.transient_bytes if first else 0,
               costs.head.transient_bytes if last else 0)


def receives_input(split: Split, index: int) -> bool:
    """Virtual stage `index` takes hidden states from the stage before it (on another
    rank or handed over on its own)."""
    return split.embedding_stage < index <= split.loss_stage


def static_floor_bytes(costs: ModelCosts, pp: int) -> int:
    """The least weights, gradients and optimizer state the fullest of `pp` ranks holds
    under any split: between them the ranks hold every layer, the embedding and the head
    (a tied table twice when two stages hold it), so one holds at least the average."""
    return -(-stage_cost(costs, 0, costs.num_layers, True, True).static_bytes // pp)


def stage_busy_ms(costs: ModelCosts, split: Split) -> list[float]:
    """Per virtual stage, least_busy_ms of its pieces (the embedding, its layers, the
    head) without building the stages: a job search bounds thousands of shapes by it."""
    layers = [0.0, *accumulate(least_busy_ms(c) for c in costs.layers)]
    embedding, head = least_busy_ms(costs.embedding), least_busy_ms(costs.head)
    return [layers[st.offset + st.layers] - layers[st.offset]
            + embedding * st.has_embedding + head * st.has_head for st in split.stages]


def held_by_rank(costs: ModelCosts, split: Split, index: int) -> LayerCost:
    """What stage `index` counts that another stage of its rank holds: the tied table on
    the head's stage where the embedding's stage shares its rank (Split.ends_share_rank).
    The two stages use one parameter there (torch pipelining keeps a rank's stage modules
    in one process), so its weights, gradient and optimizer state count once, on the
    embedding's stage, and no all-reduce keeps two copies in step."""
    return costs.tied if index == split.loss_stage and split.ends_share_rank else _NOTHING


def less_held(c: StageCost, twice: LayerCost) -> StageCost:
    """Stage cost `c` without what it counts twice (`twice`: static bytes, params)."""
    if not (twice.static_bytes or twice.params):
        return c
    return replace(c, static_bytes=c.static_bytes - twice.static_bytes,
                   params=c.params - twice.params)


def stage_costs(costs: ModelCosts, split: Split, memory: Any = None) -> list[StageCost]:
    """Per-virtual-stage costs for a split, in virtual-stage order; `memory` (a memory
    policy's costs, ppsim.policy.costs) prices each stage in place of `costs`."""
    if split.num_layers != costs.num_layers:
        raise UserError("pipeline.split", f"covers {split.num_layers} layers but the model "
                        f"has {costs.num_layers}", f"make the counts add up to {costs.num_layers}")
    if split.mtp != costs.mtp_layers:
        raise UserError("pipeline.split", f"places {split.mtp} MTP layers but the model has "
                        f"{costs.mtp_layers}", "count the model's MTP layers in the layout")
    out = []
    for st in split.stages:
        receives = receives_input(split, st.index)
        c = (stage_cost(costs, st.offset, st.layers, st.has_embedding, st.has_head, receives)
             if memory is None else memory.stage_cost(st.offset, st.layers, st.index,
                                                      st.has_embedding, st.has_head, receives))
        c = less_held(c, held_by_rank(costs, split, st.index))
        if st.index < split.embedding_stage or st.index >= split.loss_stage:
            # Before the embedding only token ids pass; after the loss nothing does.
            c = _no_output(c)
        out.append(c)
    return out


def _no_output(c: StageCost) -> StageCost:
    return replace(c, output_bytes=0)


def uniform_costs(num_layers: int, layer: LayerCost, embedding: LayerCost | None = None,
                  head: LayerCost | None = None) -> ModelCosts:
    return ModelCosts(layers=(layer,) * num_layers, embedding=embedding or LayerCost(),
                      head=head or LayerCost())
