"""Fuzz the command line with the frameworks' inputs: torchtitan's dotted fields, its
config registry and `activation-checkpoint:MODE`, a DeepSpeed config and PipelineModule's
flags, Megatron's shared-expert width, DSA indexer sizes and recompute flags, mixed with
ppsim's own. Every line ends in exit 0, 2 or 3, no traceback; exit 2 says one line
`ppsim CMD: error: ...` (notes and warnings apart, on lines of their own) and prints
nothing on stdout. Hypothesis runs derandomised, so a failure reproduces."""

from __future__ import annotations

import atexit
import copy
import functools
import io
import json
import shutil
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ppsim.cli.main import _subparser, build_parser, main
from ppsim.cli.torchtitan_registry import REGISTRY

COMMANDS = ["simulate", "simulate", "plan", "split", "costs", "schedule"]
CASE_SECONDS = 30

SMALL = ["0", "1", "2", "3", "4", "8", "-1"]
HOSTILE_INT = ["16", "1000000000", "9223372036854775808", "1e3", "nan", "", "x"]
PRESETS = ["tiny-gpt", "tiny-llm", "gpt3-1.3b", "llama3-8b", "qwen3-30b-a3b",
           "deepseek-v3", "tiny-hybrid", "nope"]
WORDS = {
    "--schedule": ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev", "x"],
    "--split": ["5,3", "even", "4,4", "2,2,2,2", "-1,9", "a", ","],
    "--layout": ["Et*3|t*5L", "Et|t|t|tL", "E|L", "(("],
    "--preset": PRESETS,
    "--recompute": ["none", "full", "selective"],
    "--recompute-granularity": ["full", "selective"],
    "--recompute-method": ["uniform", "block", "x"],
    "--experimental-attention-variant": ["dsa", "x"],
    "--torchtitan-config": [*REGISTRY, "nope", ""],
    "--parallelism.pipeline_parallel_schedule": ["1F1B", "Interleaved1F1B", "GPipe",
                                                 "ZBVZeroBubble", "InterleavedZeroBubble",
                                                 "x"],
    "--parallelism.fsdp_reshard_after_forward": ["default", "always", "never", "x"],
    "--parallelism.module_fqns_per_model_part": [
        "[['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3'], "
        "['layers.4', 'layers.5', 'layers.6', 'layers.7', 'norm', 'lm_head']]",
        "[['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'lm_head']]",
        "[[]]", "[", "1" * 50, "[" * 200],
    "--training.mixed_precision_param": ["bfloat16", "float32"],
    "--training.mixed_precision_reduce": ["float32", "bfloat16"],
    "--training.dtype": ["float32", "bfloat16"],
    "--partition-method": ["parameters", "uniform", "type:x"],
}
INT_FLAGS = ["--pp", "--vpp", "--tp", "--dp", "--gpus", "--global-batch-size",
             "--micro-batch-size", "--microbatches", "--num-layers", "--seq-length",
             "--recompute-num-layers", "--hidden-size", "--num-attention-heads",
             "--ffn-hidden-size", "--num-experts", "--moe-ffn-hidden-size",
             "--moe-shared-expert-intermediate-size", "--dsa-indexer-n-heads",
             "--dsa-indexer-head-dim", "--dsa-indexer-topk", "--activation-checkpoint-interval",
             "--parallelism.tensor_parallel_degree", "--parallelism.context_parallel_degree",
             "--parallelism.expert_parallel_degree", "--parallelism.pipeline_parallel_degree",
             "--parallelism.data_parallel_shard_degree",
             "--parallelism.data_parallel_replicate_degree",
             "--parallelism.num_pp_microbatches",
             "--parallelism.pipeline_parallel_layers_per_stage",
             "--parallelism.pipeline_parallel_first_stage_less_layers",
             "--parallelism.pipeline_parallel_last_stage_less_layers",
             "--training.max_context_length"]
TOKEN_FLAGS = ["--training.num_tokens_per_microbatch_per_dp_rank",
               "--training.num_tokens_per_train_step"]
SWITCHES = ["--bf16", "--multi-latent-attention", "--compile.enable",
            "--compile.enable_async_tensor_parallel", "--use-distributed-optimizer",
            "--sequence-parallel", "--json"]
AC_WORDS = ["activation-checkpoint:full", "activation-checkpoint:none",
            "activation-checkpoint:selective", "activation_checkpoint:full",
            "activation-checkpoint:", "activation-checkpoint:memory_budget"]


@st.composite
def flag_words(draw: st.DrawFn, takes: frozenset[str] | None = None) -> list[str]:
    """One flag and its value (mostly small numbers and real names, some hostile); with
    `takes`, mostly a flag the command takes."""
    kind = draw(st.sampled_from(["int", "int", "int", "word", "word", "tokens", "switch",
                                 "ac", "ds"]))
    if kind == "int":
        words = [draw(st.sampled_from(INT_FLAGS)),
                 draw(st.sampled_from(SMALL * 3 + HOSTILE_INT))]
    elif kind == "word":
        flag = draw(st.sampled_from(sorted(WORDS)))
        words = [flag, draw(st.sampled_from(WORDS[flag]))]
    elif kind == "tokens":
        tokens = draw(st.sampled_from(["64", "128", "256", "8192", "16384", "65536", "-1",
                                       "0", "100", "x"]))
        words = [draw(st.sampled_from(TOKEN_FLAGS)), tokens]
    elif kind == "switch":
        words = [draw(st.sampled_from(SWITCHES))]
    elif kind == "ac":
        words = [draw(st.sampled_from(AC_WORDS))]
    else:
        words = ["--deepspeed-config", DS_PATH]
    flag = words[0].split(":")[0].replace("activation-checkpoint", "--activation-checkpoint")
    if takes is not None and flag not in takes and draw(st.integers(0, 9)):
        return []  # a flag the command does not take: now and then, its one-line refusal
    return words


@functools.cache
def _takes(command: str) -> frozenset[str]:
    """The option strings `command` takes."""
    sub = _subparser(build_parser(command), command)
    return frozenset(sub._option_string_actions)  # noqa: SLF001


@st.composite
def lines(draw: st.DrawFn) -> list[str]:
    """A command line: a command, a small preset most of the time, one to six flags."""
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command == "plan":
        argv += ["--time-budget", "1"]
    if draw(st.integers(0, 3)):
        argv += ["--preset", draw(st.sampled_from(PRESETS[:4]))]
    for _ in range(draw(st.integers(1, 6))):
        argv += draw(flag_words(_takes(command)))
    if command == "plan" and "--gpus" in argv:  # a small job search, within the budget
        argv += ["--gpus", draw(st.sampled_from(["1", "2", "4", "8"]))]
        if draw(st.integers(0, 3)):
            argv += ["--global-batch-size", draw(st.sampled_from(["8", "16", "64"]))]
    return argv


def _some(draw: st.DrawFn, options: dict[str, list[str]]) -> list[str]:
    """A few of `options`' flags, each with one of its values."""
    out: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(options)), max_size=5, unique=True)):
        out += [flag, draw(st.sampled_from(options[flag]))]
    return out


DEGREE = ["1", "1", "2", "2", "4", "0", "-1"]
TT_FIELDS = {
    "--parallelism.tensor_parallel_degree": DEGREE,
    "--parallelism.pipeline_parallel_degree": DEGREE + ["2", "4"],
    "--parallelism.expert_parallel_degree": DEGREE,
    "--parallelism.context_parallel_degree": DEGREE,
    "--parallelism.data_parallel_shard_degree": ["-1", "1", "2", "0", "-2"],
    "--parallelism.data_parallel_replicate_degree": DEGREE,
    "--parallelism.num_pp_microbatches": ["1", "2", "4", "8", "0"],
    "--parallelism.pipeline_parallel_layers_per_stage": ["1", "2", "3", "4", "0"],
    "--parallelism.pipeline_parallel_first_stage_less_layers": ["0", "1", "2", "-1"],
    "--parallelism.pipeline_parallel_last_stage_less_layers": ["0", "1", "2", "-1"],
    "--parallelism.pipeline_parallel_schedule": WORDS["--parallelism.pipeline_parallel_"
                                                      "schedule"],
    "--parallelism.module_fqns_per_model_part":
        WORDS["--parallelism.module_fqns_per_model_part"],
    "--training.max_context_length": ["64", "128", "4096", "8192", "0", "7"],
    "--training.num_tokens_per_microbatch_per_dp_rank": ["64", "128", "8192", "16384", "100",
                                                         str(8192 * 10**12)],
    "--training.num_tokens_per_train_step": ["-1", "256", "512", "65536", "100", "0",
                                             str(8192 * 10**12)],
    "--gpus": ["1", "2", "4", "8", "16", "0"],
    "--dp": ["1", "2", "4"],
}
MOE_FIELDS = {
    "--num-experts": ["2", "4", "8", "0", "1"],
    "--moe-ffn-hidden-size": ["16", "32", "64", "0", "-1"],
    "--moe-shared-expert-intermediate-size": ["0", "1", "7", "32", "48", "64", "1000", "-1",
                                              "-64", "9" * 20],
    "--moe-router-topk": ["1", "2", "4", "9", "0"],
    "--ffn-hidden-size": ["0", "64", "256"],
    "--ep": ["1", "2", "4"], "--tp": ["1", "2", "4"], "--pp": ["1", "2", "4"],
    "--recompute-method": ["uniform", "block"],
    "--recompute-num-layers": ["1", "2", "0", "-1", "100"],
    "--recompute-granularity": ["full", "selective"],
}
DSA_FIELDS = {
    "--dsa-indexer-n-heads": ["1", "4", "64", "0", "-1", "9" * 20],
    "--dsa-indexer-head-dim": ["1", "16", "128", "0", "-1"],
    "--dsa-indexer-topk": ["1", "32", "64", "2048", "0", "-1", "9" * 20],
    "--experimental-attention-variant": ["dsa", "dsa", "x"],
    "--seq-length": ["64", "128", "1"],
    "--pp": ["1", "2"], "--tp": ["1", "2"],
    "--recompute-method": ["uniform", "block"],
}
MEGATRON_MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                  "--seq-length", "64", "--vocab-size", "1000"]


@st.composite
def framework_lines(draw: st.DrawFn) -> list[str]:
    """A line of one framework's words that mostly make sense together: torchtitan's
    fields over a registry function or a small preset, Megatron's experts with a shared
    expert of any width, DeepSeek's sparse attention's indexer, recompute flags."""
    command = draw(st.sampled_from(["simulate", "simulate", "plan", "split", "costs"]))
    argv = [command, *(["--time-budget", "1"] if command == "plan" else [])]
    kind = draw(st.sampled_from(["titan", "titan", "moe", "dsa"]))
    if kind == "titan":
        if draw(st.booleans()):
            argv += ["--torchtitan-config", draw(st.sampled_from(WORDS["--torchtitan-config"]
                                                                 [:5]))]
        else:
            argv += ["--preset", draw(st.sampled_from(["tiny-gpt", "tiny-llm", "llama3-8b"]))]
        argv += _some(draw, TT_FIELDS)
        argv += draw(st.lists(st.sampled_from(AC_WORDS), max_size=1))
        if command == "plan" and "--gpus" in argv:
            argv += ["--global-batch-size", draw(st.sampled_from(["8", "16", "64"]))]
    elif kind == "moe":
        argv += ["--preset", draw(st.sampled_from(["tiny-gpt", "qwen3-30b-a3b"]))]
        argv += _some(draw, MOE_FIELDS)
    else:
        argv += [*MEGATRON_MODEL, "--multi-latent-attention", *_some(draw, DSA_FIELDS)]
    return argv


# ------------------------------------------------------------------ DeepSpeed configs

DS_DIR = Path(tempfile.mkdtemp(prefix="ppsim-fuzz-ds-"))  # the lines name it: made once
atexit.register(shutil.rmtree, DS_DIR, True)
DS_PATH = str(DS_DIR / "ds.json")
DS_VALUES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 8, 16, -1, -8, 2**63, 10**400, 0.5, 2.0, 1e308,
                     "auto", "8", "", "bf16", "fp32", "cpu", "none", True, False, None,
                     [], {}, [1], {"enabled": True}, {"a": {"b": [None]}}]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 100))
DS_PATHS = [("train_batch_size",), ("train_micro_batch_size_per_gpu",),
            ("gradient_accumulation_steps",), ("bf16",), ("bf16", "enabled"),
            ("bfloat16", "enabled"), ("fp16",), ("fp16", "enabled"),
            ("fp16", "loss_scale"), ("amp", "enabled"), ("zero_optimization",),
            ("zero_optimization", "stage"), ("zero_optimization", "offload_optimizer"),
            ("zero_optimization", "offload_param", "device"),
            ("zero_optimization", "overlap_comm"), ("zero_optimization", "cpu_offload"),
            ("optimizer",), ("optimizer", "type"), ("optimizer", "params"),
            ("data_types",), ("data_types", "grad_accum_dtype"),
            ("activation_checkpointing",),
            ("activation_checkpointing", "partition_activations"),
            ("pipeline",), ("pipeline", "activation_checkpoint_interval"),
            ("pipeline", "stages"), ("communication_data_type",), ("steps_per_print",),
            ("bogus",), ("zero_optimization", "bogus"), ("pipeline", "bogus")]
DS_BASES = [
    {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1,
     "gradient_accumulation_steps": 8, "bf16": {"enabled": True}},
    {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
     "zero_optimization": {"stage": 1}, "pipeline": {"activation_checkpoint_interval": 1}},
    {"train_batch_size": 8, "fp16": {"enabled": True}, "optimizer": {"type": "AdamW"}},
    {},
]
DS_RAW = ["", "{", "[]", "null", '{"train_batch_size": NaN}', '{"a": 1, "a": 2}',
          "[" * 5000 + "]" * 5000, '{"train_batch_size": 1e999}', "\ufeff{}"]


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(doc.get(key), dict):
            doc[key] = {}
        doc = doc[key]
    doc[path[-1]] = value


@st.composite
def ds_texts(draw: st.DrawFn) -> bytes:
    """A DeepSpeed config's bytes: a valid base with keys set, dropped or added, or
    text that is not a JSON object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(DS_RAW)).encode() if draw(st.booleans()) else b"\xff{}"
    doc = json.loads(json.dumps(draw(st.sampled_from(DS_BASES))))
    for _ in range(draw(st.integers(0, 4))):
        path = draw(st.sampled_from(DS_PATHS))
        if draw(st.integers(0, 4)) == 0:
            doc.pop(path[0], None)
        else:
            _put(doc, path, copy.deepcopy(draw(DS_VALUES)))  # sampled: shared
    return json.dumps(doc, allow_nan=True).encode()


# ------------------------------------------------------------------ the check


def check_outcome(argv: list[str], code: Any, out: str, err: str, seconds: float) -> None:
    """Exit 0, 2 or 3, no traceback; exit 2: stdout empty and one error line, the last,
    after any notes and warnings; --json's output strict JSON."""
    what = f"{argv!r}: exit {code}, stderr {err[-800:]!r}"
    assert code in (0, 2, 3), what
    assert "Traceback" not in err, what
    if code == 2:
        assert out == "", what
        prefix = f"ppsim {argv[0]}: "
        said = err.splitlines()
        assert err.endswith("\n") and said, what
        assert said[-1].startswith(prefix + "error: "), what
        for line in said[:-1]:
            assert line.startswith(("warning:", "note:", prefix + "warning:",
                                    prefix + "note:")), what
    if code == 0 and "--json" in argv:
        def strict(name: str) -> None:
            raise AssertionError(f"{what}: {name} in JSON output")

        assert isinstance(json.loads(out, parse_constant=strict), dict), what
    assert seconds < CASE_SECONDS, f"{what}: took {seconds:.1f} s"


def run_line(argv: list[str], ds: bytes) -> None:
    """`ppsim ARGV` in this process, the DeepSpeed config holding `ds`, checked."""
    Path(DS_PATH).write_bytes(ds)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a bad flag value
            code = exc.code
    check_outcome(argv, code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


@settings(max_examples=600, derandomize=True, deadline=None)
@given(argv=lines(), ds=ds_texts())
@example(argv=["simulate", "--preset", "gpt3-1.3b", "--pp", "0", "--gpus", "2"], ds=b"{}")
def test_framework_lines_fail_only_in_one_line(argv: list[str], ds: bytes) -> None:
    run_line(argv, ds)


DS_FLAGS = ["--pp", "--dp", "--gpus", "--micro-batch-size", "--global-batch-size",
            "--microbatches", "--activation-checkpoint-interval"]


@st.composite
def deepspeed_lines(draw: st.DrawFn) -> list[str]:
    """A DeepSpeed job's line: its config, a small model, the batch and parallel flags."""
    command = draw(st.sampled_from(["simulate", "simulate", "split", "plan"]))
    argv = [command, "--preset", draw(st.sampled_from(["tiny-gpt", "gpt3-1.3b"])),
            "--deepspeed-config", DS_PATH]
    if command == "plan":
        argv += ["--time-budget", "1"]
    for flag in draw(st.lists(st.sampled_from(DS_FLAGS), max_size=4)):
        argv += [flag, draw(st.sampled_from(["1", "2", "4", "8", "0", "-1", "3"]))]
    if command != "plan" and draw(st.booleans()):
        argv += ["--partition-method", draw(st.sampled_from(["parameters", "uniform"]))]
    for flag in draw(st.lists(st.sampled_from(["--bf16", "--fp16", "--recompute",
                                               "--use-distributed-optimizer"]), max_size=2)):
        argv += [flag, "full"] if flag == "--recompute" else [flag]
    return argv


@settings(max_examples=600, derandomize=True, deadline=None)
@given(argv=framework_lines(), ds=ds_texts())
def test_each_frameworks_lines_fail_only_in_one_line(argv: list[str], ds: bytes) -> None:
    run_line(argv, ds)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(argv=deepspeed_lines(), ds=ds_texts())
@example(argv=["simulate", "--preset", "gpt3-1.3b", "--deepspeed-config", DS_PATH],
         ds=b'{"train_batch_size": 8, "data_types": {"grad_accum_dtype": []}}')
@example(argv=["split", "--preset", "gpt3-1.3b", "--deepspeed-config", DS_PATH, "--pp", "-1",
               "--partition-method", "parameters"], ds=b'{"train_batch_size": 8}')
def test_deepspeed_configs_fail_only_in_one_line(argv: list[str], ds: bytes) -> None:
    run_line(argv, ds)
