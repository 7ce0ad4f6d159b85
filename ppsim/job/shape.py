"""The job's shape as Megatron reads it: parallel sizes, GPUs, global and micro batch.

Megatron derives the data-parallel size from the world (world / (tp x pp x cp),
megatron/core/parallel_state.py) and the microbatches per replica from the global batch
(global / (micro x dp), megatron/core/num_microbatches_calculator.py); ppsim refuses
what Megatron refuses, with Megatron's own words.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ppsim.config import limits, validate
from ppsim.costs.experts import torchtitan_expert_tp
from ppsim.costs.mixer_split import check_split
from ppsim.errors import UserError
from ppsim.job import deepep
from ppsim.job.context_parallel import check_context_parallel
from ppsim.job.ranks import Sizes, parse_order


@dataclass(frozen=True, kw_only=True)
class JobShape:
    """One training job: its parallel sizes and its batch."""

    sizes: Sizes
    """Parallel sizes."""
    micro_batch_size: int
    """Sequences per microbatch."""
    seq_length: int
    """Tokens per sequence."""
    microbatches: int
    """Microbatches per replica per iteration."""
    rank_order: str
    """Megatron's rank order, innermost first."""

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.microbatches * self.sizes.dp

    @property
    def gpus(self) -> int:
        return self.sizes.gpus

    @property
    def tokens(self) -> int:
        """Tokens one iteration trains on."""
        return self.global_batch_size * self.seq_length


def microbatches_for(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """Microbatches per replica; UserError with Megatron's ConstantNumMicroBatches message
    when the global batch does not divide."""
    per = micro_batch_size * dp
    if global_batch_size % per:
        raise UserError("pipeline.global_batch_size", f"global batch size ({global_batch_size}) "
                        f"is not divisible by micro batch size ({micro_batch_size}) times data "
                        f"parallel size ({dp})",
                        f"use a multiple of {per}, e.g. {max(per, global_batch_size // per * per)}")
    return global_batch_size // per


def dp_for_gpus(gpus: int, tp: int, cp: int, pp: int) -> int:
    """dp = gpus / (tp x pp x cp); UserError with Megatron's message when it does not divide."""
    model = tp * pp * cp
    if gpus < 1:
        raise UserError("--gpus", f"must be at least 1, got {gpus}",
                        f"give the job's world size, a multiple of tp x pp x cp = {model}")
    if gpus % model:
        raise UserError("--gpus", f"world_size ({gpus}) is not divisible by {model}",
                        f"give a multiple of tp x pp x cp = {model}")
    return gpus // model


def arch_of(model: Any) -> Any:
    """The Architecture of a transformer [model]; None for a uniform one."""
    return getattr(model, "arch", None)


def job_shape(cfg: Any) -> JobShape | None:
    """The shape of the configured job; None for a uniform model (no sizes, no tokens)."""
    a = arch_of(cfg.model)
    if a is None:
        return None
    p = cfg.pipeline
    sizes = Sizes(tp=a.tp, cp=a.cp, ep=a.ep, dp=a.dp, pp=p.pp, etp=a.expert_tp)
    return JobShape(sizes=sizes, micro_batch_size=a.micro_batch_size, seq_length=a.seq_length,
                    microbatches=p.microbatches, rank_order=p.rank_order)


def tp_overlap_refusal(cfg: Any) -> None:
    """Megatron's refusal of --tp-comm-overlap without sequence parallelism, which it
    turns off at tp 1: for the job as configured (a job search's base config is not one;
    its shapes at tp 1 run without the overlap)."""
    a = arch_of(cfg.model)
    if a is None or not cfg.pipeline.tp_comm_overlap:
        return
    words = "Tensor parallel communication/GEMM overlap can happen only when sequence " \
        "parallelism is enabled"
    if a.tp == 1:
        raise UserError("pipeline.tp_comm_overlap", words, "drop --tp-comm-overlap at tp 1, "
                        "where Megatron disables sequence parallelism")
    if not a.sequence_parallel:
        raise UserError("pipeline.tp_comm_overlap", words + " (Megatron's words)",
                        "add --sequence-parallel, or set model.sequence_parallel = true")


def dispatcher_refusal(dispatcher: str | None, a: Any) -> tuple[str, str] | None:
    """(problem, fix) when ppsim does not price `dispatcher` for the model `a` (None for
    a uniform one): the all-gather dispatcher across expert-parallel ranks."""
    if dispatcher == "allgather" and a is not None and a.num_experts and a.ep > 1:
        return ("allgather: ppsim prices the all-to-all dispatch between expert-parallel "
                "ranks", "give alltoall (or flex), or ep 1")
    return None


def _precision_runs_here(a: Any, hardware: Any) -> None:
    """MXFP8 and NVFP4 need Blackwell's tensor cores: refused on hardware without them."""
    if a.fp8 and a.fp8_recipe == "mxfp8" and not getattr(hardware, "mxfp8", False):
        raise UserError("model.fp8_recipe", "mxfp8 needs tensor cores that run MX formats "
                        "(Blackwell; [hardware] mxfp8 = true), which this hardware's lack",
                        "use --fp8-recipe tensorwise or blockwise here, or --hardware "
                        "b200-180gb")
    if a.nvfp4 and not getattr(hardware, "fp4_peak_tflops", 0.0):
        raise UserError("model.fp8", "NVFP4 (--fp4-format e2m1) needs FP4 tensor cores "
                        "(Blackwell; [hardware] fp4_peak_tflops), which this hardware lacks",
                        "use --hardware b200-180gb or gb200-186gb, or train in FP8")


def check(cfg: Any) -> None:
    """The job fields of a config in range: UserError naming the field otherwise."""
    p = cfg.pipeline
    parse_order(p.rank_order)
    if p.global_batch_size < 0:
        raise UserError("pipeline.global_batch_size", f"must be >= 0, got {p.global_batch_size}",
                        "give sequences per iteration, or 0 to use microbatches")
    if cfg.hardware.gpus_per_node < 1:
        raise UserError("hardware.gpus_per_node", f"must be at least 1, got "
                        f"{cfg.hardware.gpus_per_node}", "give the GPUs in one node, e.g. 8")
    for name in ("intra_node_bandwidth_gbps", "intra_node_latency_us",
                 "inter_node_bandwidth_gbps", "inter_node_latency_us"):
        value = getattr(cfg.hardware, name)
        if not 0 <= value < 1e9:
            raise UserError(f"hardware.{name}", f"must be >= 0 and finite, got {value}",
                            "give a figure per GPU per direction, or 0 for the p2p link's")
    for name in ("ddp_bucket_size", "ddp_num_buckets"):
        if getattr(p, name) is not None:
            validate.count(f"pipeline.{name}", getattr(p, name), hi=limits.MAX_BUCKET,
                           fix="give a whole number, or drop it for Megatron's default")
    if p.ddp_bucket_size is not None and p.ddp_num_buckets is not None:
        raise UserError("pipeline.ddp_num_buckets", "Cannot specify both num_buckets and "
                        "bucket_size", "give --ddp-bucket-size or --ddp-num-buckets")
    if p.overlap_param_gather and not p.overlap_grad_reduce:
        raise UserError("pipeline.overlap_param_gather", "Must use --overlap-param-gather "
                        "with --overlap-grad-reduce", "add --overlap-grad-reduce "
                        "(overlap_grad_reduce = true in [pipeline])")
    a = arch_of(cfg.model)
    if a is None:
        return
    check_split(a)
    if a.fsdp:
        _fsdp_alone(p, a)
    _precision_runs_here(a, cfg.hardware)
    refusal = dispatcher_refusal(p.moe_token_dispatcher_type, a)
    if refusal is not None:
        raise UserError("pipeline.moe_token_dispatcher_type", *refusal)
    if p.moe_token_dispatcher_type == "flex" and a.num_experts:
        _deepep_runs(a, p, getattr(cfg.hardware, "sm_count", 0))
    if p.moe_shared_expert_overlap and a.moe_latent_size and a.shared_width:
        raise UserError("pipeline.moe_shared_expert_overlap", "Shared expert overlap with MoE "
                        "latent projections is not supported during training",
                        "drop --moe-shared-expert-overlap, or the latent size")
    _torchtitan_experts_fold(a)
    _copies_divide(a)
    _bf16_layers_fit(a, p.pp)
    if p.overlap_param_gather and not (a.distributed_optimizer or a.megatron_fsdp):
        raise UserError("pipeline.overlap_param_gather", "--overlap-param-gather only "
                        "supported with distributed optimizer or megatron fsdp", "add "
                        "--use-distributed-optimizer (distributed_optimizer = true in [model])")
    _gather_with_step(a, p)
    check_context_parallel(a)
    _experts_fold(a, p)
    if p.global_batch_size:
        microbatches_for(p.global_batch_size, a.micro_batch_size, a.dp)


def _gather_with_step(a: Any, p: Any) -> None:
    """--overlap-param-gather-with-optimizer-step as Megatron's arguments.py and optimizer
    accept it, its chunks aside (`plan --gpus` searches them: check_gather_chunks)."""
    if not p.overlap_param_gather_with_optimizer_step:
        return
    flag = "pipeline.overlap_param_gather_with_optimizer_step"
    drop = "or drop --overlap-param-gather-with-optimizer-step"
    if a.fsdp:
        raise UserError(flag, "is priced with the distributed optimizer alone (Megatron's "
                        "FSDP gathers its own way)", f"drop the FSDP flag, {drop}")
    if not a.distributed_optimizer:
        raise UserError(flag, "--overlap-param-gather-with-optimizer-step only supported "
                        "with distributed optimizer", f"add --use-distributed-optimizer, {drop}")
    if not p.overlap_param_gather:
        raise UserError(flag, "Must use --overlap-param-gather-with-optimizer-step with "
                        "--overlap-param-gather", f"add --overlap-param-gather, {drop}")
    if a.optimizer == "muon":
        raise UserError(flag, "overlap_param_gather_with_optimizer_step is not supported "
                        "with use_layer_wise_distributed_optimizer", f"use adam, {drop}")


def check_gather_chunks(p: Any, vpp: int) -> None:
    """A job under --overlap-param-gather-with-optimizer-step runs interleaved (Megatron's
    arguments.py asserts a virtual pipeline size)."""
    if p.overlap_param_gather_with_optimizer_step and vpp <= 1:
        raise UserError("pipeline.overlap_param_gather_with_optimizer_step",
                        "--overlap-param-gather-with-optimizer-step only supported with "
                        "interleaved pipeline parallelism", "give --vpp 2 or more, or drop "
                        "--overlap-param-gather-with-optimizer-step")


def _experts_fold(a: Any, p: Any) -> None:
    """The experts' world etp x ep x edp x pp is the dense one's (Megatron's
    initialize_model_parallel): etp x ep divides tp x cp x dp, and outside pp-last rank
    orders the two data-parallel sizes agree (asserted for every model: a dense one's
    expert world is tp x 1 x cp·dp, so there cp > 1 fails it). At dp 1 (no world given) a
    preset's ep above one replica's ranks views the experts of a wider world and is let
    be."""
    ranks, folded = a.tp * a.cp * a.dp, a.expert_tp * a.ep
    if (ranks >= folded or a.dp > 1) and ranks % folded:
        raise UserError("model.etp" if a.etp else "model.ep",
                        f"world_size ({ranks * p.pp}) is not divisible by "
                        f"expert_tensor_model_pipeline_parallel size ({folded * p.pp})",
                        f"choose etp x ep ({a.expert_tp} x {a.ep}) dividing tp x cp x dp "
                        f"({ranks})")
    if p.pp > 1 and not p.rank_order.endswith("pp") and ranks >= folded \
            and a.expert_dp != a.dp:
        raise UserError("pipeline.rank_order", "When not using pp-last rank ordering, the "
                        "data parallel size of the attention and moe layers must be the "
                        f"same (dp {a.dp}, expert dp {a.expert_dp})", "use the default "
                        "order, or etp x ep equal to tp x cp")


def _torchtitan_experts_fold(a: Any) -> None:
    """torchtitan borrows ep from one replica's ranks, dp_shard x cp x tp, and refuses
    an ep that does not divide them, in its own words (ParallelDims._validate), before
    Megatron's folding rules could word it. HSDP copies that do not divide dp have no
    dp_shard (the launch notes so); at dp 1 a preset's ep views a wider world, as in
    _experts_fold."""
    n = a.dp_replicas
    if not (a.torchtitan_fsdp and a.num_experts) or a.dp % n:
        return
    region = a.dp // n * a.cp * a.tp
    if (a.dp > 1 or region >= a.ep) and region % a.ep:
        raise UserError("parallelism.expert_parallel_degree",
                        f"expert_parallel_degree ({a.ep}) must divide dp_shard * cp * tp "
                        f"({region})", f"give an ep dividing {region}, or more dp_shard "
                        "ranks per replica")


def _copies_divide(a: Any) -> None:
    """Copies of the sharded state divide the data-parallel group, dense and expert, as
    Megatron asserts (parallel_state.py)."""
    n, group = a.dp_replicas, a.dp * a.cp
    if n == 1 or group == 1:  # dp x cp = 1: one replica's view, before the world gives dp
        return
    if group % n:
        raise UserError("model.dp_replicas", "Data parallel size should be divisible by "
                        f"partial DistOpt shard factor (dp x cp = {group}, {n} copies)",
                        "give a number of copies dividing dp x cp")
    ranks, folded = a.tp * group, a.expert_tp * a.ep
    if a.num_experts and ranks >= folded and a.expert_dp % n:
        raise UserError("model.dp_replicas", "Expert data parallel size should be divisible "
                        "by partial DistOpt shard factor (tp x cp x dp / (etp x ep) = "
                        f"{a.expert_dp}, {n} copies)", "give a number of copies dividing "
                        "the expert data-parallel size")


def _deepep_runs(a: Any, p: Any, sm_count: int) -> None:
    """UserError for a flex (DeepEP) dispatcher Megatron or DeepEP refuses: padded to
    capacity, an etp x ep group of one or of a size DeepEP has no configuration for, its SMs
    all of the GPU's, or odd across nodes."""
    if a.moe_pad_to_capacity:
        raise UserError("pipeline.moe_token_dispatcher_type", "Flex token dispatcher with "
                        "deepep backend does not support moe_pad_expert_input_to_capacity",
                        "give alltoall, or drop --moe-pad-expert-input-to-capacity")
    held = p.moe_flex_dispatcher_num_sms or deepep.DEFAULT_SMS
    if sm_count and held >= sm_count:
        raise UserError("pipeline.moe_flex_dispatcher_num_sms",
                        f"{held} SMs for DeepEP leave none of the GPU's {sm_count} to "
                        "compute", f"give fewer than {sm_count}")
    if a.expert_tp * a.ep <= 1:
        raise UserError("pipeline.moe_token_dispatcher_type", "DeepEP dispatcher requires "
                        "TPxEP > 1", "give --ep or --etp above 1, or alltoall")
    deepep.check(a.expert_tp * a.ep, held)


def _fsdp_alone(p: Any, a: Any) -> None:
    """Megatron DDP's knobs have no meaning under FSDP, which overlaps one unit at a time
    (Megatron's FSDPs take --overlap-grad-reduce, and overlap anyway); torchtitan keeps
    each expert whole on its rank; Megatron's --use-torch-fsdp2 takes neither pipeline nor
    expert parallelism nor gradient-accumulation fusion nor tied embeddings (its
    assertions)."""
    own = torchtitan_expert_tp(a.tp, a.ep)
    if a.torchtitan_fsdp and a.num_experts and a.expert_tp != own:
        raise UserError("model.etp", f"{a.expert_tp}: torchtitan splits each expert over "
                        "tp without expert parallelism and over no ranks with it (it has "
                        "no expert tensor-parallel size)",
                        f"give etp {own} (or leave it unset) under --fsdp")
    if a.megatron_fsdp2:
        for size, what in ((p.pp, "pipeline"), (a.ep, "expert")):
            if size != 1:
                raise UserError("model.fsdp_framework", f"--use-torch-fsdp2 is not supported "
                                f"with {what} parallelism (Megatron's words)",
                                f"give --{what[0]}p 1, or use --fsdp (torchtitan's FSDP2)")
        if a.gradient_accumulation_fusion:
            raise UserError("model.gradient_accumulation_fusion", "--use-torch-fsdp2 is not "
                            "supported with gradient accumulation fusion (Megatron's words)",
                            "add --no-gradient-accumulation-fusion")
        if a.tie_embeddings:
            raise UserError("model.tie_embeddings", "--use-torch-fsdp2 requires "
                            "--untie-embeddings-and-output-weights (Megatron's words)",
                            "add --untie-embeddings-and-output-weights (tie_embeddings = "
                            "false), or use --fsdp (torchtitan's FSDP2)")
    # Megatron-FSDP's strategy turns both overlaps on itself (megatron_fsdp.py); Megatron
    # takes --overlap-grad-reduce beside --use-torch-fsdp2 too, whose FSDP2 overlaps anyway.
    ddp_only = (() if a.fsdp_by_megatron else (("overlap_grad_reduce", "--overlap-grad-reduce"),))
    for name, flag in (*ddp_only, ("ddp_bucket_size", "--ddp-bucket-size"),
                       ("ddp_num_buckets", "--ddp-num-buckets")):
        if getattr(p, name) not in (None, False):
            raise UserError(f"pipeline.{name}", f"{flag} is Megatron DDP's; FSDP reduces "
                            "and gathers one unit (a layer) at a time, overlapped by "
                            "itself", f"drop {flag} ({name} in [pipeline]), or drop --fsdp")


def resolved(cfg: Any, microbatches_given: int | None = None,
             batch_given: bool = True) -> Any:
    """cfg with the microbatches its global batch gives (unchanged when none is set).

    A microbatch count given with it (a flag, a file's field, a TUI edit) is either the
    one the batch gives, or refused when the global batch was given with it
    (`batch_given`), or else replaces the loaded global batch: what is given overrides
    what was loaded, and nothing given is dropped silently."""
    p = cfg.pipeline
    if not p.global_batch_size:
        return cfg
    a = arch_of(cfg.model)
    mbs, dp = (a.micro_batch_size, a.dp) if a is not None else (1, 1)
    if microbatches_given is not None and not batch_given \
            and microbatches_given * mbs * dp != p.global_batch_size:
        return replace(cfg, pipeline=replace(p, global_batch_size=0,
                                             microbatches=microbatches_given))
    m = microbatches_for(p.global_batch_size, mbs, dp)
    if microbatches_given is not None and microbatches_given != m:
        raise UserError("pipeline.microbatches", f"{microbatches_given} disagrees with "
                        f"global_batch_size {p.global_batch_size}, which gives {m} at "
                        f"micro_batch_size {mbs} and dp {dp}", "give the global batch "
                        "(--global-batch-size) or the microbatches (--microbatches), not both")
    return cfg if m == p.microbatches else replace(cfg, pipeline=replace(p, microbatches=m))


def _bf16_layers_fit(a: Any, pp: int) -> None:
    """--num-layers-at-start/end-in-bf16 as Megatron bounds them under FP8: at most the
    layers of one pipeline stage (TransformerConfig.__post_init__)."""
    if not (a.fp8 and a.first_last_layers_bf16):
        return
    most = a.num_layers // pp
    for where in ("start", "end"):
        n = getattr(a, f"num_layers_at_{where}_in_bf16")
        if n > most:
            raise UserError(f"model.num_layers_at_{where}_in_bf16", f"num_layers_at_{where}_"
                            f"in_bf16 ({n}) must be between 0 and number of layers per "
                            f"pipeline stage ({most}).", f"give at most {most}")
