"""Real models: any layer count, stacks of layer kinds, flagship presets, Megatron's rules."""

from __future__ import annotations

import json

import pytest
from helpers import every_split, small_shapes
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.costs.transformer import Architecture, layer_kinds, model_params
from ppsim.errors import UserError
from ppsim.pipeline.layout import parse_layout, to_layout
from ppsim.pipeline.problem import Hardware, Problem, build_problem, model_costs, resolve_split
from ppsim.pipeline.split import Split, default_split, near_even_counts
from ppsim.plan.planner import plan
from ppsim.schedules.generators import build_schedule, schedule_placement
from ppsim.sim.simulate import simulate

# --- Stacks of layer kinds: the planner is still exact --------------------------------------


@st.composite
def stacks(draw):
    """A problem whose layers are drawn from 2-3 kinds of different cost and size."""
    name, pp, vpp, m = draw(small_shapes(["gpipe", "1f1b", "1f1b", "interleaved-1f1b",
                                          "zb-h1", "zbv", "dualpipev"], min_pp=2, max_m=8))
    n_kinds = draw(st.integers(2, 3))
    t = st.integers(1, 24).map(lambda x: x / 4)
    kinds = []
    for _ in range(n_kinds):
        b = draw(t)
        kinds.append(LayerCost(forward_ms=draw(t), backward_ms=b, weight_grad_ms=b / 2,
                               static_bytes=draw(st.integers(100, 3000)),
                               activation_bytes=draw(st.integers(10, 400)),
                               weight_grad_bytes=5, output_bytes=draw(st.sampled_from([0, 10**6]))))
    # Hidden states are one size whatever the layer: fix every kind's output to the first's.
    kinds = [LayerCost(**{**k.__dict__, "output_bytes": kinds[0].output_bytes}) for k in kinds]
    layers = draw(st.integers(pp * vpp, 9 if pp * vpp <= 3 else 8))
    which = draw(st.lists(st.integers(0, n_kinds - 1), min_size=layers, max_size=layers))
    heavy = st.integers(0, 40).map(lambda x: x / 4)
    head = LayerCost(forward_ms=draw(heavy), backward_ms=draw(heavy),
                     activation_bytes=draw(st.integers(0, 800)), static_bytes=900)
    emb = LayerCost(forward_ms=draw(heavy), static_bytes=draw(st.integers(0, 2000)))
    costs = ModelCosts(layers=tuple(kinds[i] for i in which), embedding=emb, head=head,
                       kinds=tuple(f"k{i}" for i in which))
    schedule = build_schedule(name, pp, vpp, m)
    split, _ = default_split(layers, pp, vpp, 0, schedule_placement(name))
    memory = draw(st.sampled_from([1e12, 6000.0, 12000.0]))
    hw = Hardware(memory, draw(st.sampled_from([0.0, 0.25])), 2.0)
    return Problem(costs, split, schedule, hw)


@settings(max_examples=40, deadline=None)
@given(stacks())
def test_plan_equals_brute_force_on_heterogeneous_stacks(problem):
    results = every_split(problem)
    fitting = [(r.iteration_time_ms, r.peak_memory_bytes) for _, r in results if r.fits]
    res = plan(problem, top_k=2)
    if not fitting:
        assert res.best is None
        return
    best_t, best_mem = min(fitting)
    assert res.best is not None and res.proven_optimal
    assert res.best.summary.iteration_time_ms == pytest.approx(best_t, rel=1e-9)
    # The answer's own simulation agrees with what the planner reports.
    sim = simulate(problem.with_split(res.best.split)).summary
    assert sim.iteration_time_ms == pytest.approx(res.best.summary.iteration_time_ms, rel=1e-12)


@given(st.integers(1, 300), st.integers(1, 40))
def test_near_even_covers_every_layer_once_and_is_balanced(layers, stages):
    counts = near_even_counts(layers, stages)
    assert len(counts) == stages and sum(counts) == layers
    assert max(counts) - min(counts) <= 1
    if stages > 2 and layers % stages <= stages - 2:
        # The ends, which carry the embedding and the head, are the ones left short.
        assert counts[0] == counts[-1] == layers // stages


def test_layer_counts_that_do_not_divide_plan_simulate_and_split():
    for argv in (["plan", "--num-layers", "10", "--pp", "3", "--microbatches", "6", "--json"],
                 ["simulate", "--num-layers", "10", "--pp", "3", "--microbatches", "6",
                  "--json"]):
        assert main(argv) == 0
    cfg = config_from_dict({"model": {"preset": "llama3-8b"}, "pipeline": {"pp": 3}})
    split = resolve_split(cfg)
    assert split.counts == (11, 11, 10) and split.num_layers == 32  # the head stage is short
    with pytest.raises(UserError, match="divisible by the pipeline-model-parallel size"):
        resolve_split(config_from_dict({"model": {"preset": "llama3-8b"},
                                        "pipeline": {"pp": 3, "split": "even"}}))


def test_plan_baseline_without_an_even_split_is_megatrons_best_first_last(capsys):
    assert main(["plan", "--num-layers", "10", "--pp", "3", "--microbatches", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["baseline_label"].startswith("Megatron ")
    assert out["baseline_label"] != "Megatron even"
    assert sum(out["baseline"]["split"]) == 10
    assert out["best"]["iteration_time_ms"] <= out["baseline"]["iteration_time_ms"]


# --- Presets: parameter counts match the model cards ----------------------------------------


@pytest.mark.parametrize("name, total, active, source", [
    # DeepSeek-V3 technical report (arXiv 2412.19437), abstract: 671B total, 37B activated.
    ("deepseek-v3", 671e9, 37e9, "arXiv 2412.19437"),
    # Qwen3 technical report / model card: 235B total, 22B activated.
    ("qwen3-235b-a22b", 235e9, 22e9, "Qwen/Qwen3-235B-A22B model card"),
    # Mixtral of Experts (arXiv 2401.04088): 47B total (46.7B), 13B active (12.9B).
    ("mixtral-8x7b", 46.7e9, 12.9e9, "arXiv 2401.04088"),
    # The Llama 3 Herd of Models (arXiv 2407.21783): 405B dense.
    ("llama3.1-405b", 405e9, 405e9, "arXiv 2407.21783"),
])
def test_preset_parameter_counts_match_model_cards(name, total, active, source):
    arch = Architecture(**MODEL_PRESETS[name])
    counts = model_params(arch)
    got_total, got_active = counts.total, counts.active
    assert got_total == pytest.approx(total, rel=0.02), source
    assert got_active == pytest.approx(active, rel=0.02), source


def test_gpt_oss_parameter_counts_match_its_model_card():
    """arXiv 2508.10925, Table 1: 116.83B total; 5.13B active, a count that takes the
    unembedding but not the embedding (ppsim's active count takes both)."""
    arch = Architecture(**MODEL_PRESETS["gpt-oss-120b"])
    counts = model_params(arch)
    total, active = counts.total, counts.active
    assert total == pytest.approx(116.83e9, rel=0.01)
    assert active - arch.vocab_size * arch.hidden_size == pytest.approx(5.13e9, rel=0.01)


def test_deepseek_stack_kinds_and_mtp():
    arch = Architecture(**MODEL_PRESETS["deepseek-v3"])
    assert layer_kinds(arch) == ("dense",) * 3 + ("moe",) * 58
    costs = model_costs(config_from_dict({"model": {"preset": "deepseek-v3"}}))
    assert costs.num_layers == 62 and costs.mtp_layers == 1 and costs.kinds[-1] == "mtp"
    dense, moe = costs.layers[0], costs.layers[3]
    assert moe.static_bytes != dense.static_bytes and moe.forward_ms != dense.forward_ms
    # The MTP module carries a decoder layer plus the shared head and its own loss.
    assert costs.layers[-1].forward_ms > moe.forward_ms + 0.9 * costs.head.forward_ms


def test_moe_all_to_all_costs_time_only_with_expert_parallelism():
    base = {"preset": "mixtral-8x7b"}
    hw = {"preset": "h100-80gb"}
    one = model_costs(config_from_dict({"model": {**base, "ep": 1}, "hardware": hw}))
    eight = model_costs(config_from_dict({"model": {**base, "ep": 8}, "hardware": hw}))
    assert eight.layers[0].forward_ms > one.layers[0].forward_ms
    assert eight.layers[0].static_bytes < one.layers[0].static_bytes / 4  # experts / ep


def test_layer_kind_spec_errors():
    with pytest.raises(UserError, match="lists 4 layers but num_layers is 5"):
        model_costs(config_from_dict({"model": {"preset": "mixtral-8x7b", "num_layers": 5,
                                                "layers": "dense*2, moe*2"}}))
    with pytest.raises(UserError, match="unknown layer kind 'mlp'"):
        model_costs(config_from_dict({"model": {"preset": "mixtral-8x7b", "layers": "mlp*32"}}))


# --- Megatron conformance --------------------------------------------------------------------


def test_deepseek_layout_from_megatron_docs_plans_and_round_trips():
    cfg = config_from_dict({"model": {"preset": "deepseek-v3"},
                            "pipeline": {"pp": 16, "microbatches": 32,
                                         "layout": "Et*3|(tt|)*29,m|L"}})
    problem = build_problem(cfg)
    # vpp comes from the layout (32 stages / pp 16), and the schedule is interleaved.
    assert problem.split.vpp == 2 and problem.schedule.name == "interleaved-1f1b"
    assert parse_layout(to_layout(problem.split), 16, 61, 1) == problem.split


@pytest.mark.parametrize("layout, pp, layers, counts, emb, loss", [
    ("(|)*2Et*5|tL", 2, 6, (0, 0, 5, 1), 2, 3),  # E after empty stages
    ("Et*5|ttttt|L|", 2, 10, (5, 5, 0, 0), 0, 2),  # L followed by an empty stage
    ("E(t|)*2*2L", 2, 2, (1, 1, 0, 0), 0, 3),  # a star after a starred group
])
def test_layouts_megatron_builds_are_accepted(layout, pp, layers, counts, emb, loss):
    s = parse_layout(layout, pp, layers)
    assert (s.counts, s.embedding_stage, s.loss_stage) == (counts, emb, loss)
    assert parse_layout(to_layout(s), pp, layers) == s
    stages = s.stages
    assert stages[emb].has_embedding and stages[loss].has_head
    # Simulated like any other split: every op runs, empty stages pass data on.
    cfg = config_from_dict({"model": {"kind": "uniform", "num_layers": layers,
                                      "forward_ms": 1.0, "backward_ms": 2.0},
                            "pipeline": {"pp": pp, "layout": layout, "microbatches": 4}})
    sim = simulate(build_problem(cfg))
    assert sim.summary.iteration_time_ms > 0


@pytest.mark.parametrize("pipeline, message", [
    ({"pp": 1, "layout": "Et|tL"}, "pipeline-model-parallel size should be greater than 1"),
    ({"pp": 2, "layout": "Et|tL", "first_stage_layers": 0}, "cannot be combined"),
    ({"pp": 2, "layout": "Et|tL", "last_stage_layers": 0}, "cannot be combined"),
    ({"pp": 2, "layout": "Et| tL"}, "invalid layer character ' '"),
    ({"pp": 2, "vpp": 3, "layout": "Et|t|t|tL"}, "set vpp = 2"),
])
def test_what_megatron_refuses_is_refused(pipeline, message):
    cfg = config_from_dict({"model": {"kind": "uniform", "num_layers": 2 if "vpp" not in pipeline
                                      else 4, "forward_ms": 1.0},
                            "pipeline": pipeline})
    with pytest.raises(UserError, match=message):
        build_problem(cfg)


def test_layout_vpp_is_derived_when_not_restated(capsys):
    assert main(["split", "--num-layers", "4", "--pp", "2", "--layout", "Et|t|t|tL",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vpp"] == 2


def test_compare_rows_in_json_and_the_plan_is_never_slower(capsys):
    argv = ["plan", "--num-layers", "10", "--pp", "3", "--microbatches", "6", "--json",
            "--compare", "4,3,3", "--compare", "Et*2|t*4|t*4L"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["compared"]
    assert [r["label"] for r in rows] == ["4,3,3", "Et*2|t*4|t*4L"]
    assert rows[1]["split"] == [2, 4, 4]
    for r in rows:
        assert set(r) >= {"label", "split", "iteration_time_ms", "bubble_fraction", "fits",
                          "peak_memory_bytes"}
        assert out["best"]["iteration_time_ms"] <= r["iteration_time_ms"] * (1 + 1e-9)
        if r["best_speedup"] > 1 + 1e-9:
            assert "loads rank" in r["why"] and "faster" in r["why"]


def test_compare_with_the_wrong_shape_is_a_clear_error(capsys):
    argv = ["plan", "--num-layers", "4", "--pp", "2", "--compare", "Et|t|t|tL"]
    assert main(argv) == 2
    assert "plan with --vpp 2" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["3,3", "Et*3|t*2L"])
def test_compare_errors_name_the_flag_not_the_config_field(value, capsys):
    assert main(["plan", "--num-layers", "4", "--pp", "2", "--compare", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim plan: error: --compare: ") and value in err
    assert "pipeline." not in err and err.count("\n") == 1


def test_megatron_split_with_mtp_puts_it_on_the_last_stage():
    cfg = config_from_dict({"model": {"preset": "deepseek-v3"},
                            "pipeline": {"pp": 4, "first_stage_layers": 13,
                                         "last_stage_layers": 18}})
    split = resolve_split(cfg)
    assert split.counts == (13, 15, 15, 19) and split.mtp == 1
    assert split == Split((13, 15, 15, 19), 4, 1, "loop", 1)


def test_a_search_stopped_by_its_budget_does_not_claim_nothing_fits(capsys):
    # Memory binds hard here: within 2 s no fitting split is found, but one exists
    # (the planner's own memory search reaches a peak under the limit).
    argv = ["plan", "--preset", "deepseek-v3", "--hardware", "h200-141gb", "--pp", "16",
            "--vpp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "64",
            "--time-budget", "2"]
    code = main(argv)
    err = capsys.readouterr().err
    if code == 3:
        assert "within the time budget" in err and "no split fits" not in err
    else:
        assert code == 0
