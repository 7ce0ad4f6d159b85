"""The memory-policy search's answer crosses a pipe."""

from __future__ import annotations

import pickle

from ppsim.tui.policy_plan import plan_policy
from ppsim.tui.session import state_from_config
from ppsim.tui.testing import preset_config


def test_a_policy_plan_pickles() -> None:
    """The answer crosses the pipe: the policy's pricing is no closure."""
    cfg = preset_config("llama3-70b", 4, 8)
    best = plan_policy(cfg, state_from_config(cfg), budget_s=1.0)
    back = pickle.loads(pickle.dumps(best))
    assert back.result.best == best.result.best and back.policies == best.policies
