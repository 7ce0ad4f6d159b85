"""Model Optimizer's post-training arguments in a pasted Megatron launch line.

Megatron-LM's post-training configs (examples/post_training/modelopt/conf/*.sh) pass
Model Optimizer's arguments (megatron/post_training/arguments.py: --export-model-type,
--enable-gpt-oss, ...) in MODEL_ARGS; ppsim refused each as "unrecognized arguments"
without saying what to do. Those that change nothing in an iteration are now taken;
those that make another iteration (a teacher's forward, quantizers, frozen parameters)
are refused by name, exit 2 (--export-force-local-attention is priced:
test_unfused_attention.py)."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import run_main as _run

# NVIDIA-Nemotron-Nano-9B-v2's MODEL_ARGS in Megatron-LM's modelopt conf, as written.
NANO_9B_V2 = """--trust-remote-code --save-interval 100000 --micro-batch-size 1 --bf16
--no-masked-softmax-fusion --disable-bias-linear --untie-embeddings-and-output-weights
--position-embedding-type none --no-rope-fusion --normalization RMSNorm --squared-relu
--hidden-size 4480 --ffn-hidden-size 15680 --num-attention-heads 40 --kv-channels 128
--group-query-attention --num-query-groups 8 --hybrid-layer-pattern
M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M- --mamba-head-dim 80
--mamba-num-heads 128 --mamba-num-groups 8 --mamba-state-dim 128 --seq-length 4096
--max-position-embeddings 131072 --tokenizer-type HuggingFaceTokenizer
--make-vocab-size-divisible-by 1 --use-mcore-models --export-model-type HybridModel
--padded-vocab-size 131072"""
MODELOPT_TAKEN = ("--export-model-type HybridModel --enable-gpt-oss --export-qk-l2-norm "
                  "--export-moe-apply-probs-on-input --finetune-hf-dataset x/y "
                  "--export-te-mcore-model --modelopt-enabled --qad-train-target both "
                  "--export-quant-cfg None --export-kv-cache-quant none")
JOB = ["--hardware", "h100-80gb", "--json"]


def _time(argv: list[str]) -> float:
    code, out, err = _run(["simulate", *argv, *JOB])
    assert code == 0, err
    return json.loads(out)["iteration_time_ms"]


def test_a_post_training_config_prices_as_its_model_alone() -> None:
    """Nemotron Nano 9B v2's config as pasted prices as the model flags without
    Model Optimizer's, and names none of them on stderr."""
    pasted = shlex.split(NANO_9B_V2)
    code, _, err = _run(["simulate", *pasted, *JOB])
    assert code == 0, err
    assert "export-model-type" not in err
    bare = shlex.split(NANO_9B_V2.replace("--export-model-type HybridModel", ""))
    assert _time(pasted) == _time(bare)
    assert _time([*pasted, *shlex.split(MODELOPT_TAKEN)]) == _time(bare)


@pytest.mark.parametrize("flags, named", [
    ("--export-kd-teacher-load /ckpt/teacher", "--export-kd-teacher-load"),
    ("--export-quant-cfg fp8", "--export-quant-cfg fp8"),
    ("--export-real-quant-cfg fp8_real_quant", "--export-real-quant-cfg"),
    ("--export-kv-cache-quant fp8", "--export-kv-cache-quant fp8"),
    ("--export-offline-model", "--export-offline-model"),
    ("--qad-train-target mtp", "--qad-train-target mtp"),
    ("--freeze-base-for-mtp", "--freeze-base-for-mtp"),
    ("--checkpoint-activations", "--checkpoint-activations: is no longer valid"),
])
def test_what_makes_another_iteration_is_refused_by_name(flags: str, named: str) -> None:
    code, out, err = _run(["simulate", "--preset", "llama3-8b", *shlex.split(flags), *JOB])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ppsim simulate: error: {named}")
    assert "Traceback" not in err


@pytest.mark.parametrize("backend", ["flash", "fused", "auto"])
def test_the_fused_backends_price_as_no_backend(backend: str) -> None:
    preset = ["--preset", "llama3-8b"]
    assert _time([*preset, "--attention-backend", backend]) == _time(preset)
