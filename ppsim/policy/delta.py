"""Megatron's --delta-offload-bytes-across-pp-ranks, as its offload manager applies it.

megatron/core/pipeline_parallel/fine_grained_activation_offload.py,
PipelineOffloadManager.post_warmup_callback: after the first iteration it walks the
iteration's chunks (one per microbatch and virtual stage, in backward order) and, in
each, its offload groups (one per layer and offloaded module, in forward order), and
keeps whole groups on the device until pp_rank x delta bytes are consumed; then in each
chunk it keeps the last int(eligible x (1 - fraction)) of the groups still offloaded.
So the delta is a budget per iteration, spent on the first chunks the backward takes
(those the rank holds at its peak), not a cut of every microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Group:
    """One offload group of a chunk: a layer's offloaded module."""

    moved: int
    """Bytes it copies to the host (Megatron's group.total_offload_bytes)."""
    freed: int
    """Of those, the bytes that leave the device."""


def kept_by_delta(chunks: list[list[int]], pp_rank: int, delta: int) -> list[list[bool]]:
    """Per chunk (backward order), per group (forward order, its moved bytes): whether the
    delta keeps it on the device: whole groups, from the first, until the rank's
    pp_rank x delta bytes are used up (the group that crosses the budget is kept)."""
    budget = pp_rank * delta
    out = []
    for groups in chunks:
        row = []
        for moved in groups:
            keep = budget > 0
            if keep:
                budget -= moved
            row.append(keep)
        out.append(row)
    return out


def delta_held_bytes(groups: list[Group], chunks: int, held: int, pp_rank: int,
                     delta: int, fraction: float) -> int:
    """The device bytes a rank holds at its peak beyond what `fraction` alone leaves:
    of `chunks` alike chunks (a stage's `groups` each), the delta keeps whole groups
    from the first; the first `held` chunks are in flight together at the peak. Of the
    groups the delta keeps, `fraction` of their bytes would have left the device (the
    fraction priced as that share of the groups' bytes, as ppsim.policy.costs does)."""
    if not delta or not pp_rank or not groups:
        return 0
    per_chunk = sum(g.moved for g in groups)
    # Only the chunks the budget reaches need walking (every group of a chunk may be 0).
    reach = min(chunks, held, pp_rank * delta // per_chunk + 1 if per_chunk else chunks)
    kept = kept_by_delta([[g.moved for g in groups]] * reach, pp_rank, delta)
    freed = sum(g.freed for row in kept for g, k in zip(groups, row, strict=True) if k)
    return int(fraction * freed)
