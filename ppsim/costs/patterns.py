"""Megatron's per-layer 0/1 patterns (--moe-layer-freq, --window-attn-skip-freq): a list
expression such as "([0]*3+[1]*58)", read without eval (lists of 0 and 1, + and *)."""

from __future__ import annotations

import ast

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
