"""--moe-token-dispatcher-type flex (DeepEP, Megatron's default flex backend; HybridEP as
DeepEP): priced, said in the job's JSON and line, exported in the plan's flags; NCCL EP
refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem


def simulate(capsys, *flags: str) -> dict:
    assert main(["simulate", "--preset", "mixtral-8x7b", "--num-layers", "4", "--hardware",
                 "h100-80gb", "--ep", "8", "--dp", "8", "--pp", "1", "--microbatches", "2",
                 "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_expert_per_gpu_in_a_node_is_priced_as_the_all_to_all(capsys) -> None:
    # Mixtral: 8 experts on 8 GPUs of one node; top-2 always hits 2 GPUs, so DeepEP sends
    # what the all-to-all sends.
    flex = simulate(capsys, "--moe-token-dispatcher-type", "flex")
    a2a = simulate(capsys, "--moe-token-dispatcher-type", "alltoall")
    assert flex["job"]["moe_token_dispatcher_type"] == "flex"
    assert a2a["job"]["moe_token_dispatcher_type"] == "alltoall"
    assert flex["iteration_time_ms"] == pytest.approx(a2a["iteration_time_ms"], rel=1e-12)


def test_across_nodes_a_token_crosses_once_a_node() -> None:
    # Two GPUs a node: a token's top-2 of 8 experts lie on 4 x (1 - 6/8 x 5/7) = 1.86
    # of the 4 nodes on average, so it crosses to 3 x 13/28 = 1.39 other nodes, where the
    # all-to-all sends 1.5 of its 2 copies off the node.
    from ppsim.job.collectives import spread
    from ppsim.sim.simulate import simulate as run

    def ms(dispatcher: str) -> float:
        cfg = config_from_dict({
            "model": {"preset": "mixtral-8x7b", "num_layers": 4, "ep": 8, "dp": 8},
            "pipeline": {"pp": 1, "microbatches": 2, "moe_token_dispatcher_type": dispatcher},
            "hardware": {"preset": "h100-80gb", "gpus_per_node": 2}})
        return run(build_problem(cfg), record=False).summary.iteration_time_ms

    assert spread(8, 2, 4) == pytest.approx(4 * (1 - (6 / 8) * (5 / 7)))
    assert ms("flex") < ms("alltoall")


def test_hybridep_is_priced_as_deepep_and_says_so(capsys) -> None:
    """Megatron's own DeepSeek-V3 example (examples/megatron_fsdp) and Bridge's GB200 and
    Nemotron 3 recipes run HybridEP; its traffic is DeepEP's (a token once to each node
    holding one of its experts, then NVLink), priced so, with a note."""
    deepep = simulate(capsys, "--moe-token-dispatcher-type", "flex")
    hybrid = simulate(capsys, "--moe-token-dispatcher-type", "flex",
                      "--moe-flex-dispatcher-backend", "hybridep", "--moe-hybridep-num-sms", "20")
    assert hybrid["iteration_time_ms"] == deepep["iteration_time_ms"]
    assert main(["simulate", "--preset", "mixtral-8x7b", "--moe-token-dispatcher-type", "flex",
                 "--moe-flex-dispatcher-backend", "hybridep"]) == 0
    assert "note: HybridEP priced as DeepEP" in capsys.readouterr().err


def test_other_flex_backends_are_refused_with_exit_status_2() -> None:
    run = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--preset",
                          "mixtral-8x7b", "--moe-token-dispatcher-type", "flex",
                          "--moe-flex-dispatcher-backend", "ncclep"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--moe-flex-dispatcher-backend: ncclep" in run.stderr


@pytest.mark.parametrize("dispatcher, more, words", [
    ("allgather", {}, "allgather: ppsim prices the all-to-all dispatch"),
    ("deepep", {}, "unknown dispatcher 'deepep'"),
    ("flex", {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}, "Flex token "
     "dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity"),
])
def test_a_config_names_a_dispatcher_ppsim_prices(dispatcher: str, more: dict,
                                                  words: str) -> None:
    with pytest.raises(UserError) as e:
        build_problem(config_from_dict({
            "model": {"preset": "mixtral-8x7b", "num_layers": 4, "ep": 8, "dp": 8, **more},
            "pipeline": {"pp": 1, "moe_token_dispatcher_type": dispatcher}}))
    assert e.value.field == "pipeline.moe_token_dispatcher_type" and words in e.value.problem


def test_the_plan_launches_the_dispatcher_it_priced(capsys) -> None:
    assert main(["plan", "--gpus", "16", "--global-batch-size", "64", "--preset",
                 "mixtral-8x7b", "--num-layers", "4", "--hardware", "h100-80gb",
                 "--moe-token-dispatcher-type", "flex", "--json"]) in (0, 3)
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["ep"] > 1 and "--moe-token-dispatcher-type flex" in best["megatron_job_flags"]


@pytest.mark.parametrize("flags, words", [
    (["--moe-enable-deepep"], "--moe-enable-deepep: DeepEP backend is only supported with "
     "flex token dispatcher."),
    (["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep",
      "--moe-flex-dispatcher-backend", "hybridep"], "--moe-enable-deepep: Only one backend "
     "is supported for flex token dispatcher."),
])
def test_megatrons_older_deepep_switch_is_checked_as_megatron_does(capsys, flags,
                                                                   words) -> None:
    assert main(["simulate", "--preset", "mixtral-8x7b", *flags]) == 2
    assert words in capsys.readouterr().err


def test_the_older_deepep_switch_with_flex_prices_deepep(capsys) -> None:
    with_switch = simulate(capsys, "--moe-token-dispatcher-type", "flex",
                           "--moe-enable-deepep")
    assert with_switch["job"]["moe_token_dispatcher_type"] == "flex"


def test_the_model_zoos_deepseek_v3_h100_line_prices_as_written(capsys) -> None:
    """Megatron-MoE-ModelZoo's DeepSeek-V3 H100 guide, its key arguments pasted whole:
    DeepEP, the combined 1F1B with delayed weight gradients, blockwise FP8, MTP."""
    line = ("simulate --preset deepseek-v3 --hardware h100-80gb --gpus 1024 "
            "--global-batch-size 8192 --tp 2 --pp 8 --ep 32 --moe-router-dtype fp32 "
            "--moe-permute-fusion --moe-grouped-gemm --moe-router-fusion "
            "--moe-token-dispatcher-type flex --moe-enable-deepep --recompute-granularity "
            "selective --recompute-modules mla_up_proj mlp --fp8-recipe blockwise "
            "--fp8-format e4m3 --fp8-param-gather --use-precision-aware-optimizer "
            "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --overlap-moe-expert-parallel-comm "
            "--delay-wgrad-compute --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 "
            "--pipeline-model-parallel-layout Et|(tt|)*30mL --moe-router-padding-for-fp8 "
            "--moe-router-force-load-balancing --use-distributed-optimizer --json")
    assert main(line.split()) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert (job["moe_token_dispatcher_type"], job["ep_overlap"], job["pp"]) == ("flex", True, 8)
    assert job["fp8"]["recipe"] == "blockwise"
