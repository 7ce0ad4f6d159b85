"""The job's shape: dp from --gpus, microbatches from the global batch, Megatron's refusals."""

from __future__ import annotations

import json

import pytest
from helpers import run_main

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job.shape import job_shape


def args_config(*argv: str):
    return config_from_args(build_parser().parse_args(["simulate", *argv]))


def test_gpus_and_global_batch_give_dp_and_microbatches() -> None:
    cfg = args_config("--preset", "llama3.1-405b", "--pp", "16", "--gpus", "8192",
                      "--global-batch-size", "2048")
    shape = job_shape(cfg)
    assert shape is not None
    assert (shape.sizes.tp, shape.sizes.dp, shape.sizes.pp) == (8, 64, 16)
    assert cfg.pipeline.microbatches == 32  # 2048 / (1 x 64)
    assert (shape.gpus, shape.global_batch_size, shape.tokens) == (8192, 2048, 2048 * 8192)


def test_micro_batch_size_and_cp_enter_the_division() -> None:
    cfg = args_config("--preset", "llama3-8b", "--tp", "2", "--cp", "2", "--pp", "2",
                      "--gpus", "64", "--micro-batch-size", "2", "--global-batch-size", "128")
    assert cfg.model.arch.dp == 8 and cfg.pipeline.microbatches == 8  # 128 / (2 x 8)


def test_megatron_message_when_the_batch_does_not_divide(capsys) -> None:
    # megatron/core/num_microbatches_calculator.py, ConstantNumMicroBatches.
    rc = main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--dp", "4",
               "--micro-batch-size", "2", "--global-batch-size", "20"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert ("global batch size (20) is not divisible by micro batch size (2) times data "
            "parallel size (4)") in err
    assert "pipeline.global_batch_size" in err


def test_megatron_message_when_the_world_does_not_divide(capsys) -> None:
    # megatron/core/parallel_state.py: world_size % (tp x pp x cp).
    rc = main(["simulate", "--preset", "llama3-8b", "--tp", "2", "--pp", "4", "--gpus", "36"])
    assert rc == 2
    assert "world_size (36) is not divisible by 8" in capsys.readouterr().err


def test_config_file_global_batch() -> None:
    cfg = config_from_dict({"model": {"preset": "llama3-8b", "dp": 4},
                            "pipeline": {"pp": 2, "global_batch_size": 64}})
    assert cfg.pipeline.microbatches == 16
    with pytest.raises(UserError, match="global batch size \\(60\\)"):
        config_from_dict({"model": {"preset": "llama3-8b", "dp": 8},
                          "pipeline": {"pp": 2, "global_batch_size": 60}})


def test_cp_and_ep_limits() -> None:
    with pytest.raises(UserError, match="model.cp"):
        config_from_dict({"model": {"preset": "tiny-llm", "cp": 3}})
    with pytest.raises(UserError, match="model.ep"):
        config_from_dict({"model": {"preset": "mixtral-8x7b", "dp": 12, "ep": 8}})


def test_json_reports_the_job(capsys) -> None:
    assert main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--dp", "2",
                 "--global-batch-size", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["microbatches"] == 4


def test_a_world_of_zero_is_below_one_not_indivisible(capsys) -> None:
    """Before: --gpus 0 said 'world_size (0) is not divisible by 8', which it is."""
    rc = main(["simulate", "--preset", "llama3-8b", "--tp", "2", "--pp", "4", "--gpus", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--gpus: must be at least 1, got 0" in err


@pytest.mark.parametrize("pp", ["0", "-2"])
def test_a_pipeline_size_below_one_beside_gpus_is_refused_by_its_name(capsys, pp: str) -> None:
    """The world divides by tp x pp x cp: pp 0 divided by zero, pp -2 was blamed on dp."""
    rc = main(["simulate", "--preset", "gpt3-1.3b", "--pp", pp, "--gpus", "2"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err == (f"ppsim simulate: error: pipeline.pp: must be a positive integer, got {pp} "
                   "(set it to 1 or more)\n")


def test_a_dp_that_disagrees_with_the_world_is_refused(capsys) -> None:
    """Before: --dp 4 beside --gpus 16 (tp 1, pp 2: dp 8) was overridden without a word."""
    rc = main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--gpus", "16", "--dp", "4"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "--dp: 4 disagrees with --gpus 16, which gives dp = 8" in err
    assert main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--gpus", "16",
                 "--dp", "8", "--json"]) == 0


def _one_line_error(capsys, argv: list[str]) -> str:
    rc = main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--dp", "4", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_param_gather_overlap_needs_the_grad_reduce_overlap_and_the_sharded_optimizer(
        capsys) -> None:
    """Megatron's arguments.py asserts both; before, the flag was dropped without a word
    when the optimizer was not distributed (nothing to gather)."""
    err = _one_line_error(capsys, ["--overlap-param-gather", "--use-distributed-optimizer"])
    assert "Must use --overlap-param-gather with --overlap-grad-reduce" in err
    err = _one_line_error(capsys, ["--overlap-param-gather", "--overlap-grad-reduce"])
    assert "pipeline.overlap_param_gather" in err and "distributed optimizer" in err
    assert "--use-distributed-optimizer" in err
    cfg = args_config("--preset", "llama3-8b", "--pp", "2", "--dp", "4",
                      "--overlap-param-gather", "--overlap-grad-reduce",
                      "--use-distributed-optimizer")
    assert cfg.model.arch.distributed_optimizer and cfg.pipeline.overlap_param_gather


def test_expert_parallelism_needs_experts(capsys) -> None:
    """Megatron: 'num_experts must be non None to use expert model parallelism'; before,
    ep 2 on a dense model was taken and did nothing."""
    err = _one_line_error(capsys, ["--ep", "2"])
    assert "model.ep" in err and "num_experts is not set" in err


def test_microbatches_that_disagree_with_the_global_batch_are_refused(capsys) -> None:
    """Before: --microbatches 2 beside --global-batch-size 256 gave 256 microbatches
    without a word."""
    rc = main(["simulate", "--preset", "llama3-8b", "--pp", "2", "--dp", "2",
               "--global-batch-size", "256", "--microbatches", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "pipeline.microbatches: 2 disagrees with global_batch_size 256, which gives " \
           "128 at micro_batch_size 1 and dp 2" in err
    assert args_config("--preset", "llama3-8b", "--pp", "2", "--dp", "2", "--global-batch-size",
                       "256", "--microbatches", "128").pipeline.microbatches == 128
    with pytest.raises(UserError, match="pipeline.microbatches"):
        config_from_dict({"model": {"preset": "llama3-8b", "dp": 4},
                          "pipeline": {"pp": 2, "global_batch_size": 64, "microbatches": 4}})
    agreed = config_from_dict({"model": {"preset": "llama3-8b", "dp": 4},
                               "pipeline": {"pp": 2, "global_batch_size": 64,
                                            "microbatches": 16}})
    assert agreed.pipeline.global_batch_size == 64


def test_a_microbatch_flag_overrides_a_files_global_batch(tmp_path) -> None:
    """Flags override the file: before, the file's global batch won over the flag."""
    path = tmp_path / "job.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[pipeline]\npp = 2\n'
                    "global_batch_size = 64\n")
    cfg = args_config("--config", str(path), "--microbatches", "8")
    assert (cfg.pipeline.microbatches, cfg.pipeline.global_batch_size) == (8, 0)
    kept = args_config("--config", str(path), "--microbatches", "64")
    assert (kept.pipeline.microbatches, kept.pipeline.global_batch_size) == (64, 64)


def test_the_job_search_refuses_a_microbatch_count(capsys) -> None:
    """Before: plan --gpus took --microbatches 2 and planned 256 per replica."""
    rc = main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8",
               "--global-batch-size", "256", "--microbatches", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith(
        "ppsim plan: error: --microbatches:")


def test_a_tui_microbatch_edit_is_kept_under_a_global_batch() -> None:
    """Before: with a global batch loaded, the TUI's microbatch edit was replaced by the
    batch's count, so the edit changed nothing."""
    from dataclasses import replace

    from ppsim.tui.session import config_for, state_from_config

    base = args_config("--preset", "llama3-8b", "--pp", "2", "--dp", "2",
                       "--global-batch-size", "32")
    state = state_from_config(base)
    assert state.microbatches == 16
    assert config_for(base, state).pipeline.global_batch_size == 32
    edited = config_for(base, replace(state, microbatches=4))
    assert (edited.pipeline.microbatches, edited.pipeline.global_batch_size) == (4, 0)


@pytest.mark.parametrize(("gpus", "pp", "ep", "dp"), [(512, 8, 64, 32), (1024, 4, 128, 128),
                                                       (256, 8, 32, 16), (128, 2, 32, 32)])
def test_gpus_give_the_dp_the_expert_layout_is_checked_at(gpus: int, pp: int, ep: int,
                                                            dp: int) -> None:
    """Kimi K2's preset runs dp 16 at tp 2; `--gpus 512 --pp 8 --ep 64` was refused with
    "world_size (256) is not divisible by ... (512)": the layout was checked at the
    preset's dp before --gpus gave its own (32)."""
    cfg = args_config("--preset", "kimi-k2", "--hardware", "gb200-186gb", "--gpus",
                      str(gpus), "--pp", str(pp), "--ep", str(ep), "--global-batch-size",
                      "2048")
    a = cfg.model.arch
    assert (a.dp, a.ep, a.tp * a.dp * cfg.pipeline.pp) == (dp, ep, gpus)


def test_an_expert_layout_the_world_cannot_hold_is_still_refused() -> None:
    with pytest.raises(UserError, match=r"world_size \(512\) is not divisible"):
        args_config("--preset", "kimi-k2", "--hardware", "gb200-186gb", "--gpus", "512",
                    "--pp", "8", "--ep", "128", "--global-batch-size", "2048")


@pytest.mark.parametrize("command", ["simulate", "costs", "plan"])
def test_a_global_batch_of_0_on_the_command_line_is_refused(command: str) -> None:
    """It read as "no global batch" and ran the config's microbatches; Megatron asserts a
    positive global batch (a config's 0 still means unset)."""
    code, _, err = run_main([command, "--preset", "llama3-8b", "--hardware", "h100-80gb",
                             "--pp", "2", "--global-batch-size", "0"])
    assert code == 2 and err.count("\n") == 1
    assert "error: --global-batch-size: must be between 1 and" in err



def test_sequence_parallelism_needs_a_ranks_tokens_to_divide_over_tp(capsys) -> None:
    # Megatron's _split_along_first_dim asserts seq_length / cp divides over tp.
    from ppsim.job.shapes import shapes

    a = args_config("--preset", "llama3-8b", "--seq-length", "1002").model.arch
    found = shapes(a, 16, 32, 8, 32)
    assert {s.tp for s in found} == {1, 2}  # 1,002 tokens split over 2, not over 4 or 8
    assert all((1002 // s.cp) % s.tp == 0 for s in found)
    rc = main(["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
               "h100-80gb", "--seq-length", "1002", "--gpus", "16", "--global-batch-size",
               "32", "--tp", "4", "--time-budget", "5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "tp 4" in err
