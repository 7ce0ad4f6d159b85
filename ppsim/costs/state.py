"""What a weight costs to hold and to step: its gradient, the optimizer's state (Adam's,
or Muon's on the decoder's weights), how the distributed optimizer or FSDP spreads that
state, and the step's memory traffic. Megatron's distributed optimizer's table, its
precision-aware optimizer's dtypes, torchtitan's FSDP2."""

from __future__ import annotations

from dataclasses import replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.ops import Op

STATE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes of one optimizer-state element in each dtype Megatron's flags name."""
OPTIMIZER_DTYPES = {"main_grads_dtype": ("fp32", "bf16"), "main_params_dtype": ("fp32", "fp16"),
                    "exp_avg_dtype": tuple(STATE_BYTES), "exp_avg_sq_dtype": tuple(STATE_BYTES)}
"""Each state dtype field and the values Megatron's flag of that name takes."""


def grad_bytes(a: Architecture) -> int:
    """Bytes of one parameter's gradient as Megatron keeps and reduces it: fp32 for bf16
    weights, or bf16 under --grad-reduce-in-bf16 or --main-grads-dtype bf16 (neither
    forces fp32 accumulation then: arguments.py); fp16 weights' in fp16 (arguments.py
    forces fp32 accumulation for bf16 alone), in fp32 under
    --accumulate-allreduce-grads-in-fp32 (training.py: the DDP buffer's grad_reduce_in_fp32);
    under Megatron's --use-torch-fsdp2 the model's own dtype (no mixed-precision policy:
    the gradients are the weights'), and under Megatron-FSDP too
    (--megatron-fsdp-main-grads-dtype auto: the model's)."""
    if a.fsdp_by_megatron:
        return DTYPE_BYTES[a.dtype]
    if a.dtype == "fp16":
        return 4 if a.grads_in_fp32 else 2
    bf16_grads = a.grad_reduce_in_bf16 or a.main_grads_dtype == "bf16"
    return 2 if bf16_grads and a.dtype == "bf16" else 4


def landing_bytes(a: Architecture) -> float:
    """Bytes a weight's gradient costs to land each microbatch. Megatron's gradient-
    accumulation fusion: the wgrad GEMM reads and writes the main grad in the dtype it is
    kept in (grad_bytes: 8 for fp32, 4 under --grad-reduce-in-bf16); torchtitan's FSDP
    accumulates its fp32 gradient the same way; Megatron-FSDP overwrites its unit's
    buffer in the model's dtype (overwrite_main_grad: the buffer is reduce-scattered in
    every backward). Unfused (--no-gradient-accumulation-fusion, which Megatron's
    --use-torch-fsdp2 requires), the gradient is first written in the model's dtype and
    read back: two more of its bytes each way."""
    w = DTYPE_BYTES[a.dtype]
    fused = float(grad_bytes(a) * (1 if a.megatron_fsdp else 2))
    return fused if a.gradient_accumulation_fusion else fused + 2 * w


def landed(a: Architecture, ops: list[Op]) -> list[Op]:
    """`ops` with what their weights' gradients cost to land (landing_bytes)."""
    bytes_ = landing_bytes(a)
    if bytes_ == Op.grad_bytes:
        return ops
    return [replace(op, grad_bytes=bytes_) if op.params else op for op in ops]


def optimizer_state_bytes(a: Architecture) -> int:
    """Adam's state per parameter, before the distributed optimizer shards it: the master
    weight (none for fp32 training, whose weight is its own) and two moments."""
    if a.precision_aware_optimizer and not a.optimizer_cpu_offload:
        return 2 + STATE_BYTES[a.exp_avg_dtype] + STATE_BYTES[a.exp_avg_sq_dtype]
    return 8 if a.dtype == "fp32" else 12


def host_state_share(a: Architecture) -> float:
    """Of each rank's optimizer shard, the share kept and stepped on the host: Megatron's
    HybridDeviceOptimizer's fraction (fp32 master weights and moments on both sides,
    whatever the precision-aware dtypes say: it passes them to neither its host nor its
    device Adam), all of it under FSDP2's CPU offload, else none."""
    if a.fsdp:
        return 1.0 if a.fsdp_cpu_offload else 0.0
    return a.optimizer_offload_fraction if a.optimizer_cpu_offload else 0.0


def muon_state_bytes(a: Architecture) -> int:
    """Muon's state per decoder weight before the distributed optimizer spreads it: the
    fp32 momentum, and the fp32 master unless the model trains in fp32."""
    return 4 if a.dtype == "fp32" else 8


ADAM_BYTES_PER_PARAM = 28
"""AdamW's step reads the fp32 parameter, gradient and two moments (16 B) and writes
the parameter and the moments (12 B): memory-bound. Megatron's optimizer casts bf16
gradients to fp32 first, so it is 28 whatever the gradient buffer's dtype."""


def adam_step_bytes(a: Architecture) -> int:
    """Memory traffic of AdamW's step per parameter: ADAM_BYTES_PER_PARAM, or under the
    precision-aware optimizer the gradient as kept, the master weight and the moments in
    their dtypes, read and written back (not beside the host optimizer, whose device
    share steps fp32 state: host_state_share)."""
    if not a.precision_aware_optimizer or a.optimizer_cpu_offload:
        return ADAM_BYTES_PER_PARAM
    return grad_bytes(a) + 2 * optimizer_state_bytes(a)


def optimizer_shards(a: Architecture, experts: bool = False) -> int:
    """Ranks the distributed optimizer (or FSDP) shards a parameter's state over: dense
    ones over dp x cp (Megatron's intra_dp_cp_group, torchtitan's dp_shard x cp mesh),
    routed experts' over the expert data-parallel group, tp x cp x dp / (etp x ep)
    (world / (etp x ep x pp); torchtitan's efsdp); each over 1 / dp_replicas of that
    group."""
    if not (a.distributed_optimizer or a.fsdp):
        return 1
    group = a.expert_dp if experts else a.dp * a.cp
    return max(1, group // a.dp_replicas)


FSDP_SHARD_BYTES = 16
"""An FSDP shard's bytes a parameter: the fp32 weight (mixed precision computes with a
gathered bf16 copy), its fp32 gradient (FSDP2 casts the reduced gradient back to the
shard's dtype whatever it reduces in: _fsdp_collectives.py) and Adam's two fp32 moments;
under Megatron's FSDPs the bf16 weight and gradient, the fp32 master and the moments,
16 all the same."""


def bytes_per_param(a: Architecture, experts: bool = False, layer: bool = False) -> float:
    """Megatron (its distributed optimizer's table): weights + grads + Adam states, per
    parameter; bf16 weights keep fp32 gradients unless they are reduced in bf16.
    `experts`: a routed expert's, whose state shards over fewer ranks. `layer`: a decoder
    layer's weight matrix, which Muon steps (its norms stay on Adam). Under FSDP
    all of it is sharded: FSDP_SHARD_BYTES (on the host under FSDP2's CPU offload,
    ppsim.job.fsdp)."""
    if a.fsdp:
        return FSDP_SHARD_BYTES * (1 - host_state_share(a)) / optimizer_shards(a, experts)
    if a.dtype == "fp32":
        held = 8  # the weight (its own master) and its gradient
    else:
        held = 2 + grad_bytes(a)  # 16-bit weights and their gradient buffer
    muon = layer and a.optimizer == "muon"
    # The step reads fp32 gradients: an fp16 buffer's are copied (.float(), optimizer.py),
    # an fp32 buffer's read in place.
    copied = 4 * (a.dtype == "fp16" and grad_bytes(a) == 2)
    state = (muon_state_bytes(a) if muon else optimizer_state_bytes(a)) + copied
    return held + state * (1 - host_state_share(a)) / optimizer_shards(a, experts)
