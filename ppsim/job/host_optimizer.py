"""The optimizer on the host: Megatron's --optimizer-cpu-offload, its HybridDeviceOptimizer
(megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py).

The distributed optimizer hands it the rank's shard (dense and expert parameters each in
their own optimizer, at the same fraction). It keeps the first `optimizer_offload_fraction`
of the shard on the host as fp32 weights stepped by torch's fused AdamW (fp32 moments,
a pinned fp32 gradient buffer), the rest on the device as fp32 master weights stepped by
the device's Adam. Each step copies the host share's gradients out (4 bytes a
parameter: a bf16 gradient is widened on the device, as a non-blocking copy converts
there), steps them on the host and copies the fp32 weights back (4 bytes; the cast to
the bf16 weight runs on the device). Without --overlap-cpu-optimizer-d2h-h2d the copies
run on the compute stream: out, then the host's step beside the device's, then back.
With it each tensor has its own host optimizer, copied out on one stream and back on
another while the host steps the next: the three run beside each other and beside the
device's step, and the slowest of them is the step (the first tensor's copy out and the
last one's copy back, a tensor each, are left out).

The host steps at `optimizer_cpu_threads` cores of host_core_adam_gparams each (the
process's OMP_NUM_THREADS, which torchrun sets to 1 unless the environment does), and at
most at the rank's share of the node's DRAM bandwidth: the node's ranks step at once,
each moving ADAM_BYTES_PER_PARAM a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ppsim.costs.arch import Architecture
from ppsim.costs.state import ADAM_BYTES_PER_PARAM, host_state_share, optimizer_shards
from ppsim.errors import UserError

HOST_STATE_BYTES = 16
"""What the host keeps a parameter: the fp32 weight, two fp32 moments and the fp32
gradient it is copied into (Megatron's pinned buffer; FSDP2's sharded gradient)."""
COPY_BYTES = 4
"""Each way over the host link, a parameter: the fp32 gradient out, the fp32 weight
back."""


@dataclass(frozen=True, kw_only=True)
class HostOptimizer:
    """How fast one rank's host share steps."""

    fraction: float
    """Share of the rank's optimizer shard on the host."""
    link_gbps: float
    """Device <-> host, each way, GB/s."""
    threads: int
    """Host threads the rank steps with (its OMP_NUM_THREADS)."""
    core_params_per_ms: float
    """Parameters one host core steps a millisecond."""
    memory_params_per_ms: float
    """Parameters the rank's share of the node's DRAM bandwidth steps a millisecond."""
    overlap: bool
    """--overlap-cpu-optimizer-d2h-h2d."""
    copies: bool = True
    """The step copies the gradients out and the weights back (Megatron's); False: they
    live on the host, and FSDP2's CPU offload copies a unit's at each gather and
    reduce-scatter instead (ppsim.job.fsdp)."""
    host_limit_bytes: float
    """The rank's share of its node's host memory."""

    @property
    def params_per_ms(self) -> float:
        """The rank's host step rate: its cores', at most its share of the memory's."""
        return min(self.threads * self.core_params_per_ms, self.memory_params_per_ms)

    @property
    def saturating_threads(self) -> int:
        """The fewest threads whose rate reaches the memory's share."""
        return max(1, math.ceil(self.memory_params_per_ms / self.core_params_per_ms))

    def copy_ms(self, params: float) -> float:
        """One way over the host link for `params` fp32 values."""
        return params * COPY_BYTES / (self.link_gbps * 1e6)

    def step_ms(self, device_ms: float, host_params: float) -> float:
        """The step of a rank whose device share takes `device_ms` and whose host share
        is `host_params` parameters."""
        if host_params <= 0:
            return device_ms
        copy = self.copy_ms(host_params) if self.copies else 0.0
        host = host_params / self.params_per_ms
        if self.overlap:
            return max(device_ms, copy, host)
        return copy + max(device_ms, host) + copy


def host_share_bytes(hw: Any) -> float:
    """One rank's share of its node's host memory (all of it where no limit is set)."""
    total = getattr(hw, "host_memory_bytes", 0.0)
    return total / max(1, hw.gpus_per_node) if total > 0 else float("inf")


HOST_RATES = ("host_link_gbps", "host_memory_bandwidth_gbps", "host_core_adam_gparams")
"""The [hardware] figures the host optimizer is priced by."""


def host_rates_known(hw: Any) -> bool:
    """The [hardware] table gives every figure the host optimizer needs."""
    return all(getattr(hw, name, 0.0) > 0 for name in HOST_RATES)


def _known(hw: Any, name: str, what: str, example: str, why: str) -> float:
    value = float(getattr(hw, name, 0.0))
    if value <= 0:
        raise UserError(f"hardware.{name}", f"is 0 and {why} needs {what}",
                        f"set it in [hardware] ({example}), or drop {why}")
    return value


def host_optimizer(a: Architecture, hw: Any) -> HostOptimizer | None:
    """The host optimizer of a model on a [hardware] table (Megatron's, or FSDP2's CPU
    offload: all of the shard, no copies in the step); None when it is off."""
    share = host_state_share(a)
    if not share:
        return None
    fsdp = a.fsdp  # FSDP2's offload: its copies run at each gather and reduce-scatter
    why = "--fsdp-cpu-offload" if fsdp else "--optimizer-cpu-offload"
    link = _known(hw, "host_link_gbps", "the copies' link", "63 for PCIe Gen5 x16", why)
    dram = _known(hw, "host_memory_bandwidth_gbps", "the host's memory bandwidth",
                  "563.2 for a DGX H100's DDR5", why)
    core = _known(hw, "host_core_adam_gparams", "the host cores' AdamW rate",
                  "0.9, benchmarks/bench_host_optimizer.py measures it", why)
    rate = dram / max(1, hw.gpus_per_node) / ADAM_BYTES_PER_PARAM  # Gparams/s a rank
    return HostOptimizer(fraction=share, link_gbps=link,
                         threads=a.optimizer_cpu_threads, core_params_per_ms=core * 1e6,
                         memory_params_per_ms=rate * 1e6,
                         overlap=a.overlap_cpu_optimizer_d2h_h2d, copies=not fsdp,
                         host_limit_bytes=host_share_bytes(hw))


def host_fields(share: float, fsdp: bool = False) -> dict[str, Any]:
    """[model] fields that put `share` of each rank's optimizer shard on the host, with
    the distributed and precision-aware optimizers Megatron's host optimizer runs under;
    under FSDP, FSDP2's CPU offload (all of it)."""
    if fsdp:
        return {"fsdp_cpu_offload": True}
    return {"distributed_optimizer": True, "precision_aware_optimizer": True,
            "optimizer_cpu_offload": True, "optimizer_offload_fraction": share}


def host_state_bytes(a: Architecture, dense: float, experts: float) -> float:
    """Host memory the optimizer holds for a rank with `dense` and `experts` (routed
    experts') parameters: its share of the rank's shard of each."""
    share = host_state_share(a)
    if not share:
        return 0.0
    shard = dense / optimizer_shards(a) + experts / optimizer_shards(a, experts=True)
    return shard * share * HOST_STATE_BYTES
