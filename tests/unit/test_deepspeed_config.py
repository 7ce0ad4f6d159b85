"""--deepspeed-config: a DeepSpeed job's ds_config.json priced as ppsim's own flags, its
batch by DeepSpeed's rule, and what ppsim does not price refused by key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.deepspeed_batch import BatchTriple, deepspeed_batch
from ppsim.errors import UserError
from tests.helpers import run_cli

JOB = ["--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--pp", "4", "--dp", "4"]
BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
         "gradient_accumulation_steps": 8}
BATCH_FLAGS = ["--micro-batch-size", "2", "--global-batch-size", "64"]


def _pipeline_module(flags: list[str]) -> list[str]:
    """`flags` with PipelineModule's default recompute, none (activation_checkpoint_interval
    0), where they say none: the preset's own mode is not what DeepSpeed runs."""
    return flags if "--recompute" in flags else [*flags, "--recompute", "none"]


def _ds(tmp_path: Path, cfg: dict[str, Any], name: str = "ds.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _sim(argv: list[str]) -> dict[str, Any]:
    ran = run_cli(["simulate", *argv, "--json"])
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def _refused(tmp_path: Path, cfg: dict[str, Any], *extra: str) -> str:
    ran = run_cli(["simulate", *JOB, "--deepspeed-config", _ds(tmp_path, cfg), *extra])
    assert ran.returncode == 2, ran.stdout
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppsim simulate: error: "), ran.stderr
    return lines[0]


@pytest.mark.parametrize(("ds", "flags"), [
    # ZeRO-1 under bf16: the optimizer's state sharded, the gradients kept in bf16.
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
     ["--bf16", "--use-distributed-optimizer", "--grad-reduce-in-bf16"]),
    # bf16 at stage 0 under a pipeline: BF16_Optimizer, fp32 gradients, sharded state.
    ({"bf16": {"enabled": True}}, ["--bf16", "--use-distributed-optimizer"]),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}},
     ["--bf16", "--use-distributed-optimizer", "--grad-reduce-in-bf16"]),
    ({"fp16": {"enabled": True, "loss_scale_window": 500}}, ["--fp16"]),
    ({"fp16": {"enabled": True}, "zero_optimization": {"stage": 1}},
     ["--fp16", "--use-distributed-optimizer"]),
    ({"bf16": {"enabled": True}, "pipeline": {"activation_checkpoint_interval": 1}},
     ["--bf16", "--use-distributed-optimizer", "--recompute", "full"]),
])
def test_each_mapping_prices_as_its_flags(tmp_path: Path, ds: dict[str, Any],
                                          flags: list[str]) -> None:
    got = _sim([*JOB, "--deepspeed-config", _ds(tmp_path, {**BATCH, **ds})])
    want = _sim(_pipeline_module([*JOB, *flags, *BATCH_FLAGS]))
    assert got == want
    assert got["microbatches"] == 8


def test_fp32_when_neither_precision_is_enabled(tmp_path: Path) -> None:
    cfg = tmp_path / "fp32.toml"
    cfg.write_text('[model]\npreset = "gpt3-1.3b"\ndtype = "fp32"\n')
    got = _sim([*JOB, "--deepspeed-config", _ds(tmp_path, BATCH)])
    want = _sim(_pipeline_module(["--config", str(cfg), *JOB[2:], *BATCH_FLAGS]))
    bf16 = _sim(_pipeline_module([*JOB, "--bf16", *BATCH_FLAGS]))
    assert got == want
    assert got["iteration_time_ms"] != bf16["iteration_time_ms"]


def test_interval_flag_is_the_pipeline_modules(tmp_path: Path) -> None:
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}})
    got = _sim([*JOB, "--deepspeed-config", ds, "--activation-checkpoint-interval", "1"])
    assert got == _sim([*JOB, "--deepspeed-config", ds, "--recompute", "full"])
    none = _sim([*JOB, "--deepspeed-config", ds, "--activation-checkpoint-interval", "0"])
    assert none == _sim([*JOB, "--deepspeed-config", ds, "--recompute", "none"])
    assert none["iteration_time_ms"] < got["iteration_time_ms"]


@pytest.mark.parametrize(("given", "flags"), [
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2},
     ["--micro-batch-size", "2", "--microbatches", "8"]),
    ({"train_batch_size": 64, "gradient_accumulation_steps": 8},
     ["--micro-batch-size", "2", "--microbatches", "8"]),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8},
     ["--micro-batch-size", "2", "--microbatches", "8"]),
    ({"train_micro_batch_size_per_gpu": 2}, ["--micro-batch-size", "2", "--microbatches", "1"]),
    ({"train_batch_size": 32}, ["--micro-batch-size", "8", "--microbatches", "1"]),
])
def test_missing_batch_number_derived_as_deepspeed_does(tmp_path: Path, given: dict[str, int],
                                                        flags: list[str]) -> None:
    ds = {**given, "fp16": {"enabled": True}}
    assert _sim([*JOB, "--deepspeed-config", _ds(tmp_path, ds)]) == \
        _sim(_pipeline_module([*JOB, "--fp16", *flags]))


def test_a_flag_fills_a_key_the_config_leaves_out(tmp_path: Path) -> None:
    ds = _ds(tmp_path, {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}})
    got = _sim([*JOB, "--deepspeed-config", ds, "--global-batch-size", "64"])
    assert got == _sim(_pipeline_module([*JOB, "--fp16", *BATCH_FLAGS]))


@pytest.mark.parametrize(("batch", "words"), [
    ({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 8},
     "deepspeed_config.train_batch_size: Check batch related parameters. train_batch_size "
     "is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 60 != 2 * 8 * 4"),
    ({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2},
     "deepspeed_config.gradient_accumulation_steps: Gradient accumulation steps: 0 has to "
     "be greater than 0"),
    ({"train_batch_size": 0}, "Train batch size: 0 has to be greater than 0"),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": -1,
      "gradient_accumulation_steps": 2},
     "Micro batch size per gpu: -1 has to be greater than 0"),
    ({"gradient_accumulation_steps": 8}, "Either train_batch_size or "
     "train_micro_batch_size_per_gpu needs to be provided"),
    ({}, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"),
])
def test_batch_refused_in_deepspeeds_words(tmp_path: Path, batch: dict[str, int],
                                           words: str) -> None:
    line = _refused(tmp_path, batch)
    assert words in line and "(DeepSpeed's words" in line


@pytest.mark.parametrize(("cfg", "extra", "field"), [
    ({**BATCH, "zero_optimization": {"stage": 2}}, [],
     "deepspeed_config.zero_optimization.stage: ZeRO-2 and ZeRO-3 are incompatible with "
     "pipeline parallelism (DeepSpeed's words)"),
    ({**BATCH, "zero_optimization": {"stage": 3}}, ["--pp", "1"],
     "deepspeed_config.zero_optimization.stage: 3: ppsim does not price"),
    ({**BATCH, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
     [], "deepspeed_config.zero_optimization.offload_optimizer: device 'cpu'"),
    ({**BATCH, "zero_optimization": {"offload_param": {"device": "nvme"}}}, [],
     "deepspeed_config.zero_optimization.offload_param: device 'nvme'"),
    ({**BATCH, "zero_optimization": {"stage3_prefetch_bucket_size": 1, "zenflow": {}}}, [],
     "deepspeed_config.zero_optimization.zenflow: ppsim does not know"),
    # A real ZeRO-3 config is refused by its stage, not key by key through its tunings.
    ({**BATCH, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                     "offload_optimizer": {"device": "cpu"},
                                     "stage3_max_live_parameters": 10**9, "zenflow": {}}},
     ["--pp", "1"], "deepspeed_config.zero_optimization.stage: 3: ppsim does not price"),
    ({**BATCH, "communication_data_type": "fp32"}, [],
     "deepspeed_config.communication_data_type: 'fp32'"),
    ({**BATCH, "activation_checkpointing": {"partition_activations": True}}, [],
     "deepspeed_config.activation_checkpointing.partition_activations: moves"),
    ({**BATCH, "activation_checkpointing": {"cpu_checkpointing": True}}, [],
     "deepspeed_config.activation_checkpointing.cpu_checkpointing: moves"),
    ({**BATCH, "compression_training": {}}, [],
     "deepspeed_config.compression_training: ppsim does not know it"),
    ({**BATCH, "optimizer": {"type": "Lamb"}}, [],
     "deepspeed_config.optimizer.type: 'Lamb': ppsim prices Adam"),
    ({**BATCH, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, [],
     "bf16 and fp16 modes cannot be simultaneously enabled (DeepSpeed's words)"),
    ({**BATCH, "pipeline": {"activation_checkpoint_interval": 2}}, [],
     "deepspeed_config.pipeline.activation_checkpoint_interval: 2: ppsim prices interval 1"),
    (BATCH, ["--activation-checkpoint-interval", "3"],
     "--activation-checkpoint-interval: 3: ppsim prices interval 1"),
    ({**BATCH, "pipeline": {"activation_checkpoint_interval": 1}},
     ["--activation-checkpoint-interval", "0"], "--activation-checkpoint-interval: 0 "
     "disagrees with deepspeed_config.pipeline.activation_checkpoint_interval 1"),
    (BATCH, ["--micro-batch-size", "4"], "deepspeed_config.train_micro_batch_size_per_gpu: "
     "2 disagrees with --micro-batch-size 4"),
    (BATCH, ["--fp16"], "deepspeed_config.bf16: trains in fp32, the command line says --fp16"),
    ({**BATCH, "bf16": {"enabled": True}}, ["--recompute", "full"], None),
    ({**BATCH, "pipeline": {"activation_checkpoint_interval": 1}}, ["--recompute", "none"],
     "--activation-checkpoint-interval 1: gives --recompute full, the command line "
     "--recompute none"),
])
def test_refused_by_key(tmp_path: Path, cfg: dict[str, Any], extra: list[str],
                        field: str | None) -> None:
    if field is None:  # taken: the command line's own recompute over the config's batch
        assert _sim([*JOB, "--deepspeed-config", _ds(tmp_path, cfg), *extra])
        return
    assert field in _refused(tmp_path, cfg, *extra)


@pytest.mark.parametrize(("text", "field"), [
    ("{not json", "--deepspeed-config: "),
    ("[1, 2]", "--deepspeed-config: "),
    ('{"train_batch_size": "64"}', "deepspeed_config.train_batch_size: expected an integer"),
    ('{"train_batch_size": "auto"}', "deepspeed_config.train_batch_size: is \"auto\""),
    ('{"train_batch_size": true}', "deepspeed_config.train_batch_size: expected an integer"),
    ('{"train_batch_size": 64, "bf16": true}', "deepspeed_config.bf16: must be a JSON object"),
    ('{"train_batch_size": 64, "bf16": {"enabled": "yes"}}',
     "deepspeed_config.bf16.enabled: must be true or false"),
    ('{"train_batch_size": 64, "zero_optimization": {"stage": "1"}}',
     "deepspeed_config.zero_optimization.stage: must be 0, 1, 2 or 3"),
    ('{"train_batch_size": 64, "zero_optimization": []}',
     "deepspeed_config.zero_optimization: must be a JSON object"),
    ('{"train_micro_batch_size_per_gpu": 100000000}',
     "deepspeed_config.train_micro_batch_size_per_gpu: 100,000,000 is above ppsim's limit "
     "of 10,000,000"),
    ('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 100000000}',
     "deepspeed_config.gradient_accumulation_steps: 100,000,000 is above ppsim's limit of "
     "1,000,000"),
    ('{"train_batch_size": 1000000000}',  # the micro batch it gives at dp 4
     "deepspeed_config.train_micro_batch_size_per_gpu: 250,000,000 is above ppsim's limit "
     "of 10,000,000 (at dp 4)"),
    ('{"train_batch_size": 64, "data_types": {"grad_accum_dtype": []}}',
     "deepspeed_config.data_types.grad_accum_dtype: [] is not a dtype"),
    ('{"train_batch_size": 64, "data_types": {"grad_accum_dtype": {"a": 1}}}',
     "deepspeed_config.data_types.grad_accum_dtype: {'a': 1} is not a dtype"),
])
def test_bad_json_and_types_name_the_key(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(text)
    ran = run_cli(["simulate", *JOB, "--deepspeed-config", str(path)])
    assert ran.returncode == 2 and f"ppsim simulate: error: {field}" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_taken_keys_change_nothing_and_tunings_are_noted(tmp_path: Path) -> None:
    plain = {**BATCH, "bf16": {"enabled": True}}
    busy = {**plain, "steps_per_print": 10, "wall_clock_breakdown": False,
            "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
            "scheduler": {"type": "WarmupLR"}, "zero_optimization": {
                "stage": 0, "reduce_bucket_size": 5e8, "overlap_comm": True,
                # read at stage 3 alone: a template's leftovers
                "stage3_param_persistence_threshold": 10**6, "sub_group_size": 10**9}}
    ran = run_cli(["simulate", *JOB, "--deepspeed-config", _ds(tmp_path, busy), "--json"])
    assert ran.returncode == 0, ran.stderr
    plain_path = _ds(tmp_path, plain, "plain.json")
    assert json.loads(ran.stdout) == _sim([*JOB, "--deepspeed-config", plain_path])
    assert "note: deepspeed_config.zero_optimization.reduce_bucket_size taken, not priced" \
        in ran.stderr


@pytest.mark.parametrize("command", ["simulate", "split"])
@pytest.mark.parametrize(("pp", "method"), [("0", "parameters"), ("-1", "uniform")])
def test_partition_method_over_a_pipeline_size_below_1_is_refused(command: str, pp: str,
                                                                   method: str) -> None:
    """DeepSpeed's partition of the layers over no stages: refused by pp (IndexError)."""
    ran = run_cli([command, "--preset", "gpt3-1.3b", "--pp", pp, "--partition-method", method])
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr == (f"ppsim {command}: error: pipeline.pp: must be a positive integer, "
                          f"got {pp} (set it to 1 or more)\n")


def test_partition_method_is_plans_deepspeed_row(tmp_path: Path) -> None:
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}})
    ran = run_cli(["plan", *JOB, "--deepspeed-config", ds, "--json", "--time-budget", "5"])
    assert ran.returncode == 0, ran.stderr
    row = json.loads(ran.stdout)["deepspeed"]
    sim = _sim([*JOB, "--deepspeed-config", ds, "--partition-method", "parameters"])
    assert sim["split"] == row["split"] and sim["split"] != [6, 6, 6, 6]
    assert sim["iteration_time_ms"] == pytest.approx(row["iteration_time_ms"], rel=1e-12)
    ran = run_cli(["simulate", *JOB, "--deepspeed-config", ds, "--partition-method",
                   "uniform", "--split", "6,6,6,6"])
    assert ran.returncode == 2
    assert "--partition-method: and --split both give the split" in ran.stderr


def test_the_config_is_never_overwritten(tmp_path: Path) -> None:
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}})
    before = Path(ds).read_bytes()
    ran = run_cli(["simulate", *JOB, "--deepspeed-config", ds, "--trace", ds])
    assert ran.returncode == 2 and "--deepspeed-config" in ran.stderr
    assert Path(ds).read_bytes() == before


@settings(max_examples=300, deadline=None)
@given(micro=st.integers(1, 16), gas=st.integers(1, 64), dp=st.integers(1, 64),
       keep=st.sets(st.sampled_from(("train", "micro", "gas")), min_size=1))
def test_consistent_triples_come_back(micro: int, gas: int, dp: int, keep: set[str]) -> None:
    """Any consistent triple, with keys left out, is what DeepSpeed derives: each given
    number kept, the three obeying its rule; from two or more of them, the triple itself."""
    train = micro * gas * dp
    given_ = BatchTriple(train if "train" in keep else None, micro if "micro" in keep else None,
                         gas if "gas" in keep else None)
    if keep == {"gas"}:
        with pytest.raises(UserError, match="Either train_batch_size"):
            deepspeed_batch(given_, dp)
        return
    b = deepspeed_batch(given_, dp)
    assert b.train_batch_size == b.micro_batch * b.grad_accum_steps * dp
    for name, ours in (("train", b.train_batch_size), ("micro", b.micro_batch),
                       ("gas", b.grad_accum_steps)):
        if name in keep:
            assert ours == {"train": train, "micro": micro, "gas": gas}[name]
    if len(keep) >= 2:
        assert (b.train_batch_size, b.micro_batch, b.grad_accum_steps) == (train, micro, gas)
    with pytest.raises(UserError, match="DeepSpeed's words"):
        deepspeed_batch(BatchTriple(train + dp * micro * gas + 1, micro, gas), dp)


def test_the_whole_triple_with_gpus_is_checked_at_the_shapes_dp(tmp_path: Path) -> None:
    """--gpus 16 at pp 4 is dp 4 (tp 1): the triple of JOB prices as --dp 4 does, and
    at --gpus 32 (dp 8) DeepSpeed's rule refuses it (64 != 2 x 8 x 8)."""
    path = _ds(tmp_path, BATCH)
    by_gpus = [*JOB[:-2], "--gpus", "16", "--deepspeed-config", path]
    assert _sim(by_gpus) == _sim([*JOB, "--deepspeed-config", path])
    ran = run_cli(["simulate", *JOB[:-2], "--gpus", "32", "--deepspeed-config", path])
    assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1
    assert "64 != 2 * 8 * 8 (DeepSpeed's words" in ran.stderr


def test_no_interval_recomputes_nothing_as_pipeline_module(tmp_path: Path) -> None:
    """PipelineModule's activation_checkpoint_interval defaults to 0: a DeepSpeed job that
    asks for no checkpointing recomputes nothing, whatever the preset's own mode
    (gpt3-1.3b's selective); a Megatron-DeepSpeed line's own recompute flag still rules."""
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}})
    got = _sim([*JOB, "--deepspeed-config", ds])
    assert got == _sim([*JOB, "--deepspeed-config", ds, "--activation-checkpoint-interval",
                        "0"])
    assert got != _sim([*JOB, "--deepspeed-config", ds, "--recompute", "selective"])
    assert _sim([*JOB, "--deepspeed-config", ds, "--recompute-granularity", "selective"]) \
        == _sim([*JOB, "--deepspeed-config", ds, "--recompute", "selective"])


def test_plan_searches_the_shapes_a_whole_triple_leaves(tmp_path: Path) -> None:
    """`plan --gpus` over a DeepSpeed config with all three batch numbers: they fix dp
    (64 / (2 x 8) = 4), and the search keeps to what DeepSpeed's pipeline engine runs
    (one stage a rank, 1F1B, no context parallelism), so the best prints as a config."""
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
    ran = run_cli(["plan", "--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--gpus", "16",
                   "--deepspeed-config", ds, "--time-budget", "2", "--json"])
    assert ran.returncode == 0, ran.stderr
    plan = json.loads(ran.stdout)
    assert {k: plan["held"].get(k) for k in ("dp", "cp", "vpp")} == {"dp": 4, "cp": 1, "vpp": 1}
    best = plan["best"]
    assert (best["dp"], best["microbatches"], best["schedule"]) == (4, 8, "1f1b")
    assert best["deepspeed_job"]["config"]["gradient_accumulation_steps"] == 8


def test_plan_keeps_to_the_engine_without_the_accumulation_steps(tmp_path: Path) -> None:
    """A config that leaves gradient_accumulation_steps to DeepSpeed still runs on its
    pipeline engine: the search holds one stage a rank, 1F1B and cp 1, and the best
    prints as a config (not n/a for an interleaved shape)."""
    ds = _ds(tmp_path, {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1})
    ran = run_cli(["plan", "--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--gpus", "16",
                   "--deepspeed-config", ds, "--time-budget", "2", "--json"])
    assert ran.returncode == 0, ran.stderr
    plan = json.loads(ran.stdout)
    assert {k: plan["held"].get(k) for k in ("cp", "vpp")} == {"cp": 1, "vpp": 1}
    best = plan["best"]
    assert (best["vpp"], best["schedule"]) == (1, "1f1b")
    config = best["deepspeed_job"]["config"]
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] == best["micro_batch_size"]


def test_split_names_pipeline_modules_own_method(tmp_path: Path) -> None:
    """`split --partition-method` is PipelineModule's own partition: the DeepSpeed line
    names the method (no _partition_layers override to paste), with its boundaries."""
    ds = _ds(tmp_path, {**BATCH, "bf16": {"enabled": True}})
    argv = ["split", *JOB, "--deepspeed-config", ds, "--partition-method", "parameters"]
    doc = json.loads(run_cli([*argv, "--json"]).stdout)
    assert doc["deepspeed_partition_method"] == "parameters"
    text = " ".join(run_cli(argv).stdout.split())
    assert ("DeepSpeed: PipelineModule(num_stages=4, partition_method='parameters') "
            f"(boundaries {doc['deepspeed_boundaries']}") in text
    assert "_partition_layers" not in text
