"""The microbatch counts torch.distributed.pipelining's schedules refuse (torch 2.13,
torch/distributed/pipelining/schedules.py): the rules a torchtitan job and `ppsim run
--engine torch` (or `--alongside-torch`) meet. Pure.

- Schedule1F1B.__init__: n_microbatches < the stages raises ValueError.
- ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble.__init__: the microbatches
  run in max(1, n_microbatches // pp) rounds and must divide into them (m < pp: one
  round of all m).
"""

from __future__ import annotations

ROUNDED = ("interleaved-1f1b", "interleaved-zb", "zb-h1")
"""ppsim schedules whose torch class walks rounds of microbatches (zb-h1: torch's
interleaved zero bubble on one chunk per rank)."""


def torch_rounds(pp: int, microbatches: int) -> int:
    """The rounds torch's interleaved schedules split the microbatches into."""
    return max(1, microbatches // pp)


def torch_refusal(name: str, pp: int, vpp: int, microbatches: int) -> str | None:
    """Why torch's class for the ppsim schedule `name` refuses `microbatches` at pp ranks
    of vpp chunks; None where it takes them."""
    if name == "1f1b" and microbatches < pp * vpp:
        return f"torch's Schedule1F1B needs at least {pp * vpp} microbatches"
    rounds = torch_rounds(pp, microbatches)
    if name in ROUNDED and microbatches % rounds:
        return (f"torch's interleaved schedules need microbatches divisible by their "
                f"rounds max(1, m // pp) = {rounds}")
    return None
