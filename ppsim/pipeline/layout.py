"""Megatron's --pipeline-model-parallel-layout strings, read and written.

The language is Megatron-Core's (pipeline_parallel_layer_layout.py): commas are
cosmetic; `(...)*n` groups are unrolled first, then `x*n` for one symbol (so a
star after a starred group repeats the group's last symbol, as `(t|)*2*2` does);
`|` separates virtual stages; E embedding, t decoder layer, m MTP layer, L loss.
Any other character, whitespace included, is refused as Megatron refuses it.
Stage i is chunk i // pp on rank i % pp, so the stage count fixes vpp. Pure.
"""

from __future__ import annotations

import re

from ppsim.errors import UserError
from ppsim.pipeline.split import Split, _whole

EMBEDDING, DECODER, MTP, LOSS, SEP = "E", "t", "m", "L", "|"
SYMBOLS = EMBEDDING + DECODER + MTP + LOSS + SEP
FIELD = "pipeline.layout"
MAX_SYMBOLS = 1_000_000
"""Unrolled length we accept; a layout of a real model is a few hundred symbols."""
MAX_CHARS = 100_000
_GROUP = re.compile(r"\(([^)]+)\)\*([0-9]+)")
_REPEAT = re.compile(r"(.)\*([0-9]+)")
_COUNT_DIGITS = 7


def is_layout(text: str) -> bool:
    """Whether a split given as text is a layout string (else comma-separated counts)."""
    return any(c in text for c in SYMBOLS)


def _check_chars(text: str) -> None:
    """Characters and structure, with the column of the first mistake."""
    depth, opened = 0, 0
    for col, c in enumerate(text, 1):
        if c == "(":
            if depth:
                raise UserError(FIELD, f"nested parenthesis at column {col}",
                                "groups cannot nest; write the inner one out")
            depth, opened = 1, col
        elif c == ")":
            if not depth:
                raise UserError(FIELD, f"unbalanced parenthesis at column {col}", "remove it")
            depth = 0
        elif c not in SYMBOLS and c not in "*," and not ("0" <= c <= "9"):
            shown = repr(c) if c.isprintable() else f"U+{ord(c):04X}"
            raise UserError(FIELD, f"invalid layer character {shown} at column {col}",
                            "use E (embedding), t (decoder), m (MTP), L (loss), | (stage "
                            "break), (...)*n and x*n; no spaces")
    if depth:
        raise UserError(FIELD, f"unbalanced parenthesis at column {opened}", "close it")
    for match in re.finditer(r"\*([0-9]*)", text):
        digits = match.group(1)
        if not digits:
            raise UserError(FIELD, f"'*' at column {match.start() + 1} needs a count",
                            "write e.g. t*4")
        if len(digits.lstrip("0")) > _COUNT_DIGITS:
            raise UserError(FIELD, f"count {digits[:12]}... at column {match.start() + 2} is "
                            "too large", f"repeat at most {MAX_SYMBOLS:,} symbols")


def _unroll(pattern: re.Pattern[str], text: str) -> str:
    """One of Megatron's two unrolling passes, refusing an oversized result up front."""
    size, at = 0, 0
    for m in pattern.finditer(text):
        size += (m.start() - at) + len(m.group(1)) * int(m.group(2))
        at = m.end()
    size += len(text) - at
    if size > MAX_SYMBOLS:
        raise UserError(FIELD, f"unrolls to {size:,} symbols, more than {MAX_SYMBOLS:,}",
                        "give a layout with fewer layers and stages")
    return pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)


def expand(layout: str) -> list[str]:
    """The stages of a layout string, each a string of E, t, m, L."""
    if not isinstance(layout, str):
        raise UserError(FIELD, f"{layout!r} is not a string", 'e.g. "Et*4|t*4L"')
    if len(layout) > MAX_CHARS:
        raise UserError(FIELD, f"is {len(layout):,} characters long", "write it with (...)*n")
    _check_chars(layout)
    flat = _unroll(_REPEAT, _unroll(_GROUP, layout.replace(",", "")))
    left = next((c for c in flat if c not in SYMBOLS), None)
    if left is not None:
        raise UserError(FIELD, f"{left!r} is left over after unrolling (...)*n and x*n",
                        "a count follows one symbol or one group, e.g. t*4 or (tt|)*4")
    return flat.split(SEP)


def parse_layout(layout: str, pp: int, num_layers: int | None = None,
                 mtp_layers: int | None = None) -> Split:
    """A Split from Megatron's --pipeline-model-parallel-layout, e.g. "Et*3|(tt|)*29,m|L".

    num_layers counts decoder layers ('t'), as Megatron's --num-layers; mtp_layers
    the model's MTP layers ('m'). vpp is the stage count / pp.
    """
    pp = _whole(pp, "pipeline.pp", "pp", 1)
    stages = expand(layout)
    flat = "".join(stages)
    for sym, name in ((EMBEDDING, "embedding"), (LOSS, "loss")):
        if flat.count(sym) != 1:
            raise UserError(FIELD, f"has {flat.count(sym)} '{sym}' ({name})",
                            f"give '{sym}' exactly once")
    if not flat.startswith(EMBEDDING):
        raise UserError(FIELD, f"the first layer is {flat[0]!r}, not the embedding 'E'",
                        "start with 'E' (empty stages may come before it)")
    if not flat.endswith(LOSS):
        raise UserError(FIELD, f"the last layer is {flat[-1]!r}, not the loss 'L'",
                        "end with 'L' (empty stages may follow it)")
    decoders, mtps = flat.count(DECODER), flat.count(MTP)
    if num_layers is not None and decoders != num_layers:
        raise UserError(FIELD, f"has {decoders} decoder layers 't' but the model has "
                        f"{num_layers}", f"make the 't' count add up to {num_layers}")
    if mtp_layers is not None and mtps != mtp_layers:
        raise UserError(FIELD, f"has {mtps} MTP layers 'm' but the model has {mtp_layers}",
                        f"give 'm' {mtp_layers} times" if mtp_layers else "remove the 'm'")
    if mtps and flat.index(MTP) < flat.rindex(DECODER):
        raise UserError(FIELD, "an MTP layer 'm' comes before a decoder layer 't'",
                        "MTP layers follow every decoder layer")
    if len(stages) % pp:
        raise UserError(FIELD, f"{len(stages)} stages is not a multiple of pp={pp}",
                        f"give pp x vpp stages separated by '|', e.g. {pp} or {2 * pp}")
    if pp == 1 and len(stages) > 1:
        raise UserError(FIELD, f"{len(stages)} stages on pp=1: when the interleaved schedule "
                        "is used, pipeline-model-parallel size should be greater than 1",
                        "use one stage, or pp >= 2 (Megatron refuses this)")
    counts = tuple(st.count(DECODER) + st.count(MTP) for st in stages)
    emb = next(i for i, st in enumerate(stages) if EMBEDDING in st)
    loss = next(i for i, st in enumerate(stages) if LOSS in st)
    return Split(counts, pp, len(stages) // pp, "loop", mtps, emb, loss)


def _body(sym: str, n: int) -> str:
    return sym * n if n < 2 else f"{sym}*{n}"


def to_layout(split: Split) -> str:
    """Megatron's layout string for `split`, e.g. "Et*6|(t*8|)*6t*6L".

    The string says nothing of placement: Megatron always reads it in loop order.
    """
    segments = []
    for st in split.stages:
        seg = _body(DECODER, st.layers - st.mtp) + _body(MTP, st.mtp)
        segments.append((EMBEDDING if st.has_embedding else "") + seg
                        + (LOSS if st.has_head else ""))
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
