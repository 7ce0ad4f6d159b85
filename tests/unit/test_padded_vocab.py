"""Megatron's --padded-vocab-size: the model's vocabulary taken as it is, not padded.

Megatron-LM's own post-training configs (examples/post_training/modelopt/conf: Qwen2.5,
Kimi K2, Llama 4, gpt-oss, Nemotron Nano 9B v2) give the vocabulary as
--padded-vocab-size, which was "unrecognized arguments". Megatron uses it over
--vocab-size and pads nothing (megatron/training/argument_utils.py); its vocab-parallel
embedding and output layer then need it to divide by tp (`divide`, which asserts
"{} is not divisible by {}")."""

from __future__ import annotations

import argparse
import json
import shlex

from helpers import run_main as _run
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.parallel_rules import parallel_shape
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import padded_vocab
from ppsim.errors import UserError
from ppsim.job.flops import iteration_flops

# Qwen2.5-7B-Instruct's MODEL_ARGS in Megatron-LM's modelopt conf, the model part.
QWEN25_7B = ("--num-layers 28 --hidden-size 3584 --ffn-hidden-size 18944 "
             "--num-attention-heads 28 --group-query-attention --num-query-groups 4 "
             "--seq-length 4096 --max-position-embeddings 32768 --swiglu "
             "--normalization RMSNorm --position-embedding-type rope "
             "--untie-embeddings-and-output-weights --disable-bias-linear --add-qkv-bias "
             "--bf16 --padded-vocab-size 152064")


def _arch(argv: str) -> Architecture:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return config_from_args(p.parse_args(shlex.split(argv))).model.arch


def test_padded_vocab_size_is_taken_as_it_is() -> None:
    """At tp 4, --vocab-size 152064 pads to a multiple of 128 x 4 = 512 (152,064 = 297 x
    512: none), but 151,936 pads to 152,064; --padded-vocab-size 151936 keeps 151,936."""
    assert padded_vocab(_arch(f"{QWEN25_7B} --tp 4")) == 152064
    given_as_is = _arch(QWEN25_7B.replace("152064", "151936") + " --tp 4")
    assert given_as_is.vocab_size == 151936 and not given_as_is.pad_vocab
    assert padded_vocab(given_as_is) == 151936
    padded = _arch(QWEN25_7B.replace("--padded-vocab-size 152064", "--vocab-size 151936")
                   + " --tp 4")
    assert padded.pad_vocab and padded_vocab(padded) == 152064


def test_padded_vocab_size_wins_over_vocab_size() -> None:
    """Megatron reads --padded-vocab-size when both are given."""
    a = _arch(f"{QWEN25_7B} --vocab-size 151643")
    assert (a.vocab_size, a.pad_vocab) == (152064, False)


def test_megatron_flops_count_the_vocabulary_as_given() -> None:
    """Megatron's count (training.py, num_floating_point_operations) has the logit layer
    as 3 (forward and backward) x 2 x tokens x hidden x padded vocabulary: 128 fewer
    entries are 6 x tokens x 3584 x 128 fewer FLOPs."""
    a = _arch(QWEN25_7B)
    b = _arch(QWEN25_7B.replace("152064", "151936"))
    tokens = 16 * 4096
    assert iteration_flops(a, 16) - iteration_flops(b, 16) == 6 * tokens * 3584 * 128


def test_a_vocabulary_tp_does_not_divide_is_refused_as_megatron_asserts() -> None:
    code, _, err = _run(["simulate", *shlex.split(QWEN25_7B.replace("152064", "151937")),
                         "--tp", "4", "--hardware", "h100-80gb"])
    assert code == 2
    lines = [x for x in err.splitlines() if not x.startswith("note: ")]
    assert len(lines) == 1 and "151937 is not divisible by 4" in lines[0]
    assert "--vocab-size" in lines[0]  # the fix: let Megatron pad it
    assert _run(["simulate", *shlex.split(QWEN25_7B.replace("152064", "151937")),
                 "--hardware", "h100-80gb"])[0] == 0  # tp 1 divides anything


def test_the_job_search_skips_the_tensor_parallel_sizes_the_vocabulary_refuses() -> None:
    """151,937 is odd: only tp 1 splits it, so every shape the search offers has tp 1,
    where with --vocab-size (padded) it offers larger ones."""
    odd = QWEN25_7B.replace("152064", "151937").replace("--num-layers 28", "--num-layers 4")
    shapes = []
    for model in (odd, odd.replace("--padded-vocab-size", "--vocab-size")):
        code, out, err = _run(["plan", *shlex.split(model), "--gpus", "16",
                               "--global-batch-size", "64", "--hardware", "h100-80gb",
                               "--time-budget", "4", "--top", "20", "--json"])
        assert code == 0, err
        shapes.append({c["tp"] for c in json.loads(out)["candidates"]})
    assert shapes[0] == {1}
    assert max(shapes[1]) > 1


def test_presets_print_it_back_and_it_reads_back() -> None:
    a = _arch(f"{QWEN25_7B} --tp 2")
    line = " ".join(megatron_model_args(a))
    assert "--padded-vocab-size 152064" in line and "--vocab-size" not in line
    b = _arch(f"{line} --tp 2")
    assert (b.vocab_size, b.pad_vocab) == (a.vocab_size, a.pad_vocab)


@given(vocab=st.integers(1, 300_000), tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
       divisor=st.sampled_from([1, 64, 128]))
def test_padding_rules(vocab: int, tp: int, divisor: int) -> None:
    """Padded: the least multiple of divisor x tp at or above the vocabulary. As given:
    itself, accepted exactly when tp divides it."""
    heads = {"num_heads": 48, "num_kv_heads": 48, "tp": tp}
    a = Architecture(num_layers=1, hidden_size=64, num_heads=48, num_kv_heads=48,
                     ffn_hidden_size=256, vocab_size=vocab, seq_length=16, tp=tp,
                     vocab_divisor=divisor)
    m = divisor * tp
    p = padded_vocab(a)
    assert p % m == 0 and vocab <= p < vocab + m
    as_is = Architecture(**{**a.__dict__, "pad_vocab": False})
    assert padded_vocab(as_is) == vocab
    try:
        parallel_shape({**heads, "vocab_size": vocab, "pad_vocab": False})
        refused = False
    except UserError:
        refused = True
    assert refused == (vocab % tp != 0)
    parallel_shape({**heads, "vocab_size": vocab})  # padded: any size
