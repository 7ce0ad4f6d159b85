"""FSDP as torchtitan applies it: memory per parameter, when the collectives run, and what
of them a step waits for, against closed forms restated here from torch's and
torchtitan's code (torch/distributed/fsdp/_fully_shard, torch/distributed/pipelining/
stage.py, torchtitan/distributed/fsdp.py) and the h100-80gb preset's datasheet links
(NVLink 450 GB/s each way, 1 us a step; a 400 Gb/s NIC per GPU, 5 us a step; 8 GPUs a
node)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fsdp_forms import EMBEDDING, LAYER, NCCL_SHARE, NIC, NIC_STEP, NV, NV_STEP, cfg, ring
from helpers import run_cli

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.fsdp import fsdp_steps
from ppsim.job.model import build_job
from ppsim.job.shapes import Shape, sharding_choices
from ppsim.pipeline.problem import model_costs


def test_memory_per_parameter() -> None:
    # Shards: fp32 weight, fp32 gradient, Adam's two fp32 moments, over dp x cp.
    alone = model_costs(cfg({"dp": 64, "fsdp": True})).layers[0]
    assert alone.static_bytes == LAYER * 16 // 64
    # pp > 1: the gathered bf16 weights and the accumulated fp32 gradient stay all step.
    piped = model_costs(cfg({"dp": 64, "fsdp": True}, {"pp": 2})).layers[0]
    assert piped.static_bytes == LAYER * 16 // 64 + LAYER * (2 + 4)
    # pp = 1 keeping the weights to the backward ("never"): the gathered weights.
    kept = model_costs(cfg({"dp": 64, "fsdp": True, "fsdp_reshard_after_forward": "never"}))
    assert kept.layers[0].static_bytes == LAYER * 16 // 64 + LAYER * 2
    # context-parallel ranks shard too (torchtitan's dp_shard x cp mesh).
    cp = model_costs(cfg({"dp": 32, "cp": 2, "fsdp": True})).layers[0]
    assert cp.static_bytes == LAYER * 16 // 64
    # One rank: nothing to gather, all 16 bytes a parameter.
    one = model_costs(cfg({"fsdp": True}))
    assert one.layers[0].static_bytes == LAYER * 16
    assert one.embedding.static_bytes == EMBEDDING * 16


def test_a_bf16_reduce_keeps_the_shards_gradient_in_fp32() -> None:
    """torchtitan's mixed_precision_reduce bf16 (--grad-reduce-in-bf16 here) halves the
    reduce-scatter, but FSDP2 casts the reduced gradient back to the fp32 shard's dtype
    (torch's _fsdp_collectives.py): the shard is 16 bytes a parameter either way, and with
    pp the gradient accumulated unsharded is bf16. ppsim counted a 2-byte shard gradient."""
    bf16 = model_costs(cfg({"dp": 64, "fsdp": True, "grad_reduce_in_bf16": True})).layers[0]
    assert bf16.static_bytes == LAYER * 16 // 64
    piped = model_costs(cfg({"dp": 64, "fsdp": True, "grad_reduce_in_bf16": True},
                            {"pp": 2})).layers[0]
    assert piped.static_bytes == LAYER * 16 // 64 + LAYER * (2 + 2)


def test_units_in_flight_without_pp() -> None:
    """Resharding after the forward: two units' bf16 weights (the computing and the
    prefetched one) and one unit's fp32 gradient, the largest unit's (the head: the
    vocabulary projection and the final norm), held once."""
    got = model_costs(cfg({"dp": 64, "fsdp": True}))
    head = EMBEDDING + 4096
    assert got.embedding.static_bytes == EMBEDDING * 16 // 64 + head * (2 * 2 + 4)


@pytest.mark.parametrize(("policy", "pipelined", "expected"), [
    # torchtitan's loop syncs every microbatch and reshards after the forward by default.
    ("default", False, (True, True, True)),
    ("never", False, (True, False, True)),
    # torch's pipelining accumulates unsynced; the default keeps the weights.
    ("default", True, (False, False, False)),
    ("never", True, (False, False, False)),
    ("always", True, (True, True, False)),
])
def test_when_the_collectives_run(policy: str, pipelined: bool,
                                  expected: tuple[bool, bool, bool]) -> None:
    s = fsdp_steps(policy, pipelined)
    assert (s.forward_gather, s.backward_gather, s.backward_reduce) == expected


def test_each_microbatch_waits_for_what_its_compute_does_not_hide() -> None:
    c = cfg({"dp": 16, "fsdp": True, "seq_length": 1024})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    bw = min(NV, 8 * NIC)  # 16 ranks on 2 nodes: 8 NICs a node carry the ring
    gather = ring(16, LAYER * 2, bw, NIC_STEP)
    reduce = ring(16, LAYER * 4, bw, NIC_STEP)
    f, b = alone.layers[0].forward_ms, alone.layers[0].backward_ms
    assert gather > f  # this short sequence cannot hide its gather
    got = model_costs(c)
    # What the compute hides still holds 16 of its 132 SMs.
    assert got.layers[0].forward_ms == pytest.approx(f + gather - f + NCCL_SHARE * f)
    both = gather + reduce
    assert got.layers[0].backward_ms == pytest.approx(
        b + max(0.0, both - b) + NCCL_SHARE * min(both, b))
    # The embedding computes nothing to hide its unit's gather behind.
    emb_gather = ring(16, EMBEDDING * 2, bw, NIC_STEP)
    assert got.embedding.forward_ms == pytest.approx(alone.embedding.forward_ms + emb_gather)
    # The step's tail only steps the optimizer: every gradient was reduced in the loop.
    job = build_job(c)
    assert job is not None
    assert job.tail(LAYER, f, b, 0.0).reduce_ms == 0.0


def test_pipelined_step_reduces_once_exposed() -> None:
    c = cfg({"dp": 16, "fsdp": True}, {"pp": 2})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    got = model_costs(c)
    # No collective inside a microbatch: the pieces keep their compute alone.
    assert got.layers[0].forward_ms == alone.layers[0].forward_ms
    assert got.layers[0].backward_ms == alone.layers[0].backward_ms
    job = build_job(c)
    assert job is not None
    bw = min(NV, 8 * NIC)
    params, forward = 2 * LAYER, 3.0
    whole_gather = ring(16, params * 2, bw, NIC_STEP)
    first = ring(16, LAYER * 2, bw, NIC_STEP)
    waited = max(first, whole_gather - forward)
    expected = waited + NCCL_SHARE * (whole_gather - waited) + ring(16, params * 4, bw, NIC_STEP)
    assert job.tail(params, forward, 9.0, 0.0).reduce_ms == pytest.approx(expected)
    # The first stage gathers the embedding first, and nothing hides that unit.
    total = params + EMBEDDING
    first_emb = ring(16, EMBEDDING * 2, bw, NIC_STEP)
    whole_gather = ring(16, total * 2, bw, NIC_STEP)
    waited = max(first_emb, whole_gather - 1e6)
    expected = waited + NCCL_SHARE * (whole_gather - waited) + ring(16, total * 4, bw, NIC_STEP)
    assert job.tail(total, 1e6, 9.0, 0.0, holds_embedding=True).reduce_ms \
        == pytest.approx(expected)


def test_optimizer_steps_its_shard() -> None:
    c = cfg({"dp": 16, "fsdp": True}, {"pp": 2})
    job = build_job(c)
    assert job is not None
    step = job.tail(LAYER, 1.0, 1.0, 3350.0).optimizer_ms
    # AdamW reads weight, gradient, two moments and writes three: 28 bytes a parameter.
    assert step == pytest.approx(LAYER / 16 * 28 / 3350e6)


@pytest.mark.parametrize(("flags", "field"), [
    (["--fsdp", "--use-distributed-optimizer"], "model.fsdp"),
    (["--fsdp-reshard-after-forward", "never"], "model.fsdp_reshard_after_forward"),
    (["--fsdp", "--overlap-grad-reduce"], "pipeline.overlap_grad_reduce"),
    (["--fsdp", "--ddp-bucket-size", "1000000"], "pipeline.ddp_bucket_size"),
])
def test_contradictions_are_refused(flags: list[str], field: str) -> None:
    r = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
                 "--dp", "8", *flags])
    assert r.returncode == 2
    assert field in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_simulate_and_plan_say_fsdp() -> None:
    r = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
                 "--gpus", "64", "--global-batch-size", "256", "--fsdp"])
    assert r.returncode == 0, r.stderr
    assert "dp 64 FSDP" in r.stdout
    r = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
                 "--gpus", "64", "--global-batch-size", "256", "--fsdp", "--json"])
    assert json.loads(r.stdout)["job"]["data_parallel"] == "fsdp"
    r = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "256", "--fsdp", "--recompute", "full", "--pp", "2",
                 "--tp", "1", "--cp", "1", "--micro-batch-size", "1", "--vpp", "1",
                 "--json"])
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["megatron_job_flags"] is None  # Megatron's FSDP is not what ppsim prices
    titan = best["torchtitan_job"]
    assert titan["parallelism"]["data_parallel_shard_degree"] == 32
    assert titan["parallelism"]["pipeline_parallel_degree"] == 2
    assert titan["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    # ParallelismConfig's field (torchtitan/config/configs.py), not TrainingConfig's.
    assert titan["parallelism"]["num_pp_microbatches"] == 8
    assert titan["training"] == {"num_tokens_per_microbatch_per_dp_rank": 8192,
                                 "num_tokens_per_train_step": 256 * 8192,
                                 "max_context_length": 8192}
    assert titan["activation_checkpointing"] == "FullAC"
    parts = titan["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert titan["notes"] == []


def test_copies_of_the_sharded_state() -> None:
    """Megatron's --num-distributed-optimizer-instances: each copy shards over dp x cp /
    copies ranks, a contiguous block of the data-parallel group (its intra-instance
    group), and all-reduces each shard across the copies (the inter-instance group)."""
    c = cfg({"dp": 16, "distributed_optimizer": True, "dp_replicas": 2})
    # bf16 weight and fp32 gradient whole, master weight and moments over 8 ranks.
    assert model_costs(c).layers[0].static_bytes == LAYER * (2 + 4) + LAYER * 12 // 8
    job = build_job(c)
    assert job is not None
    # Ranks 0-7 share a node: the reduce-scatter and the gather stay on NVLink; ranks 0
    # and 8 hold the same shard, one NIC each: a two-rank ring all-reduce of 1/8.
    expected = (ring(8, LAYER * 4, NV, NV_STEP) + 2 * NIC_STEP + LAYER * 4 / 8 / NIC
                + ring(8, LAYER * 2, NV, NV_STEP))
    assert job.tail(LAYER, 1.0, 1.0, 0.0).reduce_ms == pytest.approx(expected)
    # FSDP's HSDP: the same groups, per unit.
    hsdp = build_job(cfg({"dp": 16, "fsdp": True, "dp_replicas": 2}, {"pp": 2}))
    assert hsdp is not None
    assert hsdp.tail(LAYER, 1e6, 1.0, 0.0).reduce_ms == pytest.approx(
        ring(8, LAYER * 2, NV, NV_STEP) + ring(8, LAYER * 4, NV, NV_STEP) + 2 * NIC_STEP
        + LAYER * 4 / 8 / NIC)


@pytest.mark.parametrize(("flags", "message"), [
    (["--dp-replicas", "2"], "need a sharded state"),
    (["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3"],
     "Data parallel size should be divisible by partial DistOpt shard factor"),
])
def test_copies_are_checked(flags: list[str], message: str) -> None:
    r = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
                 "--gpus", "16", "--global-batch-size", "32", *flags])
    assert r.returncode == 2
    assert "model.dp_replicas" in r.stderr and message in r.stderr


def test_expert_copies_are_checked() -> None:
    r = run_cli(["simulate", "--preset", "mixtral-8x7b", "--hardware", "h100-80gb", "--pp",
                 "1", "--tp", "2", "--gpus", "16", "--ep", "8", "--global-batch-size", "32",
                 "--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"])
    assert r.returncode == 2
    assert "Expert data parallel size should be divisible" in r.stderr


def test_megatron_line_with_copies_reads_back() -> None:
    r = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "128", "--use-distributed-optimizer",
                 "--dp-replicas", "4", "--pp", "1", "--tp", "1", "--cp", "1", "--recompute",
                 "full", "--json"])
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    line = best["megatron_job_flags"]
    assert "--num-distributed-optimizer-instances 4" in line
    again = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                     "--gpus", "64", *line.split(), "--json"])
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["job"]["dp_replicas"] == 4
    assert doc["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"])


def test_torchtitan_hsdp_fields() -> None:
    r = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "128", "--fsdp", "--dp-replicas", "4", "--pp", "1",
                 "--tp", "1", "--cp", "1", "--recompute", "none", "--json"])
    assert r.returncode == 0, r.stderr
    par = json.loads(r.stdout)["best"]["torchtitan_job"]["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (4, 16)


def test_torchtitan_async_tp_fields() -> None:
    """--tp-comm-overlap under --fsdp is torchtitan's AsyncTP, which it runs compiled."""
    args = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
            "--global-batch-size", "128", "--fsdp", "--tp", "4", "--pp", "1", "--json"]
    r = run_cli([*args, "--tp-comm-overlap"])
    assert r.returncode == 0, r.stderr
    titan = json.loads(r.stdout)["best"]["torchtitan_job"]
    assert titan["compile"] == {"enable": True, "enable_async_tensor_parallel": True}
    plain = run_cli(args)
    assert "compile" not in json.loads(plain.stdout)["best"]["torchtitan_job"]


def test_fsdp_over_a_distributed_optimizer_preset() -> None:
    """DeepSeek-V3's preset keeps the distributed optimizer; --fsdp (or fsdp = true beside
    the preset) replaces it, and --use-distributed-optimizer over an FSDP table the other
    way; only both at once is refused."""
    preset = config_from_dict({"model": {"preset": "deepseek-v3"}}).model.arch
    assert preset.distributed_optimizer and not preset.fsdp
    table = config_from_dict({"model": {"preset": "deepseek-v3", "fsdp": True}}).model.arch
    assert table.fsdp and not table.distributed_optimizer
    r = run_cli(["simulate", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--pp",
                 "16", "--ep", "8", "--dp", "8", "--fsdp", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["job"]["data_parallel"] == "fsdp"
    back = config_from_dict({"model": {"preset": "deepseek-v3", "fsdp": True}}).model
    assert back.with_fields({"distributed_optimizer": True}).arch.fsdp is False


def test_the_sharding_choices_of_a_shape() -> None:
    """Distributed optimizer and FSDP, each whole and with one copy a node: tp 4 leaves
    two data-parallel ranks on an 8-GPU node, so 64 ranks make 32 copies; Megatron-FSDP
    too, whole (its hybrid sharding is not priced)."""
    s = Shape(tp=4, cp=1, ep=1, pp=1, dp=64, vpp=1, mbs=1, microbatches=4)
    got = {(v.sharding, v.dp_replicas) for v in sharding_choices(s, 8, experts=False)}
    assert got == {("distributed optimizer", 1), ("distributed optimizer", 32),
                   ("fsdp", 1), ("fsdp", 32), ("megatron-fsdp", 1)}
    piped = replace(s, pp=2, dp=32)
    assert "megatron-fsdp" in {v.sharding for v in sharding_choices(piped, 8, False)}
    # Configured as Megatron-FSDP, "fsdp" is it: no second kind.
    mine = sharding_choices(s, 8, experts=False, framework="megatron-fsdp")
    assert {v.sharding for v in mine} == {"distributed optimizer", "fsdp"}
    # A data-parallel group inside one node has no copies to make, nor one with a single
    # rank a node (a copy a node would shard nothing).
    small = Shape(tp=8, cp=1, ep=1, pp=8, dp=1, vpp=1, mbs=1, microbatches=8)
    assert {v.dp_replicas for v in sharding_choices(small, 8, experts=False)} == {1}
    wide = Shape(tp=8, cp=1, ep=1, pp=1, dp=64, vpp=1, mbs=1, microbatches=8)
    assert {v.dp_replicas for v in sharding_choices(wide, 8, experts=False)} == {1}


def test_plan_searches_the_sharding() -> None:
    r = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "128", "--pp", "1", "--tp", "1", "--cp", "1",
                 "--micro-batch-size", "1", "--recompute", "full", "--search", "sharding",
                 "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    seen = {(c["data_parallel"], c["fsdp_framework"], c["dp_replicas"])
            for c in doc["candidates"]}
    assert seen == {("distributed optimizer", None, 1), ("distributed optimizer", None, 8),
                    ("fsdp", "torchtitan", 1), ("fsdp", "torchtitan", 8),
                    ("fsdp", "megatron-fsdp", 1)}  # every shape fixed but its sharding
    times = [c["iteration_time_ms"] for c in doc["candidates"] if c["fits"]]
    assert times == sorted(times)
    best = doc["best"]
    assert (best["megatron_job_flags"] is None) == (best["fsdp_framework"] == "torchtitan")
    bad = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                   "64", "--global-batch-size", "128", "--search", "tp"])
    assert bad.returncode == 2 and "recompute, policy, sharding, dispatcher, cp-comm, " \
        "host-optimizer, not tp" in bad.stderr


def test_searching_the_sharding_never_loses_to_either_choice() -> None:
    """The searched sharding includes both whole ones: its best is never slower."""
    base = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
            "--global-batch-size", "256", "--recompute", "full", "--pp", "1", "--json"]

    def best(*flags: str) -> float:
        r = run_cli([*base, *flags])
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["best"]["iteration_time_ms"]

    searched = best("--search", "sharding")
    assert searched <= best("--use-distributed-optimizer") + 1e-9
    assert searched <= best("--fsdp") + 1e-9
    assert searched <= best("--use-megatron-fsdp") + 1e-9


def test_megatrons_torch_fsdp2_reduces_in_the_models_dtype() -> None:
    """Megatron's --use-torch-fsdp2 shards the bf16 model with no mixed-precision policy:
    it gathers bf16 weights as torchtitan does, but reduce-scatters bf16 gradients, and
    its optimizer keeps fp32 masters and moments (16 bytes a parameter either way). It was
    refused."""
    from ppsim.job import fsdp

    def job(framework: str):
        j = build_job(cfg({"dp": 16, "fsdp": True, "fsdp_framework": framework,
                      "gradient_accumulation_fusion": framework != "megatron"}))
        assert j is not None
        return j

    bw = min(NV, 8 * NIC)  # 16 ranks on 2 nodes
    assert fsdp.reduce_ms(job("megatron"), LAYER) == pytest.approx(
        ring(16, LAYER * 2, bw, NIC_STEP))
    assert fsdp.reduce_ms(job("torchtitan"), LAYER) == pytest.approx(
        ring(16, LAYER * 4, bw, NIC_STEP))
    assert fsdp.gather_ms(job("megatron"), LAYER) == fsdp.gather_ms(job("torchtitan"), LAYER)
    shard = model_costs(cfg({"dp": 64, "fsdp": True, "fsdp_framework": "megatron",
                       "gradient_accumulation_fusion": False}))
    assert shard.layers[0].static_bytes == LAYER * 16 // 64
