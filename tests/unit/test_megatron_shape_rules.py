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
