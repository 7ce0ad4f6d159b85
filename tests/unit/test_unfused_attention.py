"""The unfused attention core: Megatron's DotProductAttention (--attention-backend local,
Model Optimizer's --export-force-local-attention) and Transformer Engine's unfused path
(--attention-backend unfused).

Megatron-LM's own gpt-oss training example (examples/gptoss/02_train.sh) runs it; ppsim
took --attention-backend unfused silently and priced FlashAttention, which keeps no
s x s matrix, and refused --export-force-local-attention as unknown."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from helpers import kept_under_policy
from helpers import run_main as _run
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import load_config
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import attention_ops
from ppsim.costs.modules import kept_tensors, module_effect
from ppsim.costs.ops import Op, Roofline, matmul_ms, op_times
from ppsim.executor.builders.llama import architecture
from ppsim.policy.model import StagePolicy

ROOF = Roofline(peak_tflops=100.0, matmul_efficiency=((0.25, 0.3), (64.0, 0.7)),
                attention_efficiency=0.35, memory_bandwidth_gbps=1000.0)


def _arch(**more) -> Architecture:
    base = dict(num_layers=2, hidden_size=256, num_heads=8, num_kv_heads=2,
                ffn_hidden_size=512, vocab_size=1024, seq_length=128, micro_batch_size=2,
                tp=2, dtype="bf16", unfused_attention=True, dropout=False)
    return Architecture(**{**base, **more})


def _ops(a: Architecture) -> dict[str, Op]:
    return {op.name: op for op in attention_ops(a)}


def test_the_core_is_two_batched_matmuls_a_softmax_and_a_repeat() -> None:
    """Per tp rank (4 of 8 heads, 1 of 2 key/value heads, head width 32, b 2, s 128):
    QK^T and PV over the whole s x s (2 s^2 d FLOPs a head each, no causal saving), a
    softmax reading 2-byte scores and writing probabilities, K and V repeated."""
    a = _arch()
    ops = _ops(a)
    heads, s, d = 2 * 8 / 2, 128, 32  # b x heads per rank
    assert ops["attention.scores"].flops == 2 * s * s * d * heads
    assert ops["attention.context"].flops == 2 * s * s * d * heads
    assert ops["attention.softmax"].nbytes == 2 * 2 * heads * s * s
    assert ops["attention.softmax"].backward_bytes == 3 * 2 * heads * s * s
    # read K and V (2 heads of 32 each), write them at 8 heads: 256 tokens, per rank / 2
    assert ops["attention.repeat_kv"].nbytes == 256 * (64 + 64 + 2 * 8 * 32) * 2 / 2
    assert "attention" not in ops and "attention.dropout" not in ops
    assert "attention.dropout" in _ops(replace(a, dropout=True))
    assert "attention.repeat_kv" not in _ops(replace(a, num_kv_heads=8))


def test_a_batched_matmul_of_two_activations_computes_both_gradients() -> None:
    op = _ops(_arch())["attention.scores"]
    f, b, w, kf, kb = op_times(ROOF, op)
    count = op.flops / (2 * 128 * 128 * 32)
    assert f == pytest.approx(matmul_ms(ROOF, 128, 128, 32) * count)
    assert b == pytest.approx((matmul_ms(ROOF, 128, 32, 128) + matmul_ms(ROOF, 32, 128, 128))
                              * count)
    assert w == 0 and (kf, kb) == (1, 2)


def test_it_keeps_the_probabilities_and_the_repeated_heads() -> None:
    """Beyond FlashAttention's: the 2-byte probabilities (b x heads x s^2), dropout's mask
    byte and dropped copy, K and V at every query head; less FlashAttention's fp32
    log-sum-exp. Per tp rank."""
    for dropout in (False, True):
        a = _arch(dropout=dropout)
        unfused = kept_tensors(a, "dense")
        fused = kept_tensors(replace(a, unfused_attention=False), "dense")
        scores = 2 * 8 * 128 * 128 / 2
        repeated = 2 * 256 * (8 - 2) * 32 * 2 / 2  # K and V's added heads
        lse = 4 * 256 * 8 / 2
        extra = scores * (2 + (1 + 2 if dropout else 0)) + repeated - lse
        assert sum(unfused.values()) - sum(fused.values()) == pytest.approx(extra)


@settings(max_examples=40, deadline=None)
@given(heads=st.sampled_from([4, 8]), groups=st.sampled_from([1, 2, 4]),
       s=st.sampled_from([16, 64, 96]), b=st.integers(1, 3), tp=st.sampled_from([1, 2, 4]),
       dropout=st.booleans(), kind=st.sampled_from(["dense", "moe"]))
def test_recomputing_core_attn_leaves_what_the_fused_core_leaves(heads, groups, s, b, tp,
                                                                  dropout, kind) -> None:
    """The core_attn checkpoint keeps q, k and v alone, whichever kernel runs inside it;
    its recompute runs every op of the unfused core again."""
    a = _arch(num_heads=heads, num_kv_heads=groups, seq_length=s, micro_batch_size=b,
              tp=tp, dropout=dropout, hidden_size=32 * heads, num_experts=4, top_k=2,
              moe_ffn_hidden_size=64, layers=f"{kind}*2")
    assume(groups % tp == 0 and heads % tp == 0)
    fused = replace(a, unfused_attention=False)
    assert kept_tensors(a, kind, ("core_attn",)) == kept_tensors(fused, kind, ("core_attn",))
    assert sum(kept_tensors(a, kind).values()) > sum(kept_tensors(fused, kind).values())
    repeated = module_effect(a, kind, ("core_attn",)).repeated_ops
    assert {n for n in _ops(a) if n.startswith("attention.")} <= repeated


def test_its_backward_holds_the_scores_buffer_and_the_probabilities_gradient() -> None:
    a = _arch()
    scores_bytes = 2 * 8 * 128 * 128 / 2 * 2
    plain = module_effect(a, "dense").transient_bytes
    assert plain == 2 * scores_bytes
    assert module_effect(replace(a, unfused_attention=False), "dense").transient_bytes == 0


def _parsed(argv: str) -> Architecture:
    args = build_parser().parse_args(["simulate", *shlex.split(argv)])
    return config_from_args(args).model.arch


@pytest.mark.parametrize("flags, unfused", [
    ("--attention-backend unfused", True), ("--attention-backend local", True),
    ("--export-force-local-attention", True), ("--attention-backend flash", False),
    ("--attention-backend auto", False), ("", False)])
def test_the_flags_that_select_it(flags: str, unfused: bool) -> None:
    assert _parsed(f"--preset gpt-oss-120b {flags}").unfused_attention is unfused


# Megatron-LM's examples/gptoss/02_train.sh, every array as written for one 8-GPU node
# (its defaults: pp 8, 12 layers of width 512, sequence 8192, FP8), --vocab-size added.
GPT_OSS_EXAMPLE = """--no-masked-softmax-fusion --transformer-impl transformer_engine
--disable-bias-linear --untie-embeddings-and-output-weights --no-rope-fusion
--normalization RMSNorm --num-layers 12 --hidden-size 512 --ffn-hidden-size 2048
--num-attention-heads 64 --group-query-attention --num-query-groups 8 --seq-length 8192
--max-position-embeddings 8192 --use-mcore-models --rotary-percent 1.0 --rope-type rope
--position-embedding-type rope --rotary-base 10000 --no-bias-gelu-fusion
--export-force-local-attention --no-bias-dropout-fusion --quick-geglu
--glu-linear-offset 1.0 --softmax-type learnable --window-attn-skip-freq 2
--activation-func-clamp-value 7.0 --window-size 127,0 --enable-gpt-oss
--num-experts 4 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss
--moe-aux-loss-coeff 1e-3 --moe-grouped-gemm --moe-token-dispatcher-type alltoall
--overlap-param-gather --overlap-grad-reduce --moe-ffn-hidden-size 2048
--moe-router-dtype fp32 --moe-z-loss-coeff 1e-3 --moe-permute-fusion
--micro-batch-size 1 --global-batch-size 128 --lr 1.0e-5 --train-samples 1953125000
--lr-decay-samples 1949218748 --lr-decay-style cosine --min-lr 1.0e-6 --weight-decay 0.1
--lr-warmup-fraction 0.05 --clip-grad 1.0 --bf16 --use-flash-attn
--attention-softmax-in-fp32 --accumulate-allreduce-grads-in-fp32
--disable-bf16-reduced-precision-matmul --recompute-activations
--tensor-model-parallel-size 1 --pipeline-model-parallel-size 8
--expert-model-parallel-size 1 --sequence-parallel --context-parallel-size 1
--use-distributed-optimizer --fp8-format hybrid --fp8-param-gather
--fp8-amax-compute-algo max --fp8-amax-history-len 1024 --log-interval 1
--save-interval 10000 --eval-interval 50000000 --eval-iters 0 --save /ckpt
--tensorboard-dir /ckpt/tensorboard --moe-per-layer-logging --no-load-optim --no-load-rng
--log-throughput --vocab-size 201088"""


def test_megatrons_gpt_oss_example_plans_as_written() -> None:
    """Priced with the unfused core (its selective recompute runs it again in the
    backward): slower than the same job on FlashAttention, and it plans."""
    job = ["--hardware", "h100-80gb", "--gpus", "8", "--json"]
    code, out, err = _run(["simulate", *shlex.split(GPT_OSS_EXAMPLE), *job])
    assert code == 0, err
    unfused = json.loads(out)
    fused_line = GPT_OSS_EXAMPLE.replace("--export-force-local-attention", "")
    code, out, _ = _run(["simulate", *shlex.split(fused_line), *job])
    assert unfused["iteration_time_ms"] > json.loads(out)["iteration_time_ms"]
    code, out, err = _run(["plan", *shlex.split(GPT_OSS_EXAMPLE), *job,
                           "--time-budget", "2"])
    assert code == 0, err


def test_context_parallelism_is_refused_as_megatron_refuses_it() -> None:
    code, _, err = _run(["simulate", "--preset", "llama3-8b", "--attention-backend", "local",
                         "--cp", "2", "--gpus", "16", "--hardware", "h100-80gb"])
    assert code == 2 and "only supported by TEDotProductAttention" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = _run(["plan", "--preset", "llama3-8b", "--attention-backend", "unfused",
                           "--gpus", "16", "--global-batch-size", "64", "--hardware",
                           "h100-80gb", "--time-budget", "2", "--top", "20", "--json"])
    assert code == 0, err
    assert {c["cp"] for c in json.loads(out)["candidates"]} == {1}


def test_presets_print_it_and_it_reads_back() -> None:
    a = _parsed("--preset llama3-8b --attention-backend unfused")
    line = " ".join(megatron_model_args(a))
    assert "--attention-backend unfused" in line
    assert _parsed(line).unfused_attention


GPT = load_config(None).model.fields()
LLAMA = {**GPT, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary", "num_kv_heads": 2,
         "ffn_hidden_size": 176, "layers": "dense*8", "dtype": "bf16"}


@pytest.mark.parametrize("fields", [GPT, LLAMA], ids=["gpt", "llama-gqa"])
@pytest.mark.parametrize("policy", [StagePolicy(), StagePolicy(recompute_modules=("core_attn",)),
                                    StagePolicy(offload_modules=("core_attn",),
                                                offload_fraction=1.0)],
                         ids=lambda p: p.label())
def test_the_executor_keeps_what_the_model_counts(fields: dict, policy: StagePolicy) -> None:
    """The executor's layer, its saved tensors counted as autograd keeps them."""
    fields = {**fields, "unfused_attention": True}
    kept, moved = kept_under_policy(fields, 0, policy)
    want = module_effect(architecture(fields), "dense", policy.recompute_modules,
                         policy.offload_modules)
    assert abs(kept - want.kept_bytes) <= 0.02 * want.kept_bytes, (kept, want)
    assert abs(moved - want.offloaded_bytes) <= 0.02 * max(want.offloaded_bytes, 1)


def test_the_executors_unfused_core_computes_what_flash_attention_does() -> None:
    torch = pytest.importorskip("torch")
    from ppsim.executor.builders.stage import AttentionCore

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 24, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 24, 16, generator=g, dtype=torch.float64) for _ in range(2))
    for window in (0, 5):
        torch.testing.assert_close(AttentionCore(window, unfused=True)(q, k, v),
                                   AttentionCore(window)(q, k, v))


def test_a_cost_file_measured_on_the_fused_core_is_refused_for_the_unfused_one() -> None:
    from types import SimpleNamespace

    from ppsim.costs.costfile import check_model
    from ppsim.errors import UserError

    fused = {"kind": "transformer", **{k: v for k, v in GPT.items() if k != "kind"}}
    measured = SimpleNamespace(model=fused, path="costs.json")
    check_model(measured, fused)  # the same model: taken
    with pytest.raises(UserError, match="unfused_attention"):
        check_model(measured, {**fused, "unfused_attention": True})


def test_megatrons_local_spec_is_refused_not_priced_as_transformer_engines() -> None:
    """--transformer-impl local builds separate norms and DotProductAttention; ppsim took
    it silently and priced Transformer Engine's fused modules."""
    for impl in ("local", "inference_optimized"):
        code, out, err = _run(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                               "--transformer-impl", impl])
        assert code == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"--transformer-impl {impl}" in lines[0]
    assert _run(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                 "--transformer-impl", "transformer_engine"])[0] == 0


def test_attention_sinks_say_which_kernel_the_price_assumes() -> None:
    base = ["simulate", "--preset", "gpt-oss-120b", "--hardware", "h100-80gb", "--pp", "4",
            "--softmax-type", "learnable"]
    _, _, err = _run(base)
    assert "note: --softmax-type learnable (attention sinks) priced at FlashAttention" in err
    _, _, err = _run([*base, "--attention-backend", "unfused"])
    assert "attention sinks" not in err
