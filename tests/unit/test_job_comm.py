"""The job's collectives in the layer costs and the data-parallel step, against closed forms
built from the preset's datasheet figures (H100: NVLink 450 GB/s each way, 1 us a step;
a 400 Gb/s NIC per GPU, 5 us a step; 8 GPUs a node)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import attention_ops
from ppsim.costs.ops import op_times
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.layers import layer_collectives
from ppsim.job.model import build_job
from ppsim.job.traffic import recomputed
from ppsim.pipeline.problem import build_problem, model_costs
from ppsim.sim.simulate import simulate

NV, NV_STEP, NIC, NIC_STEP = 450e6, 1e-3, 50e6, 5e-3  # bytes per ms, ms
NCCL_SHARE = 16 / 132
"""An NCCL collective's 16 channels, an SM each, of the H100's 132 SMs."""


def behind(comm: float, window: float, floor: float = 0.0) -> float:
    """A collective beside `window` ms of compute: what the window leaves of it (never
    under `floor`), and for what it hides, the compute its SMs slow."""
    waited = min(comm, max(floor, comm - window))
    return waited + NCCL_SHARE * (comm - waited)


def cfg(model: dict, pipe: dict | None = None, hw: dict | None = None):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model},
                             "pipeline": {"pp": 1, "microbatches": 4, **(pipe or {})},
                             "hardware": {"preset": "h100-80gb", **(hw or {})}})


def test_tensor_parallel_collectives_are_inside_each_layer() -> None:
    c = cfg({"tp": 4})
    alone = transformer_costs(c.model.arch, accelerator(c.hardware))
    s = 8192 * 4096 * 2  # one microbatch's hidden states, bf16
    one = 3 * NV_STEP + 3 / 4 * s / NV  # all-gather or reduce-scatter over 4 GPUs of a node
    got = model_costs(c)
    assert got.layers[0].forward_ms == pytest.approx(alone.layers[0].forward_ms + 4 * one)
    # The backward waits for each sublayer's output gradient's gather; Megatron gathers
    # each sublayer's input again beside the input-gradient GEMM of its gathered linear
    # (the QKV projection, fc1) and scatters the input's gradient beside its
    # weight-gradient GEMM. Those GEMMs outlast them: they cost NCCL's SM share alone.
    qkv = next(op for op in attention_ops(c.model.arch) if op.name == "qkv")
    assert min(op_times(accelerator(c.hardware).roofline(), qkv)[1:3]) > one
    assert got.layers[0].backward_ms == pytest.approx(alone.layers[0].backward_ms + 2 * one
                                                      + 4 * NCCL_SHARE * one)
    assert got.head.forward_ms == pytest.approx(alone.head.forward_ms + one)
    # --tp-comm-overlap (TE's userbuffers): the layer's compute outlasts its collectives,
    # so of them it waits for the last of 4 chunks of each forward reduce-scatter alone;
    # the reduce-scatters and the backward's `bulk` gathers of the inputs it hides hold
    # 16 of the 132 SMs, the ring-exchange gathers none.
    hidden = model_costs(cfg({"tp": 4}, {"tp_comm_overlap": True}))
    share, tails = 16 / 132, 2 * one / 4
    assert hidden.layers[0].forward_ms == pytest.approx(
        alone.layers[0].forward_ms + tails + share * (2 * one - tails))
    assert hidden.layers[0].backward_ms == pytest.approx(
        alone.layers[0].backward_ms + share * 4 * one)
    # Without an SM count the hidden part is free.
    free = model_costs(cfg({"tp": 4}, {"tp_comm_overlap": True}, {"sm_count": 0}))
    assert free.layers[0].forward_ms == pytest.approx(alone.layers[0].forward_ms + tails)
    assert free.layers[0].backward_ms == alone.layers[0].backward_ms


def test_tensor_parallel_across_nodes_is_slower() -> None:
    inside = model_costs(cfg({"tp": 8})).layers[0].forward_ms
    across = model_costs(cfg({"tp": 8}, hw={"gpus_per_node": 4})).layers[0].forward_ms
    assert across > inside


def test_context_parallel_ring() -> None:
    c = cfg({"cp": 2})
    half = replace(c.model.arch, seq_length=4096)
    acc = accelerator(c.hardware)
    alone = transformer_costs(half, acc)
    att = next(op for op in attention_ops(half) if op.attention)
    f, b, _, _, _ = op_times(acc.roofline(), att)
    kv = 4096 * (1024 + 1024) * 2  # K and V of 8 kv heads x 128, bf16
    f_ring = max(0.0, NV_STEP + kv / NV - f)
    b_ring = max(0.0, NV_STEP + 2 * kv / NV - b)
    got = model_costs(c)
    assert got.layers[0].forward_ms == pytest.approx(alone.layers[0].forward_ms + f + f_ring)
    # The preset's selective recompute runs the core attention's forward, the other
    # chunk's and its ring too, again inside the backward.
    assert got.layers[0].backward_ms == pytest.approx(alone.layers[0].backward_ms + b + b_ring
                                                      + f + f_ring)
    assert got.layers[0].activation_bytes == alone.layers[0].activation_bytes


def test_expert_all_to_all_on_the_links_it_crosses() -> None:
    # 16 experts: Megatron's ep must divide them (validate refuses ep 16 over 8).
    c = config_from_dict({"model": {"preset": "mixtral-8x7b", "num_layers": 2, "ep": 16,
                                    "num_experts": 16, "dp": 16},
                          "pipeline": {"pp": 1, "microbatches": 2},
                          "hardware": {"preset": "h100-80gb"}})
    acc = replace(accelerator(c.hardware), a2a_bandwidth_gbps=0.0)
    alone = transformer_costs(c.model.arch, acc)
    sent = 4096 * 2 * 4096 * 2  # tokens x top-2 x hidden, bf16
    # 16 ranks on two nodes: 7/16 of the bytes stay on NVLink, 8/16 leave by the NIC.
    a2a = 15 * NIC_STEP + max(sent * 7 / 16 / NV, sent * 8 / 16 / NIC)
    got = model_costs(c)
    assert got.layers[0].forward_ms == pytest.approx(alone.layers[0].forward_ms + 2 * a2a)


@pytest.mark.parametrize("recompute, modules", [("full", None), ("none", ("moe",))])
def test_a_recomputed_moe_block_dispatches_again(recompute: str, modules) -> None:
    """Full recompute, or the `moe` module, runs the dispatch and combine again inside the
    backward: the backward's all-to-alls are the forward's two more (a defect: they were
    left out)."""
    c = config_from_dict({"model": {"preset": "mixtral-8x7b", "num_layers": 2, "ep": 16,
                                    "num_experts": 16, "dp": 16, "recompute": recompute},
                          "pipeline": {"pp": 1, "microbatches": 2},
                          "hardware": {"preset": "h100-80gb"}})
    sent = 4096 * 2 * 4096 * 2  # tokens x top-2 x hidden, bf16
    a2a = 15 * NIC_STEP + max(sent * 7 / 16 / NV, sent * 8 / 16 / NIC)
    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    layer = transformer_costs(job.arch, acc).layers[0]
    comm = layer_collectives(job, job.arch, acc, "moe", layer, recomputed(job.arch, modules))
    ep_f = next(x for x in comm.forward if x.group == "ep")
    ep_b = next(x for x in comm.backward if x.group == "ep")
    assert ep_f.total_ms == pytest.approx(2 * a2a)
    assert ep_b.total_ms == pytest.approx(4 * a2a) and ep_b.exposed_ms == ep_b.total_ms


def test_data_parallel_step_overlaps_with_the_backward() -> None:
    plain = build_problem(cfg({"dp": 16, "distributed_optimizer": True}))
    overlapped = build_problem(cfg({"dp": 16, "distributed_optimizer": True},
                                   {"overlap_grad_reduce": True, "overlap_param_gather": True}))
    one = build_problem(cfg({"dp": 1}))
    t_plain = simulate(plain).summary.iteration_time_ms
    t_over = simulate(overlapped).summary.iteration_time_ms
    params = sum(c.params for c in plain.stage_costs)
    # dp 16 over two nodes, one GPU in 8 of each: rings through 8 NICs, capped by NVLink.
    bus = min(NV, 8 * NIC)
    rs = 15 * NIC_STEP + 15 / 16 * params * 4 / bus
    ag = 15 * NIC_STEP + 15 / 16 * params * 2 / bus
    step_one = params * 28 / 3000e6
    base = simulate(one).summary.iteration_time_ms - step_one
    assert t_plain == pytest.approx(base + rs + ag + step_one / 16, rel=1e-9)
    assert t_over < t_plain
    bwd = sum(c.backward_ms for c in plain.stage_costs)
    fwd = sum(c.forward_ms for c in plain.stage_costs)
    # The bucket reduced last and gathered first holds the embedding: Llama 3's
    # 128,256 x 4,096 table, not a 40M bucket.
    bucket = 128256 * 4096
    exposed = (behind(rs, bwd, 15 * NIC_STEP + 15 / 16 * bucket * 4 / bus)
               + behind(ag, fwd, 15 * NIC_STEP + 15 / 16 * bucket * 2 / bus))
    assert t_over == pytest.approx(base + exposed + step_one / 16, rel=1e-9)


def test_tied_embeddings_reduce_between_the_first_and_last_stage() -> None:
    def problem(tied: bool):
        return build_problem(config_from_dict({
            "model": {"preset": "gpt3-1.3b", "tie_embeddings": tied},
            "pipeline": {"pp": 4, "microbatches": 8}, "hardware": {"preset": "h100-80gb"}}))

    untied, tied = simulate(problem(False)), simulate(problem(True))
    # Ranks 0 and 3 share a node: one NVLink all-reduce of 2 ranks, the fp32 gradient of
    # the 50,304 x 2,048 table (GPT-2's 50,257 tokens padded to a multiple of 128): a ring
    # of 2 steps moving half of it each way.
    sync = 2 * NV_STEP + 50304 * 2048 * 4 / NV
    # The all-reduce is a collective: both ends start it once the later one arrives.
    step = untied.timeline.step
    start = max(step[r][0] + step[r][1] for r in (0, 3))
    expect = max(start + sync + s if r in (0, 3) else e + red + s
                 for r, (e, red, s) in enumerate(step))
    assert tied.summary.iteration_time_ms == pytest.approx(expect, rel=1e-12)
    waits = [start - step[r][0] - step[r][1] for r in (0, 3)]
    assert [r for _, r, _ in tied.timeline.step] == pytest.approx(
        [waits[0] + sync, 0, 0, waits[1] + sync])


def test_only_the_embeddings_rank_waits_for_the_embeddings_bucket() -> None:
    """pp 2, dp 16, both overlaps: rank 0 (embedding) has the embedding's bucket exposed
    in full; rank 1 (the head) all its gradients, one bucket: Megatron's DDP buckets only
    pipeline rank 0 (distributed_data_parallel.py: bucket_size None where pp_rank > 0)."""
    problem = build_problem(cfg({"dp": 16, "distributed_optimizer": True},
                                {"pp": 2, "overlap_grad_reduce": True,
                                 "overlap_param_gather": True},
                                {"collective_sms": 0}))  # the exposed bucket alone
    reduce = [r for _, r, _ in simulate(problem).timeline.step]
    # pp outermost: each stage's dp 16 spans two nodes, 8 a node, rings through 8 NICs.
    bus = min(NV, 8 * NIC)

    def rs_ag(n: float) -> float:
        return 2 * 15 * NIC_STEP + 15 / 16 * n * (4 + 2) / bus

    assert reduce[0] == pytest.approx(rs_ag(128256 * 4096), rel=1e-9)
    assert reduce[1] == pytest.approx(rs_ag(problem.stage_costs[1].params), rel=1e-9)


@pytest.mark.parametrize("buckets", [{"ddp_bucket_size": 100_000_000},
                                     {"ddp_bucket_size": 10**12}, {"ddp_num_buckets": 8},
                                     {"ddp_num_buckets": 1}])
def test_megatrons_bucket_flags_set_the_bucket_left_exposed(buckets: dict) -> None:
    """--ddp-bucket-size N: N parameters a bucket; --ddp-num-buckets K: the rank's
    parameters // K (Megatron's resolve_ddp_bucket_size). A bucket larger than the rank's
    parameters is all of them; the embedding's rank never less than its table. Rank 1
    is not bucketed whatever the flags: all its gradients wait."""
    pipe = {"pp": 2, "overlap_grad_reduce": True, "overlap_param_gather": True}
    problem = build_problem(cfg({"dp": 16, "distributed_optimizer": True},
                                {**pipe, **buckets}, {"collective_sms": 0}))
    reduce = [r for _, r, _ in simulate(problem).timeline.step]
    bus = min(NV, 8 * NIC)

    def rs_ag(n: float) -> float:
        return 2 * 15 * NIC_STEP + 15 / 16 * n * (4 + 2) / bus

    params = [c.params for c in problem.stage_costs]
    size = buckets.get("ddp_bucket_size")
    bucket = [min(p, size) if size else p // buckets["ddp_num_buckets"] for p in params]
    embedding = 128256 * 4096
    assert reduce[0] == pytest.approx(rs_ag(min(params[0], max(bucket[0], embedding))),
                                      rel=1e-9)
    assert reduce[1] == pytest.approx(rs_ag(params[1]), rel=1e-9)


def test_interleaved_ranks_wait_on_their_first_chunk_whole() -> None:
    """pp 2, vpp 2 (8 layers): rank 1 holds chunks 1 and 3; its first chunk's backward
    ends last, and unbucketed its whole gradients wait, the later chunk's having reduced
    behind that backward. Rank 0 buckets its first chunk (the embedding's bucket)."""
    problem = build_problem(cfg({"dp": 16, "distributed_optimizer": True, "num_layers": 8},
                                {"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b",
                                 "microbatches": 4, "overlap_grad_reduce": True,
                                 "overlap_param_gather": True},
                                {"collective_sms": 0}))
    reduce = [r for _, r, _ in simulate(problem).timeline.step]
    bus = min(NV, 8 * NIC)

    def rs_ag(n: float) -> float:
        return 2 * 15 * NIC_STEP + 15 / 16 * n * (4 + 2) / bus

    chunk = problem.stage_costs[1].params  # rank 1's first chunk: 2 layers, no head
    assert chunk < sum(problem.stage_costs[i].params for i in (1, 3))
    assert reduce[1] >= rs_ag(chunk) * (1 - 1e-9)
    assert reduce[0] >= rs_ag(128256 * 4096) * (1 - 1e-9)


def test_both_bucket_flags_are_refused_as_megatron_refuses_them(capsys) -> None:
    from ppsim.cli.main import main

    assert main(["simulate", "--preset", "llama3-8b", "--gpus", "16", "--ddp-bucket-size",
                 "1000", "--ddp-num-buckets", "2"]) == 2
    err = capsys.readouterr().err
    assert "Cannot specify both num_buckets and bucket_size" in err and err.count("\n") == 1


def test_fp16_gradients_are_kept_and_reduced_in_fp16() -> None:
    """Megatron forces fp32 gradient accumulation for bf16 alone (arguments.py): fp16
    weights keep an fp16 gradient buffer, reduce-scatter it and land their wgrads in it,
    as bf16 ones do under --grad-reduce-in-bf16 (the loss scale costs nothing). They were
    reduced and landed as fp32."""
    fp16 = build_problem(cfg({"dp": 16, "distributed_optimizer": True, "dtype": "fp16"}))
    bf16 = build_problem(cfg({"dp": 16, "distributed_optimizer": True,
                              "grad_reduce_in_bf16": True}))
    assert simulate(fp16).summary.iteration_time_ms == pytest.approx(
        simulate(bf16).summary.iteration_time_ms, rel=1e-12)


def test_gradients_reduced_in_bf16_halve_the_reduce_scatter_and_two_bytes_a_parameter(
        ) -> None:
    """Megatron's --grad-reduce-in-bf16: the gradient buffer is bf16, so the reduce-scatter
    moves 2 bytes a parameter, each rank holds 2 + 2 + 12 / dp bytes a parameter (bf16
    weights and gradients, the fp32 master weights and Adam moments sharded), not 6 + 12 /
    dp, and the fused wgrad GEMM accumulates into that bf16 buffer: 2 bytes read and 2
    written a weight each microbatch, not fp32's 4 and 4."""
    fp32 = build_problem(cfg({"dp": 16, "distributed_optimizer": True}))
    bf16 = build_problem(cfg({"dp": 16, "distributed_optimizer": True,
                              "grad_reduce_in_bf16": True}))
    params = sum(c.params for c in fp32.stage_costs)
    bus = min(NV, 8 * NIC)
    saved = 15 / 16 * params * (4 - 2) / bus  # the reduce-scatter's bytes, halved
    # Llama 3 8B's matrices, 4 layers (q, o 4096^2; k, v 4096 x 1024; gate, up, down 4096 x
    # 14336) and the head (128,256 x 4096); 4 microbatches on one stage, at 3,000 GB/s.
    matrices = 4 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096
    saved += 4 * matrices * (8 - 4) / 3000e6
    assert simulate(bf16).summary.iteration_time_ms == pytest.approx(
        simulate(fp32).summary.iteration_time_ms - saved, rel=1e-9)
    assert sum(c.static_bytes for c in bf16.stage_costs) == pytest.approx(
        sum(c.static_bytes for c in fp32.stage_costs) * (4 + 12 / 16) / (6 + 12 / 16),
        rel=1e-6)


@pytest.mark.parametrize("states, bytes_sharded, grad", [
    ({}, 2 + 4 + 4, 4),  # fp32 moments; the master weight as 16-bit remainders
    ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2, 4),
    ({"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp16", "main_params_dtype": "fp16"},
     2 + 1 + 2, 4),
    ({"main_grads_dtype": "bf16"}, 2 + 4 + 4, 2),
])
def test_the_precision_aware_optimizer_keeps_adams_state_in_its_dtypes(
        states: dict, bytes_sharded: int, grad: int) -> None:
    """--use-precision-aware-optimizer (TransformerEngine's FusedAdam): each rank holds
    bf16 weights, the gradient buffer (fp32, or bf16 with --main-grads-dtype bf16) and
    its 1/dp shard of the master weight (2 bytes: fp16, or the 16 bits an fp32 master
    adds to the bf16 weight) and the two moments in their dtypes; the step reads the
    gradient and reads and writes that state."""
    model = {"dp": 16, "distributed_optimizer": True}
    plain = build_problem(cfg(model))
    aware = build_problem(cfg({**model, "precision_aware_optimizer": True, **states}))
    held = sum(c.static_bytes for c in plain.stage_costs) / (6 + 12 / 16)  # parameters
    assert sum(c.static_bytes for c in aware.stage_costs) == pytest.approx(
        held * (2 + grad + bytes_sharded / 16), rel=1e-6)
    step = [s for _, _, s in simulate(aware).timeline.step][0]
    plain_step = [s for _, _, s in simulate(plain).timeline.step][0]
    assert step / plain_step == pytest.approx((grad + 2 * bytes_sharded) / 28, rel=1e-9)


@pytest.mark.parametrize("model, field", [
    ({"exp_avg_dtype": "bf16", "distributed_optimizer": True}, "model.exp_avg_dtype"),
    ({"precision_aware_optimizer": True}, "model.precision_aware_optimizer"),
    ({"precision_aware_optimizer": True, "distributed_optimizer": True, "dtype": "fp16"},
     "model.precision_aware_optimizer"),
    ({"precision_aware_optimizer": True, "distributed_optimizer": True,
      "main_params_dtype": "bf16"}, "model.main_params_dtype"),
])
def test_state_dtypes_megatron_refuses_are_refused(model: dict, field: str) -> None:
    from ppsim.errors import UserError

    with pytest.raises(UserError) as err:
        build_problem(cfg({"dp": 16, **model}))
    assert err.value.field == field


def test_distributed_optimizer_shards_dense_over_dp_cp_and_experts_over_expert_dp() -> None:
    """Megatron's distributed optimizer shards dense parameters' state over dp x cp
    (intra_dp_cp_group) and routed experts' over the expert data-parallel group,
    world / (ep x etp x pp) = dp x cp / ep (theoretical_memory_usage.py:
    num_bytes_per_parameter(expert_data_parallel_size)). Both used to shard over dp."""
    def problem(distributed: bool):
        return build_problem(config_from_dict({
            "model": {"preset": "mixtral-8x7b", "num_layers": 2, "dp": 16, "cp": 2, "ep": 8,
                      "distributed_optimizer": distributed},
            "pipeline": {"pp": 1, "microbatches": 4}, "hardware": {"preset": "h100-80gb"}}))

    sharded, whole = problem(True), problem(False)
    params = sum(c.params for c in whole.stage_costs)
    experts = 2 * 8 * 3 * 4096 * 14336 // 8  # 2 layers, 8 experts of 3 h x 14336, ep 8
    dense = params - experts
    assert sum(c.static_bytes for c in whole.stage_costs) == pytest.approx(18 * params,
                                                                           rel=1e-6)
    assert sum(c.static_bytes for c in sharded.stage_costs) == pytest.approx(
        dense * (6 + 12 / 32) + experts * (6 + 12 / 4), rel=1e-6)


def test_routed_experts_reduce_over_the_expert_data_parallel_group() -> None:
    """Megatron keeps routed experts' gradients in a buffer of their own, reduced over
    the expert data-parallel group (dp x cp / ep ranks) and stepped on that group's
    shard: Mixtral on dp 16, ep 8 reduces its dense buffer over 16 ranks on two nodes
    (8 NICs a node) and its experts over 2 ranks, one a node (one NIC)."""
    problem = build_problem(config_from_dict({
        "model": {"preset": "mixtral-8x7b", "num_layers": 2, "dp": 16, "ep": 8,
                  "distributed_optimizer": True},
        "pipeline": {"pp": 1, "microbatches": 4}, "hardware": {"preset": "h100-80gb"}}))
    params = sum(c.params for c in problem.stage_costs)
    experts = sum(c.expert_params for c in problem.stage_costs)
    assert experts == 2 * 8 * 3 * 4096 * 14336 // 8
    dense = params - experts
    dense_bus, expert_bus = min(NV, 8 * NIC), NIC

    def both(width: int) -> float:  # reduce-scatter (4) or all-gather (2) of each buffer
        return (15 * NIC_STEP + 15 / 16 * dense * width / dense_bus
                + 1 * NIC_STEP + 1 / 2 * experts * width / expert_bus)

    [(_, reduce, step)] = simulate(problem).timeline.step
    assert reduce == pytest.approx(both(4) + both(2), rel=1e-9)
    shard = dense / 16 + experts / 2
    assert step == pytest.approx(
        shard * 28 / (problem.hardware.memory_bandwidth_gbps * 1e6), rel=1e-9)


def test_a_hybrid_stacks_moe_blocks_pay_their_all_to_alls() -> None:
    # Nemotron-style 'E' blocks at ep 8 across 4 nodes of 2 GPUs: dispatch and combine
    # each way, as a MoE decoder layer's.
    from ppsim.job.layers import compute_costs, ep_all_to_all_ms, per_rank_arch
    from ppsim.job.model import build_job

    c = config_from_dict({
        "model": {"preset": "nemotron-h-8b", "hybrid_layer_pattern": "M-M-M-M*-ME",
                  "num_layers": 11, "num_experts": 8, "top_k": 2, "moe_ffn_hidden_size": 2048,
                  "ep": 8, "dp": 8},
        "pipeline": {"pp": 1, "microbatches": 2},
        "hardware": {"preset": "h100-80gb", "gpus_per_node": 2}})
    job = build_job(c)
    got, alone = model_costs(c), compute_costs(job, accelerator(c.hardware))
    a2a = ep_all_to_all_ms(job, per_rank_arch(job.arch))
    assert a2a > 0
    for kind, g, x in zip(got.kinds, got.layers, alone.layers, strict=True):
        if kind == "moe-mlp":
            assert g.forward_ms == pytest.approx(x.forward_ms + a2a)
            assert g.backward_ms == pytest.approx(x.backward_ms + a2a)


def test_a_memory_policy_leaves_the_exposed_communication_as_it_is(capsys) -> None:
    """Under a memory policy the layers are priced on the policy's base (nothing
    recomputed): the communication the job exposes is measured against that base, not
    against the model's global recompute mode, so it equals the job's without a policy."""
    from ppsim.cli.main import main

    argv = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "8", "--json"]
    waits = []
    for extra in (["--recompute-modules", "core_attn,layernorm"], ["--recompute", "none"]):
        assert main([*argv, *extra]) == 0
        waits.append(json.loads(capsys.readouterr().out)["exposed_comm_ms"])
    assert waits[0] > 0 and waits[0] == pytest.approx(waits[1], rel=1e-12)


def test_a_recomputed_mlp_gathers_and_scatters_again() -> None:
    """Megatron's `mlp` module recomputes the MLP with its sequence-parallel all-gather
    (inside TE's fc1) and reduce-scatter (fc2): a dense layer's backward then moves half
    its forward's tensor-parallel traffic again (a defect: only full recompute did),
    beside the backward's own, which gathers each sublayer's input again: the recompute's
    gather feeds the forward's GEMM alone."""
    c = cfg({"tp": 4})
    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    layer = transformer_costs(job.arch, acc).layers[0]

    def tp(modules: tuple[str, ...]) -> tuple[float, float]:
        comm = layer_collectives(job, job.arch, acc, "dense", layer,
                                 recomputed(job.arch, modules))
        return (next(x.total_ms for x in comm.forward if x.group == "tp"),
                next(x.total_ms for x in comm.backward if x.group == "tp"))

    f, b = tp(())
    assert b == pytest.approx(1.5 * f)
    assert tp(("mlp",)) == pytest.approx((f, 2 * f))
    assert tp(("core_attn",)) == pytest.approx((f, b))  # the core holds no tp traffic
