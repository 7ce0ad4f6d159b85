"""torchtitan's MoE under tensor parallelism (torchtitan b5bcd76, models/common/
moe_sharding.py, distributed/parallel_dims.py), restated from its rules: without expert
parallelism (ep 1) the routed experts are TP-sharded like a dense MLP (w1/w3 colwise,
w2 rowwise over tp), the block's input is gathered to every tensor rank, which routes
all of it, and the output reduce-scattered back; with it (ep > 1) each expert is whole
on one ep rank, the tokens stay sequence-sharded, and only the shared experts gather."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.saved import saved_tensors
from ppsim.costs.transformer import held_params

S, B = 4096, 2
H, E, K, F = 2048, 128, 8, 768  # qwen3-30b-a3b: hidden, experts, top-k, expert width


def _arch(preset: str = "qwen3-30b-a3b", **model: object):
    return config_from_dict({"model": {"preset": preset, "num_layers": 4, "seq_length": S,
                                       "micro_batch_size": B, **model},
                             "pipeline": {"pp": 1, "microbatches": 1}}).model.arch


def _titan(preset: str = "qwen3-30b-a3b", **model: object):
    return _arch(preset, fsdp=True, dp=2, **model)


@pytest.mark.parametrize(("tp", "ep", "split"), [(4, 1, 4), (2, 1, 2), (4, 4, 1), (4, 2, 1),
                                                 (1, 2, 1)])
def test_each_rank_holds_the_experts_torchtitan_places_there(tp: int, ep: int,
                                                             split: int) -> None:
    """ep 1: every expert, 1/tp of each (grouped-GEMM TP); ep > 1: E/ep experts whole."""
    experts_params = E * 3 * H * F  # gated: w1, w3 (F x H) and w2 (H x F)
    got = held_params(_titan(tp=tp, ep=ep), "moe").experts
    assert got == pytest.approx(experts_params / (ep * split))


def test_without_expert_parallelism_every_tp_rank_computes_every_token() -> None:
    """The experts' GEMMs take all the microbatch's pairs at 1/tp of the width, and the
    router scores all the gathered tokens on each rank."""
    tp, tok = 4, S * B
    ops = {op.name: op for op in mlp_ops(_titan(tp=tp, ep=1), "moe")}
    per_expert = tok * K // E
    assert ops["experts.fc1"].shape == (per_expert, 2 * F // tp, H)
    assert ops["experts.fc2"].shape == (per_expert, H, F // tp)
    assert ops["experts.fc1"].flops == pytest.approx(2 * tok * K * 2 * F * H / tp)
    assert ops["router"].flops == pytest.approx(2 * tok * E * H)


def test_with_expert_parallelism_each_rank_computes_its_own_tokens_whole() -> None:
    tp, ep, tok = 4, 4, S * B
    ops = {op.name: op for op in mlp_ops(_titan(tp=tp, ep=ep), "moe")}
    # the rank's tok / tp tokens' pairs, spread over E experts, ep of whose shares it takes
    assert ops["experts.fc1"].shape == (tok * K // tp * ep // E, 2 * F, H)
    assert ops["router"].flops == pytest.approx(2 * tok * E * H / tp)


def test_without_expert_parallelism_the_experts_keep_every_pair_whole_wide() -> None:
    """The grouped GEMM's input is every pair at the hidden width (the tokens are
    gathered), and the score product keeps the experts' whole-width partial output."""
    tp, w, pairs = 4, 2, S * B * K
    got = saved_tensors(_titan(tp=tp, ep=1), "moe")
    assert got["experts.fc1_in"] == pytest.approx(pairs * H * w)
    assert got["experts.out"] == pytest.approx(pairs * H * w)
    got = saved_tensors(_titan(tp=tp, ep=4), "moe")
    assert got["experts.fc1_in"] == pytest.approx(pairs * H * w / tp)


def test_the_moe_block_gathers_its_tokens_like_a_dense_mlp() -> None:
    """ep 1: the block's gather and scatter (a second sublayer beside attention's); ep > 1:
    none for the routed experts, one for the shared experts where there are some."""
    from ppsim.job.traffic import tp_sublayers  # noqa: PLC0415 (the rule's one home)

    assert tp_sublayers(_titan(tp=4, ep=1), "moe") == 2
    assert tp_sublayers(_titan(tp=4, ep=4), "moe") == 1
    assert tp_sublayers(_titan("deepseek-v3", tp=4, ep=8), "moe") == 2
    assert tp_sublayers(_titan("deepseek-v3", tp=4, ep=1), "moe") == 2
    assert tp_sublayers(_arch(tp=4, ep=1), "moe") == 1  # Megatron's dispatcher gathers


def _tp_rows(capsys, ep: int) -> dict[str, str]:
    assert main(["costs", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb",
                 "--num-layers", "4", "--parallelism.tensor_parallel_degree", "4",
                 "--parallelism.expert_parallel_degree", str(ep), "--gpus", "8",
                 "--training.max_context_length", "4096",
                 "activation-checkpoint:none"]) == 0
    out = capsys.readouterr().out
    return {" ".join(line.split()[:2]): line.split()[-2] for line in out.splitlines()
            if line.split()[2:3] == ["moe"] and line.startswith(("tp ", "etp "))}


def test_the_collectives_priced_are_the_blocks_gather_and_scatter(capsys) -> None:
    """activation-checkpoint:none: a gather and a scatter each way per sublayer; the
    MoE layer's are attention's and the MoE block's at ep 1, attention's alone at ep 4
    (its tokens travel by the all-to-all); no etp gather of the routed copies."""
    assert _tp_rows(capsys, 1) == {"tp all-gather": "4/mb", "tp reduce-scatter": "4/mb"}
    assert _tp_rows(capsys, 4) == {"tp all-gather": "2/mb", "tp reduce-scatter": "2/mb"}


def test_an_etp_other_than_torchtitans_is_refused(capsys) -> None:
    assert main(["costs", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb",
                 "--num-layers", "4", "--parallelism.tensor_parallel_degree", "4",
                 "--parallelism.expert_parallel_degree", "1", "--gpus", "8",
                 "--etp", "1"]) == 2
    err = capsys.readouterr().err
    assert "model.etp: 1: torchtitan splits each expert over tp without expert " \
        "parallelism" in err and "give etp 4" in err


def _simulate(capsys, *flags: str) -> tuple[int, str]:
    rc = main(["simulate", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb",
               "--num-layers", "4", "--global-batch-size", "32", *flags])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("flags", "region"), [
    (["--parallelism.tensor_parallel_degree", "2", "--parallelism.expert_parallel_degree",
      "16", "--gpus", "8"], 8),
    # HSDP: ep is borrowed from one replica's ranks (dp_shard 4 x tp 2), not all 16
    (["--parallelism.tensor_parallel_degree", "2", "--parallelism.expert_parallel_degree",
      "16", "--parallelism.data_parallel_replicate_degree", "2", "--gpus", "16"], 8),
    (["--fsdp", "--pp", "1", "--tp", "2", "--ep", "16", "--dp-replicas", "2",
      "--gpus", "16"], 8),
])
def test_an_ep_outside_a_replicas_ranks_is_refused_in_torchtitans_words(
        capsys, flags: list[str], region: int) -> None:
    """ParallelDims._validate: ep divides dp_shard x cp x tp (its words, not Megatron's)."""
    rc, err = _simulate(capsys, *flags)
    assert rc == 2
    assert err.strip().splitlines() == [
        f"ppsim simulate: error: parallelism.expert_parallel_degree: expert_parallel_degree "
        f"(16) must divide dp_shard * cp * tp ({region}) (give an ep dividing {region}, or "
        "more dp_shard ranks per replica)"]


def test_an_ep_inside_a_replicas_ranks_runs(capsys) -> None:
    rc, err = _simulate(capsys, "--parallelism.tensor_parallel_degree", "2",
                        "--parallelism.expert_parallel_degree", "8",
                        "--parallelism.data_parallel_replicate_degree", "2", "--gpus", "16")
    assert rc == 0, err
