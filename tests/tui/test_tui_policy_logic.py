"""The split editor's memory-policy logic (ppsim.tui.policy_edit, policy_plan,
copy_lanes and the EditState's policies), without a terminal."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.model import parse_model
from ppsim.config.overrides import with_overrides
from ppsim.pipeline.problem import build_problem
from ppsim.policy.model import ALL_LAYERS, StagePolicy, memory_policy, shorthand
from ppsim.policy.report import stage_policies as problem_policies
from ppsim.tui.copy_lanes import copy_lanes
from ppsim.tui.editing import EditRefused
from ppsim.tui.policy_edit import (
    KNOBS,
    choices_for,
    edit_policy,
    memory_tables,
    policy_lines,
    policy_mark,
    policy_text,
    stage_policies,
    with_stage,
)
from ppsim.tui.policy_plan import policy_summary, proposed_state
from ppsim.tui.session import apply_setting, config_for, evaluate_state, state_from_config
from ppsim.tui.testing import preset_config

LLAMA = parse_model({"preset": "llama3-70b"})
DEEPSEEK = parse_model({"preset": "deepseek-v3"})
DENSE_MODULES, DENSE_OFFLOAD = choices_for(LLAMA)  # type: ignore[misc]


def test_dense_choices_name_only_modules_a_dense_layer_has() -> None:
    """A dense Llama layer's norms are fused into QKV and fc1 in Megatron's spec: no
    `layernorm` recompute and no norm offload acts on them, so none is offered."""
    assert DENSE_MODULES[0] == ()
    assert {("core_attn",), ("mlp",)} <= set(DENSE_MODULES)
    moe_names = {"moe", "moe_act", "shared_experts", "mla_up_proj", "expert_fc1",
                 "layernorm", "attn_norm", "mlp_norm"}
    assert not any(set(m) & moe_names for m in DENSE_MODULES + DENSE_OFFLOAD)
    assert len(set(DENSE_MODULES)) == len(DENSE_MODULES)  # each choice once
    assert DENSE_OFFLOAD == [(), ("core_attn", "attn_proj")]


def test_moe_mla_choices_offer_their_modules_and_uniform_models_none() -> None:
    modules, offload = choices_for(DEEPSEEK)  # type: ignore[misc]
    assert ("layernorm", "moe_act") in modules and ("layernorm", "mla_up_proj") in modules
    assert ("core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act") in offload
    uniform = parse_model({"kind": "uniform", "num_layers": 4})
    assert choices_for(uniform) is None


def step(p: StagePolicy, knob: str, s: int, layers: int = 10) -> StagePolicy:
    return edit_policy(p, knob, s, layers, DENSE_MODULES, DENSE_OFFLOAD)


def test_block_n_stays_within_the_stage_and_full_steps_down_from_all() -> None:
    p = step(StagePolicy(), "layers", 1, 3)
    assert p.recompute_layers == 1
    with pytest.raises(EditRefused, match="0..3"):
        step(StagePolicy(recompute_layers=3), "layers", 1, 3)
    with pytest.raises(EditRefused):
        step(StagePolicy(), "layers", -1, 3)
    # "full" is N = every layer of any stage: one less is the stage's layers less one
    assert step(shorthand("full"), "layers", -1, 7).recompute_layers == 6


def test_offload_cycles_through_the_sets_and_the_fraction_needs_modules() -> None:
    with pytest.raises(EditRefused, match="offloads no modules"):
        step(StagePolicy(), "fraction", 1)
    p = step(StagePolicy(), "offload", 1)
    assert p.offload_modules == ("core_attn", "attn_proj") and p.offload_fraction == 1.0
    half = step(step(p, "fraction", -1), "fraction", -1)
    assert half.offload_fraction == 0.5
    assert step(p, "fraction", 1).offload_fraction == 1.0  # clamped
    back = step(p, "offload", -1)
    assert back.offload_modules == () and back.offload_fraction == 0.0
    with pytest.raises(EditRefused, match="no knob"):
        step(p, "speed", 1)


def test_a_module_set_typed_in_a_config_steps_to_the_ends() -> None:
    odd = StagePolicy(recompute_modules=("core_attn", "mlp"))
    assert step(odd, "modules", 1).recompute_modules == ()
    assert step(odd, "modules", -1).recompute_modules == DENSE_MODULES[-1]


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 12),
       keys=st.lists(st.tuples(st.sampled_from(KNOBS), st.sampled_from((1, -1))),
                     max_size=25))
def test_any_key_sequence_keeps_a_valid_megatron_policy(layers: int, keys: list) -> None:
    """Whatever is pressed: N within the stage, the fraction in [0, 1] and 0 without
    modules, module sets among the choices, and a step back undoes a step (or the
    key is refused and nothing changes)."""
    p = StagePolicy()
    for knob, s in keys:
        try:
            new = step(p, knob, s, layers)
        except EditRefused:
            continue
        assert 0 <= new.recompute_layers <= layers
        assert 0.0 <= new.offload_fraction <= 1.0
        assert new.offload_modules or new.offload_fraction == 0.0
        assert new.recompute_modules in DENSE_MODULES
        assert new.offload_modules in DENSE_OFFLOAD
        if knob in ("modules", "layers"):
            assert step(new, knob, -s, layers) == p
        p = new


def test_memory_tables_read_back_as_the_same_policies() -> None:
    """The [[memory.stage]] tables the TUI writes parse (ppsim.policy.model) to the
    policies it shows, whatever the global mode underneath."""
    pols = (StagePolicy(recompute_layers=2), StagePolicy(recompute_modules=("core_attn",)),
            StagePolicy(offload_modules=("core_attn",), offload_fraction=0.5),
            shorthand("full"))
    for mode in ("none", "selective", "full"):
        parsed = memory_policy(memory_tables(pols), mode, len(pols))
        assert tuple(parsed.of(i) for i in range(len(pols))) == pols


def test_policy_words_marks_and_width() -> None:
    p = StagePolicy(recompute_modules=("core_attn",), recompute_layers=2,
                    offload_modules=("core_attn",), offload_fraction=0.5)
    assert policy_text(p, 5) == "recompute core_attn · N 2/5 · offload 50% core_attn"
    assert policy_text(shorthand("full"), 4) == "recompute - · N all/4 · offload -"
    assert policy_lines(3, p, 5, 200)[0].startswith("stage 3 recompute core_attn")
    assert policy_lines(3, p, 5, 38) == ["s3 rc core_attn N2/5 off 50% core_attn"]
    assert policy_lines(3, p, 5, 26) == ["s3 rc core_attn N2/5", "   off 50% core_attn"]
    assert policy_lines(3, p, 5, 12) == ["s3 rc core_…", "   off 50% …"]
    assert [policy_mark(x, 4) for x in (StagePolicy(), shorthand("selective"),
                                        StagePolicy(recompute_layers=2), shorthand("full"),
                                        p)] == [" ", "R", "N", "F", "O"]


def test_stage_policies_follow_the_mode_until_edited() -> None:
    assert stage_policies((), "selective", 3) == (shorthand("selective"),) * 3
    mine = (StagePolicy(recompute_layers=1),) * 2
    assert stage_policies(mine, "none", 2) == mine
    assert stage_policies(mine, "none", 4) == (StagePolicy(),) * 4  # another shape
    assert with_stage(mine, 1, StagePolicy())[1] == StagePolicy()
    with pytest.raises(EditRefused):
        with_stage(mine, 2, StagePolicy())


def llama_state(pp: int = 4, microbatches: int = 8):
    cfg = preset_config("llama3-70b", pp, microbatches)
    return cfg, state_from_config(cfg)


def test_an_edited_policy_is_what_the_simulation_runs_and_moves_only_its_rank() -> None:
    cfg, s = llama_state()
    pols = stage_policies((), s.recompute, 4)
    edited = replace(s, policies=with_stage(pols, 0, StagePolicy(recompute_layers=20)))
    before = evaluate_state(cfg, replace(s, policies=pols)).sim
    after = evaluate_state(cfg, edited).sim
    assert [d["recompute_layers"] for d in problem_policies(after.problem)] == [20, 0, 0, 0]
    peaks = [[r.peak_memory_bytes for r in x.summary.ranks] for x in (before, after)]
    assert peaks[1][0] < peaks[0][0] and peaks[1][1:] == peaks[0][1:]
    assert after.summary.iteration_time_ms > before.summary.iteration_time_ms


def test_offload_copies_become_two_lanes_with_one_copy_per_microbatch() -> None:
    cfg, s = llama_state()
    off = StagePolicy(offload_modules=("core_attn",), offload_fraction=1.0)
    pols = with_stage(stage_policies((), s.recompute, 4), 1, off)
    sim = evaluate_state(cfg, replace(s, policies=pols)).sim
    lanes = copy_lanes(sim)
    assert [lane.label for lane in lanes] == ["out1", "in1"]
    for lane, kind in zip(lanes, "OR", strict=True):
        assert [o.microbatch for o in lane.ops] == list(range(8))  # FIFO, 1F1B order
        assert {o.kind for o in lane.ops} == {kind} and {o.stage for o in lane.ops} == {1}
        assert all(a.end <= b.start for a, b in zip(lane.ops, lane.ops[1:], strict=False))
    fwd = {o.action.microbatch: o.end for o in sim.timeline.ops[1] if o.action.kind == "F"}
    assert all(o.start >= fwd[o.microbatch] for o in lanes[0].ops)  # out after its F
    assert copy_lanes(evaluate_state(cfg, s).sim) == []


def test_settings_that_reshape_or_set_the_mode_drop_the_edited_policies() -> None:
    cfg, s = llama_state()
    edited = replace(s, policies=(StagePolicy(recompute_layers=1),) * 4)
    assert apply_setting(cfg, edited, "recompute", "full").policies == ()
    assert apply_setting(cfg, edited, "pp", "2").policies == ()
    assert apply_setting(cfg, edited, "microbatches", "16").policies == edited.policies


def test_a_config_with_a_memory_section_opens_with_its_policies() -> None:
    cfg = with_overrides(preset_config("llama3-70b", 4, 8),
                         memory={"recompute_modules": ["layernorm"],
                                 "stage": [{"stage": 2, "recompute_layers": 3}]})
    s = state_from_config(cfg)
    assert s.policies[0] == StagePolicy(recompute_modules=("layernorm",))
    assert s.policies[2] == StagePolicy(recompute_modules=("layernorm",), recompute_layers=3)
    assert config_for(cfg, s).memory is not None
    assert [d["recompute_layers"] for d in problem_policies(build_problem(
        config_for(cfg, s)))] == [0, 0, 3, 0]


def test_a_proposal_carries_the_split_and_a_policy_per_stage() -> None:
    from ppsim.policy.search import SpaceBest

    _, s = llama_state()
    assert proposed_state(s, SpaceBest(space="per-stage", result=None)) is None
    pols = (StagePolicy(),) * 2 + (StagePolicy(recompute_layers=ALL_LAYERS),) * 2
    shown = replace(s, policies=pols)
    assert policy_summary(shown, 80) == "s0-1 none; s2-3 N=20"
    assert policy_summary(shown, 12) == "s0-1 none; …"


def test_a_saved_config_reopens_with_the_edited_policies(tmp_path) -> None:
    """`s` writes config_to_toml(config_for(...)): the per-stage policies survive it."""
    from ppsim.config.schema import load_config
    from ppsim.config.to_toml import config_to_toml

    cfg, s = llama_state()
    pols = (StagePolicy(recompute_layers=3),
            StagePolicy(offload_modules=("core_attn",), offload_fraction=0.75),
            StagePolicy(recompute_modules=("layernorm", "mlp")), StagePolicy())
    path = tmp_path / "saved.toml"
    path.write_text(config_to_toml(config_for(cfg, replace(s, policies=pols))))
    assert state_from_config(load_config(str(path))).policies == pols


def test_the_export_carries_megatron_policy_flags_only_when_megatron_can_run_it() -> None:
    from ppsim.policy.report import policy_flags
    from ppsim.tui.exports import export_text, read_export

    cfg, s = llama_state()
    block = (StagePolicy(recompute_layers=2),) * 4
    problem = build_problem(config_for(cfg, replace(s, policies=block)))
    text = export_text(problem.split, policy=policy_flags(problem, block))
    args = read_export(text)["MEGATRON_POLICY_ARGS"].split()
    assert args[args.index("--recompute-method") + 1] == "block"
    assert args[args.index("--recompute-num-layers") + 1] == "2"
    mixed = with_stage(block, 3, StagePolicy())
    problem = build_problem(config_for(cfg, replace(s, policies=mixed)))
    text = export_text(problem.split, policy=policy_flags(problem, mixed))
    assert "MEGATRON_POLICY_ARGS" not in read_export(text)
    assert "this policy differs per stage" in text and "ppsim executor" in text
    assert "MEGATRON_POLICY_ARGS" not in export_text(problem.split)


def test_with_chunks_the_policy_plan_is_per_rank_on_the_megatron_split() -> None:
    from ppsim.policy.search import PER_RANK, space_key
    from ppsim.tui.policy_plan import plan_policy

    cfg = with_overrides(preset_config("llama3-70b", 4, 8, 2, "interleaved-1f1b"),
                         memory_bytes=62e9)
    s = state_from_config(cfg)
    best = plan_policy(cfg, s, budget_s=1.0)
    assert best.space == "per-stage" and best.label == PER_RANK
    prop = proposed_state(s, best)
    assert prop is not None and len(prop.policies) == 8 and prop.vpp == 2
    sim = evaluate_state(cfg, prop).sim
    assert all(r.fits for r in sim.summary.ranks)
    assert sim.summary.iteration_time_ms == pytest.approx(space_key(best)[0])


def test_op_sac_edits_no_per_stage_policy_and_says_why() -> None:
    """torchtitan's SelectiveAC is one policy for every block: the policy keys refuse it
    naming op-sac (not as a model of uniform costs), and the other modes take them."""
    from ppsim.tui.policy_actions import current_policies, policy_refusal

    base = preset_config("llama3-8b", pp=4, microbatches=8)
    state = apply_setting(base, state_from_config(base), "recompute", "op-sac")
    assert current_policies(state) == ()
    refusal = policy_refusal(state, True)
    assert refusal is not None and "op-sac is torchtitan's one policy" in refusal
    for mode in ("none", "selective", "full"):
        other = apply_setting(base, state, "recompute", mode)
        assert policy_refusal(other, True) is None and len(current_policies(other)) == 4
    assert "uniform costs" in (policy_refusal(replace(state, recompute="n/a"), False) or "")
