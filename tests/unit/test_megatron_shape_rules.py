"""The job shapes Megatron-LM refuses, refused by `ppsim simulate` too: exit 2, one line
naming the field and the fix. Each expected rule is restated from Megatron's source
(megatron/training/arguments.py validate_args, megatron/core/transformer/
transformer_config.py TransformerConfig.__post_init__, megatron/core/tensor_parallel/
mappings.py), not taken from ppsim's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job.model import build_job

SIMULATE = ["simulate", "--hardware", "h100-80gb", "--microbatches", "4"]


def refused(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """The one line `ppsim simulate` refuses `argv` with (exit 2)."""
    rc = main([*SIMULATE, *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    return err


def test_simulate_refuses_tokens_sequence_parallelism_cannot_scatter(capsys) -> None:
    # mappings.py _split_along_first_dim: "First dimension of the tensor should be
    # divisible by tensor parallel size"; 4,100 tokens over tp 8 leave 4; 4,104 = 8 x 513.
    err = refused(capsys, "--preset", "llama3-70b", "--pp", "8", "--tp", "8",
                  "--sequence-parallel", "--seq-length", "4100")
    assert "model.seq_length" in err and "divisible by tensor parallel size" in err
    assert "--seq-length 4104" in err and "--no-sequence-parallel" in err
    # without sequence parallelism no tensor is scattered by tokens
    assert main([*SIMULATE, "--preset", "llama3-70b", "--pp", "8", "--tp", "8",
                 "--no-sequence-parallel", "--seq-length", "4100"]) == 0


def test_under_cp_a_ranks_share_of_the_tokens_scatters_over_tp(capsys) -> None:
    # 4,100 % (2 x 2) == 0 (arguments.py), but a cp rank's 2,050 tokens do not split over 4
    err = refused(capsys, "--preset", "llama3-8b", "--num-layers", "4", "--tp", "4",
                  "--cp", "2", "--seq-length", "4100")
    assert "2,050 tokens do not divide over tp = 4" in err and "--seq-length 4104" in err


def test_run_refuses_the_same_tokens_in_the_same_words(capsys) -> None:
    # `run` checks its context-parallel split before any process starts, by the same
    # rule as simulate: a cp rank's 66 tokens do not split over 4; 136 / 2 = 68 = 4 x 17
    assert main(["run", "--preset", "tiny-gpt", "--pp", "2", "--cp", "2", "--tp", "4",
                 "--seq-length", "132", "--microbatches", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "66 tokens do not divide over tp = 4" in err[0], err
    assert "--seq-length 136" in err[0]


def _megatron_refuses(seq: int, tp: int, cp: int) -> bool:
    """arguments.py: 'seq-length should be a multiple of 2 * context-parallel-size if
    context-parallel-size > 1'; under sequence parallelism the embedding scatters a cp
    rank's seq / cp tokens over tp (_split_along_first_dim asserts they divide)."""
    return (cp > 1 and seq % (2 * cp) != 0) or (seq // cp) % tp != 0


@settings(max_examples=40)
@given(seq=st.integers(64, 4200), tp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2, 3, 4]))
def test_a_config_runs_exactly_the_sequences_megatron_runs(seq: int, tp: int,
                                                           cp: int) -> None:
    cfg = {"model": {"preset": "llama3-8b", "num_layers": 2, "tp": tp, "cp": cp,
                     "seq_length": seq, "sequence_parallel": True},
           "pipeline": {"pp": 1, "microbatches": 2}, "hardware": {"preset": "h100-80gb"}}
    try:
        build_job(config_from_dict(cfg))
        ran = True
    except UserError as e:
        assert e.field in ("model.cp", "model.seq_length")
        ran = False
    assert ran is not _megatron_refuses(seq, tp, cp)


def _parsed(**model) -> str | None:
    """The field a [model] table (over llama3-8b's, 4 layers) is refused by as a job, or
    None."""
    try:
        build_job(config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, **model},
                                    "pipeline": {"pp": 1, "microbatches": 2}}))
    except UserError as e:
        return e.field
    return None


def test_a_hidden_size_the_heads_do_not_divide_needs_its_head_dim(capsys) -> None:
    # arguments.py: `assert args.hidden_size % args.num_attention_heads == 0` only where
    # kv_channels is None; given, each head is kv_channels wide whatever the hidden size
    assert _parsed(hidden_size=4100) == "model.hidden_size"
    assert _parsed(hidden_size=4100, head_dim=128) is None
    err = refused(capsys, "--preset", "llama3-8b", "--num-layers", "4", "--num-attention-heads",
                  "48")  # 4,096 / 48 heads
    assert "model.hidden_size: 4,096 is not divisible by num_heads = 48" in err
    assert "--kv-channels" in err


@settings(max_examples=30)
@given(tp=st.sampled_from([1, 2, 4, 8]), ffn=st.integers(1024, 16384))
def test_tp_divides_a_dense_mlps_width(tp: int, ffn: int) -> None:
    # MLP's linear_fc2 is a RowParallelLinear: input_size_per_partition =
    # divide(ffn_hidden_size, tp) (ensure_divisibility: "{} is not divisible by {}")
    assert _parsed(tp=tp, ffn_hidden_size=ffn) == (
        "model.ffn_hidden_size" if ffn % tp else None)


def test_a_stack_of_moe_layers_builds_no_dense_mlp() -> None:
    # every layer MoE: no MLP of ffn_hidden_size is built, so tp need not divide it
    moe = {"num_experts": 8, "top_k": 2, "moe_ffn_hidden_size": 1024, "layers": "moe*4",
           "tp": 4, "ffn_hidden_size": 14334}
    assert _parsed(**moe) is None
    assert _parsed(**{**moe, "layers": "dense*1,moe*3"}) == "model.ffn_hidden_size"


def test_tp_divides_the_shared_experts_width() -> None:
    # SharedExpertMLP (moe/shared_experts.py) is an MLP on pg_collection.tp, the dense
    # tensor-parallel group: its width moe_shared_expert_intermediate_size divides by tp
    # even where the routed experts run at etp 1
    moe = {"num_experts": 8, "top_k": 2, "moe_ffn_hidden_size": 1026, "layers": "moe*4",
           "tp": 4, "etp": 1}
    assert _parsed(**moe) is None  # no shared expert
    assert _parsed(**moe, shared_experts=1) == "model.shared_experts"  # 1,026 % 4
    assert _parsed(**moe, shared_experts=2) is None  # 2,052 = 4 x 513


def test_mtp_runs_beside_rotary_positions_only(capsys) -> None:
    # arguments.py validate_args: "Multi-Token Prediction (MTP) is not supported with
    # learned_absolute position embedding type"; GPT-3's positions are learned
    err = refused(capsys, "--preset", "gpt3-1.3b", "--pp", "2", "--mtp-num-layers", "1")
    assert "model.mtp_layers" in err and "learned_absolute" in err
    assert _parsed(mtp_layers=1) is None  # Llama's rotary positions
    assert _parsed(mtp_layers=1, position="learned") == "model.mtp_layers"


def test_tp_beyond_the_key_value_groups_says_what_megatron_does() -> None:
    # TransformerConfig.__post_init__ refuses num_query_groups neither a multiple nor a
    # divisor of tp; at tp a multiple of them Attention all-gathers the QKV activations
    # (num_query_groups < world_size in attention.py), which ppsim prices
    # (tests/unit/test_kv_split.py)
    assert config_from_dict({"model": {"preset": "llama3-8b", "tp": 16}}).model.arch.tp == 16
    with pytest.raises(UserError, match=r"num_query_groups \(6\) must be a multiple or "
                       r"divisor of tensor_model_parallel_size \(4\)"):
        config_from_dict({"model": {"preset": "llama3-8b", "num_heads": 24, "num_kv_heads": 6,
                                    "head_dim": 128, "tp": 4}})
