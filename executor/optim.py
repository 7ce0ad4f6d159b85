"""The optimizer every engine and the profile use: AdamW, fused.

Fused is torchtitan's default implementation: one kernel over all of a rank's
tensors, so the step costs its bytes rather than a dozen eager ops per tensor
(on this VM's CPU, 1.8 ms instead of 4.9-6.4 ms for a 72-tensor stage of the
tiny GPT). The ppsim engine, the torch.distributed.pipelining peer and
`ppsim profile` all build it here, so engines compare like for like and the
profile times the step the run takes; its state (step, two moments per
tensor) is what the static-bytes accounting counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def adamw(params: Sequence[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    """Fused AdamW over `params` (all on one device, floating point)."""
    return torch.optim.AdamW(list(params), lr=lr, fused=True)
