"""The job's shape: dp from --gpus, microbatches from the global batch, Megatron's refusals."""

from __future__ import annotations

import json

import pytest

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
