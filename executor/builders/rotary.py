"""Rotary position embeddings: the tables and the rotation (Llama's HF port)."""

from __future__ import annotations

import torch


def rotary_tables(seq: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (b, s, heads, d) with (s, 1, d/2) tables, pairs (i, i + d/2) as in
    Llama's HF port."""
    a, b = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
