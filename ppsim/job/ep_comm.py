"""A MoE layer's expert-parallel collectives: the dispatcher's dispatch and combine, over
the expert group's links (--moe-shared-expert-overlap hides them behind the shared
experts' compute as far as it lasts), and the shared experts' tp collectives where they
run beside them (ppsim.job.shared_tp). ppsim.job.layers adds them to a layer's others.
"""

from __future__ import annotations

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.layerops import mlp_ops
from ppsim.costs.ops import piece_times
from ppsim.costs.transformer import Accelerator
from ppsim.job import shared_tp
from ppsim.job.collectives import all_to_all_ms, deepep_ms
from ppsim.job.model import Job
from ppsim.job.traffic import MOE_KINDS, Collective, Recomputed, with_forward_again


def ep_all_to_all_ms(job: Job, a: Architecture) -> float:
    """Dispatch and combine of one microbatch: two all-to-alls, or with the flex
    dispatcher two of DeepEP's over the etp x ep group (each token once to a node, then
    to every expert tensor-parallel piece of its experts: ppsim.job.collectives)."""
    flex = job.moe_token_dispatcher_type == "flex"
    if a.ep == 1 and not (flex and a.expert_tp > 1):
        return 0.0
    tokens = ep_token_bytes(a)
    if flex:
        return 2 * deepep_ms(tokens, job.link("ep"), a.num_experts, a.top_k, a.expert_tp)
    return 2 * all_to_all_ms(tokens * a.top_k, job.link("ep"))


def ep_token_bytes(a: Architecture) -> float:
    """The tokens one rank's dispatcher moves in one microbatch, once each (an all-to-all
    sends top_k copies of them): at the dispatcher's width, in the training dtype."""
    width = a.moe_latent_size or a.hidden_size  # what the dispatcher moves
    return a.seq_length * a.micro_batch_size * a.expert_load * width \
        * DTYPE_BYTES[a.dtype] / a.tp


def shared_experts_ms(a: Architecture, acc: Accelerator) -> tuple[float, float]:
    """(forward, backward) of a MoE layer's shared experts: what hides the all-to-alls
    under --moe-shared-expert-overlap (Megatron runs them between the router and the
    routed experts, beside the dispatch and the combine)."""
    shared = [op for op in mlp_ops(a, "moe") if op.name.startswith("shared.")]
    f, bi, bw = piece_times(acc.roofline(), shared)
    return f, bi + bw


def ep_collectives(job: Job, a: Architecture, acc: Accelerator, kind: str,
                   again: Recomputed) -> list[tuple[Collective, Collective]]:
    """A MoE layer's dispatch and combine, forward and backward (none without
    all-to-alls), and its shared experts' tp collectives where they run beside them
    (ppsim.job.shared_tp): --moe-shared-expert-overlap hides the all-to-alls behind the
    shared experts' compute as far as it lasts."""
    ep = ep_all_to_all_ms(job, a) if kind in MOE_KINDS else 0.0
    side = shared_tp.side_ms(job, a, kind)
    if not ep and not side:
        return []
    over_f, over_b = (shared_experts_ms(a, acc) if job.moe_shared_expert_overlap
                      and a.shared_width else (0.0, 0.0))
    pairs = []
    if ep:
        # The shared experts beside DeepEP run on the SMs it leaves: what they hide
        # costs its SM share again in compute.
        share = job.dispatcher_sm_share
        ep_f, ep_b = (Collective(group="ep", total_ms=ep, exposed_ms=max(0.0, ep - over)
                                 + share * min(ep, over)) for over in (over_f, over_b))
        pairs.append((ep_f, with_forward_again(ep_f, ep_b, again.dispatch)))
    if side:
        side_f, side_b = (Collective(group="tp", total_ms=side, exposed_ms=shared_tp.
                                     side_waits_ms(side, ep, over)) for over in (over_f, over_b))
        pairs.append((side_f, with_forward_again(side_f, side_b, again.dispatch)))
    return pairs
