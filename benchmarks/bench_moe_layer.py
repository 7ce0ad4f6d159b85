"""A fine-grained MoE block's ops timed one by one on a device, beside ppsim's price of
each: where the time goes that makes gpt-oss, Qwen3-30B-A3B and Nemotron 3 Nano read
40 to 57 % fast against Megatron-Bridge's published runs (bench_bridge.py).

For each model at its published run's shape (sequence, micro-batch 1, tp 1, ep 8: one
rank's 16 local experts, each getting pairs x ep / experts tokens as ppsim's even router
gives them) it builds the block's ops as ppsim names them (ppsim.costs.layerops.mlp_ops:
router, softmax and top-k, the permutation, the experts' fc1, activation and fc2, the
unpermutation with the routing weights, the shared experts) in plain torch, times each
op's forward and its backward (autograd, input and weight gradients together) over a
window after a warm-up, and prints them beside ppsim's F and B + W for the same op on the
device's preset. The experts' GEMMs are timed as a loop of one matmul an expert (what
Transformer Engine's grouped linear runs on Hopper: one cuBLAS GEMM an expert) and, in
the `bmm` column, as one batched matmul (the best a grouped GEMM of equal groups can do).
Then the whole block as one autograd graph, forward and backward: its excess over the
ops' sum is launch and dispatch time between them. No all-to-all: one device.

Run (a GPU): python benchmarks/bench_moe_layer.py --device cuda [--hardware h100-80gb]
`--quick` shrinks each model 8 times (hidden, expert width, sequence) for a CPU check of
the script itself; its times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.ops import op_times, piece_times
from ppsim.costs.transformer import accelerator
from ppsim.executor.hwprofile import _window_timer, warm_up

RUNS = (("Qwen3-30B-A3B", "qwen3-30b-a3b", 4096), ("GPT-OSS 120B", "gpt-oss-120b", 4096),
        ("Nemotron 3 Nano", "nemotron-3-nano-30b-a3b", 8192))
"""Each model with the sequence of its published run (bench_bridge.py)."""
EP = 8


@dataclass(frozen=True, kw_only=True)
class Timed:
    """One op: measured forward and backward, ms."""

    forward_ms: float
    backward_ms: float


def _act(a: Architecture, x: torch.Tensor) -> torch.Tensor:
    """The experts' activation as the model runs it (a gated one halves its input)."""
    if not a.gated_mlp:
        return F.relu(x).square()  # squared ReLU (Nemotron 3)
    gate, up = x.chunk(2, dim=-1)
    if a.gated_activation == "quick_geglu":
        return gate * torch.sigmoid(1.702 * gate) * (up + 1)
    return F.silu(gate) * up


class Block:
    """One rank's MoE block as plain tensors: the ops ppsim prices, each a callable."""

    def __init__(self, a: Architecture, device: torch.device, dtype: torch.dtype) -> None:
        def t(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=device, dtype=dtype) * 0.02).requires_grad_()

        tok, h, e, k = a.seq_length * a.micro_batch_size, a.hidden_size, a.num_experts, a.top_k
        self.a, self.local = a, max(1, e // EP)
        self.per_expert = max(1, tok * k * EP // e)
        width = a.moe_ffn_hidden_size * (2 if a.gated_mlp else 1)
        self.x, self.router = t(tok, h), t(h, e)
        self.logits = t(tok, e)
        self.index = torch.randint(0, tok, (self.local * self.per_expert,), device=device)
        self.weights = torch.rand(self.local * self.per_expert, 1, device=device, dtype=dtype)
        self.xs = t(self.local, self.per_expert, h)
        self.w1, self.w2 = t(self.local, h, width), t(self.local, a.moe_ffn_hidden_size, h)
        self.hidden = t(self.local, self.per_expert, width)
        self.acted = t(self.local, self.per_expert, a.moe_ffn_hidden_size)
        self.ys = t(self.local * self.per_expert, h)
        shared = a.shared_experts * a.moe_ffn_hidden_size
        self.s1 = t(h, shared * (2 if a.gated_mlp else 1)) if shared else None
        self.s2 = t(shared, h) if shared else None
        self.sh = t(tok, self.s1.shape[1]) if shared else None
        self.sa = t(tok, shared) if shared else None

    def ops(self) -> dict[str, tuple[Callable[[], torch.Tensor], list[torch.Tensor]]]:
        """ppsim's op name -> (its forward, the tensors its backward differentiates)."""
        a, k = self.a, self.a.top_k

        def loop(xs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # one GEMM an expert
            return torch.cat([xs[i] @ w[i] for i in range(self.local)])

        ops = {
            "router": (lambda: self.x @ self.router, [self.x, self.router]),
            "router.softmax_topk": (lambda: torch.softmax(self.logits.float(), -1)
                                    .topk(k, -1).values, [self.logits]),
            "dispatch": (lambda: self.x.index_select(0, self.index), [self.x]),
            "experts.fc1": (lambda: loop(self.xs, self.w1), [self.xs, self.w1]),
            "experts.act": (lambda: _act(a, self.hidden), [self.hidden]),
            "experts.fc2": (lambda: loop(self.acted, self.w2), [self.acted, self.w2]),
            "combine": (lambda: torch.zeros_like(self.x).index_add(
                0, self.index, self.ys * self.weights), [self.ys]),
        }
        if self.s1 is not None:
            ops["shared.fc1"] = (lambda: self.x @ self.s1, [self.x, self.s1])
            ops["shared.act"] = (lambda: _act(a, self.sh), [self.sh])
            ops["shared.fc2"] = (lambda: self.sa @ self.s2, [self.sa, self.s2])
        return ops

    def batched(self) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
        return (lambda: torch.bmm(self.xs, self.w1)), [self.xs, self.w1]

    def chain(self) -> torch.Tensor:
        """The whole block in one graph, ops in order (as one rank runs it, no all-to-all)."""
        a = self.a
        logits = self.x @ self.router
        weights = torch.softmax(logits.float(), -1).topk(a.top_k, -1).values
        xs = self.x.index_select(0, self.index).view(self.local, self.per_expert, -1)
        ys = torch.cat([_act(a, xs[i] @ self.w1[i]) @ self.w2[i] for i in range(self.local)])
        scale = weights.flatten()[: ys.shape[0], None].to(ys.dtype)
        out = torch.zeros_like(self.x).index_add(0, self.index, ys * scale)
        if self.s1 is not None:
            out = out + _act(a, self.x @ self.s1) @ self.s2
        return out


def time_op(run: Callable[[Callable[[], object], int], float],
            fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Timed:
    out = fn()
    grad = torch.randn_like(out)
    backward = run(lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), 3)
    return Timed(forward_ms=run(fn, 3), backward_ms=backward)


def model_arch(preset: str, seq: int, quick: bool) -> Architecture:
    a = parse_model({"preset": preset, "seq_length": seq, "micro_batch_size": 1,
                     "ep": EP, "tp": 1}).arch  # type: ignore[union-attr]
    if quick:
        a = replace(a, hidden_size=a.hidden_size // 8, seq_length=seq // 8,
                    moe_ffn_hidden_size=a.moe_ffn_hidden_size // 8)
    return a


def report(name: str, a: Architecture, hardware: str, device: torch.device,
           dtype: torch.dtype, window_ms: float) -> None:
    roof = accelerator(config_from_dict({"model": {"preset": "llama3-8b"},
                                         "hardware": {"preset": hardware}}).hardware).roofline()
    priced = {op.name: op_times(roof, op)[:3] for op in mlp_ops(a, "moe")}
    block, run = Block(a, device, dtype), _window_timer(device, window_ms)
    print(f"{name}: {a.seq_length} tokens, hidden {a.hidden_size}, {block.local} local "
          f"experts x {block.per_expert} tokens, expert width {a.moe_ffn_hidden_size}")
    print(f"  {'op':20} {'ppsim F':>8} {'meas F':>8} {'ppsim B+W':>9} {'meas B':>8} "
          f"{'meas/ppsim':>10}")
    sums = [0.0, 0.0]
    for op, (fn, inputs) in block.ops().items():
        f, b, w = priced[op]
        m = time_op(run, fn, inputs)
        sums[0] += f + b + w
        sums[1] += m.forward_ms + m.backward_ms
        print(f"  {op:20} {f:8.3f} {m.forward_ms:8.3f} {b + w:9.3f} {m.backward_ms:8.3f} "
              f"{(m.forward_ms + m.backward_ms) / max(f + b + w, 1e-9):10.2f}", flush=True)
    bmm = time_op(run, *block.batched())
    whole = time_op(run, block.chain, [block.x, block.router, block.w1, block.w2])
    floor = sum(piece_times(roof, mlp_ops(a, "moe")))  # with ppsim's host time a kernel
    print(f"  experts.fc1 as one bmm: F {bmm.forward_ms:.3f} B {bmm.backward_ms:.3f} ms; "
          f"ops' sum ppsim {sums[0]:.3f} measured {sums[1]:.3f} ms "
          f"({sums[1] / max(sums[0], 1e-9):.2f}x); the block as one graph: ppsim "
          f"{floor:.3f} measured {whole.forward_ms + whole.backward_ms:.3f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--hardware", default="", help="preset to price with (default: the "
                   "device's, h100-80gb or h200-141gb)")
    p.add_argument("--quick", action="store_true", help="models shrunk 8 times (CPU check)")
    p.add_argument("--sustained", type=float, default=5.0, help="seconds of warm-up")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_moe_layer: --device: no CUDA GPU here (give --device cpu --quick)",
              file=sys.stderr)
        return 2
    hardware = args.hardware or "h100-80gb"
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        hardware = args.hardware or ("h200-141gb" if "H200" in name else "h100-80gb")
        settled = warm_up(device, dtype, args.sustained)
        print(f"{name}, settled at {settled:.0f} TFLOP/s; priced on {hardware}")
    for name, preset, seq in RUNS[:1] if args.quick else RUNS:
        report(name, model_arch(preset, seq, args.quick), hardware, device, dtype,
               20.0 if args.quick else 200.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
