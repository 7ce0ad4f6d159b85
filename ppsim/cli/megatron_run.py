"""The rest of a Megatron launch line: the arguments that run the training (learning
rate, data, checkpoints, logging, ...) rather than shape an iteration. A launch script
passes them in the same breath as the model and parallel sizes (TRAINING_ARGS holds
--micro-batch-size and --global-batch-size beside --lr), so ppsim takes them too:
`ppsim plan $MODEL_ARGS $TRAINING_ARGS $MODEL_PARALLEL_ARGS $DATA_ARGS` works as pasted.

Three kinds, by what they do to one steady iteration:
- RUN: nothing (when to stop, what to read, where to save, what to log). Taken, silent.
- UNPRICED: a little of its time or memory, in ways ppsim does not model (a kernel
  fusion switched off, Python's garbage collector held back). Taken, named on stderr.
- the rest of Megatron's names stay unknown to ppsim: refused by argparse, by name.
Names as in Megatron-LM's megatron/training/arguments.py and its config dataclasses.
"""

from __future__ import annotations

import argparse

from ppsim.cli import megatron_attention
from ppsim.errors import UserError
from ppsim.job.ranks import TP_PP_DP_ORDER, parse_order

RUN = {
    "training length": (
        "train-iters", "train-samples", "exit-interval", "exit-duration-in-mins",
        "exit-signal-handler", "exit-signal", "rampup-batch-size", "step-batch-size-schedule",
        "iterations-to-skip", "skip-train"),
    "learning rate": (
        "lr", "min-lr", "decoupled-lr", "decoupled-min-lr", "lr-decay-style",
        "lr-decay-iters", "lr-decay-samples", "lr-warmup-fraction", "lr-warmup-iters",
        "lr-warmup-samples", "lr-warmup-init", "lr-wsd-decay-style", "lr-wsd-decay-iters",
        "lr-wsd-decay-samples", "override-opt-param-scheduler", "override-opt_param-scheduler",
        "use-checkpoint-opt-param-scheduler", "use-checkpoint-opt_param-scheduler",
        "start-weight-decay", "end-weight-decay", "weight-decay-incr-style"),
    "regularization": (
        "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "sgd-momentum",
        "apply-wd-to-qk-layernorm", "muon-momentum", "muon-nesterov", "muon-scale-mode",
        "muon-coefficient-type", "muon-extra-scale-factor", "muon-scalar-optimizer",
        "head-lr-mult", "embedding-init-method-std", "no-weight-decay-cond-type", "use-mup",
        "mup-width-mult",
        "mup-base-hidden-size", "mup-base-head-dim", "mup-embedding-mult", "mup-output-mult",
        "mup-attn-scale-power"),
    "numerics checks and loss scaling": (
        "seed", "init-method-xavier-uniform", "data-parallel-random-init",
        "use-cpu-initialization", "loss-scale", "initial-loss-scale", "min-loss-scale",
        "loss-scale-window", "hysteresis",
        "calculate-per-token-loss", "no-check-for-nan-in-loss-and-grad",
        "check-for-spiky-loss", "check-for-large-grads", "rerun-mode",
        "check-weight-hash-across-dp-replicas-interval", "error-injection-rate",
        "error-injection-type", "test-mode"),
    "checkpointing": (
        "save", "save-interval", "load", "no-save-optim", "no-save-rng", "no-load-optim",
        "no-load-rng", "finetune", "pretrained-checkpoint", "ckpt-step", "use-checkpoint-args",
        "no-use-tokenizer-model-from-checkpoint-args", "exit-on-missing-checkpoint",
        "moe-use-upcycling", "moe-upcycling-granularity", "enable-msc", "disable-msc",
        "ckpt-format", "auto-detect-ckpt-format", "async-save", "ckpt-fully-parallel-save",
        "no-ckpt-fully-parallel-save", "ckpt-fully-parallel-load",
        "ckpt-assume-constant-structure", "dist-ckpt-strictness", "use-dist-ckpt",
        "save-retain-interval", "non-persistent-save-interval", "non-persistent-ckpt-type",
        "non-persistent-global-ckpt-dir", "non-persistent-local-ckpt-dir",
        "ckpt-convert-format", "ckpt-convert-save", "dist-ckpt-format", "dist-ckpt-workers",
        "dist-ckpt-optim-fully-reshardable", "ckpt-fully-parallel-load-exchange-algo",
        "async-strategy", "persistent-save-interval", "use-persistent-ckpt-worker",
        "override-ckpt-iteration", "load-main-params-from-ckpt", "verify-integrity",
        "use-mp-args-from-checkpoint-args", "ckpt-drop-redundant-extra-state",
        "no-ckpt-load-validate-sharding-integrity", "non-persistent-local-ckpt-algo",
        "async-ckpt-use-cpu-shm", "async-ckpt-cpu-priority", "async-ckpt-io-priority",
        "ckpt-fully-parallel-load-per-rank-objects", "strict-fsdp-dtensor-load",
        "replication", "replication-jump", "replication-factor"),
    "data": (
        "data-path", "split", "train-data-path", "valid-data-path", "test-data-path",
        "data-args-path", "per-split-data-args-path", "data-cache-path", "no-mmap-bin-files",
        "mock-data", "num-workers", "dataloader-type", "reset-position-ids",
        "eod-mask-loss", "no-create-attention-mask-in-dataloader",
        "num-dataset-builder-threads", "object-storage-cache-path",
        "mid-level-dataset-surplus",
        "dataloader-defer-npy-index-mmap", "dataloader-fast-cache-load",
        "per-dataset-sequences-path", "phase-transition-iterations", "multiple-validation-sets",
        "validation-set-names", "full-validation", "eval-global-batch-size",
        "eval-micro-batch-size", "start-eval-at-iter", "sft", "fim-data", "fim-rate",
        "fim-spm-rate", "fim-split-sample", "fim-fragment-rate", "fim-no-prefix",
        "allow-ambiguous-pad-tokens", "no-data-sharding", "decoder-seq-length"),
    "tokenizer": (
        "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file", "vocab-extra-ids",
        "tiktoken-pattern", "tiktoken-num-special-tokens", "trust-remote-code",
        "tokenizer-hf-include-special-tokens", "tokenizer-hf-no-include-special-tokens",
        "tokenizer-hf-no-use-fast", "tokenizer-metadata", "tokenizer-sentencepiece-legacy",
        "tokenizer-special-tokens", "null-tokenizer-eod-id", "null-tokenizer-pad-id",
        "chat-template", "no-save-tokenizer-assets", "sft-tokenizer-prompt-format"),
    "logging and validation": (
        "log-interval", "log-params-norm", "log-throughput", "log-progress",
        "timing-log-level", "timing-log-option", "tensorboard-dir", "tensorboard-log-interval",
        "tensorboard-queue-size", "log-timers-to-tensorboard",
        "log-validation-ppl-to-tensorboard", "log-memory-to-tensorboard",
        "log-world-size-to-tensorboard", "no-log-loss-scale-to-tensorboard",
        "log-num-zeros-in-grad", "log-energy", "wandb-project", "wandb-exp-name",
        "wandb-save-dir", "wandb-entity", "logging-level", "log-straggler",
        "straggler-minmax-count", "disable-straggler-on-startup", "moe-per-layer-logging",
        "eval-iters", "eval-interval",
        "log-device-memory-used", "log-memory-interval", "log-max-attention-logit",
        "config-logger-dir", "no-one-logger", "one-logger-project", "one-logger-run-name",
        "one-logger-async", "app-tag-run-name", "app-tag-run-version", "nvtx-ranges",
        "pytorch-profiler-collect-shapes", "pytorch-profiler-collect-callstack",
        "pytorch-profiler-collect-chakra", "record-shapes", "moe-routing-trace-path",
        "moe-routing-trace-max-training-iters", "moe-routing-trace-capture-logits",
        "moe-routing-trace-capture-hidden-states", "moe-routing-trace-dump-weights"),
    "post-training (Model Optimizer)": (
        "export-model-type", "export-legacy-megatron", "export-te-mcore-model",
        "export-default-te-spec", "export-kd-teacher-model-config",
        "export-kd-teacher-ckpt-format", "export-kd-cfg", "finetune-hf-dataset",
        "finetune-data-split", "finetune-data-files", "modelopt-enabled", "enable-gpt-oss",
        "export-qk-l2-norm", "export-moe-apply-probs-on-input"),
    "profiling and setup": (
        "profile", "profile-step-start", "profile-step-end", "profile-ranks",
        "use-pytorch-profiler", "record-memory-history", "memory-snapshot-path",
        "distributed-backend", "distributed-timeout-minutes", "local-rank",
        "enable-experimental", "disable-gloo-process-groups",
        "lazy-mpu-init", "no-initialization", "use-same-sampling-seed-across-dp-ranks",
        "enable-ft-package", "calc-ft-timeouts", "ft-num-warmup-iters",
        "exit-signal-handler-for-training", "exit-signal-handler-for-dataloader",
        "adlr-autoresume", "adlr-autoresume-interval", "flight-recorder-dump-path",
        "flight-recorder-trace-buffer-size", "flight-recorder-include-stack-trace",
        "inprocess-restart", "gpu-sniff-test-interval", "max-tokens-to-oom"),
    "the host optimizer's class (Megatron steps Adam with its own either way)": (
        "use-torch-optimizer-for-cpu-offload",),
    "Megatron-FSDP's setup (its version, its buffers' allocation and registration)": (
        "megatron-fsdp-version", "init-model-with-meta-device", "fsdp-double-buffer",
        "fsdp-manual-registration", "fsdp-db-use-persist-buf-on-alloc-fail"),
}
"""Megatron's arguments that change nothing in a steady training iteration (a batch
ramp-up ends at --global-batch-size, the iteration ppsim prices)."""
UNPRICED_GROUPS = {
    "ppsim prices Megatron's default fused kernels, and neither Python's garbage collector "
    "nor the allocator's cache": (
        "no-masked-softmax-fusion", "no-bias-gelu-fusion", "no-bias-dropout-fusion",
        "no-rope-fusion", "no-persist-layer-norm",
        "cross-entropy-loss-fusion", "cross-entropy-fusion-impl", "manual-gc",
        "manual-gc-interval", "empty-unused-memory-level",
        "use-fused-weighted-squared-relu", "muon-no-split-qkv", "muon-fp32-matmul-prec",
        "muon-use-syrk", "disable-bf16-reduced-precision-matmul", "deterministic-mode",
        "disable-jit-fuser", "no-gradient-reduce-div-fusion", "use-te-activation-func",
        "use-transformer-engine-op-fuser", "fused-residual-rmsnorm",
        "disable-clone-scatter-output-in-embedding", "keep-fp8-transpose-cache",
        "use-grouped-gemm-for-shared-expert", "use-grouped-gemm-for-dense-mlp"),
    "ppsim prices causal attention over each whole sequence, not masks per document": (
        "reset-attention-mask", "dataloader-inter-document-masking"),
    "ppsim launches each kernel from the host, as eager PyTorch does": (
        "cuda-graph-impl", "cuda-graph-scope", "cuda-graph-modules", "cuda-graph-warmup-steps",
        "external-cuda-graph", "enable-cuda-graph", "inference-cuda-graph-scope",
        "te-rng-tracker", "optimizer-cuda-graph"),
    "ppsim prices each collective's traffic on its links, not these NCCL, stream and "
    "overlap tunings": (
        "ddp-average-in-collective", "ddp-pad-buckets-for-high-nccl-busbw",
        "ddp-reduce-scatter-with-fp32-accumulation", "no-align-grad-reduce",
        "no-align-param-gather", "no-overlap-p2p-communication",
        "overlap-p2p-communication-warmup-flush", "high-priority-stream-groups",
        "nccl-communicator-config-path", "use-sharp", "sharp-enabled-group", "use-nccl-ub",
        "disable-symmetric-registration", "symmetric-ar-type", "tp-comm-overlap-cfg",
        "tp-comm-bootstrap-backend", "tp-comm-overlap-rs-dgrad", "disable-tp-comm-overlap-ag",
        "disable-tp-comm-overlap-rs", "disable-tp-comm-split-ag", "disable-tp-comm-split-rs",
        "disable-tp-comm-bulk-dgrad", "disable-tp-comm-bulk-wgrad",
        "pipeline-model-parallel-comm-backend", "use-ring-exchange-p2p",
        "high-priority-a2a-comm-stream",
        "overlap-dispatch-backward-with-experts-wgrad", "ep-overlap-early-attn-memory-release",
        "defer-embedding-wgrad-compute", "wgrad-deferral-limit", "create-all-gather-group",
        "ddp-param-name-patterns-for-fp32-local-accumulation",
        "no-use-layer-wise-param-layout"),
    "ppsim prices Megatron-FSDP's layer units, each gathered one ahead": (
        "suggested-communication-unit-size", "megatron-fsdp-enable-fine-grained-param-gather",
        "megatron-fsdp-max-pool-double-buffer"),
    "ppsim prices DSA's indexer in every layer by its own ops, not its training loss, a "
    "top-k reused across layers or a kernel choice": (
        "dsa-indexer-loss-coeff", "dsa-indexer-use-sparse-loss", "dsa-indexer-topk-freq",
        "dsa-kernel-backend"),
    "ppsim prices the optimizer's step, not MuonClip's clipping of the attention logits "
    "after it": ("qk-clip", "qk-clip-alpha", "qk-clip-threshold"),
    "ppsim prices the host optimizer's copies at the host link's rate, as pinned memory "
    "reaches it": ("no-pin-cpu-grads", "no-pin-cpu-params"),
    "ppsim prices MXFP8 weights as Transformer Engine caches them, not the buffer "
    "Megatron's parameter gather may reuse": ("reuse-grad-buf-for-mxfp8-param-ag",),
    "ppsim prices the output layer's logits and loss, and Mamba's chunk states, in "
    "Megatron's default dtypes": ("fp16-lm-cross-entropy", "output-logit-dtype",
                                   "mamba-training-ssm-states-dtype"),
}
"""Megatron's arguments that change an iteration's time or memory a little in ways ppsim
does not model, by why not: its memory-bound operations and attention are priced as
Megatron's default fused kernels (a per-document attention mask is not one), each kernel
launched from the host (CUDA graphs replay captured ones without it), each collective by
its traffic; Python's garbage collector and the allocator's cache are not modelled."""
UNPRICED = tuple(f for group in UNPRICED_GROUPS.values() for f in group)
"""Every UNPRICED_GROUPS flag."""
_QUANTIZERS = ("Model Optimizer's quantizers run beside every linear (quantization-aware "
               "training), which ppsim does not price", "drop it to plan the run without them")
_FROZEN = ("freezes part of the model, whose parameters then keep no gradients or optimizer "
           "states; ppsim prices training every parameter",
           "drop it, or give --qad-train-target both")
_HYBRID = ("is Megatron-FSDP's hybrid sharding, which ppsim does not price",
           "drop it; --fsdp --dp-replicas N prices torchtitan's HSDP")
_FSDP_GRADS = ("ppsim prices Megatron-FSDP's gradients kept and reduced in the training "
               "dtype (bf16), its default", "drop it, or give auto")
REFUSED = {
    "checkpoint-activations": ((), "is no longer valid (Megatron's words)",
                               "use --recompute-activations, or, for more control, "
                               "--recompute-granularity and --recompute-method"),
    "batch-size": ((), "argument is no longer valid (Megatron's words)",
                   "use --micro-batch-size instead"),
    "warmup": ((), "argument is no longer valid (Megatron's words)",
               "use --lr-warmup-fraction instead"),
    "model-parallel-size": ((), "is no longer valid (Megatron's words)",
                            "use --tensor-model-parallel-size instead"),
    "te-precision-config-file": ((), "overrides the precision module by module, which ppsim "
                                 "does not price", "drop it to price the recipe's precision "
                                 "everywhere"),
    "export-kd-teacher-load": ((), "distillation runs a teacher model's forward beside the "
                               "student's every microbatch, which ppsim does not price",
                               "drop it to plan the student alone"),
    "export-quant-cfg": (("None",), *_QUANTIZERS),
    "export-real-quant-cfg": (("None",), *_QUANTIZERS),
    "export-kv-cache-quant": (("none",), *_QUANTIZERS),
    "export-offline-model": ((), "builds the model without its decoder layers (an offline "
                             "speculative-decoding draft's base)", "drop it"),
    "qad-train-target": (("both",), *_FROZEN),
    "freeze-base-for-mtp": ((), *_FROZEN),
    "data-parallel-sharding-strategy": (("optim_grads_params",), "is priced for "
                                        "Megatron-FSDP's default, optim_grads_params "
                                        "(weights, gradients and optimizer state sharded)",
                                        "drop it; --use-distributed-optimizer without "
                                        "--use-megatron-fsdp shards as optim does"),
    "outer-dp-sharding-strategy": (("no_shard",), *_HYBRID),
    "enable-full-sharding-in-hsdp": ((), *_HYBRID),
    "megatron-fsdp-main-params-dtype": (("fp32",), "ppsim prices Megatron-FSDP's fp32 "
                                        "master weights", "drop it"),
    "megatron-fsdp-main-grads-dtype": (("auto", "bf16"), *_FSDP_GRADS),
    "megatron-fsdp-grad-comm-dtype": (("auto", "bf16"), *_FSDP_GRADS),
}
"""Arguments that make an iteration other than the one ppsim prices (Model Optimizer's
post-training ones), and what Megatron itself
refuses: flag -> (the values that do not, the problem, the fix). Refused by
check_run_flags."""
REPEATED_MTP = "mtp-use-repeated-layer"
"""One MTP layer's weights shared by every depth: the same model as ppsim's at one depth,
refused beyond (check_repeated_mtp)."""
TRAINING_COMMANDS = ("run", "demo")
"""Commands that train for real: a --weight-decay or --clip-grad they took and dropped
would mislead, so they take none of these (ppsim run has its own --lr and --seed)."""
PREFIX = "megatron_run_"
"""Where argparse keeps what these flags were given (read back by `unpriced_notes`)."""


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Megatron's run arguments, taken with any values (dropped); a name the command
    already declares keeps its own meaning."""
    g = p.add_argument_group(
        "the rest of a Megatron launch line", "taken as Megatron takes them and not "
        "priced: " + ", ".join(RUN) + " arguments (--lr, --data-path, --save, ...); kernel "
        "fusion and garbage-collection switches are named on stderr (the list: "
        "docs/model.md)")
    taken = p._option_string_actions  # noqa: SLF001 - argparse has no public lookup
    for flag in (*(f for group in RUN.values() for f in group), *UNPRICED, *REFUSED,
                 "export-force-local-attention", REPEATED_MTP):
        if f"--{flag}" not in taken:
            g.add_argument(f"--{flag}", dest=PREFIX + flag.replace("-", "_"), nargs="*",
                           help=argparse.SUPPRESS)
    g.add_argument("--use-tp-pp-dp-mapping", action="store_true", default=None,
                   help=argparse.SUPPRESS)


def unpriced_notes(args: argparse.Namespace) -> list[str]:
    """A note for each group of UNPRICED flags given: which, and why not priced."""
    notes = []
    for why, flags in UNPRICED_GROUPS.items():
        named = [f"--{f}" for f in flags
                 if getattr(args, PREFIX + f.replace("-", "_"), None) is not None]
        if named:
            notes.append(f"note: {', '.join(named)} taken, not priced ({why})")
    return notes


def check_repeated_mtp(args: argparse.Namespace, depths: int) -> None:
    """--mtp-use-repeated-layer over more than one MTP depth: one layer's weights, gradients
    and optimizer state for them all, where ppsim prices a layer a depth. At one depth the
    repeated layer is the one layer (Megatron's aux-loss scale, 1 / depths, is 1)."""
    given = getattr(args, PREFIX + REPEATED_MTP.replace("-", "_"), None)
    if given is not None and depths > 1:
        raise UserError(" ".join([f"--{REPEATED_MTP}", *given]), "shares one MTP layer's "
                        f"weights across the {depths} depths; ppsim prices each depth with "
                        "its own layer (its weights, gradients and optimizer state)",
                        "drop it to price a layer a depth, or give --mtp-num-layers 1")


def check_run_flags(args: argparse.Namespace) -> str | None:
    """Refuse what changes the job beyond ppsim's model (REFUSED; an optimizer other
    than Adam or Muon is refused with the model's flags);
    return the rank order --use-tp-pp-dp-mapping selects, or None."""
    flag = lambda key: getattr(args, key, None)  # noqa: E731 - a command may lack a flag
    megatron_attention.check_spec(args)
    for name, (inert, problem, fix) in REFUSED.items():
        given = flag(PREFIX + name.replace("-", "_"))  # its values: nargs="*"
        if given is not None and not (given and set(given) <= set(inert)):
            raise UserError(" ".join([f"--{name}", *given]), problem, fix)
    ckpt = flag(PREFIX + "ckpt_format")
    if flag("overlap_param_gather_with_optimizer_step") and ckpt and ckpt != ["torch"]:
        # Megatron-LM's default torch_dist is refused too; a line without the flag may be
        # Bridge's, which checkpoints its own way: the plan's line says torch.
        raise UserError(" ".join(["--ckpt-format", *ckpt]), "--overlap-param-gather-with-"
                        "optimizer-step not supported with distributed checkpointing yet "
                        "(Megatron's words)", "give --ckpt-format torch, or drop "
                        "--overlap-param-gather-with-optimizer-step")
    if not flag("use_tp_pp_dp_mapping"):
        return None
    order = flag("rank_order")
    if order is not None and parse_order(order) != parse_order(TP_PP_DP_ORDER):
        raise UserError("--use-tp-pp-dp-mapping", f"selects the rank order {TP_PP_DP_ORDER}, "
                        f"not --rank-order {order}", "give one of them")
    return TP_PP_DP_ORDER


def _weight(text: str) -> bool:
    """Whether `text` is one of a data split's weights (a non-negative number)."""
    try:
        return float(text) >= 0.0
    except ValueError:
        return False


def data_split_hint(args: argparse.Namespace, exc: UserError) -> UserError:
    """A --split that fails as a layer split may be Megatron's data split (three
    weights: train, valid, test) from a pasted DATA_ARGS: the error says so too."""
    text = getattr(args, "split", None)
    # As Megatron reads it (any three numbers, spaced or not); a bash array's element
    # "--split '99,1,0'" reaches the command with its quotes.
    parts = text.strip("'\" ").split(",") if isinstance(text, str) else []
    # A split beside a layout (or a first/last stage's layers) is refused on the other
    # field's name: the data split may be why too.
    if not ("split" in exc.field or "cannot be combined with split" in exc.problem) \
            or len(parts) != 3 or not all(_weight(p) for p in parts):
        return exc
    hint = (f"if {text} is Megatron's data split (train,valid,test weights), drop it: "
            "ppsim's --split gives the layers of each virtual stage")
    return UserError(exc.field, exc.problem, f"{exc.fix}; {hint}" if exc.fix else hint)
