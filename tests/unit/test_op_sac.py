"""torchtitan's SelectiveAC as ppsim's op-sac recompute mode: what a layer keeps and runs
again, the collectives it repeats, where it is refused, and how the exports say it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.presets import MODEL_PRESETS
from ppsim.costs.modules import kept_tensors
from ppsim.costs.op_sac import op_sac_kept
from ppsim.costs.transformer import Accelerator, Architecture, transformer_costs
from ppsim.job.traffic import Recomputed, recomputed
from ppsim.policy.megatron import policy_export
from ppsim.policy.model import MODES, mode_ladder, shorthand
from tests.helpers import run_cli

ACC = Accelerator(peak_tflops=989.0, memory_bandwidth_gbps=3350.0)
H100 = ["--hardware", "h100-80gb"]


def llama(**kw) -> Architecture:
    return Architecture(**{**MODEL_PRESETS["llama3-8b"], **kw})


def test_a_llama_layer_keeps_what_torchtitan_s_policy_saves() -> None:
    """torchtitan b5bcd76 (distributed/activation_checkpoint.py, SelectiveAC) saves the
    outputs of the compute-intensive ops but every second matmul, counted in the block's
    forward: of wqkv, wo, w1, w3, w2 (models/common/attention.py, feed_forward.py) it
    saves wqkv, w1 and w2; attention's output and log-sum-exp; and the checkpoint keeps
    the block's input. At 8,192 tokens of llama3-8b in bf16, per layer."""
    a = llama(recompute="op-sac")
    tokens, h, kv, ffn, heads = 8192, 4096, 8 * 128, 14336, 32
    want = tokens * 2 * (h           # the block's input
                         + h + 2 * kv  # wqkv's output
                         + h           # attention's output
                         + ffn         # w1's output
                         + h)          # w2's output
    want += tokens * heads * 4  # the fp32 log-sum-exp
    assert sum(op_sac_kept(a).values()) == want
    layer = transformer_costs(a, ACC).layers[0]
    assert layer.activation_bytes == want  # no weight copies kept beside (bf16, no FP8)


def test_at_tp_the_partial_sum_stays_whole_and_the_scatters_are_kept() -> None:
    """Under sequence parallelism w2's rowwise output is a partial sum of every token at the
    full width, saved before its reduce-scatter; the two reduce-scatters' outputs are
    saved too (their op is in the save list), each a tp-th of the tokens."""
    tp, tokens, h = 4, 8192, 4096
    one, four = op_sac_kept(llama()), op_sac_kept(llama(tp=tp))
    assert four["mlp.fc2.out"] == one["mlp.fc2.out"] == tokens * h * 2
    assert four["reduce_scatter.out"] == 2 * tokens * h * 2 / tp
    assert "reduce_scatter.out" not in one
    for name in ("qkv.out", "attn.out", "mlp.fc1.out1", "norm1.in"):
        assert four[name] == one[name] / tp


@settings(max_examples=40, deadline=None)
@given(groups=st.sampled_from([1, 2, 4, 8]), head_dim=st.sampled_from([64, 128]),
       heads_per_group=st.sampled_from([1, 2, 4]), ffn_mult=st.integers(2, 6),
       seq=st.sampled_from([512, 2048, 8192]), mbs=st.sampled_from([1, 2]),
       tp=st.sampled_from([1, 2, 4, 8]))
def test_op_sac_sits_between_no_and_full_recompute(groups: int, head_dim: int,
                                                   heads_per_group: int, ffn_mult: int,
                                                   seq: int, mbs: int, tp: int) -> None:
    """Its backward runs more than none's (it repeats the cheap ops, wo and w3) and less than
    full's (which repeats the whole forward); at tp 1 it keeps less than no recompute and
    more than full recompute's input alone."""
    heads = groups * heads_per_group * tp
    h = heads * head_dim
    a = llama(hidden_size=h, num_heads=heads, num_kv_heads=groups * tp, head_dim=head_dim,
              ffn_hidden_size=ffn_mult * h, seq_length=seq, micro_batch_size=mbs, tp=tp,
              num_layers=2)
    none, sac, full = (transformer_costs(replace(a, recompute=m), ACC).layers[0]
                       for m in ("none", "op-sac", "full"))
    assert none.backward_ms < sac.backward_ms < full.backward_ms
    assert none.forward_ms == sac.forward_ms == full.forward_ms
    assert full.activation_bytes < sac.activation_bytes
    if tp == 1:
        assert sac.activation_bytes < none.activation_bytes
        assert sum(op_sac_kept(a).values()) < sum(kept_tensors(a, "dense").values())


@pytest.mark.parametrize("sp", [True, False])
def test_it_gathers_again_but_scatters_once(sp: bool) -> None:
    """The sequence-parallel all-gathers are not saved, so the backward's recompute runs
    them again; the reduce-scatters' outputs are. Without sequence parallelism the
    all-reduces are not saved either."""
    again = recomputed(llama(recompute="op-sac", tp=2, sequence_parallel=sp))
    a = llama(tp=2, sequence_parallel=sp)
    assert again.tp_share(a, "dense") == 1.0
    assert again.scatter_share(a, "dense") == (0.0 if sp else 1.0)
    assert Recomputed().tp_share(a, "dense") == Recomputed().scatter_share(a, "dense") == 0.0


def test_megatron_has_no_form_of_it() -> None:
    """A stage policy of op-sac exports no Megatron flags; torchtitan alone runs it."""
    export = policy_export((shorthand("op-sac"),) * 2, llama())
    assert export.megatron_flags is None and export.frameworks == ["torchtitan"]
    assert "SelectiveAC" in export.notes[0]


def test_the_search_ladder_is_the_framework_s() -> None:
    """A Megatron job climbs none, selective, full; a torchtitan one none, SelectiveAC,
    FullAC, and none, FullAC where ppsim does not price SelectiveAC for the model."""
    assert mode_ladder(llama()) == MODES == ("none", "selective", "full")
    assert mode_ladder(llama(recompute="op-sac")) == ("none", "op-sac", "full")
    assert mode_ladder(llama(fsdp=True)) == ("none", "op-sac", "full")
    moe = Architecture(**{**MODEL_PRESETS["qwen3-30b-a3b"], "fsdp": True})
    assert mode_ladder(moe) == ("none", "op-sac", "full")
    hybrid = Architecture(**{**MODEL_PRESETS["nemotron-h-8b"], "fsdp": True})
    assert mode_ladder(hybrid) == ("none", "full")


@pytest.mark.parametrize(("preset", "extra", "what"), [
    ("nemotron-h-8b", [], "hybrid"),
    ("qwen3-next-80b-a3b", [], "hybrid or linear-attention"),
    ("llama3-8b", ["--fp4-format", "e2m1"], "NVFP4"),
    ("llama3-8b", ["--attention-dropout", "0.1", "--hidden-dropout", "0.1"], "dropout"),
])
def test_what_it_is_not_priced_for_is_refused_in_one_line(preset: str, extra: list[str],
                                                          what: str) -> None:
    r = run_cli(["simulate", *H100, "--preset", preset, *extra, "--recompute", "op-sac"])
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppsim simulate: error: model.recompute: "
                                                   "op-sac"), lines
    assert what in lines[0] and "activation-checkpoint:full" in lines[0]


def _simulate(*argv: str) -> dict:
    r = run_cli(["simulate", *H100, *argv, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_torchtitan_s_selective_subcommand_is_op_sac() -> None:
    """activation-checkpoint:selective on a torchtitan line prices as --recompute op-sac."""
    line = ("--preset", "llama3-8b", "--parallelism.data_parallel_shard_degree", "8")
    a = _simulate(*line, "activation-checkpoint:selective")
    b = _simulate(*line, "--recompute", "op-sac")
    assert (a["iteration_time_ms"], a["ranks"][0]["peak_memory_bytes"]) == \
        (b["iteration_time_ms"], b["ranks"][0]["peak_memory_bytes"])


def test_torchtitan_s_llama3_8b_runs_as_its_registry_says() -> None:
    """llama3_8b's SelectiveAC is priced, between its none and its full, and `plan` writes
    SelectiveAC back."""
    base = ("--torchtitan-config", "llama3_8b", "--gpus", "8")
    sac, none, full = (_simulate(*base, *extra) for extra in (
        (), ("activation-checkpoint:none",), ("activation-checkpoint:full",)))
    assert none["iteration_time_ms"] < sac["iteration_time_ms"] < full["iteration_time_ms"]
    peaks = [r["ranks"][0]["peak_memory_bytes"] for r in (full, sac, none)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 3
    plan = run_cli(["plan", *H100, *base, "--global-batch-size", "16", "--json"])
    assert plan.returncode == 0, plan.stderr
    fields = json.loads(plan.stdout)["best"]["torchtitan_job"]
    assert fields["activation_checkpointing"] == "SelectiveAC"


@pytest.mark.parametrize("command", [["run", "--pp", "2"], ["profile"]])
def test_the_executor_refuses_it_in_one_line(command: list[str]) -> None:
    """The executor's blocks are Megatron's, where the per-op policy would save other
    tensors: run and profile refuse it before starting any process."""
    r = run_cli([*command, "--preset", "tiny-llm", "--swiglu", "--recompute", "op-sac"])
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: model.recompute: op-sac: the executor" in lines[0]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linears_keep_what_bf16_ones_do(recipe: str) -> None:
    """torchao's Float8 matmuls reach the policy as matmuls (its dispatch mode runs before
    the Float8 tensor's own), their outputs in bf16: the same saves, the same count."""
    fp8 = llama(fsdp=True, fp8="hybrid", fp8_recipe=recipe, recompute="op-sac")
    assert op_sac_kept(fp8) == op_sac_kept(llama(fsdp=True, recompute="op-sac"))
    fp8_acc = replace(ACC, fp8_peak_tflops=1979.0)
    assert transformer_costs(fp8, fp8_acc).layers[0].activation_bytes == \
        sum(op_sac_kept(fp8).values())


def test_a_deepseek_moe_layer_keeps_what_torchtitan_s_policy_saves() -> None:
    """torchtitan's DeepSeek block (models/deepseek_v3/model.py, common/moe.py): of wq_a,
    wq_b, wkv_a, wkv_b, wo and the shared expert's w1, w3, w2 it saves wq_a, wkv_a, wo and
    w3; attention's output and log-sum-exp; top-k's fp32 values and int64 ids; at ep 8 the
    dispatch's and the combine's all-to-all outputs, each a copy of every routed pair;
    the block's input. 4,096 tokens of DeepSeek-V3 in bf16."""
    a = Architecture(**{**MODEL_PRESETS["deepseek-v3"], "layers": "moe*61", "ep": 8,
                        "recompute": "op-sac"})
    tok, h, heads, k = 4096, 7168, 128, 8
    want = tok * 2 * (h                 # the block's input
                      + heads * 128     # attention's output (v_head_dim 128)
                      + 1536            # wq_a's output (q_lora_rank)
                      + 512 + 64        # wkv_a's (kv_lora_rank + the rotary part)
                      + h               # wo's
                      + 2048)           # the shared expert's w3
    want += tok * heads * 4 + tok * k * (4 + 8) + 2 * tok * k * h * 2
    assert sum(op_sac_kept(a, "moe").values()) == want
    layer = transformer_costs(a, ACC).layers[0]
    none = transformer_costs(replace(a, recompute="none"), ACC).layers[0]
    full = transformer_costs(replace(a, recompute="full"), ACC).layers[0]
    assert full.activation_bytes < layer.activation_bytes < none.activation_bytes
    assert none.backward_ms < layer.backward_ms < full.backward_ms


def test_a_torchtitan_job_s_recompute_search_climbs_torchtitan_s_modes() -> None:
    """No checkpointing does not fit 70 GB at 16,384 tokens a rank: the search takes
    SelectiveAC, the next of torchtitan's modes (not Megatron's selective), and says it
    in torchtitan's fields, with no Megatron flags."""
    r = run_cli(["plan", *H100, "--torchtitan-config", "llama3_8b", "--gpus", "8",
                 "--global-batch-size", "16", "--training.num_tokens_per_microbatch_per_dp_rank",
                 "16384", "--parallelism.context_parallel_degree", "1",
                 "--parallelism.tensor_parallel_degree", "1",
                 "--parallelism.pipeline_parallel_degree", "1", "--search", "recompute",
                 "--memory-gb", "70", "activation-checkpoint:none", "--json"])
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["memory_policy"] == "op-sac" and best["megatron_policy_flags"] is None
    assert best["torchtitan_job"]["activation_checkpointing"] == "SelectiveAC"


def test_a_torchtitan_job_s_policy_search_keeps_to_what_torchtitan_runs() -> None:
    """torchtitan applies one activation-checkpoint policy to every block: `--search policy`
    on its FSDP job offers none, SelectiveAC or FullAC, never Megatron's block N (which
    at 60 GB beat SelectiveAC's split, and which torchtitan cannot run)."""
    r = run_cli(["plan", *H100, "--preset", "llama3-8b", "--fsdp", "--gpus", "8",
                 "--global-batch-size", "32", "--pp", "1", "--tp", "1", "--cp", "1",
                 "--search", "policy", "--memory-gb", "60", "--json"])
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["memory_policy"] in ("none", "op-sac", "full")
    assert best["torchtitan_job"]["activation_checkpointing"] in (None, "SelectiveAC", "FullAC")


def test_the_no_fit_advice_speaks_torchtitan_s_checkpointing() -> None:
    """Under op-sac the next step is torchtitan's FullAC, named as its subcommand."""
    r = run_cli(["plan", *H100, "--preset", "llama3-8b", "--recompute", "op-sac", "--pp", "4",
                 "--microbatches", "8", "--memory-gb", "50"])
    assert r.returncode == 3
    assert "full activation checkpointing (activation-checkpoint:full, --recompute full)" \
        in r.stderr
