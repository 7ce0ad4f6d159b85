"""torchtitan's fields and DeepSpeed's config on every command that takes the config's
overrides: each gives what the ppsim flags they translate to give (split, costs,
schedule, profile, calibrate, demo, tui), and `ppsim run` runs them where the executor
runs what they say, else refuses naming the field."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import COMMANDS, _subparser, build_parser
from ppsim.cli.torchtitan_flags import subcommand_words
from ppsim.pipeline.problem import resolve_split
from tests.helpers import run_cli

LLAMA = ["--preset", "llama3-8b", "--hardware", "h100-80gb"]
TITAN_SHARDS = ["--fsdp", "--sequence-parallel"]
"""What any torchtitan line says: FSDP2 as torchtitan applies it, sequence parallelism on."""
DS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 1}}
DS_FLAGS = ["--micro-batch-size", "2", "--microbatches", "8", "--global-batch-size", "64",
            "--bf16", "--use-distributed-optimizer", "--grad-reduce-in-bf16",
            "--recompute", "none"]
"""DS as ppsim's flags (docs/model.md, DeepSpeed's config; no interval: no recompute)."""
GPT = ["--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--pp", "4", "--dp", "4"]


def _ds(tmp_path: Path, cfg: dict[str, Any] = DS) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _out(argv: list[str]) -> str:
    ran = run_cli(argv)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def _refused(argv: list[str]) -> str:
    """The one line a refusal prints (exit 2, no traceback)."""
    ran = run_cli(argv)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1, ran.stderr
    assert lines[0].startswith(f"ppsim {argv[0]}: error: "), lines
    return lines[0]


def _config(command: str, line: str) -> Any:
    words = subcommand_words([command, *shlex.split(line)])
    return config_from_args(build_parser(command).parse_args(words))


def test_every_command_with_the_overrides_takes_both() -> None:
    build_parser()  # registers the commands
    flags = {name: _subparser(build_parser(name), name)._option_string_actions  # noqa: SLF001
             for name in COMMANDS}
    taking = {name for name, options in flags.items() if "--config" in options}
    assert {"split", "simulate", "plan", "schedule", "costs", "tui", "run", "profile",
            "calibrate", "demo"} <= taking
    for name in taking:
        for flag in ("--torchtitan-config", "--parallelism.pipeline_parallel_degree",
                     "--deepspeed-config", "--activation-checkpoint-interval"):
            assert flag in flags[name], (name, flag)
        # PipelineModule's split, where the layers' split is given by --split (not
        # Megatron's data split of that name, which a launch line's commands take)
        layers = getattr(flags[name].get("--split"), "dest", None) == "split"
        assert ("--partition-method" in flags[name]) == layers, name


def test_split_reads_torchtitans_degree_and_split_rule() -> None:
    titan = json.loads(_out(["split", *LLAMA, "--parallelism.pipeline_parallel_degree", "4",
                             "--json"]))
    # torchtitan's own split of 32 layers over 4 stages: the embedding and the head each
    # counted as a layer (34 units: 9, 9, 8, 8), so 8, 9, 8, 7 decoder layers.
    ours = json.loads(_out(["split", *LLAMA, "--pp", "4", "--split", "8,9,8,7",
                            "--microbatches", "1", *TITAN_SHARDS, "--json"]))
    assert titan == ours
    assert [s["layers"] for s in titan["stages"]] == [8, 9, 8, 7]


def test_costs_reads_a_deepspeed_config_as_its_flags(tmp_path: Path) -> None:
    ds = _out(["costs", *GPT, "--deepspeed-config", _ds(tmp_path), "--json"])
    assert ds == _out(["costs", *GPT, *DS_FLAGS, "--json"])
    assert ds != _out(["costs", *GPT, "--json"])  # the mapping changes what is priced


def test_costs_reads_a_torchtitan_line_as_its_flags() -> None:
    titan = _out(["costs", "--torchtitan-config", "llama3_8b", "activation-checkpoint:full",
                  "--gpus", "8", "--json"])
    assert titan == _out(["costs", *LLAMA, "--gpus", "8", "--pp", "1", "--recompute", "full",
                          "--seq-length", "8192", "--micro-batch-size", "1",
                          "--microbatches", "1", *TITAN_SHARDS, "--loss.num_chunks", "8",
                          "--json"])


def test_schedule_reads_torchtitans_pipeline() -> None:
    titan = json.loads(_out(["schedule", "--preset", "tiny-gpt",
                             "--parallelism.pipeline_parallel_degree", "2",
                             "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
                             "--parallelism.num_pp_microbatches", "4", "--json"]))
    ours = json.loads(_out(["schedule", "--preset", "tiny-gpt", "--pp", "2", "--vpp", "2",
                            "--schedule", "interleaved-1f1b", "--microbatches", "4",
                            "--json"]))
    assert titan == ours and (titan["vpp"], titan["microbatches"]) == (2, 4)


def test_schedule_reads_deepspeeds_accumulation_steps(tmp_path: Path) -> None:
    ds = json.loads(_out(["schedule", *GPT, "--deepspeed-config", _ds(tmp_path), "--json"]))
    assert ds == json.loads(_out(["schedule", *GPT, *DS_FLAGS, "--json"]))
    assert ds["microbatches"] == 8


@pytest.mark.parametrize("command", ["profile", "calibrate", "demo"])
def test_the_other_commands_read_both_as_their_flags(command: str, tmp_path: Path) -> None:
    titan = ("--preset tiny-gpt --parallelism.pipeline_parallel_degree 2 "
             "--parallelism.data_parallel_shard_degree 2 activation-checkpoint:full")
    # torchtitan's split of 8 layers on 2 stages is the even one: these commands take no
    # --split to give it by
    _same_job(_config(command, titan), _config(
        command, "--preset tiny-gpt --pp 2 --dp 2 --microbatches 1 --recompute full --fsdp "
        "--sequence-parallel"))
    line = " ".join(GPT)
    assert _config(command, f"{line} --deepspeed-config {_ds(tmp_path)}") == _config(
        command, f"{line} {' '.join(DS_FLAGS)}")


def _same_job(a: Any, b: Any) -> None:
    """`a` and `b` are one job: the same config, their splits the same counts."""
    assert resolve_split(a).counts == resolve_split(b).counts == (4, 4)
    assert replace(a, pipeline=replace(a.pipeline, split=None)) == b


def _spec(argv: list[str], tmp_path: Path, name: str) -> dict[str, Any]:
    """The run spec `ppsim run ARGV --print-launch` prints (it starts nothing)."""
    out = _out(["run", *argv, "--print-launch", "--trace-dir", str(tmp_path / name)])
    body = re.search(r"<<'PPSIM_RUN_SPEC'\n(.*?)\nPPSIM_RUN_SPEC", out, re.S)
    assert body is not None, out
    spec = json.loads(body.group(1))
    spec.pop("trace_dir")
    return spec


def test_run_launches_a_torchtitan_line_as_fsdp_with_pipeline(tmp_path: Path) -> None:
    line = ["--preset", "tiny-gpt", "--parallelism.pipeline_parallel_degree", "2",
            "--parallelism.data_parallel_shard_degree", "2",
            "--parallelism.num_pp_microbatches", "4"]
    titan = _spec([*line, "activation-checkpoint:none"], tmp_path, "a")
    ours = _spec(["--preset", "tiny-gpt", "--pp", "2", "--dp", "2", "--fsdp",
                  "--sequence-parallel", "--split", "4,4", "--microbatches", "4",
                  "--recompute", "none"], tmp_path, "b")
    assert titan == ours
    assert titan["dp"] == 2 and titan["config"]["model"]["fsdp"] is True
    # Without the subcommand the line runs torchtitan's default SelectiveAC, which the
    # executor does not build: refused, saying the subcommand that runs.
    said = _refused(["run", *line, "--print-launch", "--trace-dir", str(tmp_path / "c")])
    assert "error: model.recompute: op-sac" in said and "activation-checkpoint:none" in said


@pytest.mark.parametrize(("line", "field"), [
    # FSDP2 at pp 1: the executor runs FSDP under a pipeline only.
    ("--parallelism.tensor_parallel_degree 1", "--parallelism.pipeline_parallel_degree"),
    ("--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree -1",
     "--parallelism.data_parallel_shard_degree"),
    ("--torchtitan-config qwen3_30b_a3b", "--parallelism.data_parallel_shard_degree"),
    ("--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 "
     "--parallelism.data_parallel_replicate_degree 2",
     "--parallelism.data_parallel_replicate_degree"),
    ("--parallelism.pipeline_parallel_degree 2 --training.max_context_length 256 "
     "--training.num_tokens_per_train_step 2048", "--training.num_tokens_per_train_step"),
])
def test_run_refuses_what_the_executor_does_not_run(line: str, field: str,
                                                    tmp_path: Path) -> None:
    said = _refused(["run", *(["--preset", "tiny-gpt"] if "torchtitan-config" not in line
                              else []), *shlex.split(line), "--print-launch",
                     "--trace-dir", str(tmp_path / "t")])
    assert said.startswith(f"ppsim run: error: {field}: "), said


def test_demo_refuses_fsdp_without_a_pipeline_before_profiling(tmp_path: Path) -> None:
    said = _refused(["demo", "--preset", "tiny-gpt", "--parallelism.tensor_parallel_degree",
                     "1", "--out", str(tmp_path / "demo")])
    assert "--parallelism.pipeline_parallel_degree: 1: " in said
    assert not (tmp_path / "demo").exists()  # refused before anything was written


def test_run_solves_deepspeeds_batch_at_the_replicas_it_launches(tmp_path: Path) -> None:
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
          "zero_optimization": {"stage": 1}}
    got = _spec(["--preset", "tiny-gpt", "--dp", "2", "--deepspeed-config",
                 _ds(tmp_path, ds)], tmp_path, "a")
    ours = _spec(["--preset", "tiny-gpt", "--dp", "2", "--micro-batch-size", "2",
                  "--microbatches", "4", "--use-distributed-optimizer"], tmp_path, "b")
    assert got == ours  # 16 = 2 a microbatch x 4 steps x 2 replicas
    said = _refused(["run", "--preset", "tiny-gpt", "--dp", "3", "--deepspeed-config",
                     _ds(tmp_path, ds), "--print-launch", "--trace-dir", str(tmp_path / "c")])
    assert "train_batch_size" in said


def test_tui_opens_on_a_torchtitan_line_as_its_flags() -> None:
    from ppsim.cli.tui import opening_config
    from ppsim.tui.session import state_from_config

    def opened(line: str) -> Any:
        words = subcommand_words(["tui", *shlex.split(line)])
        return opening_config(build_parser("tui").parse_args(words))[0]

    titan = opened("--torchtitan-config llama3_8b activation-checkpoint:full --gpus 8")
    ours = opened("--preset llama3-8b --gpus 8 --pp 1 --recompute full --seq-length 8192 "
                  "--micro-batch-size 1 --microbatches 1 --fsdp --sequence-parallel "
                  "--loss.num_chunks 8")
    assert titan == ours
    state = state_from_config(titan)
    assert (state.model_preset, state.recompute, state.pp) == ("llama3-8b", "full", 1)
    assert (titan.model.arch.dp, titan.model.arch.fsdp) == (8, True)


@settings(max_examples=20, deadline=None)
@given(command=st.sampled_from(["split", "plan", "schedule", "costs", "tui", "profile",
                                "calibrate", "demo"]),
       pp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]),
       shard=st.integers(1, 4), mbs=st.integers(1, 8))
def test_each_command_reads_a_torchtitan_line_as_simulate_does(command: str, pp: int, tp: int,
                                                              shard: int, mbs: int) -> None:
    line = (f"--preset tiny-gpt --parallelism.pipeline_parallel_degree {pp} "
            f"--parallelism.tensor_parallel_degree {tp} "
            f"--parallelism.data_parallel_shard_degree {shard} "
            f"--parallelism.num_pp_microbatches {mbs} activation-checkpoint:full")
    assert _config(command, line) == _config("simulate", line)
