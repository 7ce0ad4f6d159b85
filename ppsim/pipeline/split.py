"""Which layers go on which pipeline stage.

A `Split` is the number of layers on each virtual stage, in virtual-stage order
(layer order), plus where each virtual stage lives: placement "loop" is Megatron's
interleaved order (stage i is chunk i // pp on rank i % pp), placement "v" is ZB-V /
DualPipeV (two chunks per rank; the second walks back up the ranks). The layers are
the model's decoder layers followed by its MTP layers (`mtp` of them), so a split
covers every layer exactly once, in order. The embedding sits on `embedding_stage`
(0 unless a Megatron layout puts empty stages first) and the LM head and loss on
`loss_stage` (the last stage unless empty stages follow it).

Constructors read the forms users already have (a list, Megatron's first/last or
account-for options); `ppsim.layout` reads and writes Megatron layout strings and
`ppsim.exports` writes flags for Megatron, torchtitan and DeepSpeed. Pure: no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from ppsim.errors import UserError

Placement = Literal["loop", "v"]
PLACEMENTS = ("loop", "v")

@dataclass(frozen=True)
class Stage:
    index: int  # virtual stage index, Megatron order
    rank: int
    chunk: int
    layers: int  # layers in this stage (decoder layers, then MTP layers)
    offset: int  # 0-based index of its first layer
    has_embedding: bool  # True only for the embedding stage (stage 0 by default)
    has_head: bool  # True only for the loss stage (the last by default): LM head + loss
    mtp: int = 0  # how many of `layers` are MTP layers


def check_stages(pp: object, vpp: object) -> None:
    """Refuse a stage count no split has (pp and vpp whole, 1 or more), before the job
    is laid out on ranks from it."""
    _whole(pp, "pipeline.pp", "pp", 1)
    _whole(vpp, "pipeline.vpp", "vpp", 1)


def _whole(value: object, field: str, what: str, minimum: int) -> int:
    """`value` as an int >= minimum; bools and floats are mistakes, not numbers."""
    try:
        if isinstance(value, bool):  # an int to Python, a slip to a user
            raise TypeError
        number = operator.index(value)  # takes numpy ints, refuses 2.0
    except TypeError:
        raise UserError(
            field, f"{what} is {value!r}, not a whole number", f"give an integer >= {minimum}"
        ) from None
    if number < minimum:
        raise UserError(field, f"{what} is {number}", f"give an integer >= {minimum}")
    return number


@dataclass(frozen=True)
class Split:
    counts: tuple[int, ...]  # layers per virtual stage, in virtual-stage order
    pp: int
    vpp: int = 1
    placement: Placement = "loop"
    mtp: int = 0  # the last `mtp` layers are MTP layers (Megatron's 'm')
    embedding_stage: int = 0  # virtual stage holding the embedding
    loss_stage: int = -1  # virtual stage holding the LM head and loss; -1: the last

    def __post_init__(self) -> None:
        pp = _whole(self.pp, "pipeline.pp", "pp", 1)
        vpp = _whole(self.vpp, "pipeline.vpp", "vpp", 1)
        if self.placement not in PLACEMENTS:
            raise UserError(
                "pipeline.placement", f"unknown placement {self.placement!r}", "use 'loop' or 'v'"
            )
        if self.placement == "v" and vpp != 2:
            raise UserError(
                "pipeline.vpp",
                f"placement 'v' needs exactly 2 virtual stages per rank, got vpp={vpp}",
                "set vpp = 2 or use placement 'loop'",
            )
        try:
            if isinstance(self.counts, str | bytes):
                raise TypeError
            raw = tuple(self.counts)
        except TypeError:
            raise UserError(
                "pipeline.split", f"{self.counts!r} is not a list of counts", "e.g. [8, 8, 8, 8]"
            ) from None
        if len(raw) != pp * vpp:
            raise UserError(
                "pipeline.split",
                f"has {len(raw)} entries but pp={pp} x vpp={vpp} needs {pp * vpp}",
                "give one layer count per virtual stage, in stage order",
            )
        counts = tuple(_whole(c, "pipeline.split", f"entry {i}", 0) for i, c in enumerate(raw))
        mtp = _whole(self.mtp, "model.mtp_layers", "mtp_layers", 0)
        if mtp > sum(counts):
            raise UserError("model.mtp_layers", f"{mtp} MTP layers but the split has only "
                            f"{sum(counts)} layers", "count MTP layers in the split")
        last = len(raw) - 1
        loss = last if self.loss_stage == -1 else self.loss_stage
        emb = _whole(self.embedding_stage, "pipeline.layout", "embedding stage", 0)
        loss = _whole(loss, "pipeline.layout", "loss stage", 0)
        if not emb <= loss <= last:
            raise UserError("pipeline.layout", f"embedding on stage {emb} and loss on stage "
                            f"{loss} of 0..{last}", "put E before L")
        # Normalise so that equal splits compare equal whatever was passed in.
        for name, value in (("counts", counts), ("pp", pp), ("vpp", vpp), ("mtp", mtp),
                            ("embedding_stage", emb), ("loss_stage", loss)):
            object.__setattr__(self, name, value)

    @property
    def num_layers(self) -> int:
        """All layers the split covers: decoder layers plus MTP layers."""
        return sum(self.counts)

    @property
    def decoder_layers(self) -> int:
        """Megatron's --num-layers: the decoder layers, without MTP."""
        return self.num_layers - self.mtp

    @property
    def standard_ends(self) -> bool:
        """The embedding on the first stage and the loss on the last (every builder's case)."""
        return self.embedding_stage == 0 and self.loss_stage == self.num_stages - 1

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def ends_share_rank(self) -> bool:
        """The embedding and the LM head on two stages of one rank (a V placement, or
        several stages on the rank of pp = 1)."""
        emb, loss = self.embedding_stage, self.loss_stage
        return emb != loss and self.stage_rank(emb) == self.stage_rank(loss)

    @cached_property
    def stages(self) -> tuple[Stage, ...]:
        out, offset, first_mtp = [], 0, self.decoder_layers
        for i, n in enumerate(self.counts):
            rank, chunk = self.stage_rank(i), self.stage_chunk(i)
            mtp = max(0, offset + n - max(offset, first_mtp))
            out.append(Stage(i, rank, chunk, n, offset, i == self.embedding_stage,
                             i == self.loss_stage, mtp))
            offset += n
        return tuple(out)

    def _check(self, field: str, value: int, bound: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            raise UserError(field, f"{value!r} is out of range", f"use 0..{bound - 1}")

    def stage_rank(self, index: int) -> int:
        self._check("pipeline.stage", index, self.num_stages)
        if self.placement == "v" and index >= self.pp:
            return 2 * self.pp - 1 - index
        return index % self.pp

    def stage_chunk(self, index: int) -> int:
        self._check("pipeline.stage", index, self.num_stages)
        return index // self.pp

    def stage_index(self, rank: int, chunk: int) -> int:
        self._check("pipeline.rank", rank, self.pp)
        self._check("pipeline.chunk", chunk, self.vpp)
        if self.placement == "v" and chunk == 1:
            return 2 * self.pp - 1 - rank
        return chunk * self.pp + rank

    def rank_layers(self, rank: int) -> int:
        return sum(self.counts[self.stage_index(rank, c)] for c in range(self.vpp))


def split_from_counts(
    counts: Sequence[int],
    pp: int,
    vpp: int = 1,
    num_layers: int | None = None,
    placement: Placement = "loop",
    mtp: int = 0,
) -> Split:
    """A split given as one layer count per virtual stage, checked against the model."""
    split = Split(counts, pp, vpp, placement, mtp)  # type: ignore[arg-type]  # Split normalises
    if num_layers is not None and split.num_layers != num_layers:
        raise UserError(
            "pipeline.split",
            f"sums to {split.num_layers} but the model has {num_layers} layers",
            f"make the counts add up to {num_layers}",
        )
    return split


def even_split(num_layers: int, pp: int, vpp: int = 1) -> Split:
    """Megatron's default: every virtual stage gets num_layers / (pp * vpp) layers."""
    return megatron_split(num_layers, pp, vpp)


def near_even_counts(layers: int, stages: int) -> tuple[int, ...]:
    """The one near-even split: as even as possible, the remainder to the middle stages.

    The first stage carries the embedding and the last the head and loss, so when
    the layers do not divide, those two are the ones left one layer short (as
    Llama 3 405B's 7, 8 x 14, 7 on 16 stages, and as the README promises). When the
    layers divide it is Megatron's even split.
    """
    q, rem = divmod(layers, stages)
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    extra = set(order[:rem])
    return tuple(q + (i in extra) for i in range(stages))


def default_split(num_layers: int, pp: int, vpp: int = 1, mtp: int = 0,
                  placement: Placement = "loop") -> tuple[Split, str]:
    """The split used when none is given, and how it was chosen: "the even split"
    wherever ppsim says even (`ppsim split`, the planner's baseline, the TUI).

    Megatron's even split when the decoder layers divide (MTP layers on the last
    stage, as Megatron builds them); otherwise the near-even split over all layers.
    """
    decoder = num_layers - mtp
    try:
        even = megatron_split(decoder, pp, vpp)
    except UserError:
        counts = near_even_counts(num_layers, pp * vpp)
        return (Split(counts, pp, vpp, placement, mtp),
                f"near-even: Megatron has no even split of {decoder} layers over pp={pp}"
                + (f" x vpp={vpp}" if vpp > 1 else ""))
    counts = list(even.counts)
    counts[-1] += mtp
    return Split(tuple(counts), pp, vpp, placement, mtp), "Megatron's even split"


def even_counts(num_layers: int, pp: int, vpp: int = 1, mtp: int = 0) -> tuple[int, ...]:
    """The counts of `default_split`: what every baseline and "even" button uses."""
    return default_split(num_layers, pp, vpp, mtp)[0].counts


def megatron_split(
    num_layers: int,
    pp: int,
    vpp: int = 1,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
) -> Split:
    """The split Megatron-Core builds from these options.

    Counts and offsets follow `get_num_layers_to_build` / `get_transformer_layer_offset`
    (megatron/core/transformer/transformer_block.py, transformer_layer.py); rejections
    follow TransformerConfig.__post_init__ and megatron/training/arguments.py. Where
    Megatron accepts a configuration and then builds garbage (pp = 2, vpp > 1 with first
    and last set divides by zero; first + last above num_layers gives negative counts),
    we return the split it means, or refuse, never the garbage.
    """
    L = _whole(num_layers, "model.num_layers", "num_layers", 1)
    pp = _whole(pp, "pipeline.pp", "pp", 1)
    vpp = _whole(vpp, "pipeline.vpp", "vpp", 1)
    first, last = first_stage_layers, last_stage_layers
    emb, loss = bool(account_for_embedding), bool(account_for_loss)
    if pp == 1 and vpp > 1:
        raise UserError(
            "pipeline.vpp",
            f"vpp={vpp} needs pipeline parallelism, but pp=1",
            "use vpp = 1, or pp >= 2 (Megatron's interleaved schedule)",
        )
    if first is not None or last is not None:
        if emb or loss:
            raise UserError(
                "pipeline.first_stage_layers",
                "first/last stage layers cannot be combined with account_for_embedding "
                "or account_for_loss",
                "use one way of making the split uneven, or a layout",
            )
        per_rank = _uneven_ranks(L, pp, vpp, first, last)
    elif emb or loss:
        per_rank = _account_for_ranks(L, pp, vpp, emb, loss)
    else:
        per_rank = _even_ranks(L, pp, vpp)
    counts = [0] * (pp * vpp)
    for rank, rank_count in enumerate(per_rank):
        for chunk in range(vpp):
            counts[chunk * pp + rank] = rank_count // vpp
    # The embedding and the loss each take one layer's place on their own stage.
    counts[0] -= emb
    counts[-1] -= loss
    return Split(tuple(counts), pp, vpp)


def _uneven_ranks(L: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """Layers per rank under --decoder-first/last-pipeline-num-layers."""
    checked = []
    for field, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        n = None if value is None else _whole(value, f"pipeline.{field}", field, 1)
        if n is not None and n % vpp:
            raise UserError(
                f"pipeline.{field}",
                f"{n} layers do not divide over vpp={vpp} virtual stages",
                f"use a multiple of {vpp}",
            )
        checked.append(n)
    first, last = checked
    if pp == 1:
        # The one stage is first and last; Megatron builds `last` layers there if set.
        field, n = (
            ("last_stage_layers", last) if last is not None else ("first_stage_layers", first)
        )
        if n != L:
            raise UserError(
                f"pipeline.{field}",
                f"is {n}, but with pp=1 the only stage holds all {L} layers",
                f"set it to {L} or leave it unset",
            )
        return [L]
    field = "pipeline." + ("last_stage_layers" if first is None else "first_stage_layers")
    middle_stages = pp - (first is not None) - (last is not None)
    middle = L - (first or 0) - (last or 0)
    if middle < 0:
        raise UserError(
            field,
            f"first ({first or 0}) + last ({last or 0}) stage layers exceed the model's {L}",
            "lower them",
        )
    if bool(middle) != bool(middle_stages):
        raise UserError(
            field,
            f"{middle} middle layers remaining but {middle_stages} middle PP stages available",
            f"make first + last = {L}" if not middle_stages else "leave some layers for them",
        )
    per_middle = middle // middle_stages if middle_stages else 0
    if middle_stages and middle % middle_stages:
        raise UserError(
            field,
            f"{middle} middle layers do not divide over the {middle_stages} middle stages",
            f"choose first/last so that {L} - first - last is a multiple of {middle_stages}",
        )
    if middle_stages and per_middle % vpp:
        raise UserError(
            field,
            f"each middle rank gets {per_middle} layers, which do not divide over vpp={vpp}",
            f"choose first/last so that each middle rank gets a multiple of {vpp}",
        )
    ranks = [per_middle] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    return ranks


def _account_for_ranks(L: int, pp: int, vpp: int, embedding: bool, loss: bool) -> list[int]:
    """Layers per rank when the embedding and/or loss count as one layer each."""
    field = "pipeline.account_for_" + ("embedding" if embedding else "loss")
    n = L + embedding + loss
    what = " + ".join([f"{L} layers"] + ["embedding"] * embedding + ["loss"] * loss)
    if n % pp:
        raise UserError(
            field, f"{what} = {n} do not divide over pp={pp}", f"use a pp that divides {n}"
        )
    if (n // pp) % vpp:
        raise UserError(
            field,
            f"{what} = {n} give {n // pp} per rank, which do not divide over vpp={vpp}",
            f"use a vpp that divides {n // pp}",
        )
    return [n // pp] * pp


def _even_ranks(L: int, pp: int, vpp: int) -> list[int]:
    if L % pp:
        raise UserError(
            "pipeline.pp",
            f"number of layers ({L}) should be divisible by the pipeline-model-parallel "
            f"size ({pp})",
            "choose another pp, set first/last stage layers, or give a layout",
        )
    if (L // pp) % vpp:
        raise UserError(
            "pipeline.vpp",
            f"{L // pp} layers per rank do not divide over vpp={vpp}",
            f"use a vpp that divides {L // pp}",
        )
    return [L // pp] * pp


