"""Expert tensor parallelism apart from tp (Megatron's --expert-tensor-parallel-size, MoE
parallel folding). Restated from Megatron's code, not from ppsim's:

- parallel_state.initialize_model_parallel: the experts' world is etp x ep x edp x pp with
  edp = world / (etp x ep x pp), refused with "world_size (N) is not divisible by
  expert_tensor_model_pipeline_parallel size (M)"; RankGenerator orders it as the dense
  world (etp innermost, then ep, then edp), so at tp 8 etp 1 ep 8 the eight experts' ranks
  are one node's.
- MoEAlltoAllTokenDispatcher: each rank routes its s / tp tokens (sequence parallel),
  the all-to-all over ep, then (etp > 1) an all-gather over the expt_tp group and a
  reduce-scatter back; TEGroupedLinear splits an expert's units over etp and keeps the
  gathered input.

So with mixtral-8x7b (h 4,096, experts 8 x top-2, 14,336 wide, gated) at s = 4,096:
a rank's experts compute 2 x (s / tp) x top_k x 3 x h x ffn FLOPs whatever etp is, hold
8 / ep experts of 3 x h x ffn / etp weights, and keep etp x (s / tp) x top_k x h inputs.
"""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.saved import saved_tensors
from ppsim.costs.transformer import held_params
from ppsim.job.model import build_job
from ppsim.job.traffic import dispatcher_tp_ms

S, H, FFN, E, K = 4096, 4096, 14336, 8, 2


def _cfg(**model: object) -> object:
    fields = {"preset": "mixtral-8x7b", "num_layers": 2, "seq_length": S,
              "micro_batch_size": 1, **model}
    return config_from_dict({"model": fields, "pipeline": {"pp": 1, "microbatches": 1},
                             "hardware": {"preset": "h100-80gb"}})


def _arch(**model: object) -> object:
    return _cfg(**model).model.arch


def _expert_flops(a: object) -> float:
    return sum(op.flops for op in mlp_ops(a, "moe") if op.name.startswith("experts."))


@pytest.mark.parametrize("tp, etp, ep, dp", [(2, 1, 8, 4), (2, 2, 8, 8), (4, 1, 4, 2),
                                             (4, 2, 2, 2), (1, 2, 4, 8), (8, 1, 8, 1)])
def test_the_experts_matmuls_weights_and_kept_input_follow_etp(tp, etp, ep, dp) -> None:
    a = _arch(tp=tp, etp=etp, ep=ep, dp=dp)
    tokens = S / tp  # a rank's own, sequence parallel
    assert _expert_flops(a) == pytest.approx(2 * tokens * K * 3 * H * FFN, rel=1e-6)
    fc1 = next(op for op in mlp_ops(a, "moe") if op.name == "experts.fc1")
    assert fc1.shape == (int(etp * tokens * K * ep / E), 2 * FFN // etp, H)  # one expert's
    assert held_params(a, "moe").experts == E // ep * 3 * H * FFN / etp
    assert saved_tensors(a, "moe")["experts.fc1_in"] == etp * tokens * K * H * 2


def test_at_expert_tp_equal_to_tp_each_rank_keeps_every_gathered_copy() -> None:
    """The defect: at tp 2 (etp = tp, Megatron's default) the grouped linear keeps the
    all-gathered s x top_k copies, not 1 / tp of them (what etp 1 keeps)."""
    assert saved_tensors(_arch(tp=2, ep=4, dp=4), "moe")["experts.fc1_in"] == S * K * H * 2
    assert saved_tensors(_arch(tp=2, etp=1, ep=8, dp=4), "moe")["experts.fc1_in"] \
        == S * K * H * 2 / 2


def _gather_ms(nbytes: float, n: int) -> float:
    """nccl-tests' all-gather inside a node on the H100 preset: 1 us a step, 450 GB/s."""
    return (n - 1) * 1e-3 + (n - 1) / n * nbytes / 450e6


@pytest.mark.parametrize("tp, etp, ep, dp", [(4, 1, 4, 2), (4, 2, 2, 2), (4, 4, 2, 2),
                                             (1, 2, 4, 8)])
def test_the_dispatcher_gathers_over_the_expert_tp_group(tp, etp, ep, dp) -> None:
    cfg = _cfg(tp=tp, etp=etp, ep=ep, dp=dp)
    job = build_job(cfg)
    copies = etp * (S / tp) * K * H * 2  # etp ranks' routed copies, bf16
    want = 0.0 if etp == 1 else 2 * _gather_ms(copies, etp)
    assert dispatcher_tp_ms(job, job.arch) == pytest.approx(want, rel=1e-9)


def _groups(tp: int, etp: int, ep: int, dp: int) -> dict:
    cfg = _cfg(tp=tp, etp=etp, ep=ep, dp=dp)
    return build_job(cfg).describe()


def test_folding_puts_the_expert_group_inside_a_node() -> None:
    """tp 8 on 8-GPU nodes: at etp 8 the ep group strides over nodes; at etp 1 it is the
    node's eight ranks and the all-to-all stays on NVLink."""
    assert _groups(8, 8, 8, 8)["crosses_nodes"]["ep"] is True
    folded = _groups(8, 1, 8, 8)
    assert folded["crosses_nodes"]["ep"] is False and folded["etp"] == 1
    assert _groups(8, 0, 8, 8)["etp"] == 8  # unset: tp


@pytest.mark.parametrize("model, field, words", [
    ({"tp": 2, "etp": 2, "ep": 8, "dp": 4}, "model.etp",
     "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)"),
    ({"tp": 1, "ep": 8, "dp": 4}, "model.ep",
     "world_size (4) is not divisible by expert_tensor_model_pipeline_parallel size (8)"),
    ({"tp": 2, "etp": 3, "ep": 1, "dp": 3}, "model.etp", "does not divide "
     "moe_ffn_hidden_size"),
])
def test_megatrons_expert_world_rules_are_refused_in_its_words(model, field, words, tmp_path,
                                                               capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text("\n".join(["[model]", 'preset = "mixtral-8x7b"',
                               *(f"{k} = {v}" for k, v in model.items()),
                               "[pipeline]", "pp = 1"]) + "\n")
    assert main(["simulate", "--config", str(path), "--hardware", "h100-80gb"]) == 2
    err = capsys.readouterr().err
    assert field in err and words in err and len(err.strip().splitlines()) == 1, err


def test_outside_pp_last_orders_the_two_data_parallel_sizes_agree(capsys) -> None:
    base = ["simulate", "--preset", "mixtral-8x7b", "--hardware", "h100-80gb", "--tp", "2",
            "--ep", "8", "--etp", "1", "--gpus", "16", "--pp", "2",
            "--global-batch-size", "16"]
    assert main([*base, "--json"]) == 0
    capsys.readouterr()
    assert main([*base, "--use-tp-pp-dp-mapping"]) == 2
    err = capsys.readouterr().err
    assert "When not using pp-last rank ordering, the data parallel size of the attention " \
        "and moe layers must be the same" in err


def test_a_megatron_launch_lines_expert_tp_is_priced_and_read_back(capsys) -> None:
    """Megatron's flag is priced (it was refused), and the plan prints it where the shape
    folds; its launch line reads back into the same job."""
    line = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--ffn-hidden-size 4096 --num-experts 16 --moe-router-topk 2 --swiglu "
            "--moe-ffn-hidden-size 1024 --tensor-model-parallel-size 2 --sequence-parallel "
            "--expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
            "--micro-batch-size 1 --global-batch-size 32 --moe-token-dispatcher-type alltoall "
            "--vocab-size 32000")
    sim = ["simulate", *shlex.split(line), "--hardware", "h100-80gb", "--gpus", "16", "--json"]
    assert main(sim) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert (job["tp"], job["ep"], job["etp"], job["dp"]) == (2, 8, 1, 8)
    plan = ["plan", *shlex.split(line), "--hardware", "h100-80gb", "--gpus", "16",
            "--tp", "2", "--pp", "1", "--time-budget", "30", "--json"]
    assert main(plan) in (0, 3)
    best = json.loads(capsys.readouterr().out)["best"]
    flags = best["megatron_job_flags"]
    assert "--expert-tensor-parallel-size 1" in flags and best["etp"] == 1
    assert main(["simulate", *shlex.split(line.split(" --tensor-model")[0]), "--vocab-size",
                 "32000", *shlex.split(flags), "--hardware", "h100-80gb", "--gpus", "16",
                 "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["job"]["etp"] == 1
    assert back["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([1, 2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8, 16]))
def test_folding_moves_no_work_and_loses_no_weight(tp, etp, ep, dp) -> None:
    """Whatever the fold, a rank's experts do the same FLOPs (its own tokens' share),
    the experts' weights over the etp x ep x edp world are each held edp times, and edp
    is the dense world's ranks over etp x ep."""
    if (tp * dp) % (etp * ep) or FFN % etp:
        return
    a = _arch(tp=tp, etp=etp, ep=ep, dp=dp)
    assert _expert_flops(a) == pytest.approx(2 * S / tp * K * 3 * H * FFN, rel=1e-6)
    edp = tp * dp // (etp * ep)
    assert held_params(a, "moe").experts * etp * ep * edp == pytest.approx(
        E * 3 * H * FFN * edp, rel=1e-12)
    assert a.expert_dp == edp


def test_torchtitans_fsdp_keeps_each_expert_whole() -> None:
    """torchtitan's experts' mesh is efsdp x ep, efsdp = dp_shard x cp x tp / ep
    (torchtitan/distributed/parallel_dims.py): no expert is split over tp."""
    a = _arch(tp=2, ep=8, dp=4, fsdp=True)
    assert a.expert_tp == 1 and a.expert_dp == 4 * 2 // 8
    assert held_params(a, "moe").experts == E // 8 * 3 * H * FFN
    job = build_job(_cfg(tp=8, ep=8, dp=8, fsdp=True)).describe()
    assert job["etp"] == 1 and job["crosses_nodes"]["ep"] is False  # a node's 8 ranks


def test_an_expert_tp_under_torchtitans_fsdp_is_refused(capsys) -> None:
    assert main(["simulate", "--preset", "mixtral-8x7b", "--hardware", "h100-80gb", "--tp",
                 "2", "--ep", "4", "--etp", "2", "--fsdp", "--gpus", "16",
                 "--global-batch-size", "16"]) == 2
    err = capsys.readouterr().err
    assert "model.etp: 2: torchtitan splits each expert over tp without expert " \
        "parallelism and over no ranks with it" in err


def test_the_sharding_search_offers_fsdp_only_with_torchtitans_expert_split(capsys) -> None:
    assert main(["plan", "--preset", "mixtral-8x7b", "--num-layers", "8", "--hardware",
                 "h100-80gb", "--gpus", "16", "--global-batch-size", "32", "--pp", "1",
                 "--search", "sharding", "--time-budget", "30", "--top", "60", "--json"]) in (0, 3)
    rows = json.loads(capsys.readouterr().out)["candidates"]
    titan = [c for c in rows if c["fsdp_framework"] == "torchtitan"]
    # torchtitan splits each expert over tp without expert parallelism, else over none
    assert titan and all(c["etp"] == (c["tp"] if c["ep"] == 1 else 1) for c in titan)
    assert any(c["etp"] == c["tp"] > 1 for c in rows)
    # Megatron-FSDP splits experts over etp as Megatron does.
    assert any(c["etp"] == c["tp"] > 1 for c in rows if c["fsdp_framework"] == "megatron-fsdp")


def test_the_job_line_names_a_folded_expert_tp(capsys) -> None:
    base = ["simulate", "--preset", "mixtral-8x7b", "--hardware", "h100-80gb", "--tp", "2",
            "--ep", "8", "--gpus", "16", "--pp", "1", "--global-batch-size", "16"]
    assert main([*base, "--etp", "1"]) == 0
    assert "(tp 2 cp 1 ep 8 etp 1 dp 8 pp 1)" in capsys.readouterr().out
    assert main([*base, "--etp", "2", "--ep", "4"]) == 0
    assert "(tp 2 cp 1 ep 4 dp 8 pp 1)" in capsys.readouterr().out


def test_the_plan_table_tells_a_folded_expert_tp_from_an_unfolded_one(capsys) -> None:
    """The table's shape cell names etp where it is not tp: without it, tp 2 ep 8 at
    etp 1 and at etp 2 print as one shape."""
    assert main(["plan", "--preset", "mixtral-8x7b", "--num-layers", "8", "--hardware",
                 "h100-80gb", "--gpus", "16", "--global-batch-size", "32", "--pp", "1",
                 "--tp", "2", "--ep", "8", "--time-budget", "30", "--top", "20"]) in (0, 3)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    shapes = [" ".join(w for w in r if w[:2] in ("tp", "cp", "ep", "et", "pp", "dp"))
              for r in rows if "tp2" in r]
    assert "tp2 cp1 ep8 etp1 pp1 dp8" in shapes
    assert "tp2 cp1 ep8 pp1 dp8" in shapes


def test_an_expert_tp_alone_gathers_inside_each_microbatch() -> None:
    """tp 1, ep 1, etp 2: the only collective is the dispatcher's gather over etp, and
    the layer waits for it."""
    from ppsim.costs.transformer import accelerator, transformer_costs
    from ppsim.job.layers import job_costs

    cfg = _cfg(tp=1, etp=2, ep=1, dp=2)
    job, acc = build_job(cfg), accelerator(cfg.hardware)
    alone = transformer_costs(job.arch, acc).layers[0].forward_ms
    gather = 2 * _gather_ms(2 * S * K * H * 2, 2)
    assert job_costs(job, acc).layers[0].forward_ms - alone == pytest.approx(gather, rel=1e-6)


def test_a_dense_model_with_cp_outside_pp_last_orders_is_refused_as_megatron_asserts(
        capsys) -> None:
    """Megatron builds the expert grid for every model: a dense one's is tp x 1 x (cp x
    dp) x pp, so with --use-tp-pp-dp-mapping, pp > 1 and cp > 1 its data-parallel sizes
    differ and initialize_model_parallel asserts."""
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2",
            "--cp", "2", "--gpus", "16", "--pp", "2", "--global-batch-size", "16",
            "--use-tp-pp-dp-mapping"]
    assert main(base) == 2
    assert "When not using pp-last rank ordering" in capsys.readouterr().err
    assert main([*base[:8], "1", *base[9:], "--json"]) == 0  # cp 1: the sizes agree
