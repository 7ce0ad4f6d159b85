"""Builders shared by tests: small configs and problems."""

from __future__ import annotations

from typing import Any

from ppsim.config import config_from_dict
from ppsim.problem import Problem, build_problem


def uniform_problem(pp: int, vpp: int, m: int, schedule: str, counts: list[int] | None = None,
                    layers_per_stage: int = 1, f: float = 1.0, b: float = 2.0, w: float = 0.0,
                    act: int = 100, out: int = 10, static: int = 1000, wg: int = 0,
                    hw: dict | None = None,
                    head: dict | None = None, emb: dict | None = None,
                    memory: float = 1e15, split_b: float = 0.0) -> Problem:
    n = sum(counts) if counts is not None else pp * vpp * layers_per_stage
    model: dict[str, Any] = {"kind": "uniform", "num_layers": n, "forward_ms": f,
                             "backward_ms": b, "weight_grad_ms": w, "activation_bytes": act,
                             "weight_grad_bytes": wg,
                             "output_bytes": out, "static_bytes": static,
                             "split_backward_ms": split_b}
    if head:
        model["head"] = head
    if emb:
        model["embedding"] = emb
    pipe: dict[str, Any] = {"pp": pp, "vpp": vpp, "microbatches": m, "schedule": schedule}
    if counts is not None:
        pipe["split"] = counts
    return build_problem(config_from_dict({"model": model, "pipeline": pipe,
                                           "hardware": {"memory_bytes": memory, **(hw or {})}}))
