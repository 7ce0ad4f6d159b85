"""What a backward holds while it runs, beyond the activations its forward kept: the
head's logit gradient, the tensors a recompute brings back (StageCost.transient_bytes).
Before, neither counted: a rank's peak was its held activations alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.model import RangeMax, stage_costs
from ppsim.costs.transformer import accelerator, layer_kinds, transformer_costs
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

SEQ, VOCAB, HIDDEN = 8192, 128_256, 4096
"""Llama 3 8B (meta-llama/Meta-Llama-3-8B config.json): bf16, 2 bytes an element."""


def _llama(recompute: str, schedule: str = "1f1b"):
    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "recompute": recompute},
        "pipeline": {"pp": 2, "microbatches": 4, "schedule": schedule},
        "hardware": {"preset": "h100-80gb", "memory_bytes": 1e15}})
    problem = build_problem(cfg)
    return problem, simulate(problem).summary


def test_the_last_rank_holds_the_logit_gradient_inside_its_backward() -> None:
    """1F1B's last rank holds one microbatch at its B; the head's backward then makes the
    logits' gradient in bf16 beside the fp32 softmax it kept: seq x vocab x 2 bytes."""
    problem, summary = _llama("selective")
    last = stage_costs(problem.costs, problem.split)[-1]
    assert summary.ranks[1].peak_inflight == 1
    assert summary.ranks[1].peak_activation_bytes == last.activation_bytes + SEQ * VOCAB * 2


def test_a_fully_recomputed_stage_holds_one_layers_tensors_again() -> None:
    """Rank 0 of two holds two microbatches' layer inputs at its fullest; inside a B
    the recomputed layer's tensors come back: all it keeps without recompute but the
    input it kept anyway."""
    problem, summary = _llama("full")
    first = stage_costs(problem.costs, problem.split)[0]
    cfg = config_from_dict({"model": {"preset": "llama3-8b", "recompute": "none"},
                            "hardware": {"preset": "h100-80gb"}})
    plain = transformer_costs(cfg.model.arch, accelerator(cfg.hardware))
    recomputed = plain.layers[0].activation_bytes - SEQ * HIDDEN * 2
    assert summary.ranks[0].peak_inflight == 2
    assert summary.ranks[0].peak_activation_bytes == 2 * first.activation_bytes + recomputed


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_the_memory_timeline_shows_the_transient_and_the_engines_agree(schedule) -> None:
    """The peak is a sample of the recorded memory timeline (the B's start), and the
    readable simpy engine counts the same."""
    from ppsim.sim.simpy_engine import simulate as simulate_simpy

    problem, summary = _llama("full", schedule)
    sim = simulate(problem)
    for r, stats in enumerate(summary.ranks):
        assert sim.timeline is not None
        assert max(act for _, act, _ in sim.timeline.memory[r]) == stats.peak_activation_bytes
    assert simulate_simpy(problem).summary == summary


@pytest.mark.parametrize("preset", ["llama3-8b", "deepseek-v3", "mixtral-8x7b",
                                    "nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_recompute_brings_back_what_the_layer_keeps_without_it(preset: str) -> None:
    """Whole-layer recompute: its transient and what it keeps make up what the layer keeps
    with no recompute. Recomputed attention brings back what it drops and its output
    (the output projection keeps the first one; FlashAttention's backward takes the new)."""
    cfg = config_from_dict({"model": {"preset": preset}, "hardware": {"preset": "h100-80gb"}})
    a, acc = cfg.model.arch, accelerator(cfg.hardware)
    none = transformer_costs(a, acc, recompute=(), full=False)
    full = transformer_costs(a, acc, recompute=(), full=True)
    selective = transformer_costs(a, acc, recompute=("core_attn",), full=False)
    kinds = none.kinds or ("dense",) * len(none.layers)
    assert set(layer_kinds(a))  # a stack to check
    for kind, n, f, s in zip(kinds, none.layers, full.layers, selective.layers, strict=True):
        if kind == "mtp":  # an MTP module has its own head and loss
            assert n.transient_bytes == none.head.transient_bytes
            continue
        assert n.transient_bytes == 0
        assert f.transient_bytes > 0
        assert f.transient_bytes + f.activation_bytes == n.activation_bytes
        dropped = n.activation_bytes - s.activation_bytes
        if dropped == 0:  # no attention in it (a Mamba, MLP or MoE layer of a hybrid)
            assert s.transient_bytes == 0
        else:
            assert dropped < s.transient_bytes < dropped + n.output_bytes * 3
    assert none.head.transient_bytes == full.head.transient_bytes > 0


def test_recomputed_attention_brings_back_its_output_and_log_sum_exp() -> None:
    """Llama 3 8B, selective recompute: 8,192 x 4,096 bf16 output and 8,192 x 32 fp32."""
    cfg = config_from_dict({"model": {"preset": "llama3-8b"}, "hardware": {"preset": "h100-80gb"}})
    costs = transformer_costs(cfg.model.arch, accelerator(cfg.hardware), recompute=("core_attn",))
    assert costs.layers[0].transient_bytes == SEQ * HIDDEN * 2 + SEQ * 32 * 4


@settings(max_examples=200)
@given(st.lists(st.integers(0, 10**6), max_size=40), st.data())
def test_range_max_is_the_slices_max(values: list[int], data) -> None:
    lo = data.draw(st.integers(0, len(values)))
    hi = data.draw(st.integers(lo, len(values)))
    assert RangeMax(values).max(lo, hi) == max(values[lo:hi], default=0)


def test_costs_says_what_each_backward_holds_while_it_runs(capsys) -> None:
    from ppsim.cli.main import main

    assert main(["costs", "--preset", "llama3-70b", "--hardware", "h100-80gb",
                 "--recompute", "full"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # Megatron pads the vocabulary to a multiple of 128 x tp: 128,256 -> 129,024 at tp 8
    head = 8192 * 129_024 // 8 * 2
    assert f"head {head / 1e6:.0f} MB" in out and "inside its B a piece also holds" in out


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_without_transients_a_problem_counts_what_the_ops_hold_between_them(recompute) -> None:
    """Problem.transients off (what an executor's trace samples): the last rank's peak is
    its one microbatch's activations, and the planner's evaluator agrees with simulate."""
    from ppsim.plan.search import SplitSearch

    problem, _ = _llama(recompute)
    held = replace(problem, transients=False)
    summary = simulate(held).summary
    last = stage_costs(problem.costs, problem.split)[-1]
    assert summary.ranks[1].peak_activation_bytes == last.activation_bytes
    assert SplitSearch(held).evaluate(problem.split.counts) == summary
