"""The job search's recompute choice (ppsim.job.policy_search.fitting_mode): the first
global mode, from the configured one on, under which a shape's default split fits."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppsim.config.overrides import with_overrides
from ppsim.config.schema import config_from_dict
from ppsim.job.policy_search import fitting_mode
from ppsim.pipeline.problem import build_problem
from ppsim.policy.model import MODES
from ppsim.sim.simulate import simulate


def _fits(cfg, mode: str) -> bool:
    c = with_overrides(cfg, model={"recompute": mode})
    return simulate(build_problem(c), record=False).summary.fits


TORCHTITAN_LADDER = ("none", "op-sac", "full")
"""torchtitan's modes, cheapest first: no checkpointing, SelectiveAC, FullAC."""


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memory_gb=st.floats(1.0, 40.0), configured=st.sampled_from([*MODES, "op-sac"]),
       pp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2, 4]),
       mbs=st.sampled_from([1, 2]))
def test_the_mode_chosen_is_the_first_stronger_one_that_fits(
        memory_gb: float, configured: str, pp: int, tp: int, mbs: int) -> None:
    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 8, "recompute": configured, "tp": tp,
                  "micro_batch_size": mbs},
        "pipeline": {"pp": pp, "microbatches": 2 * pp},
        "hardware": {"preset": "h100-80gb", "memory_bytes": memory_gb * 1e9}})
    found = fitting_mode(cfg)
    ladder = TORCHTITAN_LADDER if configured == "op-sac" else MODES
    stronger = ladder[ladder.index(configured) + 1:]
    fitting = [m for m in stronger if _fits(cfg, m)]
    if not fitting:
        assert found is None
        return
    assert found is not None and found.mode == fitting[0] and found.summary.fits
    assert found.summary.peak_memory_bytes <= memory_gb * 1e9
    # Recompute only adds time: each stronger mode is no faster.
    times = [simulate(build_problem(with_overrides(cfg, model={"recompute": m})),
                      record=False).summary.iteration_time_ms for m in ladder]
    assert times == sorted(times)
