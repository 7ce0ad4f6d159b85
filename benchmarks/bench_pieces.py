"""A piece timed alone (as `ppsim profile` times it) against its cost inside a stage.

The simulator sums pieces (embedding, layers, head) into a stage. This times, in one
process and alternating so the machine's drift hits all alike, each piece alone and
its marginal cost inside a stage: a stage of N layers plus the piece, minus the same
stage without it. A gap here is a bias of the profile (the simulator sums pieces),
not noise. 2026-12-01 (tiny preset, two runs of 200 reps): a layer costs 10-20 % less
inside a stage of 4 than alone (F 0.89 vs 1.09 and 1.04 vs 1.26 ms; B 1.49 vs 1.61 and
1.81 vs 1.93 ms); the LM head about the same (F 2.61 vs 2.55, 2.74 vs 2.99 ms).

Run:    .venv/bin/python benchmarks/bench_pieces.py [--layers 4] [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from ppsim.config.schema import load_config
from ppsim.executor.alloc import keep_freed_memory
from ppsim.executor.builders.stage import Stage
from ppsim.executor.profile import Profiler

Timed = Callable[[], tuple[float, float]]


def stage_op(prof: Profiler, stage: Stage, loss: bool) -> Timed:
    """F and B of a whole stage (with the loss when it holds the head), in ms."""
    b = prof.builder
    targets = b.microbatch(prof.seed, 0, 0)[1]
    embedded = stage.embedding is not None

    def run() -> tuple[float, float]:
        x = prof.ids if embedded else prof.x.detach().clone().requires_grad_()
        t0 = time.perf_counter()
        y = stage(x)
        if loss:
            y = b.loss(y, targets) / prof.m
        t1 = time.perf_counter()
        torch.autograd.backward(y, grad_tensors=None if loss else prof.grad)
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3

    return run


def piece_op(prof: Profiler, kind: str) -> Timed:
    """F and B of one piece as the profile times it, in ms."""
    piece = next(p for p in prof.pieces if p.kind == kind)

    def run() -> tuple[float, float]:
        x = prof.input_for(piece)
        t0 = time.perf_counter()
        y = prof.forward(piece, x, 0)
        t1 = time.perf_counter()
        prof.backward(piece, y)
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="layers in the stage")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc returning freed memory to the OS (as before 2026-12-01)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.default_malloc:
        keep_freed_memory()  # as ppsim profile and the executor do
    prof = Profiler(load_config(None).model.fields(), torch.device("cpu"), 8)
    b, n = prof.builder, args.layers

    def stage(offset: int, emb: bool, head: bool) -> Stage:
        s = Stage(b, offset, n, emb, head, prof.seed)
        for p in s.parameters():
            p.grad = torch.zeros_like(p)
        return s

    ops: dict[str, Timed] = {
        "layers": stage_op(prof, stage(1, False, False), False),
        "layers+head": stage_op(prof, stage(1, False, True), True),
        "embedding+layers": stage_op(prof, stage(0, True, False), False),
        "head": piece_op(prof, "head"),
        "embedding": piece_op(prof, "embedding"),
        "layer": piece_op(prof, "layer"),
    }
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in ops}
    for _ in range(args.reps):
        for k, op in ops.items():
            got[k].append(op())

    def med(k: str, i: int) -> float:
        return statistics.median(x[i] for x in got[k])

    print(f"{'piece':10} {'alone F':>8} {'in stage F':>10} {'alone B':>8} {'in stage B':>10}")
    for name, with_it in (("head", "layers+head"), ("embedding", "embedding+layers")):
        print(f"{name:10} {med(name, 0):8.2f} {med(with_it, 0) - med('layers', 0):10.2f} "
              f"{med(name, 1):8.2f} {med(with_it, 1) - med('layers', 1):10.2f}")
    print(f"{'layer':10} {med('layer', 0):8.2f} {med('layers', 0) / n:10.2f} "
          f"{med('layer', 1):8.2f} {med('layers', 1) / n:10.2f}   (stage of {n} / {n})")


if __name__ == "__main__":
    main()
