"""Which decoder layers go on which pipeline stage.

A `Split` is the number of decoder layers on each virtual stage, in virtual-stage
order (layer order), plus where each virtual stage lives: placement "loop" is
Megatron's interleaved order (stage i is chunk i // pp on rank i % pp), placement
"v" is ZB-V / DualPipeV (two chunks per rank; the second walks back up the ranks).
Stage 0 also holds the embedding, the last virtual stage the LM head and loss.

Constructors read the forms users already have (a list, Megatron's first/last or
account-for options, a Megatron layout string); exporters write Megatron flags,
torchtitan module names and DeepSpeed partition boundaries. Pure: no I/O.
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

# Layout symbols, as in Megatron's PipelineParallelLayerLayout.
EMBEDDING, DECODER, MTP, LOSS, SEP = "E", "t", "m", "L", "|"
_SYMBOLS = EMBEDDING + DECODER + MTP + LOSS + SEP
_LAYOUT = "pipeline.layout"


@dataclass(frozen=True)
class Stage:
    index: int  # virtual stage index, Megatron order
    rank: int
    chunk: int
    layers: int  # decoder layers in this stage
    offset: int  # 0-based index of its first decoder layer
    has_embedding: bool  # True only for stage 0
    has_head: bool  # True only for the last virtual stage (LM head + loss)


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
    counts: tuple[int, ...]  # decoder layers per virtual stage, in virtual-stage order
    pp: int
    vpp: int = 1
    placement: Placement = "loop"

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
        # Normalise so that equal splits compare equal whatever was passed in.
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "pp", pp)
        object.__setattr__(self, "vpp", vpp)

    @property
    def num_layers(self) -> int:
        return sum(self.counts)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @cached_property
    def stages(self) -> tuple[Stage, ...]:
        out, offset, last = [], 0, self.num_stages - 1
        for i, n in enumerate(self.counts):
            rank, chunk = self.stage_rank(i), self.stage_chunk(i)
            out.append(Stage(i, rank, chunk, n, offset, i == 0, i == last))
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
) -> Split:
    """A split given as one layer count per virtual stage, checked against the model."""
    split = Split(counts, pp, vpp, placement)  # type: ignore[arg-type]  # Split normalises
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


def _count(chars: list[tuple[str, int]], j: int) -> tuple[int, int]:
    """The `*n` starting at chars[j], if any: (n, index after it); (1, j) if none."""
    if j >= len(chars) or chars[j][0] != "*":
        return 1, j
    k = j + 1
    while k < len(chars) and chars[k][0] in "0123456789":  # not isdigit(): '²' is a digit
        k += 1
    if k == j + 1 or k - j > 10:  # at most 9 digits: int() refuses 4,300, memory far fewer
        raise UserError(_LAYOUT, f"'*' at column {chars[j][1]} needs a count of 1 to 9 digits",
                        "write e.g. t*4")
    return int("".join(c for c, _ in chars[j + 1 : k])), k


def _expand(chars: list[tuple[str, int]], groups: bool) -> list[tuple[str, int]]:
    """Layout symbols after unrolling `(...)*n` and `x*n`, each with its 1-based column.

    Same language as Megatron's parse_str_to_list, which unrolls with two regexes; we
    also say where a malformed string goes wrong.
    """
    out: list[tuple[str, int]] = []
    i = 0
    while i < len(chars):
        c, col = chars[i]
        if c == "(" and groups:
            j = i + 1
            while j < len(chars) and chars[j][0] != ")":
                if chars[j][0] == "(":
                    raise UserError(
                        _LAYOUT,
                        f"nested parenthesis at column {chars[j][1]}",
                        "groups cannot nest; write the inner one out",
                    )
                j += 1
            if j == len(chars):
                raise UserError(_LAYOUT, f"unbalanced parenthesis at column {col}", "close it")
            if j == i + 1:
                raise UserError(_LAYOUT, f"empty group at column {col}", "remove it")
            if j + 1 == len(chars) or chars[j + 1][0] != "*":
                raise UserError(
                    _LAYOUT,
                    f"group at column {col} is not followed by *n",
                    "write e.g. (tt|)*4, or drop the parentheses",
                )
            n, end = _count(chars, j + 1)
            out.extend(_expand(chars[i + 1 : j], groups=False) * n)
            i = end
        elif c in "()":
            raise UserError(_LAYOUT, f"unbalanced parenthesis at column {col}", "remove it")
        elif c in _SYMBOLS:
            n, i = _count(chars, i + 1)
            out.extend([(c, col)] * n)
        elif c == "*":
            raise UserError(
                _LAYOUT, f"'*' at column {col} follows no symbol or group", "write e.g. t*4"
            )
        else:
            raise UserError(
                _LAYOUT,
                f"unknown symbol {c!r} at column {col}",
                "use E (embedding), t (decoder layer), L (loss), | (stage break), (...)*n, x*n",
            )
    return out


def parse_layout(layout: str, pp: int, num_layers: int | None = None) -> Split:
    """A Split from Megatron's --pipeline-model-parallel-layout, e.g. "Et*3|(tt|)*29,t|L"."""
    pp = _whole(pp, "pipeline.pp", "pp", 1)
    if not isinstance(layout, str):
        raise UserError(_LAYOUT, f"{layout!r} is not a string", 'e.g. "Et*4|t*4L"')
    stages: list[list[tuple[str, int]]] = [[]]
    # Commas are cosmetic in Megatron; whitespace is too, here.
    chars = [(c, col) for col, c in enumerate(layout, 1) if c != "," and not c.isspace()]
    for sym, col in _expand(chars, groups=True):
        if sym == SEP:
            stages.append([])
        else:
            stages[-1].append((sym, col))
    flat = [s for stage in stages for s in stage]
    mtp = [col for sym, col in flat if sym == MTP]
    if mtp:
        raise UserError(
            _LAYOUT,
            f"MTP layers ('m' at column {mtp[0]}) are not supported",
            "remove the 'm' symbols; ppsim plans decoder layers only",
        )
    for sym, name in ((EMBEDDING, "embedding"), (LOSS, "loss")):
        cols = [col for s, col in flat if s == sym]
        if len(cols) != 1:
            where = f" (columns {', '.join(map(str, cols))})" if cols else ""
            raise UserError(
                _LAYOUT, f"has {len(cols)} '{sym}' ({name}){where}", f"give '{sym}' exactly once"
            )
    # Megatron only asks that E be the first layer and L the last; ppsim also puts them
    # on the first and last stage, so an empty stage before E or after L is refused.
    if flat[0][0] != EMBEDDING or stages[0][:1] != flat[:1]:
        col = next(col for s, col in flat if s == EMBEDDING)
        raise UserError(
            _LAYOUT, f"'E' at column {col} is not the first layer of stage 0", "start with 'E'"
        )
    if flat[-1][0] != LOSS or stages[-1][-1:] != flat[-1:]:
        col = next(col for s, col in flat if s == LOSS)
        raise UserError(
            _LAYOUT, f"'L' at column {col} is not the last layer of the last stage", "end with 'L'"
        )
    counts = tuple(sum(s == DECODER for s, _ in stage) for stage in stages)
    if num_layers is not None and sum(counts) != num_layers:
        raise UserError(
            _LAYOUT,
            f"has {sum(counts)} decoder layers 't' but the model has {num_layers}",
            f"make the 't' count add up to {num_layers}",
        )
    if len(stages) % pp:
        raise UserError(
            _LAYOUT,
            f"{len(stages)} stages is not a multiple of pp={pp}",
            f"give pp x vpp stages separated by '|', e.g. {pp} or {2 * pp}",
        )
    return Split(counts, pp, len(stages) // pp)


def _stage_body(n: int) -> str:
    return DECODER * n if n < 2 else f"{DECODER}*{n}"


def to_layout(split: Split) -> str:
    """Megatron's layout string for `split`, e.g. "Et*6|(t*8|)*6t*6L".

    The string says nothing of placement: Megatron always reads it in loop order.
    """
    segments = [_stage_body(n) for n in split.counts]
    segments[0] = EMBEDDING + segments[0]
    segments[-1] += LOSS
    parts, i, last = [], 0, len(segments) - 1
    while i < last:  # group runs of identical stages; the last one has no trailing '|'
        j = i
        while j + 1 < last and segments[j + 1] == segments[i]:
            j += 1
        k, plain = j - i + 1, segments[i] + SEP
        grouped = f"({plain})*{k}"
        parts.append(grouped if len(grouped) < len(plain) * k else plain * k)
        i = j + 1
    parts.append(segments[last])
    return "".join(parts)


def _megatron_base(split: Split) -> list[str]:
    if split.placement != "loop":
        raise UserError(
            "pipeline.placement",
            f"Megatron places virtual stages in loop order, not {split.placement!r}",
            "use placement 'loop' for a Megatron export",
        )
    if split.pp == 1 and split.vpp > 1:
        raise UserError(
            "pipeline.vpp", f"Megatron needs pp >= 2 for vpp={split.vpp}", "use vpp = 1"
        )
    base = ["--num-layers", str(split.num_layers), "--pipeline-model-parallel-size", str(split.pp)]
    if split.vpp > 1 and split.pp == 2:
        # arguments.py: the interleaved schedule with pp=2 needs p2p overlap.
        base.append("--overlap-p2p-comm")
    return base


def megatron_layout_flag(split: Split) -> list[str]:
    """Megatron argv tokens that give `split` through the layout flag."""
    return _megatron_base(split) + ["--pipeline-model-parallel-layout", to_layout(split)]


def megatron_flags(split: Split) -> list[str]:
    """The shortest Megatron argv tokens that build exactly `split`.

    Tries the even split and every first/last and account-for-embedding/loss option,
    fewest tokens first, and falls back to the layout flag, which can say anything.
    """
    base = _megatron_base(split)
    L, pp, vpp = split.num_layers, split.pp, split.vpp
    vpp_flag = ["--num-virtual-stages-per-pipeline-rank", str(vpp)] if vpp > 1 else []
    first, last = split.rank_layers(0), split.rank_layers(pp - 1)
    candidates: list[tuple[dict[str, object], list[str]]] = [({}, [])]
    for f, la in ((first, None), (None, last), (first, last)):
        if pp == 2 and vpp > 1 and f is not None and la is not None:
            continue  # Megatron divides by zero here; the layout flag is safe
        flags = []
        if f is not None:
            flags += ["--decoder-first-pipeline-num-layers", str(f)]
        if la is not None:
            flags += ["--decoder-last-pipeline-num-layers", str(la)]
        candidates.append(({"first_stage_layers": f, "last_stage_layers": la}, flags))
    for e, lo in ((True, False), (False, True), (True, True)):
        flags = ["--account-for-embedding-in-pipeline-split"] * e
        flags += ["--account-for-loss-in-pipeline-split"] * lo
        candidates.append(({"account_for_embedding": e, "account_for_loss": lo}, flags))
    for options, flags in sorted(candidates, key=lambda c: len(c[1])):  # stable: shortest first
        try:
            if megatron_split(L, pp, vpp, **options) == split:  # type: ignore[arg-type]
                return base + vpp_flag + flags
        except UserError:
            continue
    return megatron_layout_flag(split)


def torchtitan_fqns(split: Split) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part: module names per virtual stage."""
    parts = []
    for st in split.stages:
        names = ["tok_embeddings"] if st.has_embedding else []
        names += [f"layers.{k}" for k in range(st.offset, st.offset + st.layers)]
        names += ["norm", "output"] if st.has_head else []
        parts.append(names)
    return parts


def deepspeed_boundaries(split: Split) -> list[int]:
    """DeepSpeed PipelineModule partition boundaries over [embedding, layers..., head]."""
    if split.vpp > 1:
        raise UserError(
            "pipeline.vpp",
            f"DeepSpeed runs one stage per rank, but vpp={split.vpp}",
            "use vpp = 1 for a DeepSpeed export",
        )
    empty = [st.index for st in split.stages[1:-1] if st.layers == 0]
    if empty:
        raise UserError(
            "pipeline.split",
            f"stage {empty[0]} has no layers, and DeepSpeed cannot run an empty stage",
            "give every middle stage at least one layer",
        )
    # Spec 0 is the embedding, spec k + 1 decoder layer k, spec L + 1 the head.
    return [0] + [1 + st.offset + st.layers for st in split.stages[:-1]] + [split.num_layers + 2]
