"""An MTP depth's projection's tensor-parallel collectives (Megatron's
MultiTokenPredictionLayer._concat_embeddings, megatron/core/transformer/
multi_token_prediction.py).

eh_proj, the 2h -> h projection of the concatenated embedding and hidden states, is a
column-parallel linear (TE's, gather_output False) whose output Megatron gathers over tp
(gather_from_tensor_model_parallel_region, whose backward only splits) and, with
sequence parallelism, splits back to the rank's tokens (scatter_to_sequence_parallel_
region, whose backward gathers the gradient). With sequence parallelism the linear
gathers its 2h-wide input first (quantized under FP8, which Megatron's MTP runs, not
FP4), and its backward gathers that input again for its weight gradient
(traffic.regathers) and reduce-scatters the input's gradient, each beside one of its
GEMMs (ppsim.job.tp_async); without it the backward all-reduces the input's gradient
beside its weight-gradient GEMM. Its userbuffer name (mtp_eh_proj) is none TE knows,
so --tp-comm-overlap leaves it so. A full recompute runs its forward again inside the
depth's checkpoint (MultiTokenPredictionLayer._checkpointed_forward).
"""

from __future__ import annotations

from ppsim.costs.arch import Architecture
from ppsim.costs.fp8 import fp8_bytes, mtp_precision
from ppsim.costs.kinds import mtp_gemm_window
from ppsim.costs.transformer import Accelerator
from ppsim.job.collectives import all_gather_ms, all_reduce_ms, reduce_scatter_ms
from ppsim.job.model import Job
from ppsim.job.tp_async import linear_collectives, runs_async
from ppsim.job.traffic import PieceCollectives, hidden_bytes, regathers
from ppsim.job.userbuffers import TpTraffic


def eh_proj_traffic(job: Job, a: Architecture, again: bool) -> tuple[TpTraffic, TpTraffic]:
    """(forward, backward) collectives of one MTP depth's eh_proj at tp > 1, the
    forward's again in the backward where the depth is recomputed (`again`)."""
    if a.tp == 1:
        none = TpTraffic(gathers_ms=0.0, scatters_ms=0.0)
        return none, none
    link, plain = job.link("tp"), hidden_bytes(a)
    output = all_gather_ms(plain, link)  # the h-wide output, gathered from its columns
    if not a.sequence_parallel:
        dgrad = all_reduce_ms(2 * plain, link)
        return TpTraffic(gathers_ms=output, scatters_ms=0.0), TpTraffic(
            gathers_ms=output * again, scatters_ms=0.0, reduces_ms=dgrad,
            dgrad_reduces_ms=dgrad)
    quantized = mtp_precision(a).fp8_copies
    inputs = all_gather_ms(2 * hidden_bytes(a, fp8_bytes(a) if quantized else 0), link)
    regather = inputs if regathers(a) else 0.0
    forward = inputs + output
    return TpTraffic(gathers_ms=forward, scatters_ms=0.0), TpTraffic(
        gathers_ms=output + regather + forward * again,
        scatters_ms=reduce_scatter_ms(2 * plain, link), regathers_ms=regather)


def eh_proj_collectives(job: Job, a: Architecture, acc: Accelerator,
                        again: bool) -> PieceCollectives:
    """eh_proj_traffic as the depth waits for it: the backward's re-gather and input
    gradient beside the projection's GEMMs where Megatron runs them async, the rest
    exposed."""
    f, b = eh_proj_traffic(job, a, again)
    window = mtp_gemm_window(a, acc.roofline()) if runs_async(job, a) else None
    return linear_collectives(job, f, b, window)
