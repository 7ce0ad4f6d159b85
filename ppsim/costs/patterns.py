"""Megatron's per-layer 0/1 patterns (--moe-layer-freq, --window-attn-skip-freq): a list
expression such as "([0]*3+[1]*58)", read without eval (lists of 0 and 1, + and *)."""

from __future__ import annotations

import ast
from collections.abc import Callable

from ppsim.errors import UserError

MAX_PATTERN = 100_000
"""No model has more layers than this; a longer list is refused unread."""


def bits(text: str) -> list[int]:
    """The list a pattern expression means; ValueError when it is not one."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError("not an expression") from None
    return _value(node)


def _value(node: ast.AST) -> list[int]:
    if isinstance(node, ast.List):
        values = [n.value for n in node.elts if isinstance(n, ast.Constant)]
        if len(values) != len(node.elts) or any(v not in (0, 1) or isinstance(v, bool)
                                                for v in values):
            raise ValueError("a list of 0 and 1")
        return values
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left) + _value(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for lst, times in ((node.left, node.right), (node.right, node.left)):
            if isinstance(times, ast.Constant) and type(times.value) is int:
                part = _value(lst)
                if len(part) * times.value > MAX_PATTERN:
                    raise ValueError("longer than any model")
                return part * max(times.value, 0)
    raise ValueError("lists of 0 and 1 with + and *")


def layer_pattern(text: str, num_layers: int, *, where: str, nth: Callable[[int, int], int],
                  example: str, length: Callable[[int, int], str]) -> list[int]:
    """One 0/1 a layer from Megatron's pattern argument `text`: "N" gives nth(N, i) for
    layer i (from 0), a list expression the list itself, one entry a layer; UserError
    naming `where` otherwise (`length(got, wanted)`: Megatron's words for a wrong count)."""
    t = text.strip()
    if t.isdigit():
        every = int(t)
        if every < 1:
            raise UserError(where, "must be at least 1", "give N >= 1 or a list")
        return [nth(every, i) for i in range(num_layers)]
    try:
        pattern = bits(t)
    except ValueError:
        raise UserError(where, f"{text!r} is neither a number nor a list expression of 0 "
                        "and 1", f"write e.g. {example}") from None
    if len(pattern) != num_layers:
        raise UserError(where, length(len(pattern), num_layers), "give one 0 or 1 per layer")
    return pattern


def moe_layers(freq: str, num_layers: int) -> list[int]:
    """Megatron's --moe-layer-freq, 1 a MoE layer: N makes every Nth layer from the first
    one."""
    return layer_pattern(freq, num_layers, where="--moe-layer-freq",
                         nth=lambda every, i: int(i % every == 0),
                         example='"([0]*3+[1]*58)"',
                         length=lambda got, want: "Invalid length of moe_layer_pattern: "
                         f"{got}, expected {want}")


def linear_attention_layers(freq: str, num_layers: int) -> list[int]:
    """Megatron's --linear-attention-freq, 1 a GatedDeltaNet layer: N makes every Nth
    layer (numbers from 1) full attention and the rest linear."""
    return layer_pattern(freq, num_layers, where="model.linear_attention_freq",
                         nth=lambda every, i: int((i + 1) % every != 0),
                         example='"4" or "([1]*3+[0])*12"',
                         length=lambda got, want: "Invalid length of linear_attention_pattern: "
                         f"{got}, expected {want}")


def windows(n: int, w: int, freq: str) -> tuple[int, ...]:
    """The attention windows of `n` layers, as Megatron's is_layer_window_attention places
    a window `w` by --window-attn-skip-freq `freq`: "N", one full-attention layer after
    N - 1 windowed ones (layer numbers from 1); a list, 1 windowed; none: every layer."""
    if not w:
        return (0,) * n
    if not freq.strip():
        return (w,) * n
    bits_ = layer_pattern(freq, n, where="model.window_attn_skip_freq",
                          nth=lambda every, i: int((i + 1) % every != 0),
                          example='"2" or "([1]*3+[0])*9"',
                          length=lambda got, want: f"{got} entries for {want} layers")
    return tuple(w if bit else 0 for bit in bits_)
