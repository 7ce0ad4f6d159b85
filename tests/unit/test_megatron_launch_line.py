"""A Megatron launch line pasted whole: the training, data, checkpoint and logging
arguments beside the model and parallel ones.

Megatron's scripts pass --micro-batch-size and --global-batch-size in TRAINING_ARGS, next
to --lr and --clip-grad; `ppsim plan $TRAINING_ARGS ...` was "unrecognized arguments:
--train-iters ... --lr ..." and the user had to pick the arguments ppsim knew out by hand."""

from __future__ import annotations

import io
import json
import shlex
from contextlib import redirect_stderr

import pytest
from helpers import run_main as _run
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.cli.megatron_run import RUN, UNPRICED

# Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh, its argument arrays as
# written (paths filled in), with --vocab-size, which Megatron reads from the vocab file.
GPT_MODEL_ARGS = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 "
                  "--seq-length 2048 --max-position-embeddings 2048 --attention-backend auto "
                  "--vocab-size 50257")
TRAINING_ARGS = ("--micro-batch-size 1 --global-batch-size 1536 --step-batch-size-schedule "
                 "'0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536' --train-iters 500000 "
                 "--weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std "
                 "0.006 --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine --min-lr "
                 "6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000")
MODEL_PARALLEL_ARGS = "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16"
DATA_ARGS = ("--data-path /data/text_document --vocab-file gpt2-vocab.json --merge-file "
             "gpt2-merges.txt --split 949,50,1")
EVAL_AND_LOGGING_ARGS = ("--log-interval 100 --save-interval 10000 --eval-interval 1000 "
                         "--save /ckpt --load /ckpt --eval-iters 10 --tensorboard-dir /tb")
PRICED = shlex.split(f"{GPT_MODEL_ARGS} --micro-batch-size 1 --global-batch-size 1536 "
                     f"--init-method-std 0.006 --fp16 {MODEL_PARALLEL_ARGS}")
"""What ppsim reads of that line; the rest runs the training."""
JOB = ["--hardware", "h100-80gb", "--gpus", "1536"]


def _errors(err: str) -> list[str]:
    """The error lines (a note, such as the one on sequence parallelism, may precede)."""
    return [line for line in err.splitlines() if not line.startswith("note: ")]


def test_megatrons_example_launch_line_plans_as_pasted() -> None:
    """`ppsim plan` takes every array of Megatron's GPT-3 175B example, and prices it as
    the arguments ppsim reads alone."""
    line = shlex.split(" ".join((GPT_MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS,
                                 DATA_ARGS, EVAL_AND_LOGGING_ARGS)))
    code, whole, err = _run(["plan", *line, *JOB, "--time-budget", "2", "--json"])
    assert code == 0, err
    assert "not priced" not in err  # none of these touches an iteration
    code, priced, _ = _run(["plan", *PRICED, *JOB, "--time-budget", "2", "--json"])
    assert code == 0
    a, b = json.loads(whole)["best"], json.loads(priced)["best"]
    assert a["split"] == b["split"] and a["iteration_time_ms"] == b["iteration_time_ms"]


# Megatron-LM's examples/mamba/train.sh, its 800M options as written (paths filled in).
MAMBA_800M = ("--tensor-model-parallel-size 1 --sequence-parallel "
              "--pipeline-model-parallel-size 1 --use-distributed-optimizer "
              "--overlap-param-gather --overlap-grad-reduce "
              "--untie-embeddings-and-output-weights --init-method-std 0.02 "
              "--position-embedding-type none --hybrid-layer-pattern "
              "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M- --hidden-size 1024 "
              "--num-attention-heads 16 --group-query-attention --num-query-groups 8 "
              "--seq-length 4096 --max-position-embeddings 4096 --train-samples 73242188 "
              "--lr-warmup-samples 50000 --lr-decay-samples 73192188 --save ./checkpoints "
              "--load ./checkpoints --data-path /data --data-cache-path ./data-cache "
              "--split 99,1,0 --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "
              "/tok --distributed-backend nccl --micro-batch-size 4 --global-batch-size 32 "
              "--lr 2.5e-4 --min-lr 2.5e-5 --lr-decay-style cosine --weight-decay 0.1 "
              "--clip-grad 1.0 --attention-dropout 0.0 --hidden-dropout 0.0 "
              "--disable-bias-linear --normalization RMSNorm --adam-beta1 0.9 "
              "--adam-beta2 0.95 --log-interval 10 --save-interval 2000 --eval-interval 2000 "
              "--eval-iters 32 --bf16 --use-mcore-models --spec "
              "megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec "
              "--no-create-attention-mask-in-dataloader --tensorboard-dir ./tensorboard")


def test_megatrons_hybrid_example_plans_as_pasted() -> None:
    """Megatron's Mamba recipe (torchrun --nproc_per_node 8) with its layer --spec and
    the deprecated --hybrid-override-pattern spelling of the pattern."""
    job = ["--vocab-size", "256000", "--gpus", "8", "--time-budget", "2", "--json"]
    code, out, err = _run(["plan", *shlex.split(MAMBA_800M), *job])
    assert code == 0, err
    best = json.loads(out)["best"]
    assert (best["tp"], best["pp"], best["dp"]) == (1, 1, 8)
    old = MAMBA_800M.replace("--hybrid-layer-pattern", "--hybrid-override-pattern")
    code, again, _ = _run(["plan", *shlex.split(old), *job])
    assert code == 0 and json.loads(again)["best"]["iteration_time_ms"] == \
        best["iteration_time_ms"]


def test_megatrons_data_split_on_simulate_is_named_as_such() -> None:
    """simulate's --split is the layers of each stage; Megatron's data split pasted there
    is refused as a layer split, and the error says what it may be."""
    code, _, err = _run(["simulate", *PRICED, *JOB, *shlex.split(DATA_ARGS)])
    assert code == 2 and len(_errors(err)) == 1
    assert "pipeline.split: " in err and "if 949,50,1 is Megatron's data split" in err
    # A layer split that is wrong for another reason keeps its own message.
    code, _, err = _run(["simulate", *PRICED, *JOB, "--split", "90,3,3,0"])
    assert code == 2 and "data split" not in err
    # Beside a layout (Megatron's DeepSeek-V3 test configs give both) it is refused on the
    # layout's name; that error says what the split may be too (it did not).
    code, _, err = _run(["simulate", "--preset", "llama3-8b", "--pp", "4", "--layout",
                         "Et*8|t*8|t*8|t*8L", "--split", "99,1,0"])
    assert code == 2 and "pipeline.layout: " in err
    assert "if 99,1,0 is Megatron's data split" in err
    # Megatron-LM's example scripts keep "--split '99,1,0'" in a bash array, whose
    # expansion hands the quotes on; Megatron reads spaced weights too (neither was named).
    for text in ("'99,1,0'", "969, 30, 1", "98.5,1,0.5"):
        code, _, err = _run(["simulate", "--preset", "llama3-8b", "--split", text])
        assert code == 2 and len(_errors(err)) == 1, err
        assert f"if {text} is Megatron's data split" in err, err


def test_unpriced_switches_are_named_on_stderr_and_change_nothing() -> None:
    code, base, _ = _run(["simulate", *PRICED, *JOB, "--json"])
    assert code == 0
    switches = ["--no-rope-fusion", "--manual-gc", "--manual-gc-interval", "10",
                "--empty-unused-memory-level", "1"]
    code, out, err = _run(["simulate", *PRICED, *JOB, *switches, "--json"])
    assert code == 0 and out == base
    note = [line for line in err.splitlines() if "not priced" in line]
    assert len(note) == 1
    assert all(s in note[0] for s in ("--no-rope-fusion", "--manual-gc,",
                                      "--empty-unused-memory-level"))


def test_each_reason_gets_its_note() -> None:
    """Megatron's newer names (--cuda-graph-modules, Megatron-LM's CUDA graph guide) and
    communication tunings were "unrecognized arguments"; each group's note says why it is
    not priced, and resiliency and µP switches pass silently."""
    code, base, _ = _run(["simulate", *PRICED, *JOB, "--json"])
    switches = ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn",
                "mlp", "--use-sharp", "--no-align-grad-reduce", "--deterministic-mode",
                "--enable-ft-package", "--use-mup", "--mup-width-mult", "4",
                "--log-memory-interval", "10"]
    code, out, err = _run(["simulate", *PRICED, *JOB, *switches, "--json"])
    assert code == 0 and out == base
    notes = [line for line in err.splitlines() if "not priced" in line]
    assert len(notes) == 3
    graphs = next(n for n in notes if "--cuda-graph-modules" in n)
    assert "--cuda-graph-impl" in graphs and "from the host" in graphs
    comm = next(n for n in notes if "--use-sharp" in n)
    assert "--no-align-grad-reduce" in comm and "traffic" in comm
    assert not any(f in err for f in ("--enable-ft-package", "--use-mup", "--log-memory"))


def test_newer_switches_are_taken_with_their_reason() -> None:
    """Megatron's per-document masks, the logits' dtype, the optimizer's CUDA graph, ...
    were "unrecognized arguments"; data and checkpoint switches pass silently."""
    code, base, _ = _run(["simulate", *PRICED, *JOB, "--json"])
    switches = ["--dataloader-inter-document-masking", "--output-logit-dtype", "fp32",
                "--optimizer-cuda-graph", "--create-all-gather-group", "--no-data-sharding",
                "--enable-msc", "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"]
    code, out, err = _run(["simulate", *PRICED, *JOB, *switches, "--json"])
    assert code == 0 and out == base
    notes = [line for line in err.splitlines() if "not priced" in line]
    assert len(notes) == 4
    assert any("--dataloader-inter-document-masking" in n and "per document" in n
               for n in notes)
    assert not any(f in err for f in ("--no-data-sharding", "--enable-msc", "--no-weight"))


@pytest.mark.parametrize("extra, field", [
    (["--batch-size", "4"], "--batch-size 4"),
    (["--warmup", "10"], "--warmup 10"),
    (["--model-parallel-size", "8"], "--model-parallel-size 8"),
    (["--te-precision-config-file", "p.yaml"], "--te-precision-config-file p.yaml"),
    (["--optimizer", "sgd"], "--optimizer"),
    (["--optimizer", "adaptive_muon"], "--optimizer"),
    (["--data-parallel-sharding-strategy", "optim"], "--data-parallel-sharding-strategy optim"),
    (["--megatron-fsdp-main-grads-dtype", "fp32"], "--megatron-fsdp-main-grads-dtype fp32"),
    (["--use-tp-pp-dp-mapping", "--rank-order", "tp-cp-ep-dp-pp"], "--use-tp-pp-dp-mapping"),
])
def test_what_changes_the_job_beyond_ppsims_model_is_refused_by_name(extra: list[str],
                                                                     field: str) -> None:
    code, out, err = _run(["simulate", *PRICED, *JOB, *extra])
    assert code == 2 and out == "" and len(_errors(err)) == 1
    assert f"error: {field}: " in err and "Traceback" not in err


def test_adams_name_is_taken() -> None:
    code, base, _ = _run(["simulate", *PRICED, *JOB, "--json"])
    code2, out, _ = _run(["simulate", *PRICED, *JOB, "--optimizer", "adam", "--json"])
    assert code == code2 == 0 and out == base


def test_use_tp_pp_dp_mapping_is_megatrons_other_rank_order() -> None:
    """Megatron's initialize.py: order 'tp-cp-ep-pp-dp' under --use-tp-pp-dp-mapping."""
    job = [*PRICED, "--hardware", "h100-80gb", "--gpus", "3072", "--json"]
    _, mapped, _ = _run(["simulate", *job, "--use-tp-pp-dp-mapping"])
    _, ordered, _ = _run(["simulate", *job, "--rank-order", "tp-cp-ep-pp-dp"])
    _, default, _ = _run(["simulate", *job])
    assert json.loads(mapped)["job"]["rank_order"] == "tp-cp-ep-pp-dp"
    assert mapped == ordered and mapped != default


def test_a_misspelt_megatron_argument_is_still_refused() -> None:
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as stop:
        main(["simulate", *PRICED, *JOB, "--lr-decay-stile", "cosine"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --lr-decay-stile" in err.getvalue()


def test_commands_that_train_for_real_take_no_training_arguments_to_drop() -> None:
    """ppsim run trains with its own --lr and --seed; a Megatron --clip-grad it took and
    dropped would mislead, so it is refused there."""
    args = build_parser("run").parse_args(["run", "--seed", "3", "--lr", "1e-4"])
    assert args.seed == 3 and args.lr == 1e-4
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit):
        build_parser("run").parse_args(["run", "--clip-grad", "1.0"])
    assert "unrecognized arguments: --clip-grad" in err.getvalue()


RUN_FLAGS = sorted({f for group in RUN.values() for f in group} - {"split"})
VALUE = st.one_of(st.integers(-10**6, 10**6).map(str),
                  st.floats(-1e6, 1e6).map(lambda x: f"{x:.4f}"),
                  st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                          max_size=12).filter(lambda t: not t.startswith("-")))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(RUN_FLAGS + list(UNPRICED)),
                          st.lists(VALUE, max_size=3)), max_size=8))
def test_run_arguments_with_any_values_leave_the_config_as_it_was(extra) -> None:
    """Whatever Megatron run arguments a line holds, in any order and with any values
    Megatron's own parser takes (negative numbers, paths, none), the config ppsim prices
    is the same."""
    tail = [tok for flag, values in extra for tok in (f"--{flag}", *values)]
    parser = build_parser("simulate")
    with redirect_stderr(io.StringIO()):  # the notes
        base = config_from_args(parser.parse_args(["simulate", *PRICED, *JOB]))
        cfg = config_from_args(parser.parse_args(["simulate", *PRICED, *JOB, *tail]))
    assert cfg == base


# A layout string, stage by stage (E on the first, L on the last): `counts` layers 't'.
def _layout(counts: list[int]) -> str:
    stages = [("E" if i == 0 else "") + "t" * n + ("L" if i == len(counts) - 1 else "")
              for i, n in enumerate(counts)]
    return "|".join(stages)


@settings(max_examples=15, deadline=None)
@given(pp=st.sampled_from([1, 2, 4]), vpp=st.integers(1, 3),
       data=st.data(), microbatches=st.sampled_from([4, 8]))
def test_schedule_runs_the_chunks_a_pasted_layout_gives_as_simulate_does(
        pp: int, vpp: int, data: st.DataObject, microbatches: int) -> None:
    """`ppsim schedule` took no --pipeline-model-parallel-layout: the line a user had just
    priced with `simulate` was refused ("unrecognized arguments"), and --vpp had to be
    worked out by hand. The layout now gives the ranks' chunks, the same order simulate
    runs."""
    vpp = 1 if pp == 1 else vpp  # Megatron refuses chunks on one rank (so does ppsim)
    counts = data.draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp)
                       .filter(lambda c: sum(c) > 0))
    line = ["--num-layers", str(sum(counts)), "--pp", str(pp), "--microbatches",
            str(microbatches), "--layout", _layout(counts)]
    code, out, err = _run(["schedule", *line, "--json"])
    assert code == 0, err
    code, sim, err = _run(["simulate", *line, "--json"])
    assert code == 0, err
    order, priced = json.loads(out), json.loads(sim)
    assert (order["schedule"], order["vpp"]) == (priced["schedule"], priced["vpp"]) \
        == (("interleaved-1f1b" if vpp > 1 else "1f1b"), vpp)


def test_costs_takes_a_pasted_layout_and_checks_it_as_simulate_does() -> None:
    """`ppsim costs` refused a launch line's layout; now it takes it, and a layout that
    does not add up is refused in the same words as simulate's."""
    good = ["--num-layers", "8", "--pp", "2", "--layout", "Et*2|t*2|t*2|t*2L"]
    code, out, err = _run(["costs", *good])
    assert code == 0 and "per-piece costs" in out, err
    bad = ["--num-layers", "8", "--pp", "2", "--layout", "Et*2|t*2|t*2L"]
    code, _, err = _run(["costs", *bad])
    _, _, sim_err = _run(["simulate", *bad])
    assert code == 2 and "pipeline.layout" in err
    assert _errors(err)[-1].split(": ", 1)[1] == _errors(sim_err)[-1].split(": ", 1)[1]


def test_gpt2s_tokenizer_gives_the_vocabulary() -> None:
    """A launch line with --tokenizer-type GPT2BPETokenizer and no --vocab-size (Megatron
    reads it from gpt2-vocab.json) prices GPT-2's 50,257 tokens, padded as Megatron pads."""
    model = shlex.split(GPT_MODEL_ARGS.replace(" --vocab-size 50257", ""))
    data = shlex.split(DATA_ARGS.replace(" --split 949,50,1", ""))
    line = [*model, "--tokenizer-type", "GPT2BPETokenizer", *data,
            *PRICED[len(shlex.split(GPT_MODEL_ARGS)):]]
    code, by_tokenizer, err = _run(["simulate", *line, *JOB, "--json"])
    assert code == 0, err
    assert "50,257" in err and "GPT2BPETokenizer" in err
    code, by_size, _ = _run(["simulate", *PRICED, *JOB, "--json"])
    assert code == 0
    assert json.loads(by_tokenizer)["iteration_time_ms"] == \
        json.loads(by_size)["iteration_time_ms"]
    code, _, err = _run(["simulate", *model, *data, *JOB])
    assert code == 2 and "--tokenizer-type GPT2BPETokenizer" in err, err
    assert len(_errors(err)) == 1
