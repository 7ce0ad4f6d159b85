"""Per-op roofline: a layer as a list of ops, each timed by what bounds it.

Matmuls run at a fraction of peak that grows with their size (a curve of
(GFLOP, efficiency) points: small matmuls pay a fixed launch and fill/drain
time); attention runs at FlashAttention's FLOPs with the causal half skipped;
everything else (norms, rotary, activation functions, residual adds, the
loss's softmax, routing) is bytes over memory bandwidth. Every op also costs
at least the host's per-kernel dispatch time, so small models come out
launch-bound as eager PyTorch is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppsim.errors import UserError

# FlashAttention's backward does five s x s matmuls (scores recomputed, dV, dP,
# dQ, dK) against the forward's two: 2.5x the forward FLOPs.
FLASH_BACKWARD = 2.5


@dataclass(frozen=True)
class Op:
    """One forward op of a piece; its backward and weight-gradient work follow from it."""

    name: str
    flops: float = 0.0
    """Forward FLOPs (matmuls and attention)."""
    shape: tuple[int, int, int] = (0, 0, 0)
    """(m, n, k) of a matmul: m x k times k x n; m is the token count."""
    nbytes: float = 0.0
    """Forward bytes read and written (memory-bound ops)."""
    attention: bool = False
    """The attention core (FlashAttention)."""
    params: int = 0
    """Weights of a matmul: W lands their gradient where it is reduced from."""
    grad_bytes: float = 8.0
    """Bytes each weight's gradient costs W to land, each microbatch: read and write of
    the fp32 main grad it accumulates into (Megatron's gradient-accumulation fusion), or
    less where sharding keeps the gradient elsewhere (ppsim.costs.state.landed)."""
    backward_bytes: float = -1.0
    """Backward bytes of a memory-bound op; -1: twice the forward's."""
    fp8: bool = False
    """A matmul Transformer Engine runs quantized (ppsim.costs.fp8): in FP8, or in NVFP4
    where `fp4`."""
    fp4: bool = False
    """A quantized matmul that runs in NVFP4 (--fp4-format), at the FP4 peak."""
    both_grads: bool = False
    """A matmul of two activations (unfused attention's scores and context): its
    backward computes both operands' gradients, each in the input-gradient pass."""


QUANTIZE_BYTES = 4
"""Bytes an element of an FP8 GEMM's operand costs to quantize: read in bf16, written as
FP8 and as its FP8 transpose."""
NVFP4_BYTES = 0.5 + 1 / 16
"""An NVFP4 element: 4 bits, and its share of its 16-element block's E4M3 scale."""
NVFP4_QUANTIZE_BYTES = 2 + 2 * NVFP4_BYTES
"""Bytes an element of an NVFP4 GEMM's operand costs to quantize: read in bf16, written
rowwise and columnwise (the weight gradient's copy through the random Hadamard transform,
which Transformer Engine fuses into the quantization)."""


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """What a device achieves, per kind of work."""

    peak_tflops: float
    """Dense peak of the training dtype."""
    efficiency: float = 0.5
    """Matmul efficiency when no curve is given."""
    matmul_efficiency: tuple[tuple[float, float], ...] = ()
    """(GFLOP of one matmul, fraction of peak), interpolated in log GFLOP."""
    attention_efficiency: float = 0.0
    """FlashAttention's fraction of peak; 0: the matmul efficiency."""
    memory_bandwidth_gbps: float = 0.0
    """Achieved memory bandwidth; 0: memory-bound ops are free."""
    kernel_overhead_us: float = 0.0
    """Least time one kernel takes (host dispatch + launch)."""
    fp8_peak_tflops: float = 0.0
    """Dense FP8 peak; 0: no FP8 tensor cores."""
    fp8_efficiency_ratio: float = 1.0
    """FP8 GEMMs' share of their peak over bf16's at the same FLOPs."""
    fp4_peak_tflops: float = 0.0
    """Dense FP4 peak (NVFP4); 0: no FP4 tensor cores."""
    fp4_efficiency_ratio: float = 1.0
    """NVFP4 GEMMs' share of their peak over bf16's at the same FLOPs."""


def matmul_efficiency(r: Roofline, gflop: float) -> float:
    """Fraction of peak a matmul of `gflop` GFLOP reaches."""
    pts = sorted(r.matmul_efficiency)
    if not pts:
        return r.efficiency
    if gflop <= pts[0][0]:
        return pts[0][1] * gflop / pts[0][0]  # below the curve: fixed time dominates
    for (g0, e0), (g1, e1) in zip(pts, pts[1:], strict=False):
        if gflop <= g1:
            x = (math.log(gflop) - math.log(g0)) / (math.log(g1) - math.log(g0))
            return e0 + x * (e1 - e0)
    return pts[-1][1]


def matmul_ms(r: Roofline, m: int, n: int, k: int, fp8: bool = False,
              fp4: bool = False) -> float:
    """An (m, n, k) matmul; `fp8`: at the FP8 peak, on the bf16 efficiency curve scaled
    by fp8_efficiency_ratio; `fp4`: at the FP4 peak likewise (fp4_efficiency_ratio)."""
    flops = 2.0 * m * n * k
    if flops <= 0:
        return 0.0
    eff = max(matmul_efficiency(r, flops / 1e9), 1e-6)
    if fp4:
        return flops / (r.fp4_peak_tflops * 1e9 * eff * r.fp4_efficiency_ratio)
    if fp8:
        return flops / (r.fp8_peak_tflops * 1e9 * eff * r.fp8_efficiency_ratio)
    return flops / (r.peak_tflops * 1e9 * eff)


@dataclass(frozen=True, kw_only=True)
class MatmulPasses:
    """The (m, n, k) of each matmul a weight matmul's op runs: m x k times k x n."""

    forward: tuple[int, int, int]
    input_grad: tuple[int, int, int]
    """dX = dY W^T."""
    weight_grad: tuple[int, int, int] | None
    """dW = X^T dY; None for a matmul without weights (its W pass is empty)."""
    operand_grad: tuple[int, int, int] | None = None
    """The second operand's gradient, X^T dY, where it is an activation (`both_grads`):
    part of the input-gradient pass."""


def matmul_passes(op: Op) -> MatmulPasses:
    """The matmuls of a matmul op's forward, input-gradient and weight-gradient passes
    (what `ppsim profile --hardware-out` times for a config)."""
    m, n, k = op.shape
    return MatmulPasses(forward=(m, n, k), input_grad=(m, k, n),
                        weight_grad=(k, n, m) if op.params else None,
                        operand_grad=(k, n, m) if op.both_grads else None)


def _mem_ms(r: Roofline, nbytes: float) -> float:
    return nbytes / (r.memory_bandwidth_gbps * 1e6) if r.memory_bandwidth_gbps > 0 else 0.0


def op_times(r: Roofline, op: Op) -> tuple[float, float, float, int, int]:
    """(forward, input-gradient, weight-gradient) ms of an op, and its kernel counts
    in the forward and in the backward."""
    if op.attention:
        eff = r.attention_efficiency or matmul_efficiency(r, op.flops / 1e9)
        f = op.flops / (r.peak_tflops * 1e9 * eff)
        return f, FLASH_BACKWARD * f, 0.0, 1, 1
    if op.flops:
        m, n, k = op.shape
        scale = op.flops / (2.0 * m * n * k)  # several equal matmuls (experts) in one op
        passes = matmul_passes(op)
        _check_peak(r, op)
        q = op.fp8, op.fp4
        f = matmul_ms(r, *passes.forward, *q) * scale
        b = matmul_ms(r, *passes.input_grad, *q) * scale
        if passes.operand_grad:
            b += matmul_ms(r, *passes.operand_grad, *q) * scale
        w = matmul_ms(r, *passes.weight_grad, *q) * scale if passes.weight_grad else 0.0
        w += _mem_ms(r, op.grad_bytes * op.params)
        if not op.fp8:
            return f, b, w, 1, 2 if passes.operand_grad else 1
        # quantize the input (forward) and the output's gradient (backward) first
        per = NVFP4_QUANTIZE_BYTES if op.fp4 else QUANTIZE_BYTES
        f += _mem_ms(r, per * m * k * scale)
        b += _mem_ms(r, per * m * n * scale)
        return f, b, w, 2, 2
    back = 2 * op.nbytes if op.backward_bytes < 0 else op.backward_bytes
    return _mem_ms(r, op.nbytes), _mem_ms(r, back), 0.0, 1, 1


def _check_peak(r: Roofline, op: Op) -> None:
    """A quantized matmul needs the tensor cores of its format."""
    if op.fp4 and r.fp4_peak_tflops <= 0:
        raise UserError("hardware.fp4_peak_tflops", "is 0: the device has no FP4 tensor "
                        "cores to run --fp4-format on", "give the dense FP4 peak (B200: "
                        "9000), or drop --fp4-format")
    if op.fp8 and not op.fp4 and r.fp8_peak_tflops <= 0:
        raise UserError("hardware.fp8_peak_tflops", "is 0: the device has no FP8 "
                        "tensor cores to run --fp8-format on", "give the dense FP8 peak "
                        "(H100/H200: 1979), or drop fp8")


def piece_times(r: Roofline, ops: list[Op]) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) ms of a list of ops. The host issues
    kernels ahead of the device, so a phase takes the longer of the device's sum and
    the host's dispatch time for its kernels."""
    f = b = w = 0.0
    nf = nb = nw = 0
    for op in ops:
        of, ob, ow, kf, kb = op_times(r, op)
        f, b, w = f + of, b + ob, w + ow
        nf += kf
        nb += kb
        nw += 1 if op.params else 0
    t = r.kernel_overhead_us / 1e3
    return max(f, nf * t), max(b, nb * t), max(w, nw * t)
