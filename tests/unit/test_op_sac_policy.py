"""torchtitan's SelectiveAC (recompute op-sac) beside the memory-policy machinery: a
[memory] policy over it is refused in one line, and the policy planners do not hand
Megatron's per-stage policies to a state that runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli

BASE = """[model]
preset = "llama3-8b"
recompute = "{mode}"
[hardware]
preset = "h100-80gb"
[pipeline]
pp = 4
microbatches = 8
"""

TABLES = {
    "offload_modules": '[memory]\noffload_modules = ["core_attn", "attn_proj"]\n',
    "recompute_modules": '[memory]\nrecompute_modules = ["core_attn"]\n',
    "recompute_layers": "[memory]\nrecompute_layers = 2\n",
    "stage": '[[memory.stage]]\nstage = 1\nrecompute_modules = ["core_attn"]\n',
}


@pytest.mark.parametrize("key", sorted(TABLES))
def test_a_memory_policy_over_op_sac_is_refused_in_one_line(key: str, tmp_path: Path) -> None:
    """Megatron's modules, block N or offload on torchtitan's one policy for every block:
    no framework runs it (ppsim priced a module set that replaced op-sac unsaid, and
    failed with a traceback on offload)."""
    path = tmp_path / "job.toml"
    path.write_text(BASE.format(mode="op-sac") + TABLES[key])
    for command in ("simulate", "costs", "plan"):
        r = run_cli([command, "--config", str(path)])
        assert (r.returncode, r.stdout) == (2, ""), (command, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"ppsim {command}: error: memory.{key}: recompute op-sac"), lines
        assert "set [model] recompute to none, selective or full" in lines[0]


def test_the_flags_over_op_sac_are_refused_and_full_still_takes_them() -> None:
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4"]
    r = run_cli([*base, "--recompute", "op-sac", "--recompute-modules", "core_attn"])
    assert r.returncode == 2 and "memory.recompute_modules: recompute op-sac" in r.stderr
    assert run_cli([*base, "--recompute", "full", "--recompute-modules", "core_attn"]
                   ).returncode == 0


def test_the_tui_policy_planner_refuses_op_sac_as_the_keys_do() -> None:
    """`P` on an op-sac state proposed Megatron's per-stage policies beside recompute
    op-sac (a [memory] over it, which no framework runs); it says why, as the keys do."""
    from ppsim.errors import UserError
    from ppsim.tui.policy_actions import policy_refusal
    from ppsim.tui.policy_plan import plan_policy
    from ppsim.tui.session import apply_setting, state_from_config
    from ppsim.tui.testing import preset_config

    base = preset_config("llama3-8b", pp=4, microbatches=8)
    state = apply_setting(base, state_from_config(base), "recompute", "op-sac")
    with pytest.raises(UserError) as err:
        plan_policy(base, state, budget_s=0.5)
    assert str(err.value).startswith("recompute: op-sac is torchtitan's one policy")
    assert str(err.value).split(": ", 1)[1] in (policy_refusal(state, True) or "")
    full = apply_setting(base, state, "recompute", "full")
    assert len(plan_policy(base, full, budget_s=0.5).policies) == 4


def test_the_job_search_s_policy_plan_keeps_op_sac_on_its_ladder() -> None:
    """`plan --gpus --search policy` plans each fast shape's policy from recompute none;
    the global modes must stay the configured job's (torchtitan's none, op-sac, full):
    here op-sac fits and is faster than any Megatron block N, which was chosen instead."""
    from ppsim.config.overrides import with_overrides
    from ppsim.job.policy_search import best_policy
    from ppsim.pipeline.problem import build_problem
    from ppsim.sim.simulate import simulate
    from ppsim.tui.testing import preset_config

    cfg = with_overrides(preset_config("llama3-8b", pp=4, microbatches=8),
                         model={"recompute": "op-sac"}, memory_bytes=52e9)
    # the search ends when done (0.7 s alone); the budget is room for a loaded machine,
    # where the global modes' share (0.3 of it) ran out before op-sac at 4 s
    plan = best_policy(cfg, 15.0)
    assert plan is not None and (plan.label, plan.megatron_flags) == ("op-sac", None)
    counts = list(plan.problem.split.counts)
    again = simulate(build_problem(with_overrides(cfg, split={"split": counts})),
                     record=False).summary
    assert again.fits and again.iteration_time_ms == pytest.approx(
        plan.summary.iteration_time_ms)


def test_plan_s_policy_search_prints_no_megatron_flags_for_op_sac() -> None:
    """Where op-sac is the fastest policy, the text printed the split's Megatron flags
    alone (which run no recompute) while the JSON said null; both say n/a and why."""
    import json

    argv = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "8", "--recompute", "op-sac", "--memory-gb", "52",
            "--search", "policy", "--time-budget", "2"]
    text = run_cli(argv)
    assert text.returncode == 0, text.stderr
    assert "fastest: global (op-sac)" in text.stdout
    megatron = [line for line in text.stdout.splitlines() if line.startswith("Megatron:")]
    assert len(megatron) == 1 and megatron[0].split()[1:3] == ["n/a", "(torchtitan's"]
    best = json.loads(run_cli([*argv, "--json"]).stdout)["best"]
    assert best["policy_space"] == "global" and best["megatron_flags"] is None
    assert "SelectiveAC" in best["megatron_note"]
