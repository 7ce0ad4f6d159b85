"""Megatron's router flags: the values its parser takes and the combinations its
TransformerConfig refuses. ppsim's router is even and fused, so none of them changes a
cost; a line Megatron stops at is refused rather than priced."""

from __future__ import annotations

import argparse
from typing import Any

from ppsim.errors import UserError

CHOICES: dict[str, tuple[str, ...]] = {
    "moe-router-load-balancing-type": ("aux_loss", "seq_aux_loss", "global_aux_loss",
                                       "sinkhorn", "quantile_balancing", "none"),
    "moe-router-score-function": ("softmax", "sigmoid", "sqrtsoftplus"),
    "moe-router-dtype": ("fp32", "fp64"),
    "moe-token-drop-policy": ("probs", "position"),
}
"""Megatron's choices for each (arguments.py; TransformerConfig's Literal fields)."""
CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
"""The load balancing a capacity factor works with (TransformerConfig.__post_init__)."""


def add_router_flags(g: Any) -> None:
    """The router flags these checks read (the load balancing takes one or more)."""
    hidden = argparse.SUPPRESS
    for flag, choices in CHOICES.items():
        many = "+" if flag == "moe-router-load-balancing-type" else None
        g.add_argument(f"--{flag}", nargs=many, choices=choices, help=hidden)
    for flag in ("moe-router-enable-expert-bias", "moe-router-pre-softmax"):
        g.add_argument(f"--{flag}", action="store_true", default=None, help=hidden)
    for flag in ("moe-router-num-groups", "moe-router-group-topk"):
        g.add_argument(f"--{flag}", type=int, help=hidden)
    g.add_argument("--moe-aux-loss-coeff", nargs="+", type=float, help=hidden)


def check_router(args: argparse.Namespace, known: dict[str, Any]) -> None:
    """UserError for a router Megatron's TransformerConfig refuses: the line's flags over
    `known`, the [model] fields of the model it starts from (top_k, num_experts,
    moe_capacity_factor)."""
    get = lambda dest: getattr(args, dest, None)  # noqa: E731
    top_k = get("moe_router_topk") or known.get("top_k")
    factor = get("moe_expert_capacity_factor")  # negative: dropless, as Megatron reads it
    factor = known.get("moe_capacity_factor") or 0 if factor is None else max(factor, 0)
    balancing = get("moe_router_load_balancing_type") or ["aux_loss"]
    score = get("moe_router_score_function") or "softmax"
    if len(balancing) > 1 and len(get("moe_aux_loss_coeff") or []) != len(balancing):
        raise UserError("--moe-aux-loss-coeff", "moe_aux_loss_coeff must be a list of the "
                        "same length as moe_router_load_balancing_type (Megatron's words)",
                        f"give {len(balancing)} coefficients, one a load balancing type")
    if factor > 0 and any(b not in CAPACITY_BALANCING for b in balancing):
        raise UserError("--moe-router-load-balancing-type", "moe_expert_capacity_factor "
                        "only works with aux_loss, seq_aux_loss, global_aux_loss or none "
                        "load balancing (Megatron's words)", "choose one of those, or drop "
                        "--moe-expert-capacity-factor")
    if get("moe_router_enable_expert_bias") and score not in ("sigmoid", "sqrtsoftplus"):
        raise UserError("--moe-router-enable-expert-bias", "Expert bias for aux-loss-free "
                        "routing only supports 'sigmoid' and 'sqrtsoftplus' score functions "
                        "(Megatron's words)", "add --moe-router-score-function sigmoid, or "
                        "drop --moe-router-enable-expert-bias")
    if top_k == 1 and score == "softmax" and not get("moe_router_pre_softmax") \
            and balancing != ["sinkhorn"]:
        # softmax over one chosen logit is constant: its gradient is zero
        raise UserError("--moe-router-topk", "Please use --moe-router-pre-softmax when topk "
                        "is 1 (Megatron's words)", "add --moe-router-pre-softmax, or route "
                        "to two experts or more")
    _group_limited(get("moe_router_num_groups"), get("moe_router_group_topk"),
                   get("num_experts") or known.get("num_experts"))


def _group_limited(groups: int | None, group_topk: int | None, experts: int | None) -> None:
    """Group-limited routing's sizes, as TransformerConfig asserts them."""
    if not group_topk:
        return
    if not groups:
        raise UserError("--moe-router-group-topk", "When using group limited routing, "
                        "moe_router_num_groups must be specified (Megatron's words)",
                        "add --moe-router-num-groups N")
    if experts and experts % groups:
        raise UserError("--moe-router-num-groups", f"num_moe_experts ({experts}) should be "
                        f"divisible by moe_router_num_groups ({groups}) (Megatron's words)",
                        "give a number of groups dividing the experts")
    if group_topk > groups:
        raise UserError("--moe-router-group-topk", f"moe_router_group_topk ({group_topk}) "
                        f"should be smaller than moe_router_num_groups ({groups}) (Megatron's "
                        "words)", f"give at most {groups}")
