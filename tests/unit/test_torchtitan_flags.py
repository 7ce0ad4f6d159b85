"""torchtitan's own field names: what `ppsim plan --gpus` prints for an FSDP job's best
shape as torchtitan's ParallelismConfig / TrainingConfig reads back through torchtitan's
command-line overrides (`--parallelism.tensor_parallel_degree 2`, the
`activation-checkpoint:full` subcommand) to the same simulated job."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.torchtitan_registry import REGISTRY
from ppsim.config.presets import MODEL_PRESETS
from tests.helpers import run_cli

H100 = ["--hardware", "h100-80gb"]
CHUNKED = ["--loss.num_chunks", "8"]
"""Every registry function's loss: ChunkedLossWrapper at its default 8 chunks."""


def _json(argv: list[str]) -> dict:
    r = run_cli([*argv, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _overrides(titan: dict) -> list[str]:
    """torchtitan's command line for the printed fields, each field spelled as torchtitan's
    config manager takes it (tyro: --section.field VALUE; the policy a subcommand)."""
    words: list[str] = []
    for section in ("parallelism", "training"):
        for key, value in titan[section].items():
            words += [f"--{section}.{key}", str(value)]
    if titan.get("compile", {}).get("enable_async_tensor_parallel"):
        words += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
    words.append({"FullAC": "activation-checkpoint:full",
                  "SelectiveAC": "activation-checkpoint:selective",
                  None: "activation-checkpoint:none"}[titan["activation_checkpointing"]])
    return words


SHAPES = {
    "pp-interleaved": ["--preset", "llama3-8b", "--gpus", "32", "--global-batch-size", "64",
                       "--pp", "4", "--vpp", "2", "--tp", "1", "--cp", "1",
                       "--micro-batch-size", "1", "--recompute", "full"],
    "fsdp-tp": ["--preset", "llama3-8b", "--gpus", "16", "--global-batch-size", "32",
                "--pp", "1", "--tp", "2", "--cp", "1", "--micro-batch-size", "2",
                "--recompute", "none", "--tp-comm-overlap"],
    "hsdp-1f1b": ["--preset", "llama3-8b", "--gpus", "32", "--global-batch-size", "64",
                  "--pp", "2", "--vpp", "1", "--tp", "2", "--cp", "1", "--dp-replicas", "2",
                  "--micro-batch-size", "1", "--recompute", "full"],
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_printed_torchtitan_fields_simulate_the_planned_job(shape: list[str]) -> None:
    plan = _json(["plan", *H100, "--fsdp", *shape, "--time-budget", "1"])
    best = plan["best"]
    titan = best["torchtitan_job"]
    assert titan["notes"] == []
    line = _overrides(titan)
    sim = _json(["simulate", "--preset", "llama3-8b", *H100, *line])
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"])
    assert max(r["peak_memory_bytes"] for r in sim["ranks"]) == pytest.approx(
        best["peak_memory_bytes"])
    if titan["parallelism"]["pipeline_parallel_degree"] > 1:
        assert sim["split"] == best["split"]


BASE = ["simulate", "--preset", "llama3-8b", *H100]


@pytest.mark.parametrize(("titan", "ours"), [
    (["--parallelism.data_parallel_shard_degree", "8"], ["--dp", "8"]),
    (["--parallelism.data_parallel_shard_degree", "4",
      "--parallelism.data_parallel_replicate_degree", "2"], ["--dp", "8", "--dp-replicas", "2"]),
    (["--parallelism.data_parallel_shard_degree", "-1", "--gpus", "16",
      "--parallelism.tensor_parallel_degree", "2"], ["--gpus", "16", "--tp", "2"]),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.context_parallel_degree", "2"], ["--dp", "2", "--cp", "2"]),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.fsdp_reshard_after_forward", "never"],
     ["--dp", "2", "--fsdp-reshard-after-forward", "never"]),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--training.num_tokens_per_microbatch_per_dp_rank", "8192",
      "--training.num_tokens_per_train_step", "65536", "--training.max_context_length",
      "2048"], ["--dp", "2", "--micro-batch-size", "4", "--global-batch-size", "32",
                "--seq-length", "2048"]),
    (["--parallelism.data_parallel_shard_degree", "2", "activation-checkpoint:full"],
     ["--dp", "2", "--recompute", "full"]),
    (["--parallelism.data_parallel_shard_degree", "2", "activation_checkpoint:none"],
     ["--dp", "2", "--recompute", "none"]),
    (["--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree",
      "2", "--compile.enable_async_tensor_parallel"],
     ["--dp", "2", "--tp", "2", "--tp-comm-overlap"]),
    (["--parallelism.data_parallel_shard_degree", "2", "--training.mixed_precision_param",
      "bfloat16", "--training.mixed_precision_reduce", "float32", "--training.dtype",
      "float32"], ["--dp", "2"]),
    # pp: torchtitan's default schedule 1F1B and its default split (the embedding and the
    # head each counted as a layer: 33 + 1 over 4 stages, earlier stages one more).
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.pipeline_parallel_degree", "4", "--parallelism.num_pp_microbatches",
      "8"], ["--dp", "2", "--pp", "4", "--schedule", "1f1b", "--microbatches", "8",
             "--split", "8,9,8,7"]),
    # A multi-stage schedule: two stages a rank, 34 over 8.
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.pipeline_parallel_degree", "4", "--parallelism.num_pp_microbatches",
      "8", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"],
     ["--dp", "2", "--pp", "4", "--vpp", "2", "--schedule", "interleaved-1f1b",
      "--microbatches", "8", "--split", "4,5,4,4,4,4,4,3"]),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.pipeline_parallel_degree", "2", "--parallelism.num_pp_microbatches", "4",
      "--parallelism.pipeline_parallel_layers_per_stage", "9",
      "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"],
     ["--dp", "2", "--pp", "2", "--vpp", "2", "--schedule", "interleaved-1f1b",
      "--microbatches", "4", "--split", "8,9,8,7"]),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.pipeline_parallel_degree", "2", "--parallelism.num_pp_microbatches", "4",
      "--parallelism.module_fqns_per_model_part",
      str([["tok_embeddings", *(f"layers.{k}" for k in range(10))],
           [*(f"layers.{k}" for k in range(10, 32)), "norm", "lm_head"]])],
     ["--dp", "2", "--pp", "2", "--microbatches", "4", "--split", "10,22"]),
], ids=["shard", "hsdp", "leftover", "cp", "reshard", "tokens", "full-ac", "no-ac",
        "async-tp", "dtypes", "pp-default-split", "interleaved", "layers-per-stage", "fqns"])
def test_each_torchtitan_field_says_what_ppsim_s_flag_says(titan: list[str],
                                                           ours: list[str]) -> None:
    pp = [] if any("pipeline_parallel_degree" in w for w in titan) else ["--pp", "1"]
    mbs = [] if any("tokens" in w for w in titan) or "--microbatches" in ours \
        else ["--microbatches", "1"]
    # No activation-checkpoint subcommand: torchtitan's default, SelectiveAC.
    ac = [] if "--recompute" in ours else ["--recompute", "op-sac"]
    assert _json([*BASE, *titan]) == _json([*BASE, "--fsdp", *pp, *mbs, *ac, *ours])


def test_a_registry_function_is_its_model_and_fields(capsys: pytest.CaptureFixture) -> None:
    """llama3_70b (torchtitan/models/llama3/config_registry.py): the 70B flavour, tp 8,
    8 x 8192 tokens a microbatch, FullAC; the line's own fields win over it."""
    titan = _json(["simulate", *H100, "--torchtitan-config", "llama3_70b", "--gpus", "64"])
    ours = _json(["simulate", *H100, "--preset", "llama3-70b", "--fsdp", "--gpus", "64",
                  "--tp", "8", "--pp", "1", "--micro-batch-size", "8", "--seq-length", "8192",
                  "--microbatches", "1", "--recompute", "full", *CHUNKED])
    assert titan == ours
    wider = _json(["simulate", *H100, "--torchtitan-config", "llama3_70b", "--gpus", "64",
                   "--parallelism.tensor_parallel_degree", "4"])
    assert wider == _json(["simulate", *H100, "--preset", "llama3-70b", "--fsdp", "--gpus",
                           "64", "--tp", "4", "--pp", "1", "--micro-batch-size", "8",
                           "--seq-length", "8192", "--microbatches", "1", "--recompute",
                           "full", *CHUNKED])
    # llama3_405b compiles (taken, named as not priced) for AsyncTP, and trains in float8.
    r = run_cli(["simulate", *H100, "--torchtitan-config", "llama3_405b", "--gpus", "512",
                 "--json"])
    assert r.returncode == 0, r.stderr
    assert "compile.enable taken, not priced" in r.stderr
    ours = _json(["simulate", *H100, "--preset", "llama3.1-405b", "--fsdp", "--gpus", "512",
                  "--tp", "8", "--pp", "1", "--micro-batch-size", "2", "--seq-length", "8192",
                  "--microbatches", "1", "--recompute", "full", "--tp-comm-overlap",
                  "--fp8-format", "hybrid", "--fp8-recipe", "rowwise", *CHUNKED])
    assert json.loads(r.stdout) == ours


def test_gpt_oss_120b_is_its_preset_and_fields() -> None:
    """gpt_oss_120b (torchtitan/models/gpt_oss/config_registry.py): the 120b flavour,
    ep 1 (the preset's ep 8 overridden), 1 x 8192 tokens a microbatch, FullAC."""
    titan = _json(["simulate", *H100, "--torchtitan-config", "gpt_oss_120b", "--gpus", "64"])
    ours = _json(["simulate", *H100, "--preset", "gpt-oss-120b", "--fsdp", "--gpus", "64",
                  "--tp", "1", "--ep", "1", "--pp", "1", "--micro-batch-size", "1",
                  "--seq-length", "8192", "--microbatches", "1", "--recompute", "full",
                  *CHUNKED])
    assert titan == ours


def _preset_sizes(preset: dict) -> dict:
    """A preset's sizes in the registry's Flavour names (ffn only where a dense layer
    uses it; the dense layers are the `layers` spec's leading dense group)."""
    layers = preset.get("layers", "")
    dense = int(layers.split(",")[0].split("*")[1]) if layers.startswith("dense") else 0
    moe = preset.get("num_experts", 0) > 0
    return dict(hidden=preset["hidden_size"], layers=preset["num_layers"],
                heads=preset["num_heads"], kv_heads=preset["num_kv_heads"],
                head_dim=preset.get("head_dim", preset["hidden_size"] // preset["num_heads"]),
                vocab=preset["vocab_size"],
                ffn=preset["ffn_hidden_size"] if dense or not moe else None,
                dense_layers=dense, experts=preset.get("num_experts", 0),
                top_k=preset.get("top_k", 0), expert_ffn=preset.get("moe_ffn_hidden_size"),
                shared_experts=preset.get("shared_experts", 0))


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(sorted(REGISTRY)))
def test_every_registry_preset_has_the_flavour_s_sizes(name: str) -> None:
    """Each function's preset is its flavour: the sizes recorded from torchtitan's model
    registry are the preset's."""
    job = REGISTRY[name]
    assert _preset_sizes(MODEL_PRESETS[job.preset]) == asdict(job.flavour)


@pytest.mark.parametrize(("argv", "field"), [
    (["--torchtitan-config", "llama3_1b", "--gpus", "8"], "--torchtitan-config"),
    (["--torchtitan-config", "llama3_70b"], "--parallelism.data_parallel_shard_degree"),
    (["--parallelism.data_parallel_shard_degree", "0"],
     "--parallelism.data_parallel_shard_degree"),
    (["--parallelism.data_parallel_shard_degree", "2",
      "--parallelism.data_parallel_replicate_degree", "0"],
     "--parallelism.data_parallel_replicate_degree"),
    (["--parallelism.data_parallel_shard_degree", "2", "activation-checkpoint:memory-budget"],
     "activation_checkpoint"),
    (["--parallelism.data_parallel_shard_degree", "2", "--training.dtype", "bfloat16"],
     "--training.dtype"),
    (["--parallelism.data_parallel_shard_degree", "2", "--training.mixed_precision_param",
      "float32"], "--training.mixed_precision_param"),
    (["--training.num_tokens_per_microbatch_per_dp_rank", "8192"],
     "--training.num_tokens_per_microbatch_per_dp_rank"),
    (["--training.num_tokens_per_microbatch_per_dp_rank", "1000",
      "--training.max_context_length", "2048"],
     "--training.num_tokens_per_microbatch_per_dp_rank"),
    (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.module_fqns_per_model_part",
      "[['layers.0'], ['tok_embeddings']]"], "--parallelism.module_fqns_per_model_part"),
    (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.module_fqns_per_model_part",
      "not a list"], "--parallelism.module_fqns_per_model_part"),
    (["--parallelism.pipeline_parallel_degree", "2",
      "--parallelism.pipeline_parallel_layers_per_stage", "4"],
     "--parallelism.pipeline_parallel_layers_per_stage"),
    (["--parallelism.data_parallel_shard_degree", "4", "--dp", "2"],
     "--parallelism.data_parallel_shard_degree"),
    (["--parallelism.tensor_parallel_degree", "2", "--tp", "4"], "--tp"),
    (["--parallelism.data_parallel_shard_degree", "2", "activation-checkpoint:full",
      "--recompute", "none"], "--recompute"),
    (["--parallelism.data_parallel_shard_degree", "2", "--parallelism.pipeline_parallel_degree",
      "2", "--parallelism.num_pp_microbatches", "4", "--training.max_context_length", "8192",
      "--training.num_tokens_per_microbatch_per_dp_rank", "8192",
      "--training.num_tokens_per_train_step", str(8192 * 16)],
     "--training.num_tokens_per_train_step"),
    # The same step where the shard degree is -1: dp is the world's (--gpus 16, pp 2: 8).
    (["--torchtitan-config", "llama3_8b", "--gpus", "16", "--parallelism.pipeline_parallel_degree",
      "2", "--parallelism.num_pp_microbatches", "4",
      "--training.num_tokens_per_train_step", str(8192 * 64)],
     "--training.num_tokens_per_train_step: gives more than one gradient-accumulation step"),
], ids=["unknown-config", "leftover-without-world", "shard-0",
        "replicate-0", "memory-budget", "bf16-dtype", "fp32-params",
        "tokens-without-seq", "partial-sequences", "fqns-out-of-order", "fqns-text",
        "layers-per-stage-single", "dp-disagrees", "tp-disagrees", "recompute-disagrees",
        "two-accumulation-steps", "two-accumulation-steps-at-the-world-s-dp"])
def test_what_ppsim_does_not_price_is_refused_in_one_line(argv: list[str], field: str) -> None:
    preset = [] if "--torchtitan-config" in argv else ["--preset", "llama3-8b"]
    r = run_cli(["simulate", *preset, *H100, *argv])
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppsim simulate: error: " + field), lines


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       pp=st.sampled_from([1, 2]), shard=st.sampled_from([1, 2, 4]),
       replicate=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2]))
def test_torchtitan_degrees_are_ppsim_s_job(tp: int, cp: int, pp: int, shard: int,
                                            replicate: int, mbs: int) -> None:
    """Any valid degrees: torchtitan's names give the job ppsim's flags give (FSDP over
    shard x replicate, the replicas HSDP's copies; one accumulation step)."""
    seq = 2048
    titan = ["--parallelism.data_parallel_shard_degree", str(shard),
             "--parallelism.data_parallel_replicate_degree", str(replicate),
             "--parallelism.tensor_parallel_degree", str(tp),
             "--parallelism.context_parallel_degree", str(cp),
             "--parallelism.pipeline_parallel_degree", str(pp),
             "--parallelism.num_pp_microbatches", "4",
             "--training.num_tokens_per_microbatch_per_dp_rank", str(mbs * seq),
             "--training.max_context_length", str(seq), "activation-checkpoint:full"]
    ours = ["--fsdp", "--dp", str(shard * replicate), "--dp-replicas", str(replicate),
            "--tp", str(tp), "--cp", str(cp), "--pp", str(pp),
            "--microbatches", "4" if pp > 1 else "1", "--micro-batch-size", str(mbs),
            "--seq-length", str(seq), "--recompute", "full"]
    if pp > 1:
        ours += ["--split", "16,16"]  # torchtitan's: 32 + 2 over 2
    a, b = run_cli([*BASE, *titan, "--json"]), run_cli([*BASE, *ours, "--json"])
    assert (a.returncode, a.stderr.splitlines()[-1:]) == (b.returncode, b.stderr.splitlines()[-1:])
    assert a.stdout == b.stdout


def test_plan_holds_the_fields_a_torchtitan_line_gives() -> None:
    """`plan --gpus`: the sizes the line gives are held and the rest searched, the
    registry function's parallel sizes and micro batch too (a search starts from the
    job, it does not stop at it); the step's tokens give the global batch."""
    plan = _json(["plan", *H100, "--torchtitan-config", "llama3_70b", "--gpus", "64",
                  "--training.num_tokens_per_train_step", str(8192 * 128),
                  "--parallelism.tensor_parallel_degree", "8", "--time-budget", "1"])
    assert plan["global_batch_size"] == 128
    assert plan["held"] == {"tp": 8}
    assert plan["best"]["torchtitan_job"]["parallelism"]["tensor_parallel_degree"] == 8


def test_plan_searches_a_torchtitan_line_that_gives_no_pipeline() -> None:
    """A torchtitan line without pipeline_parallel_degree under `plan --gpus`: each
    shape's split is the search's (it raised a TypeError on the missing degree)."""
    plan = _json(["plan", *H100, "--preset", "llama3-8b", "--parallelism."
                  "tensor_parallel_degree", "2", "--gpus", "8", "--global-batch-size", "8",
                  "--time-budget", "1"])
    assert plan["held"] == {"tp": 2} and plan["best"]["tp"] == 2


@pytest.mark.parametrize("degree", ["tensor_parallel_degree", "pipeline_parallel_degree",
                                    "context_parallel_degree", "expert_parallel_degree"])
def test_a_degree_below_one_is_refused_by_its_name(degree: str) -> None:
    # pipeline_parallel_degree 0 beside layers_per_stage divided by zero
    r = run_cli(["simulate", *H100, "--preset", "tiny-gpt", "--gpus", "8",
                 "--parallelism.pipeline_parallel_layers_per_stage", "1",
                 f"--parallelism.{degree}", "0"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"error: --parallelism.{degree}: must be at least 1, got 0" in r.stderr


@pytest.mark.parametrize("name", ["num_tokens_per_microbatch_per_dp_rank",
                                  "num_tokens_per_train_step"])
def test_tokens_past_the_limit_are_refused_by_their_name(name: str) -> None:
    """Tokens become sequences: too many are refused as the tokens given, not as the
    micro batch or the global batch the line never named."""
    r = run_cli(["simulate", *H100, "--preset", "llama3-8b", "--gpus", "2",
                 "--training.max_context_length", "8192", f"--training.{name}",
                 str(8192 * 10**12)])
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"ppsim simulate: error: --training.{name}: 8,192,000,000,000,000 tokens are "
        "1,000,000,000,000 sequences of 8192, above the limit of "), lines


@pytest.mark.parametrize("mode", ["", "foo", "memory_budget"])
def test_an_activation_checkpoint_word_torchtitan_lacks_is_named_so(mode: str) -> None:
    """torchtitan's subcommands are selective, full, memory-budget and none
    (distributed/activation_checkpoint.py): another word is no mode, not an unpriced one."""
    r = run_cli(["simulate", *H100, "--preset", "llama3-8b", f"activation-checkpoint:{mode}"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"error: activation_checkpoint: {mode!r} is none of torchtitan's modes" in r.stderr


def test_a_global_batch_over_one_step_names_the_flag_given() -> None:
    """ppsim's own --global-batch-size beside a torchtitan line with pp: more than one
    accumulation step is refused naming it, in sequences (no sequence length was given:
    the message multiplied by None)."""
    r = run_cli(["simulate", *H100, "--global-batch-size", "32",
                 "--parallelism.data_parallel_shard_degree", "2", "--fsdp", "--pp", "4"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "error: --global-batch-size: gives more than one gradient-accumulation step" \
        in r.stderr and "(give 2, or more num_pp_microbatches)" in r.stderr


def test_a_schedule_without_a_pipeline_is_moot() -> None:
    """deepseek_v3_671b names Interleaved1F1B and leaves pp at 1: torchtitan builds no
    pipeline, so no schedule (and no chunks per rank) is asked of the job."""
    r = run_cli(["simulate", *H100, "--torchtitan-config", "deepseek_v3_671b", "--gpus", "1024",
                 "--json"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["pp"], out["vpp"]) == (1, 1)


def test_a_line_without_a_checkpoint_policy_runs_torchtitan_s_default() -> None:
    """A torchtitan line that gives no activation-checkpoint subcommand runs
    Trainer.Config's default, SelectiveAC (op-sac), not the preset's Megatron recompute:
    `plan` prints it as torchtitan's (it said torchtitan had no form of the policy), and
    simulate reads the print back to the plan's time and peak."""
    line = ["--preset", "llama3-8b", *H100, "--parallelism.data_parallel_shard_degree", "-1"]
    assert _json(["simulate", *line, "--gpus", "8"]) == _json(
        ["simulate", *line, "--gpus", "8", "activation-checkpoint:selective"])
    best = _json(["plan", *line, "--gpus", "8", "--global-batch-size", "8",
                  "--time-budget", "1"])["best"]
    titan = best["torchtitan_job"]
    assert (titan["activation_checkpointing"], titan["notes"]) == ("SelectiveAC", [])
    sim = _json(["simulate", *line, "--gpus", "8", *_overrides(titan)])
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"])
    assert max(r["peak_memory_bytes"] for r in sim["ranks"]) == pytest.approx(
        best["peak_memory_bytes"])


def test_a_shard_degree_the_world_disagrees_with_is_named_as_given() -> None:
    """A torchtitan line's shard degree beside --gpus that gives another dp is refused
    naming the field the line gave, not ppsim's --dp it never typed."""
    r = run_cli(["simulate", *H100, "--preset", "llama3-8b", "--gpus", "16",
                 "--parallelism.data_parallel_shard_degree", "4"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("ppsim simulate: error: --parallelism.data_parallel_shard_degree:"
                               " 4 gives dp 4, and --gpus 16 gives dp = 16"), lines


def test_a_one_stage_shape_runs_no_pipeline_schedule() -> None:
    """The line names InterleavedZeroBubble; the search's best shape has pp 1, where
    torchtitan builds no pipeline: it is priced as one stage, so its printed fields (no
    schedule) read back to the same time and peak."""
    r = run_cli(["plan", *H100, "--torchtitan-config", "llama3_70b",
                 "--parallelism.tensor_parallel_degree", "2",
                 "--parallelism.pipeline_parallel_schedule", "InterleavedZeroBubble",
                 "--gpus", "64", "--global-batch-size", "64", "--json"])
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["pp"] == 1
    fields = best["torchtitan_job"]
    line = [f"--parallelism.{k}={v}" for k, v in fields["parallelism"].items()]
    line += [f"--training.{k}={v}" for k, v in fields["training"].items()]
    back = _json(["simulate", *H100, "--preset", "llama3-70b", *line,
                  f"--loss.num_chunks={fields['loss']['num_chunks']}",
                  "activation-checkpoint:full"])
    assert back["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-9)
    assert max(x["peak_memory_bytes"] for x in back["ranks"]) == best["peak_memory_bytes"]


def test_a_schedule_ppsim_does_not_price_is_refused_by_torchtitan_s_field() -> None:
    """argparse refuses it (exit 2, one line), as the user's process sees it."""
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", *H100, "--preset",
                        "llama3-8b", "--parallelism.pipeline_parallel_degree", "2",
                        "--parallelism.pipeline_parallel_schedule", "LoopedBFS"],
                       capture_output=True, text=True, check=False)
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "ppsim simulate: error: argument --parallelism.pipeline_parallel_schedule: "
        "'LoopedBFS' is not a schedule ppsim prices"), lines
