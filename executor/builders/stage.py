"""A pipeline stage built from any `ModelBuilder`: embedding, decoder layers, head.

Every piece is built under a torch RNG seeded by what it is ("layer5",
"embedding", "head") and the run's seed, never by build order, so any split of
the same model starts from bit-identical weights, whatever init the builder
uses. Layers are registered under their global index ("layers.5.q.weight"),
so a parameter has the same name whichever stage holds it.

Recompute (activation checkpointing, torch.utils.checkpoint, non-reentrant):
"full" recomputes each decoder layer in the backward and keeps only its input;
"selective" recomputes the modules that mark themselves with
`ppsim_recompute = True` (the attention core, as Megatron's selective
recompute does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ppsim.executor.builders.context import context
from ppsim.executor.builders.cp_attention import context_attention
from ppsim.executor.builders.deferral import defer_linears
from ppsim.executor.builders.tensor import current
from ppsim.executor.builders.tied import share_table, ties
from ppsim.executor.builders.user_tp import parallelized

if TYPE_CHECKING:
    from ppsim.executor.builders import ModelBuilder

RECOMPUTE_MODES = ("none", "selective", "full")


def piece_seed(seed: int, what: str) -> int:
    return seed * 1_000_003 + sum(ord(c) * 31 ** k for k, c in enumerate(what)) % (1 << 40)


def build_piece(make: Callable[[], nn.Module], seed: int, what: str) -> nn.Module:
    """`make()` under an RNG seeded by `what`, with its Linears made deferrable."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(piece_seed(seed, what))
        module = make()
    defer_linears(module)
    return module


_window_masks: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}
"""The sliding-window masks made so far, one per (length, window, dtype, device)."""


def window_mask(length: int, window: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """The additive mask of a sliding window: query i sees keys i - window .. i (Megatron's
    --window-size W,0). One per shape, shared by every layer and left out of the bytes a
    stage keeps (saved_bytes): FlashAttention takes a window as two integers, no mask."""
    key = (length, window, dtype, device)
    if key not in _window_masks:
        i = torch.arange(length, device=device)
        behind = i[:, None] - i[None, :]
        seen = (behind >= 0) & (behind <= window)
        _window_masks[key] = torch.zeros(length, length, dtype=dtype, device=device
                                         ).masked_fill_(~seen, float("-inf"))
    return _window_masks[key]


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      window: int = 0) -> torch.Tensor:
    """softmax(QK^T / sqrt(d) + mask)V as Megatron's DotProductAttention computes it: K
    and V repeated to every query head, the whole score matrix, the probabilities kept
    for the backward (ppsim.costs.layerops.unfused_core_ops)."""
    repeat = q.shape[1] // k.shape[1]
    if repeat > 1:
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    length = q.shape[2]
    mask = window_mask(length, window if 0 < window < length - 1 else length, q.dtype,
                       q.device)
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class AttentionCore(nn.Module):
    """softmax(QK^T)V with a causal mask: what FlashAttention computes; with `window` > 0,
    each query sees itself and at most `window` keys before it; `unfused`: as Megatron's
    DotProductAttention computes it (`unfused_attention`).

    q: (b, heads, s, d); k, v: (b, kv_heads, s, d) (grouped-query attention is
    done by the kernel, no repeated K/V is stored).
    """

    ppsim_recompute = True
    """Selective recompute checkpoints this module."""

    def __init__(self, window: int = 0, unfused: bool = False) -> None:
        super().__init__()
        self.window, self.unfused = window, unfused

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if context() is not None:  # every context-parallel rank's keys and values
            return context_attention(q, k, v, self.window)
        if self.unfused:
            return unfused_attention(q, k, v, self.window)
        gqa = k.shape[1] != q.shape[1]
        length = q.shape[2]
        if 0 < self.window < length - 1:
            mask = window_mask(length, self.window, q.dtype, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


# ------------------------------------------------------------------ recompute + bytes


_counting: list[dict[int, int]] = []
"""Active saved-bytes counters (innermost last); checkpoint inputs are added to it."""


def counters() -> list[dict[int, int]]:
    """The active saved-bytes counters (a storage freed early is taken out of each)."""
    return _counting


def checkpointed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args) under a non-reentrant checkpoint, its tensor inputs counted as kept."""
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    if _counting:  # what a checkpoint keeps for its recompute: its tensor inputs
        for a in args:
            if torch.is_tensor(a):
                st = a.untyped_storage()
                _counting[-1][st.data_ptr()] = st.nbytes()
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _wrap(module: nn.Module) -> None:
    module.forward = functools.partial(checkpointed, type(module).forward.__get__(module))


def apply_recompute(layers: nn.ModuleDict, mode: str) -> None:
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute {mode!r} is not one of {RECOMPUTE_MODES}")
    if mode == "full":
        for layer in layers.values():
            _wrap(layer)
    elif mode == "selective":
        for m in layers.modules():
            if getattr(m, "ppsim_recompute", False):
                _wrap(m)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of `tensors`' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


@contextmanager
def saved_bytes(exclude: set[int]) -> Iterator[dict[int, int]]:
    """Storages autograd keeps for the backward while inside: {data_ptr: bytes}.

    Counts saved tensors (saved-tensor hooks) and checkpoint inputs, once per
    storage; storages in `exclude` (the parameters) and the window masks are left out.
    """
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    _counting.append(seen)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield seen
    finally:
        _counting.pop()
        for ptr in [*exclude, *(m.untyped_storage().data_ptr() for m in _window_masks.values())]:
            seen.pop(ptr, None)


# ------------------------------------------------------------------ the stage


def _split(builder: ModelBuilder, make: Callable[[], nn.Module], piece: str
           ) -> Callable[[], nn.Module]:
    """`make`, then the builder's own tensor-parallel split of the piece where it has one."""
    return lambda: parallelized(builder, make(), piece, current())


def embedding_piece(builder: ModelBuilder, seed: int = 0) -> nn.Module:
    """The embedding as every split builds it (seeded by its name, this tensor rank's
    slice): also what a tied head's copy is made equal to (ppsim.executor.tied)."""
    return build_piece(_split(builder, builder.embedding, "embedding"), seed, "embedding")


class Stage(nn.Module):
    """One virtual stage: [embedding] + decoder layers offset..offset+n-1 + [head]."""

    def __init__(self, builder: ModelBuilder, offset: int, num_layers: int,
                 has_embedding: bool, has_head: bool, seed: int = 0,
                 recompute: str = "none") -> None:
        super().__init__()
        self.embedding = embedding_piece(builder, seed) if has_embedding else None
        self.layers = nn.ModuleDict({
            str(i): build_piece(_split(builder, functools.partial(builder.layer, i), "layer"),
                                seed, f"layer{i}")
            for i in range(offset, offset + num_layers)})
        self.head = build_piece(_split(builder, builder.head, "head"), seed, "head") \
            if has_head else None
        if self.embedding is not None and self.head is not None and ties(builder):
            share_table(self.head, self.embedding)
        apply_recompute(self.layers, recompute)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers.values():
            x = layer(x)
        # The logits are returned, never bound to a local: a reference cycle through a
        # layer's frames keeps every caller's frame, locals and all, until a full
        # collection (on CUDA, torch 2.11's first checkpoint call leaves one through the
        # imports it runs), and one microbatch's logits would stay allocated.
        return x if self.head is None else self.head(x)


def build_stage(builder: ModelBuilder, stage: Any, seed: int = 0,
                recompute: str = "none") -> Stage:
    """The module of one `ppsim.split.Stage` (offset, layers, has_embedding, has_head)."""
    return Stage(builder, stage.offset, stage.layers, stage.has_embedding, stage.has_head,
                 seed, recompute)


def full_model(builder: ModelBuilder, seed: int = 0, recompute: str = "none") -> Stage:
    """The whole model on one process: the reference a pipeline run must match."""
    return Stage(builder, 0, builder.num_layers, True, True, seed, recompute)
