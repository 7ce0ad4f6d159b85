"""What `ppsim run` and `ppsim profile` check of context parallelism before any process
starts: the executor splits the shipped decoders' sequence over cp ranks, its attention
passing K and V round a ring, gathering them, exchanging the heads or both
(ppsim.executor.builders.cp_attention); what it does not run is refused by name."""

from __future__ import annotations

import argparse
from typing import Any

from ppsim.costs.layerops import sequence_split_problem, splittable_seq_length
from ppsim.errors import UserError


def check_run_context(args: argparse.Namespace, cfg: Any) -> None:
    """`ppsim run` at cp > 1: the model (check_context_model), on the ppsim engine."""
    check_context_model(cfg, own_builder=bool(args.model))
    a = cfg.model.arch
    if a.cp > 1 and (args.engine != "ppsim" or args.alongside_torch):
        raise UserError("model.cp", f"{a.cp}: context parallelism runs on the ppsim engine, "
                        "without the torch peer", "use --engine ppsim without "
                        "--alongside-torch, or cp = 1")


def check_context_model(cfg: Any, own_builder: bool = False) -> None:
    """At cp > 1, what the executor (`ppsim run`, `ppsim profile`) splits over cp ranks:
    the shipped decoders' attention (the built-in GPT, the Llama-style decoder with GQA or
    latent attention), by any of Megatron's --cp-comm-type (routed experts fold over tp x
    cp x dp, as Megatron folds them)."""
    a = cfg.model.arch
    if a.cp <= 1:
        return
    if own_builder or cfg.model.fields().get("builder") or a.hybrid_layer_pattern \
            or a.experimental_attention_variant:
        raise UserError("model.cp", f"{a.cp}: the executor splits the sequence of the "
                        "shipped decoders' attention layers only (a builder of one's own, "
                        "or a Mamba or linear-attention mixer, would see part of it)",
                        "run the shipped decoder (no --model, no hybrid pattern), or cp = 1")
    problem = sequence_split_problem(a.seq_length, a.cp, a.tp, a.sequence_parallel)
    if problem:
        raise UserError("model.seq_length", problem,
                        f"use --seq-length {splittable_seq_length(a.seq_length, a.cp, a.tp)}"
                        ", or choose tp and cp with tp x cp dividing seq_length")
