"""Megatron's own flag names: what `ppsim plan` prints as Megatron flags reads back.

`plan` ends with `Megatron: --num-layers 80 --pipeline-model-parallel-size 8
--pipeline-model-parallel-layout ...`; a user pasting that (or their launch script's
flags) into `ppsim simulate` was told "unrecognized arguments"."""

from __future__ import annotations

import io
import json
import shlex
from contextlib import redirect_stdout

import pytest

from ppsim.cli.main import main
from ppsim.sim.simulate import simulate


def _json(argv: list[str]) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("model", [
    ["--preset", "llama3-70b", "--pp", "8", "--microbatches", "16"],
    ["--preset", "deepseek-v3", "--pp", "16", "--ep", "64", "--microbatches", "16",
     "--recompute", "full"],
    ["--preset", "llama3-70b", "--pp", "4", "--vpp", "2", "--microbatches", "16"],
], ids=["llama3-70b", "deepseek-v3-mtp", "llama3-70b-interleaved"])
def test_the_megatron_flags_plan_prints_simulate_the_planned_split(model: list[str]) -> None:
    preset = model[:2]
    common = ["--hardware", "h100-80gb", "--microbatches", model[model.index("--microbatches")
                                                                   + 1]]
    if "--recompute" in model:
        common += ["--recompute", "full"]
    if "--ep" in model:
        common += ["--expert-model-parallel-size", "64"]
    # Whatever the budget finds: the split the flags say is the one simulated again.
    plan = _json(["plan", *model, "--hardware", "h100-80gb", "--time-budget", "1"])
    flags = shlex.split(plan["best"]["megatron_flags"])
    assert "--pipeline-model-parallel-size" in flags
    sim = _json(["simulate", *preset, *common, *flags])
    assert sim["iteration_time_ms"] == pytest.approx(plan["best"]["iteration_time_ms"])
    assert sim["split"] == plan["best"]["split"]


def test_megatron_names_mean_the_same_as_ppsim_s() -> None:
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb"]
    ours = _json([*base, "--tp", "2", "--pp", "4", "--vpp", "2", "--ep", "1",
                  "--first-stage-layers", "2", "--microbatch-group-size", "4"])
    # Megatron's tensor parallelism has sequence parallelism only when asked for it;
    # ppsim's --tp has the config's (on by default).
    megatron = _json([*base, "--tensor-model-parallel-size", "2", "--sequence-parallel",
                      "--pipeline-model-parallel-size", "4",
                      "--virtual-pipeline-model-parallel-size", "2",
                      "--expert-model-parallel-size", "1",
                      "--decoder-first-pipeline-num-layers", "2",
                      "--microbatch-group-size-per-virtual-pipeline-stage", "4"])
    assert megatron == ours


def test_the_mtp_depth_flag_sets_it_over_a_preset(tmp_path, capsys) -> None:
    """--mtp-num-layers over a preset sets its MTP depths as Megatron's flag does (it was
    refused wherever it disagreed with the preset, so DeepSeek-V3 could not be priced as
    NVIDIA's GB200 guide trains it, without MTP); the same as [model] mtp_layers."""
    base = ["simulate", "--hardware", "h100-80gb", "--pp", "2", "--microbatches", "4"]
    assert _json([*base, "--preset", "llama3-8b"])["split"] == [16, 16]
    gained = _json([*base, "--preset", "llama3-8b", "--mtp-num-layers", "1"])
    assert gained["split"] == [16, 17]
    cfg = tmp_path / "mtp.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\nmtp_layers = 1\n')
    assert gained["iteration_time_ms"] == _json([*base, "--config", str(cfg)])["iteration_time_ms"]
    deepseek = [*base, "--preset", "deepseek-v3", "--ep", "8"]
    assert sum(_json(deepseek)["split"]) == 62
    assert sum(_json([*deepseek, "--mtp-num-layers", "0"])["split"]) == 61
    capsys.readouterr()
    # A hybrid pattern names its own depths: Megatron warns and keeps them, and so does ppsim.
    hybrid = [*base, "--preset", "qwen3-next-80b-a3b"]
    assert _json([*hybrid, "--mtp-num-layers", "0"])["split"] == _json(hybrid)["split"]
    assert "--mtp-num-layers 0 ignored: the hybrid layer pattern has 1" in capsys.readouterr().err


LLAMA = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "4",
         "--microbatches", "8"]


@pytest.mark.parametrize("megatron, ours", [
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
     "--recompute full"),
    # The preset recomputes core_attn (selective): Megatron's block method, nothing else.
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2",
     "--recompute none --recompute-num-layers 2"),
    ("--recompute-granularity selective", "--recompute selective"),
    ("--recompute-activations", "--recompute selective"),
    # Megatron's arguments.py: --recompute-activations sets selective over any granularity
    # (ppsim kept full).
    ("--recompute-granularity full --recompute-activations", "--recompute selective"),
    ("--recompute-granularity selective --recompute-modules layernorm mlp",
     "--recompute none --recompute-modules layernorm,mlp"),
    ("--fine-grained-activation-offloading --offload-modules core_attn attn_proj "
     "--activation-offload-fraction 0.5", "--fine-grained-activation-offloading "
     "--offload-modules core_attn,attn_proj --offload-fraction 0.5"),
])
def test_megatrons_memory_policy_flags_mean_what_ppsim_s_do(megatron: str, ours: str) -> None:
    """Before, `--recompute-granularity` and friends, which `plan --search policy` prints
    as the policy's Megatron flags, were unrecognized."""
    got, want = _json([*LLAMA, *megatron.split()]), _json([*LLAMA, *ours.split()])
    assert got == want
    assert got != _json([*LLAMA, "--recompute", "none"])


def test_the_recompute_flags_ppsim_exports_read_back() -> None:
    from ppsim.costs.arch import Architecture
    from ppsim.policy.megatron import recompute_flags
    from ppsim.policy.model import ALL_LAYERS, StagePolicy

    arch = Architecture(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4,
                        ffn_hidden_size=256, vocab_size=512, seq_length=64)
    for policy, ours in [(StagePolicy(recompute_layers=ALL_LAYERS), "--recompute full"),
                         (StagePolicy(recompute_layers=3),
                          "--recompute none --recompute-num-layers 3"),
                         (StagePolicy(recompute_modules=("core_attn", "layernorm")),
                          "--recompute-modules core_attn,layernorm")]:
        flags = recompute_flags(policy, arch).flags
        assert _json([*LLAMA, *flags]) == _json([*LLAMA, *ours.split()]), flags


@pytest.mark.parametrize("flags, field", [
    ("--recompute-granularity full", "--recompute-method"),
    ("--recompute-granularity full --recompute-method block", "--recompute-num-layers"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
     "--recompute-num-layers"),
    ("--recompute-granularity selective --recompute-method uniform", "--recompute-method"),
    # TransformerConfig refuses the missing layer count; it never reads modules under full.
    ("--recompute-granularity full --recompute-method uniform --recompute-modules mlp",
     "--recompute-num-layers"),
    ("--recompute-granularity selective --recompute full", "--recompute-granularity"),
    # The flag given is named, not the granularity it sets (arguments.py:
    # --recompute-activations sets selective; TransformerConfig: --moe-layer-recompute too).
    ("--recompute-activations --recompute none", "--recompute-activations"),
    ("--moe-layer-recompute --recompute none", "--moe-layer-recompute"),
    # TransformerConfig: full granularity needs a layer count, whatever the method; none
    # with selective; moe_act recompute needs grouped GEMM.
    ("--recompute-granularity full --recompute-method uniform", "--recompute-num-layers"),
    ("--recompute-granularity selective --recompute-num-layers 2", "--recompute-num-layers"),
    ("--recompute-granularity selective --recompute-modules moe_act", "--recompute-modules"),
    ("--recompute-activations --recompute-modules core_attn,moe_act", "--recompute-modules"),
])
def test_megatrons_recompute_flags_are_refused_where_megatron_refuses_them(
        flags: str, field: str, capsys) -> None:
    assert main([*LLAMA, *flags.split()]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"error: {field}:" in err


@pytest.mark.parametrize("flags", ["--recompute-method uniform",
                                   "--recompute-method block --recompute-num-layers 2"])
def test_a_method_without_granularity_recomputes_nothing_as_in_megatron(
        flags: str, capsys) -> None:
    # TransformerConfig reads recompute_method and recompute_num_layers only under a
    # recompute_granularity; arguments.py asserts nothing of them without one.
    plain = _json(LLAMA)
    capsys.readouterr()
    assert _json([*LLAMA, *flags.split()]) == plain
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: Megatron ignores "
                                                       "--recompute-method")


def test_a_method_beside_the_combined_overlap_is_refused_as_in_megatron(capsys) -> None:
    # TransformerConfig: "disable recomputation method when enabling
    # overlap_moe_expert_parallel_comm", with or without a granularity.
    moe = ["simulate", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb", "--pp", "4",
           "--ep", "8", "--microbatches", "8", "--overlap-moe-expert-parallel-comm"]
    assert main([*moe, "--recompute-method", "uniform"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error: --recompute-method:" in err


def test_moe_act_recompute_with_grouped_gemm_is_megatrons_and_ppsims_moe_act() -> None:
    moe = ["simulate", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb", "--pp", "4"]
    got = _json([*moe, "--recompute-granularity", "selective", "--recompute-modules",
                 "moe_act", "--moe-grouped-gemm"])
    assert got == _json([*moe, "--recompute", "none", "--recompute-modules", "moe_act"])
    assert got != _json([*moe, "--recompute", "none"])


def test_a_per_rank_offload_step_ppsim_exports_reads_back() -> None:
    """Megatron's --delta-offload-bytes-across-pp-ranks, exported from a [memory] section's
    offload_step_bytes, reads back as the same priced job."""
    from ppsim.config.schema import config_from_dict
    from ppsim.pipeline.problem import build_problem
    from ppsim.policy.report import policy_flags

    problem = build_problem(config_from_dict({
        "model": {"preset": "llama3-70b", "recompute": "none"},
        "pipeline": {"pp": 4, "microbatches": 8}, "hardware": {"preset": "h100-80gb"},
        "memory": {"offload_modules": ["core_attn", "attn_proj"],
                   "offload_step_bytes": 300_000_000}}))
    flags = policy_flags(problem, problem.memory.policies).megatron_flags
    assert flags is not None and "--delta-offload-bytes-across-pp-ranks" in flags
    ours = _json([*LLAMA, "--recompute", "none", *flags])
    per_stage = simulate(problem).summary
    assert ours["iteration_time_ms"] == pytest.approx(per_stage.iteration_time_ms, rel=1e-9)
    assert [r["peak_memory_bytes"] for r in ours["ranks"]] == pytest.approx(
        [r.peak_memory_bytes for r in per_stage.ranks], rel=1e-9)


def test_an_offload_step_without_offload_modules_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "llama3-70b"\n[memory]\noffload_step_bytes = 1000\n')
    assert main(["simulate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "memory.offload_step_bytes" in err


@pytest.mark.parametrize("megatron, ours", [
    ("--num-virtual-stages-per-pipeline-rank 2", "--vpp 2"),
    # 80 layers on 4 ranks: 20 a rank, 5 a chunk -> 4 chunks a rank (arguments.py).
    ("--num-layers-per-virtual-pipeline-stage 5", "--vpp 4"),
    ("--num-layers-per-virtual-pipeline-stage 20", "--vpp 1"),
])
def test_megatrons_virtual_pipeline_flags_mean_vpp(megatron: str, ours: str) -> None:
    got, want = _json([*LLAMA, *megatron.split()]), _json([*LLAMA, *ours.split()])
    assert got == want and got["vpp"] == int(ours.split()[-1])


@pytest.mark.parametrize("flags, message", [
    ("--num-layers-per-virtual-pipeline-stage 3", "number of layers per pipeline stage (20) "
     "must be divisible by number of layers per virtual pipeline stage (3)"),
    ("--num-layers-per-virtual-pipeline-stage 5 --vpp 2", "is given with --vpp"),
    ("--num-layers-per-virtual-pipeline-stage 5 --decoder-first-pipeline-num-layers 10",
     "is given with --decoder-first-pipeline-num-layers"),
    ("--num-layers-per-virtual-pipeline-stage 5 --account-for-embedding-in-pipeline-split",
     "number of layers of the model (81) must be divisible by pipeline model parallel size"),
])
def test_layers_per_virtual_stage_is_refused_where_megatron_refuses_it(
        flags: str, message: str, capsys) -> None:
    assert main([*LLAMA, *flags.split()]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("per_chunk, vpp", [(2, 2), (1, 4)])
def test_layers_per_virtual_stage_on_the_embedded_default_re_splits_it(per_chunk: int,
                                                                        vpp: int) -> None:
    """`ppsim simulate --num-layers-per-virtual-pipeline-stage 2` on the embedded default was
    refused ("has 2 entries but pp=2 x vpp=2 needs 4"): its saved two-stage split was kept
    though the flag changes how many stages there are, as --vpp does."""
    got = _json(["simulate", "--num-layers-per-virtual-pipeline-stage", str(per_chunk)])
    want = _json(["simulate", "--vpp", str(vpp)])
    assert got == want and got["vpp"] == vpp and len(got["split"]) == 2 * vpp


def test_block_recompute_skips_the_mtp_layer_as_megatron_does() -> None:
    """Megatron's block method recomputes no MTP layer (multi_token_prediction.py warns
    "recompute_method == 'block' is not supported for MTP yet. Skipping recompute"); its
    uniform method recomputes it. Block N above every stage's layers is then uniform on
    every rank but the one holding the MTP layer, which keeps that layer's activations."""
    base = ["simulate", "--preset", "deepseek-v3", "--hardware", "h200-141gb", "--pp", "4",
            "--microbatches", "8", "--recompute-granularity", "full"]
    block = [*base, "--recompute-method", "block", "--recompute-num-layers", "99"]
    uniform = [*base, "--recompute-method", "uniform", "--recompute-num-layers", "1"]

    def peaks(argv: list[str]) -> list[int]:
        return [r["peak_memory_bytes"] for r in _json(argv)["ranks"]]

    with_mtp_block, with_mtp_uniform = peaks(block), peaks(uniform)
    assert with_mtp_block[:-1] == with_mtp_uniform[:-1]
    assert with_mtp_block[-1] > with_mtp_uniform[-1]
    no_mtp = ["--mtp-num-layers", "0"]
    assert peaks([*block, *no_mtp]) == peaks([*uniform, *no_mtp])
