"""What a builder of one's own promises (README, 'Your own model'), tried before any
process starts: a torch `dtype`, an `activation_shape` its embedding returns and each
layer keeps, a `microbatch` that is a pure function of its arguments, and a `loss` that
is a scalar. Broken, each of these failed only inside the ranks, blaming what tripped
over it (a LayerNorm's width, gloo aborting on a short message, an in-place add) or not
at all (inputs and targets drawn apart on the first and last stage). The pieces run on
the meta device (no memory, no time); a piece that cannot run there is left to the
ranks."""

from __future__ import annotations

from typing import Any

import torch

from ppsim.errors import UserError

_SHAPE_FIX = "make activation_shape the (batch, tokens, ...) shape of what the embedding " \
    "returns and every layer takes and returns"


def check_contract(builder: Any, where: str) -> None:
    """Refuse (UserError, in `where`'s name) a builder that breaks its contract."""
    if not isinstance(builder.dtype, torch.dtype):
        raise UserError(where, f"the builder's dtype is {builder.dtype!r}, not a torch.dtype",
                        "set dtype = torch.float32 (or torch.bfloat16, ...)")
    shape = _activation_shape(builder, where)
    inputs, targets = _microbatch(builder, where)
    with torch.device("meta"):
        try:
            x = builder.embedding()(inputs.to("meta"))
        except Exception:  # a piece that needs real tensors: its ranks will tell
            return
        _same_shape(where, "the embedding returns", x, shape)
        h = torch.empty(shape)
        for i in sorted({0, builder.num_layers - 1}):
            try:
                y = builder.layer(i)(h)
            except Exception:
                return
            _same_shape(where, f"layer({i}) returns", y, shape)
        try:
            loss = builder.loss(builder.head()(h), targets.to("meta"))
        except Exception:
            return
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) \
            else f"a {type(loss).__name__}"
        raise UserError(where, f"the builder's loss(output, targets) returns {got}, not a "
                        "scalar tensor", "return the microbatch's mean loss (e.g. "
                        "F.cross_entropy with its default reduction='mean')")


def _activation_shape(builder: Any, where: str) -> tuple[int, ...]:
    shape = builder.activation_shape
    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) < 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                for d in dims):
        raise UserError(where, f"the builder's activation_shape is {shape!r}, not a tuple of "
                        "at least two positive ints", _SHAPE_FIX)
    return dims


def _same_shape(where: str, what: str, got: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        seen = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise UserError(where, f"{what} {seen} but the builder's activation_shape is "
                        f"{shape} (stages exchange tensors of that shape)", _SHAPE_FIX)


def _microbatch(builder: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One microbatch, drawn twice: the first stage draws the inputs and the last the
    targets, so one that differs between calls trains on targets of other inputs."""
    draws = [builder.microbatch(0, 0, 0) for _ in range(2)]
    for d in draws:
        if not (isinstance(d, tuple | list) and len(d) == 2
                and all(isinstance(t, torch.Tensor) for t in d)):
            raise UserError(where, "the builder's microbatch(seed, iteration, index) returns "
                            f"a {type(d).__name__}, not a pair of tensors",
                            "return (inputs, targets)")
    if not all(torch.equal(a, b) for a, b in zip(*draws, strict=True)):
        raise UserError(where, "the builder's microbatch(0, 0, 0) returned other tensors the "
                        "second time (the first and last stages draw it apart)",
                        "make it a pure function of (seed, iteration, index), e.g. a "
                        "torch.Generator seeded by them")
    return draws[0][0], draws[0][1]
