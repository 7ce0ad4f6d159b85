"""Megatron-FSDP (--use-megatron-fsdp, its default optim_grads_params strategy) against
closed forms restated from Megatron-LM's code: megatron/core/distributed/fsdp/src/
megatron_fsdp/megatron_fsdp.py (each TransformerLayer a unit, gathered before its forward
and again before its backward, one unit prefetched; grad_reduce_every_bprop: each unit's
gradient reduce-scattered in every backward; the embedding and output layer in no unit,
gathered once and kept), mixed_precision.py (main_grads_dtype None: the model's bf16;
main_params_dtype fp32) and the h100-80gb preset's links (NVLink 450 GB/s each way, 1 us
a step; a 400 Gb/s NIC per GPU, 5 us a step; 8 GPUs a node). It was refused by name."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
from fsdp_forms import EMBEDDING, LAYER, NCCL_SHARE, NIC, NIC_STEP, NV, cfg, ring
from helpers import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job import fsdp
from ppsim.job.fsdp import fsdp_steps
from ppsim.job.model import build_job
from ppsim.job.pending import pending_shape
from ppsim.job.shapes import Shape
from ppsim.pipeline.problem import build_problem, model_costs

HEAD = EMBEDDING + 4096
"""The output layer and the final norm: root parameters too."""
MFSDP = {"fsdp": True, "fsdp_framework": "megatron-fsdp"}
# Megatron-LM's examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, its FSDP arguments
# and the data-parallel ones beside them, as written.
EXAMPLE_ARGS = ["--use-distributed-optimizer", "--overlap-grad-reduce",
                "--overlap-param-gather", "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy", "optim_grads_params",
                "--no-gradient-accumulation-fusion", "--init-model-with-meta-device",
                "--ckpt-format", "fsdp_dtensor", "--fsdp-double-buffer",
                "--megatron-fsdp-grad-comm-dtype", "bf16",
                "--megatron-fsdp-main-grads-dtype", "bf16"]


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_cli(argv: list[str]) -> Ran:
    return Ran(*run_main(argv))


BASE = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1"]
"""(Megatron-FSDP runs with pp too: one stage keeps these checks small.)"""


def behind(comm: float, window: float, floor: float = 0.0) -> float:
    exposed = min(comm, max(floor, comm - window))
    return exposed + NCCL_SHARE * (comm - exposed)


def test_every_microbatch_gathers_and_reduces_each_layer() -> None:
    steps = fsdp_steps("default", False, "megatron-fsdp")
    assert (steps.forward_gather, steps.backward_gather, steps.backward_reduce,
            steps.root_once) == (True, True, True, True)
    assert not fsdp_steps("default", False).root_once  # torchtitan's units include them


@pytest.mark.parametrize("pp", [1, 2])
def test_memory_a_parameter(pp: int) -> None:
    """Sharded over dp: the bf16 weight and gradient, the fp32 master and Adam's two
    moments (16 bytes); the embedding and the output layer held gathered in bf16, each on
    its stage; on every GPU its buffers: two layer units' gathered weights (the computing
    one, the prefetched one) and one layer's bf16 gradient, whatever the stage (no
    weights kept gathered across the pipeline's microbatches, as torchtitan's are)."""
    c = cfg({"dp": 64, **MFSDP}, {"pp": pp})
    got = model_costs(c)
    assert got.layers[0].static_bytes == LAYER * 16 // 64
    assert got.head.static_bytes == HEAD * 16 // 64 + HEAD * 2
    assert got.embedding.static_bytes == EMBEDDING * 16 // 64 + EMBEDDING * 2
    buffers = LAYER * (2 * 2 + 2)
    problem = build_problem(c)
    assert problem.hardware.job.fsdp_buffer_bytes == buffers
    assert problem.hardware.memory_bytes == c.hardware.memory_bytes - buffers


@settings(max_examples=25, deadline=None)
@given(dp=st.sampled_from([2, 4, 8, 16, 64, 512]), cp=st.sampled_from([1, 2, 4]))
def test_layer_state_shards_over_dp_times_cp(dp: int, cp: int) -> None:
    got = model_costs(cfg({"dp": dp, "cp": cp, "seq_length": 1024, **MFSDP}))
    assert got.layers[0].static_bytes == LAYER * 16 // (dp * cp)


def test_each_microbatch_waits_for_what_its_compute_does_not_hide() -> None:
    c = cfg({"dp": 16, "seq_length": 1024, **MFSDP})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    bw = min(NV, 8 * NIC)  # 16 ranks on 2 nodes: 8 NICs a node carry the ring
    gather = ring(16, LAYER * 2, bw, NIC_STEP)
    reduce = ring(16, LAYER * 2, bw, NIC_STEP)  # bf16 gradients
    got = model_costs(c)
    f, b = alone.layers[0].forward_ms, alone.layers[0].backward_ms
    assert got.layers[0].forward_ms == pytest.approx(f + behind(gather, f))
    assert got.layers[0].backward_ms == pytest.approx(b + behind(gather + reduce, b))
    # The embedding is gathered once a step, not each microbatch; its gradient is
    # reduce-scattered in every backward.
    emb = alone.embedding
    assert got.embedding.forward_ms == pytest.approx(emb.forward_ms)
    emb_reduce = ring(16, EMBEDDING * 2, bw, NIC_STEP)
    assert got.embedding.backward_ms == pytest.approx(
        emb.backward_ms + behind(emb_reduce, emb.backward_ms))


def test_the_step_gathers_the_embedding_and_the_head_once() -> None:
    """During the first forward, the embedding's gather before anything computes, the
    output layer's behind the forward; no gradient is left to reduce after the loop."""
    job = build_job(cfg({"dp": 16, "seq_length": 1024, **MFSDP}))
    assert job is not None
    bw = min(NV, 8 * NIC)
    whole = ring(16, (EMBEDDING + HEAD) * 2, bw, NIC_STEP)
    first = ring(16, EMBEDDING * 2, bw, NIC_STEP)
    forward = 50.0
    got = fsdp.step_reduction(job, 4 * LAYER + EMBEDDING + HEAD, 0, forward, True,
                              EMBEDDING + HEAD)
    assert got.cost_ms == pytest.approx(behind(whole, forward, first))
    # On the links: that gather, beside the first forward, and nothing else.
    (gather,) = got.on_links
    assert (gather.what, gather.beside) == ("parameter all-gather", "forward")
    assert gather.total_ms == pytest.approx(whole)
    assert fsdp.step_reduction(job, 4 * LAYER, 0, forward, False, 0).cost_ms == 0.0


def test_megatrons_example_arguments_are_taken() -> None:
    """Its launch line as written: --use-distributed-optimizer and the overlaps beside
    --use-megatron-fsdp (which turns them on itself), the default strategy and bf16
    gradients named, the checkpoint format Megatron asserts."""
    job = [*BASE, "--gpus", "16", "--global-batch-size", "64", "--json"]
    ran = run_cli(["simulate", *job, *EXAMPLE_ARGS])
    assert ran.returncode == 0, ran.stderr
    bare = run_cli(["simulate", *job, "--use-megatron-fsdp",
                    "--no-gradient-accumulation-fusion"])
    assert ran.stdout == bare.stdout
    d = json.loads(ran.stdout)["job"]
    assert (d["data_parallel"], d["fsdp_framework"]) == ("fsdp", "megatron-fsdp")
    dist = run_cli(["simulate", *job, "--use-distributed-optimizer"])
    assert json.loads(dist.stdout)["iteration_time_ms"] != \
        json.loads(ran.stdout)["iteration_time_ms"]
    text = run_cli(["simulate", *BASE, "--gpus", "16", "--use-megatron-fsdp"])
    buffers = LAYER * (2 * 2 + 2) / 1e9
    assert f"dp 16 Megatron-FSDP ({buffers:.2f} GB of buffers) pp 1" \
        in " ".join(text.stdout.split())


def test_the_plans_launch_line_reads_back() -> None:
    base = [*BASE, "--gpus", "16", "--global-batch-size", "32"]
    ran = run_cli(["plan", *base, "--use-megatron-fsdp", "--top", "1", "--json"])
    assert ran.returncode == 0, ran.stderr
    best = json.loads(ran.stdout)["best"]
    flags = best["megatron_job_flags"]
    assert "--use-megatron-fsdp --ckpt-format fsdp_dtensor" in flags
    assert best["torchtitan_job"] is None
    again = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                     "--gpus", "16", *flags.split(), "--json"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["iteration_time_ms"] == pytest.approx(
        best["iteration_time_ms"])


@pytest.mark.parametrize(("extra", "field", "words"), [
    (["--use-precision-aware-optimizer"], "model.precision_aware_optimizer", "decoupled"),
    (["--num-distributed-optimizer-instances", "2"], "model.dp_replicas", "hybrid"),
    (["--fsdp-cpu-offload"], "model.fsdp_cpu_offload", "--use-megatron-fsdp offers none"),
    (["--torch-fsdp2-no-reshard-after-forward"], "model.fsdp_reshard_after_forward",
     "optim_grads_params"),
    (["--ddp-bucket-size", "40000000"], "pipeline.ddp_bucket_size", "one unit"),
    (["--optimizer", "muon"], "model.optimizer", "does not support the muon optimizer"),
    (["--data-parallel-sharding-strategy", "optim_grads"],
     "--data-parallel-sharding-strategy optim_grads", "optim_grads_params"),
    (["--outer-dp-sharding-strategy", "optim"], "--outer-dp-sharding-strategy optim",
     "hybrid"),
])
def test_what_is_not_priced_is_refused(extra: list[str], field: str, words: str) -> None:
    ran = run_cli(["simulate", *BASE, "--gpus", "16", "--use-megatron-fsdp", *extra])
    assert ran.returncode == 2 and ran.stdout == ""
    assert f"error: {field}: " in ran.stderr and words in ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_executor_refuses_it(tmp_path) -> None:
    """It runs torchtitan's FSDP, not Megatron-FSDP: said, not run as another."""
    path = tmp_path / "job.toml"
    path.write_text('[model]\npreset = "tiny-llm"\ndp = 2\nfsdp = true\n'
                    'fsdp_framework = "megatron-fsdp"\n[pipeline]\npp = 1\n'
                    'microbatches = 2\n')
    ran = run_cli(["run", "--config", str(path), "--dp", "2"])
    assert ran.returncode == 2 and "model.fsdp_framework" in ran.stderr
    assert "--use-megatron-fsdp" in ran.stderr


def test_megatrons_fsdps_keep_the_fused_swiglus_input_alone() -> None:
    """Megatron's model under either of its FSDPs runs its fused SwiGLU, which keeps
    its input alone; only torchtitan's eager one keeps the SiLU's output too. Under
    --use-torch-fsdp2 the layer was priced as torchtitan's."""
    dist = model_costs(cfg({"dp": 8, "distributed_optimizer": True})).layers[0]
    for framework in ("megatron", "megatron-fsdp"):
        got = model_costs(cfg({"dp": 8, "fsdp": True, "fsdp_framework": framework,
                      "gradient_accumulation_fusion": framework != "megatron"}))
        assert got.layers[0].activation_bytes == dist.activation_bytes
    titan = model_costs(cfg({"dp": 8, "fsdp": True})).layers[0]
    silu = 4096 * 14336 * 2  # a sequence of 4096 tokens' SiLU output in bf16
    assert titan.activation_bytes >= dist.activation_bytes + silu


@pytest.mark.parametrize("framework", ["megatron", "megatron-fsdp"])
def test_searching_the_sharding_tries_the_distributed_optimizer(framework: str) -> None:
    """A searched shape under the distributed optimizer drops FSDP's own fields: under
    --use-torch-fsdp2 each such shape was refused ("fsdp_framework ... FSDP is off")."""
    c = cfg({"dp": 8, "fsdp": True, "fsdp_framework": framework,
                      "gradient_accumulation_fusion": framework != "megatron"})
    s = Shape(tp=1, cp=1, ep=1, pp=1, dp=8, vpp=1, mbs=1, microbatches=4, etp=1,
              sharding="distributed optimizer", dp_replicas=1)
    p = pending_shape(c, s, 32)
    assert p.cfg.model.arch.distributed_optimizer and not p.cfg.model.arch.fsdp


def test_routed_experts_shard_over_the_expert_data_parallel_group() -> None:
    """16 ranks at ep 8: the dense weights shard over all 16, each expert's over the 2
    ranks that hold it (Megatron's expt_dp group)."""
    c = config_from_dict({"model": {"preset": "qwen3-30b-a3b", "num_layers": 4, "dp": 16,
                                    "ep": 8, "recompute": "none", **MFSDP},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    layer = model_costs(c).layers[0]
    dense = layer.params - layer.expert_params
    assert layer.expert_params > dense > 0
    assert layer.static_bytes == pytest.approx(dense * 16 / 16 + layer.expert_params * 16 / 2,
                                               abs=2)


def test_torch_fsdp2_jobs_plan_without_naming_pp() -> None:
    """Megatron's default is one stage, the only one it takes --use-torch-fsdp2 at: the
    job search keeps to it unasked (it said "give --pp 1", the embedded default's two
    stages refused)."""
    ran = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
                   "--global-batch-size", "32", "--use-torch-fsdp2",
                   "--no-gradient-accumulation-fusion", "--top", "3", "--json"])
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    assert {c["pp"] for c in doc["candidates"]} == {1}
    assert doc["held"] == {}


def test_torch_fsdp2_moe_jobs_plan_without_naming_ep() -> None:
    """Megatron-LM d98e8a6 arguments.py asserts expert_model_parallel_size == 1 under
    --use-torch-fsdp2, and 1 is its default: a MoE preset (Mixtral's ep 8) plans at ep 1
    unasked (it said "give --ep 1" though the search chooses ep itself)."""
    ran = run_cli(["plan", "--preset", "mixtral-8x7b", "--hardware", "h100-80gb", "--gpus",
                   "64", "--global-batch-size", "64", "--use-torch-fsdp2",
                   "--no-gradient-accumulation-fusion", "--time-budget", "10", "--top", "3",
                   "--json"])
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    assert {(c["pp"], c["ep"]) for c in doc["candidates"]} == {(1, 1)}
    assert doc["held"] == {}


def test_searching_the_sharding_beside_megatrons_overlaps_tries_fsdp() -> None:
    """A Megatron job's usual --overlap-grad-reduce --overlap-param-gather are DDP's
    knobs: the searched FSDP shapes drop them (each was refused, "--overlap-grad-reduce
    is Megatron DDP's", so FSDP never entered the search's table)."""
    ran = run_cli(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
                   "--global-batch-size", "32", "--pp", "1", "--tp", "1", "--cp", "1",
                   "--micro-batch-size", "1", "--use-distributed-optimizer",
                   "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size",
                   "40000000", "--search", "sharding", "--top", "10", "--json"])
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    kinds = {c["fsdp_framework"] for c in doc["candidates"]}
    assert kinds == {"torchtitan", "megatron-fsdp"}
    assert doc["refused"] == 0
    # The two distributed-optimizer shapes (one replica a node, or all 16) hold every
    # weight with their activations: no split of a single stage fits them.
    assert doc["floor_overflows"] == 2 and doc["total_shapes"] == 5


def test_each_gradient_lands_in_its_units_bf16_buffer() -> None:
    """Megatron-FSDP's gradient-accumulation fusion writes each weight gradient into its
    unit's bf16 buffer, overwritten every microbatch (overwrite_main_grad), where
    Megatron's DDP reads and writes an fp32 main grad (8 bytes a weight): 6 bytes a
    weight less memory traffic in every backward, at the preset's 3,000 GB/s. It was
    priced as the fp32 main grad's."""
    matmuls = LAYER - 2 * 4096  # the two norms' weights are no matmul's
    acc = accelerator(cfg({}).hardware)
    own = transformer_costs(cfg({"dp": 8, **MFSDP}).model.arch, acc)
    ddp = transformer_costs(cfg({"dp": 8, "distributed_optimizer": True}).model.arch, acc)
    saved = 6 * matmuls / 3000e6
    assert ddp.layers[0].weight_grad_ms - own.layers[0].weight_grad_ms == pytest.approx(saved)
    vocab = 128256 * 4096
    assert ddp.head.weight_grad_ms - own.head.weight_grad_ms == pytest.approx(6 * vocab / 3000e6)
    assert own.layers[0].forward_ms == ddp.layers[0].forward_ms


@pytest.mark.parametrize("sharding", [MFSDP, {"distributed_optimizer": True}])
def test_unfused_gradients_land_twice(sharding: dict) -> None:
    """--no-gradient-accumulation-fusion (taken and not priced): the wgrad GEMM writes the
    bf16 gradient, and it is read back to land: 4 bytes a weight more in every backward,
    under Megatron-FSDP and the distributed optimizer alike."""
    matmuls = LAYER - 2 * 4096
    acc = accelerator(cfg({}).hardware)
    fused = transformer_costs(cfg({"dp": 8, **sharding}).model.arch, acc)
    unfused = transformer_costs(cfg({"dp": 8, "gradient_accumulation_fusion": False,
                                     **sharding}).model.arch, acc)
    assert unfused.layers[0].weight_grad_ms - fused.layers[0].weight_grad_ms \
        == pytest.approx(4 * matmuls / 3000e6)
    line = [*BASE, "--gpus", "16", "--global-batch-size", "32", "--json"]
    code, out, err = run_main(["simulate", *line, "--no-gradient-accumulation-fusion"])
    assert code == 0 and "not priced" not in err
    code, base, _ = run_main(["simulate", *line])
    assert json.loads(out)["iteration_time_ms"] > json.loads(base)["iteration_time_ms"]
    code, out, err = run_main(["plan", *line, "--use-megatron-fsdp", "--top", "1",
                               "--no-gradient-accumulation-fusion"])
    assert code == 0, err
    assert "--no-gradient-accumulation-fusion" in json.loads(out)["best"]["megatron_job_flags"]


def test_the_executor_refuses_unfused_gradients() -> None:
    """It would run as without the flag (torch's autograd has no fusion to turn off)."""
    ran = run_cli(["run", "--no-gradient-accumulation-fusion"])
    assert ran.returncode == 2 and ran.stdout == ""
    assert "error: model.gradient_accumulation_fusion: " in ran.stderr


def test_it_is_told_of_the_tensor_parallel_overlap_it_leaves_off() -> None:
    """Under Megatron's FSDPs the sequence-parallel collectives are Megatron's as ever,
    and --tp-comm-overlap hides them; only torchtitan's FSDP has no such flag. The hint
    was dropped for every FSDP job."""
    job = ["--preset", "llama3-70b", "--hardware", "h100-80gb", "--gpus", "64",
           "--global-batch-size", "256", "--seq-length", "8192", "--tp", "4", "--pp", "1",
           "--json"]
    for flag, off in (("--use-megatron-fsdp", ["--tp-comm-overlap"]),
                      ("--use-torch-fsdp2 --no-gradient-accumulation-fusion",
                       ["--tp-comm-overlap"]), ("--fsdp", [])):
        code, out, err = run_main(["simulate", *job, *flag.split()])
        assert code == 0, err
        assert json.loads(out)["overlaps_off"] == off, flag
