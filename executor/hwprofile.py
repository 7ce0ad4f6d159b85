"""Measure the roofline figures of this device: a [hardware] table for a config.

A handful of matmul shapes (the efficiency curve), FlashAttention
(scaled_dot_product_attention, causal) at a few sequence lengths, a copy for
memory bandwidth, and the executor's layer at a tiny width for the host's time
per op. On a GPU it takes well under a minute; on CPU the sizes are small.

Given a model, the curve is measured at the matmuls that model runs (each weight
matmul's forward, input-gradient and weight-gradient shapes, per tensor-parallel
rank, the head's included) and attention at its heads, sequence and dropout, so the
[hardware] table holds that job's kernel rates rather than a square-matmul curve's.
`sustained` seconds of a large matmul first bring a GPU to the clock it holds under
a training job's power draw (a burst runs faster than that), and each figure is then
the mean over a window of back-to-back runs (WINDOW_MS, or the warm-up's length where
that is shorter) rather than a median of single ones.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ppsim.costs.arch import Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.kinds import kind_ops
from ppsim.costs.kv_split import rank_kv_heads
from ppsim.costs.layerops import attention_ops, head_ops, layer_ops, mtp_ops
from ppsim.costs.ops import FLASH_BACKWARD, matmul_passes
from ppsim.costs.stack import layer_kinds
from ppsim.executor.builders.gpt import build
from ppsim.executor.builders.llama import architecture
from ppsim.executor.devices import dense_peak, device_facts, low_precision_facts
from ppsim.job.layers import per_rank_arch

GPU_MATMULS = [(256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (2048, 6144, 2048),
               (4096, 4096, 4096), (8192, 4096, 14336), (8192, 8192, 8192)]
CPU_MATMULS = [(32, 32, 32), (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512)]
MAX_MODEL_MATMULS = 64
"""Distinct matmul shapes measured for a model at the most (a hybrid MoE stack has ~40)."""
ATTENTION_DROPOUT = 0.1
"""Megatron's default --attention-dropout, what a model with dropout on runs."""


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    def run(fn: Callable[[], Any], reps: int) -> float:
        """Median ms of `fn` over reps, after two warm-ups."""
        times = []
        for i in range(reps + 2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return run


def _window_timer(device: torch.device, window_ms: float) -> Callable[[Callable[[], Any], int],
                                                                      float]:
    """Mean ms of `fn` over back-to-back runs filling `window_ms` (at least `reps`),
    after one warm-up: the rate a kernel holds in a stream of work, not a burst's."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(fn: Callable[[], Any], reps: int) -> float:
        fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        once = max(time.perf_counter() - t0, 1e-7)
        n = max(reps, int(window_ms / 1e3 / once))
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t0) * 1e3 / n

    return run


def warm_up(device: torch.device, dtype: torch.dtype, seconds: float) -> float:
    """Run the largest matmul for `seconds`; returns its TFLOP/s over the last second,
    the power-saturated rate the device settles at."""
    m, n, k = generic_matmuls(device)[-1]
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    run = _window_timer(device, 1e3 * max(seconds - 1.0, 0.0))
    run(lambda: a @ b, 1)
    ms = _window_timer(device, 1e3 * min(seconds, 1.0))(lambda: a @ b, 1)
    return 2 * m * n * k / (ms * 1e9)


def model_matmuls(a: Architecture) -> list[tuple[int, int, int]]:
    """The distinct (m, n, k) a model's weight matmuls run per tensor-parallel (and
    context-parallel) rank: every layer kind's, the head's and an MTP module's, each in
    its forward, input-gradient and weight-gradient shape (ppsim.costs.ops)."""
    a = per_rank_arch(a)
    ops = [op for kind in sorted(set(layer_kinds(a))) for op in kind_ops(a, kind)]
    ops += head_ops(a) + (mtp_ops(a) if a.mtp_layers else [])
    shapes: list[tuple[int, int, int]] = []
    for op in ops:
        if not op.flops or op.attention:
            continue
        p = matmul_passes(op)
        for shape in (p.forward, p.input_grad, p.weight_grad, p.operand_grad):
            if shape and shape not in shapes:
                shapes.append(shape)
    return shapes[:MAX_MODEL_MATMULS]


Tick = Callable[[str], None]
"""Told what is measured next (the CLI's progress bar)."""


def _quiet(what: str) -> None:
    pass


def generic_matmuls(device: torch.device) -> list[tuple[int, int, int]]:
    return GPU_MATMULS if device.type == "cuda" else CPU_MATMULS


def measure_matmuls(device: torch.device, dtype: torch.dtype, reps: int,
                    shapes: list[tuple[int, int, int]] | None = None,
                    window_ms: float = 0.0, tick: Tick = _quiet) -> list[dict]:
    """Each shape's time and rate; by default the generic curve's shapes."""
    run = _window_timer(device, window_ms) if window_ms > 0 else _timer(device)
    out = []
    for m, n, k in shapes or generic_matmuls(device):
        tick(f"matmul {m} x {n} x {k}")
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        ms = run(lambda a=a, b=b: a @ b, reps)
        out.append({"shape": [m, n, k], "gflop": 2 * m * n * k / 1e9,
                    "tflops": 2 * m * n * k / (ms * 1e9), "ms": ms})
    return out


def _qkv(device: torch.device, dtype: torch.dtype, b: int, heads: int, kv_heads: int, s: int,
         qk_dim: int, v_dim: int) -> tuple[torch.Tensor, ...]:
    """Query, key, value (b, heads, s, d) and an output gradient."""
    def t(h: int, d: int, grad: bool = True) -> torch.Tensor:
        return torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=grad)

    return t(heads, qk_dim), t(kv_heads, qk_dim), t(kv_heads, v_dim), t(heads, v_dim, False)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float) -> torch.Tensor:
    gqa = q.shape[1] != k.shape[1]
    kw = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, **kw)


def _time_attention(run: Callable[[Callable[[], Any], int], float], qkvg: tuple[torch.Tensor, ...],
                    dropout: float, reps: int) -> tuple[float, float]:
    """(forward ms, backward ms) of causal SDPA: the backward as forward + backward less
    the forward."""
    q, k, v, g = qkvg
    fwd = run(lambda: _sdpa(q, k, v, dropout), reps)
    both = run(lambda: _sdpa(q, k, v, dropout).backward(g), reps)
    return fwd, max(both - fwd, 1e-6)


def measure_attention(device: torch.device, dtype: torch.dtype, reps: int) -> list[dict]:
    """Causal SDPA forward and backward; FLOPs as FlashAttention counts them (half the
    s x s scores)."""
    run = _timer(device)
    heads, hd, lengths = (32, 128, (1024, 4096, 8192)) if device.type == "cuda" \
        else (4, 32, (64, 128, 256))
    out = []
    for s in lengths:
        flops = 2 * s * s * heads * hd  # 4 s^2 (heads x hd), halved by the causal mask
        fwd, bwd = _time_attention(run, _qkv(device, dtype, 1, heads, heads, s, hd, hd), 0.0,
                                   reps)
        out.append({"seq_length": s, "flops": flops, "forward_ms": fwd, "backward_ms": bwd,
                    "forward_tflops": flops / (fwd * 1e9),
                    "backward_tflops": FLASH_BACKWARD * flops / (bwd * 1e9)})
    return out


def measure_model_attention(device: torch.device, dtype: torch.dtype, a: Architecture,
                            window_ms: float = 0.0) -> dict:
    """A model's attention core as it runs per rank (its heads, key/value heads, head
    widths, sequence, micro-batch, and Megatron's attention dropout when the model has
    dropout), forward and forward + backward, FLOPs as the model counts them; on a GPU
    by each fused kernel that takes it, the fastest kept (`kernel`; all in `kernels`)."""
    a = per_rank_arch(a)
    sh = attention_shape(a)
    heads = max(1, a.num_heads // a.tp)
    qk_dim, v_dim = sh.q // a.num_heads, sh.out // a.num_heads
    kv_heads = rank_kv_heads(a)
    dropout = ATTENTION_DROPOUT if a.dropout else 0.0
    b, s = a.micro_batch_size, a.seq_length
    qkvg = _qkv(device, dtype, b, heads, kv_heads, s, qk_dim, v_dim)
    run = _window_timer(device, window_ms) if window_ms > 0 else _timer(device)
    flops = next(op.flops for op in attention_ops(a) if op.attention)
    timed = {}
    for name, backend in _backends(device):
        try:
            with sdpa_kernel(backend) if backend else contextlib.nullcontext():
                fwd, bwd = _time_attention(run, qkvg, dropout, 5)
        except RuntimeError:  # this kernel does not take these shapes or this dropout
            continue
        timed[name] = {"forward_ms": fwd, "backward_ms": bwd,
                       "tflops": (1 + FLASH_BACKWARD) * flops / ((fwd + bwd) * 1e9)}
    if not timed:
        raise RuntimeError("no attention kernel ran the model's attention")
    best = max(timed, key=lambda n: timed[n]["tflops"])
    return {"heads": heads, "kv_heads": kv_heads, "head_dim": qk_dim, "v_head_dim": v_dim,
            "seq_length": s, "micro_batch_size": b, "dropout": dropout, "flops": flops,
            "kernel": best, "kernels": timed, **timed[best]}


def _backends(device: torch.device) -> list[tuple[str, list[SDPBackend] | None]]:
    """The fused kernels to time on a GPU (Megatron's Transformer Engine picks a fused
    one: FlashAttention or cuDNN's); the default choice elsewhere."""
    if device.type != "cuda":
        return [("default", None)]
    return [("flash", [SDPBackend.FLASH_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
            ("efficient", [SDPBackend.EFFICIENT_ATTENTION])]


def measure_bandwidth(device: torch.device, reps: int) -> float:
    """GB/s of a large copy (read + write)."""
    n = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _timer(device)(lambda: dst.copy_(src), reps)
    return 2 * n / (ms * 1e6)


def measure_kernel_overhead(device: torch.device) -> float:
    """Host microseconds per modelled op: the executor's own decoder layer at a tiny width
    (device time ~0), forward and backward, over the ops the roofline counts for it
    (ppsim.layerops). Eager PyTorch spends this in Python modules, dispatch and
    autograd for every op, so a small model's layer is host-bound."""
    fields = {"num_layers": 1, "hidden_size": 64, "num_heads": 2, "num_kv_heads": 2,
              "ffn_hidden_size": 256, "vocab_size": 128, "seq_length": 16,
              "micro_batch_size": 1, "gated_mlp": False, "norm": "layernorm",
              "position": "learned", "dtype": "bf16" if device.type == "cuda" else "fp32"}
    builder = build(fields)
    layer = builder.layer(0).to(device=device, dtype=builder.dtype)
    x = torch.randn(*builder.activation_shape, device=device, dtype=builder.dtype,
                    requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()

    ops = len(layer_ops(architecture(fields), "dense"))
    return _timer(device)(step, 20) * 1e3 / (2 * ops)  # a forward and a backward kernel each


def efficiency_curve(matmuls: list[dict], peak: float) -> list[list[float]]:
    """(GFLOP, fraction of peak) points, one per distinct GFLOP (shapes of equal work
    averaged: the curve is keyed by work alone), in order."""
    by_work: dict[float, list[float]] = {}
    for x in matmuls:
        by_work.setdefault(_figures(x["gflop"]), []).append(min(1.0, x["tflops"] / peak))
    return [[g, _figures(statistics.fmean(e))] for g, e in sorted(by_work.items())]


def _figures(x: float) -> float:
    """A GFLOP count or a fraction of peak to 4 significant figures: a small matmul, or
    one timed on a loaded CPU (~1e-5 of peak), stays above 0, where 4 decimals made it 0,
    a curve point the [hardware] table refuses."""
    return float(f"{x:.4g}")


def _curve_points(generic: list[dict], model: list[dict]) -> list[dict]:
    """The model's matmuls, and the generic ones beyond their range (the tails the
    curve extrapolates to otherwise)."""
    if not model:
        return generic
    lo, hi = min(x["gflop"] for x in model), max(x["gflop"] for x in model)
    return model + [x for x in generic if x["gflop"] < lo or x["gflop"] > hi]


def hardware_table(peak: float, matmuls: list[dict], attention_tflops: float,
                   copy_gbps: float, kernel_overhead_us: float) -> dict[str, Any]:
    """The [hardware] figures of a measurement. The peak is rounded before the
    efficiencies are taken of it, so the table's efficiency x peak gives back the rate
    measured (a slow CPU's peak is a few hundredths of a TFLOP/s)."""
    peak = _figures(peak)
    return {"peak_tflops": peak, "matmul_efficiency": efficiency_curve(matmuls, peak),
            "attention_efficiency": _figures(min(1.0, attention_tflops / peak)),
            "memory_bandwidth_gbps": round(copy_gbps, 1),
            "kernel_overhead_us": round(kernel_overhead_us, 2)}


WINDOW_MS = 200.0
"""The window each kernel is timed over after a warm-up: long beside a launch, short
beside the seconds a clock takes to settle."""


def window_ms(sustained_s: float) -> float:
    """The window each kernel is timed over after `sustained_s` seconds of warm-up:
    WINDOW_MS, or the warm-up's length where that is shorter; 0 (a median of single runs)
    without a warm-up."""
    return min(WINDOW_MS, 1e3 * sustained_s) if sustained_s > 0 else 0.0


def measure_hardware(device_kind: str = "cpu", reps: int = 10, model: Architecture | None = None,
                     sustained_s: float = 0.0,
                     progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """The measurements and the [hardware] table they make: at `model`'s own matmuls and
    attention when given, after `sustained_s` seconds of warm-up (then each figure is a
    window's mean: module docstring). `progress(what, done, total)` before each step."""
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    window = window_ms(sustained_s)
    shapes = model_matmuls(model) if model else []
    # The matmuls, attention, the model's attention, bandwidth and host time, the warm-up.
    total = (len(generic_matmuls(device)) + len(shapes) + 2 + (1 if model else 0)
             + (1 if sustained_s > 0 else 0))
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        if progress:
            progress(what, done, total)
        done += 1

    settled = None
    if sustained_s > 0:
        tick(f"warming up for {sustained_s:g} s")
        settled = warm_up(device, dtype, sustained_s)
    generic = measure_matmuls(device, dtype, reps, window_ms=window, tick=tick)
    mine = measure_matmuls(device, dtype, reps, shapes, window, tick) if model else []
    peak = dense_peak(device, max(x["tflops"] for x in generic + mine))
    tick("attention")
    att = measure_attention(device, dtype, reps)
    model_att = None
    if model:
        tick("the model's attention")
        model_att = measure_model_attention(device, dtype, model, window)
    tick("memory bandwidth and time per kernel")
    bw = measure_bandwidth(device, reps)
    overhead = measure_kernel_overhead(device)
    if model_att:
        att_tflops = model_att["tflops"]
    else:  # forward and backward together, at the longest length
        last = att[-1]
        att_tflops = ((1 + FLASH_BACKWARD) * last["flops"]
                      / ((last["forward_ms"] + last["backward_ms"]) * 1e9))
    hw = hardware_table(peak, _curve_points(generic, mine), att_tflops, bw, overhead)
    hw.update(low_precision_facts(device))
    hw.update(device_facts(device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch_version": torch.__version__, "hardware": hw,
            "measurements": {"matmuls": generic, "model_matmuls": mine, "attention": att,
                             "model_attention": model_att, "copy_gbps": bw,
                             "kernel_overhead_us": overhead, "sustained_s": sustained_s,
                             "window_ms": window,
                             "settled_tflops": settled,
                             "seconds": time.perf_counter() - t0}}


def hardware_toml(result: dict[str, Any]) -> str:
    """A [hardware] table to paste into a config (or use as one with --config)."""
    hw = result["hardware"]
    m = result["measurements"]
    lines = [f"# Measured by ppsim profile --hardware-out on {result['device']} "
             f"(torch {result['torch_version']})."]
    if m.get("model_matmuls"):
        lines.append(f"# At the model's own {len(m['model_matmuls'])} matmul shapes and "
                     "attention, per tensor-parallel rank.")
    if m.get("sustained_s"):
        lines.append(f"# After {m['sustained_s']:g} s of warm-up, each kernel timed over a "
                     f"{m.get('window_ms', WINDOW_MS):g} ms window (the rate a training job "
                     "holds).")
    lines.append("[hardware]")
    for key, v in hw.items():
        if key == "matmul_efficiency":
            v = "[" + ", ".join(f"[{g}, {e}]" for g, e in v) + "]"
        if key == "kernel_overhead_us":
            # Eager PyTorch's host time per op: what ppsim run pays, not a fused job.
            lines.append("# kernel_overhead_us: the eager executor's host time per op (ppsim "
                         "run); drop it to price a Megatron or TE job.")
        lines.append(f"{key} = {v}")
    return "\n".join(lines) + "\n"
