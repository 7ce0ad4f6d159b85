"""Megatron's --delta-offload-bytes-across-pp-ranks as its offload manager applies it:
megatron/core/pipeline_parallel/fine_grained_activation_offload.py,
PipelineOffloadManager.post_warmup_callback (lines 640-669 of Megatron-LM's main):

    keep_on_gpu_bytes = self._pp_rank * self._delta_offload_bytes_across_pp_ranks
    for chunk in self._cached_chunks_backward:
        for group in chunk.offload_groups:
            if group.offload and keep_on_gpu_bytes > 0:
                keep_on_gpu_bytes -= group.total_offload_bytes
                group.offload = False
    for chunk in self._cached_chunks_backward:   # then the fraction, per chunk
        eligible = [g for g in chunk.offload_groups if g.offload and g.total_offload_bytes > 0]
        disabled = int(len(eligible) * (1 - fraction))   # the last ones stay on the GPU

A chunk is one microbatch of one virtual stage (init_model_chunk_offload_handler), and
_cached_chunks_backward holds every chunk of the warm-up iteration (asserted as long as
_cached_chunks_forward), so the delta is a budget per iteration, in whole groups (one per
layer and offloaded module), spent on the first chunks the backward takes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.policy.delta import Group, delta_held_bytes
from ppsim.policy.report import policy_flags
from ppsim.sim.simulate import simulate

PP, MB = 4, 8
MODULES = ["core_attn", "attn_proj"]


def megatron_stays(chunks: list[list[int]], pp_rank: int, delta: int,
                   fraction: float) -> list[list[bool]]:
    """Megatron's two loops over group bytes per chunk: True where a group stays on GPU."""
    offload = [[True] * len(c) for c in chunks]
    keep = pp_rank * delta
    for c, groups in enumerate(chunks):
        for g, nbytes in enumerate(groups):
            if offload[c][g] and keep > 0:
                keep -= nbytes
                offload[c][g] = False
    for c, groups in enumerate(chunks):
        eligible = [g for g, nbytes in enumerate(groups) if offload[c][g] and nbytes > 0]
        for g in reversed(eligible[len(eligible) - int(len(eligible) * (1 - fraction)):]):
            offload[c][g] = False
    return [[not o for o in row] for row in offload]


def _problem(step: int):
    memory = {"offload_modules": MODULES, "offload_fraction": 1.0}
    if step:
        memory["offload_step_bytes"] = step
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "recompute": "none"},
        "pipeline": {"pp": PP, "microbatches": MB}, "hardware": {"preset": "h100-80gb"},
        "memory": memory}))


def test_the_delta_keeps_megatrons_groups_on_the_gpu_at_the_peak() -> None:
    """Each rank's peak rises by the bytes Megatron's rule keeps on the GPU in the chunks
    1F1B holds at the peak (pp - r); ppsim lowered every microbatch's fraction instead."""
    plain = _problem(0)
    pc, st0 = plain.memory.costs, plain.split.stages[0]
    groups = pc.groups(plain.memory.policies[0], st0.offset, st0.layers)
    step = groups[0].moved * 3 // 2  # one and a half groups: rank r keeps r x that, whole
    stepped = _problem(step)
    base = [r.peak_memory_bytes for r in simulate(plain).summary.ranks]
    got = [r.peak_memory_bytes for r in simulate(stepped).summary.ranks]
    for r, stage in enumerate(stepped.split.stages):
        gs = pc.groups(stepped.memory.policies[r], stage.offset, stage.layers)
        stays = megatron_stays([[g.moved for g in gs]] * MB, r, step, 1.0)
        held = sum(g.freed for row in stays[:PP - r] for g, s in zip(gs, row, strict=True) if s)
        assert got[r] - base[r] == held
    assert got[1] - base[1] > 0 and got[1] - base[1] < 3 * groups[0].freed


def test_the_delta_round_trips_through_megatrons_flags() -> None:
    problem = _problem(1_000_000)
    flags = policy_flags(problem, problem.memory.policies).megatron_flags
    assert flags is not None
    i = flags.index("--delta-offload-bytes-across-pp-ranks")
    assert flags[i + 1] == "1000000"
    assert policy_flags(_problem(0), _problem(0).memory.policies).megatron_flags == \
        flags[:i]


@settings(max_examples=200, deadline=None)
@given(moved=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
       chunks=st.integers(1, 8), pp=st.integers(2, 8), delta=st.integers(0, 3 * 10**6),
       fraction=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_held_bytes_grow_with_the_rank_and_never_pass_the_offloaded(
        moved: list[int], chunks: int, pp: int, delta: int, fraction: float) -> None:
    """The bytes a rank offloads over the iteration never rise with the rank and never go
    below 0; the bytes held at the peak are Megatron's kept groups in the first chunks."""
    groups = [Group(moved=m, freed=m // 2) for m in moved]
    every = fraction * sum(g.freed for g in groups) * chunks
    offloaded = [every - delta_held_bytes(groups, chunks, chunks, r, delta, fraction)
                 for r in range(pp)]
    assert offloaded[0] == every
    assert all(a >= b for a, b in zip(offloaded, offloaded[1:], strict=False))
    assert all(o >= 0 for o in offloaded)
    held = [delta_held_bytes(groups, chunks, pp - r, r, delta, fraction) for r in range(pp)]
    ref = [sum(g.freed for row in megatron_stays([moved] * min(chunks, pp - r), r, delta, 1.0)
               for g, s in zip(groups, row, strict=True) if s) for r in range(pp)]
    assert held == [int(fraction * x) for x in ref]


def test_a_negative_delta_is_refused() -> None:
    with pytest.raises(Exception, match="offload_step_bytes"):
        _problem(-1)
