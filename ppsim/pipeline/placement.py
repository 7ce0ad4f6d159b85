"""Where ranks run and which links their messages cross.

The `[placement]` section says which device each rank runs on and how many ranks
share a node. Ranks on one device share it (processor sharing: k running ops each
progress at 1/k); messages between two devices of one node share that pair's
intra-node link, and messages leaving a node share its NIC (inter-node link).
On CPU, gloo spends CPU time on both ends of every message (`message_cpu_ms` between
devices, `local_message_cpu_ms` between two ranks on one device).
The default, one device per rank and every pair of ranks on its own link, is the
unshared case the simulator has always modelled. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ppsim.errors import UserError
from ppsim.pipeline.messages import delay_ms


@dataclass(kw_only=True)
class PlacementConfig:
    devices: list[int] | None = None
    """Device index of each rank (ranks with equal indices share a device); default: one
    device per rank."""
    ranks_per_node: int = 0
    """Ranks (in rank order) per node; 0: every rank on one node."""
    intra_node_bandwidth_gbps: float | None = None
    """GB/s between two devices of one node; default: the hardware's P2P bandwidth."""
    intra_node_latency_ms: float | None = None
    """Latency between two devices of one node; default: the hardware's P2P latency."""
    inter_node_bandwidth_gbps: float | None = None
    """GB/s of a node's NIC, shared by every message leaving the node; default: the
    hardware's P2P bandwidth."""
    inter_node_latency_ms: float | None = None
    """Latency between nodes; default: the hardware's P2P latency."""
    context_switch_ms: float = 0.0
    """Extra time an op pays when it starts on a device another rank is also using."""
    message_cpu_ms: float = 0.0
    """CPU time a message between two devices costs its sender and its receiver (gloo on
    CPU); 0 on GPUs."""
    local_message_cpu_ms: float = 0.0
    """The same for a message between two ranks on one device: both ends' work lands on
    that device (gloo on CPU, through the host)."""
    shared_links: bool = False
    """Messages on one link share its bandwidth (True), or each message has the link to
    itself (False, the unshared model; set automatically when devices are shared)."""


@dataclass(frozen=True)
class LinkSpec:
    key: tuple[str, int, int]
    """Which physical link: ("dev", a, b) between two devices of a node (a <= b;
    a == b for two ranks on one device, through the host), or ("nic", node, 0)."""
    latency_ms: float
    bandwidth_gbps: float
    """0: free (no bandwidth term)."""

    def transfer_ms(self, nbytes: int) -> float:
        """Time on an idle link: latency plus bytes over bandwidth."""
        return delay_ms(self.latency_ms, self.bandwidth_gbps, nbytes)


@dataclass(frozen=True)
class Topology:
    """A resolved placement for pp ranks."""

    devices: tuple[int, ...]
    ranks_per_node: int
    intra: tuple[float, float]
    """(latency ms, bandwidth GB/s) inside a node."""
    inter: tuple[float, float]
    """(latency ms, bandwidth GB/s) between nodes."""
    context_switch_ms: float = 0.0
    message_cpu_ms: float = 0.0
    shared_links: bool = False
    local_message_cpu_ms: float = 0.0
    cores: int = 0
    """Processors every rank's ops share, scheduled by the OS (unpinned CPU ranks); 0:
    each device is its own processor."""
    copies: int = 1
    """With cores: the processes each rank stands for on them, itself and its twins in
    the other data-parallel replicas (dp), which run its ops in lockstep, busy when it is.
    A profile with tp > 1 records no cores: its ops hold waits on the tensor-parallel
    peers' collectives, which sharing would stretch as if they were work."""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def pp(self) -> int:
        return len(self.devices)

    @property
    def shares_devices(self) -> bool:
        return len(set(self.devices)) < len(self.devices)

    @property
    def pooled(self) -> bool:
        """The ranks' processes (their copies included) outnumber the cores they share."""
        return 0 < self.cores < self.pp * self.copies

    @property
    def compute_devices(self) -> tuple[int, ...]:
        """Per rank, the processor its ops run on: its device, or one pool for all."""
        return (0,) * self.pp if self.pooled else self.devices

    @property
    def alone(self) -> tuple[bool, ...]:
        """Per rank: it has its processor to itself (no other rank on its device, no
        context switch, no pool of cores shared with its twins), so each op takes
        exactly its work."""
        on = self.compute_devices
        quiet = not self.context_switch_ms and not self.pooled
        return tuple(quiet and on.count(d) == 1 for d in on)

    @property
    def is_private(self) -> bool:
        """Every rank owns its device and every message its link: the classic model."""
        return (not self.shares_devices and not self.shared_links and not self.pooled
                and self.message_cpu_ms == 0 and self.context_switch_ms == 0)
    # local_message_cpu_ms needs ranks sharing a device, so it never makes a private one.

    def message_cpu(self, src: int, dst: int) -> float:
        """CPU ms a message from rank src to rank dst costs each end (0 within a rank)."""
        if src == dst:
            return 0.0
        same = self.devices[src] == self.devices[dst]
        return self.local_message_cpu_ms if same else self.message_cpu_ms

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node if self.ranks_per_node else 0

    def link(self, src: int, dst: int) -> LinkSpec:
        """The link a message from rank src to rank dst crosses."""
        got = self._cache.get((src, dst))
        if got is None:
            got = self._cache[(src, dst)] = self._link(src, dst)
        return got

    def _link(self, src: int, dst: int) -> LinkSpec:
        if self.node_of(src) != self.node_of(dst):
            return LinkSpec(("nic", self.node_of(src), 0), *self.inter)
        a, b = sorted((self.devices[src], self.devices[dst]))
        return LinkSpec(("dev", a, b), *self.intra)


def _finite(field_name: str, value: float | None, default: float) -> float:
    v = default if value is None else value
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise UserError(f"placement.{field_name}", f"must be a finite number >= 0, got {v!r}",
                        "give e.g. 0.01 (ms) or 50 (GB/s)")
    return float(v)


def topology(cfg: PlacementConfig, pp: int, latency_ms: float,
             bandwidth_gbps: float, cores: int = 0, copies: int = 1) -> Topology:
    """Resolve a [placement] section for pp ranks; link defaults come from the hardware.
    `cores`, `copies`: unpinned ranks share that many cores, each standing for `copies`
    processes (Topology.cores, Topology.copies)."""
    devices = tuple(range(pp)) if cfg.devices is None else tuple(cfg.devices)
    if len(devices) != pp:
        raise UserError("placement.devices", f"lists {len(devices)} devices for {pp} ranks",
                        f"give one device index per rank ({pp})")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
        raise UserError("placement.devices", f"{list(devices)} has a non-index entry",
                        "use whole numbers >= 0, e.g. [0, 0] for two ranks on one device")
    rpn = cfg.ranks_per_node
    if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 0:
        raise UserError("placement.ranks_per_node", f"must be a whole number >= 0, got {rpn!r}",
                        "use 0 for one node")
    for r in range(pp):  # a device lives on one node
        if rpn and any(devices[q] == devices[r] and q // rpn != r // rpn for q in range(pp)):
            raise UserError("placement.devices", f"device {devices[r]} spans two nodes",
                            "give ranks of different nodes different devices")
    intra = (_finite("intra_node_latency_ms", cfg.intra_node_latency_ms, latency_ms),
             _finite("intra_node_bandwidth_gbps", cfg.intra_node_bandwidth_gbps,
                     bandwidth_gbps))
    inter = (_finite("inter_node_latency_ms", cfg.inter_node_latency_ms, latency_ms),
             _finite("inter_node_bandwidth_gbps", cfg.inter_node_bandwidth_gbps,
                     bandwidth_gbps))
    cs = _finite("context_switch_ms", cfg.context_switch_ms, 0.0)
    cpu = _finite("message_cpu_ms", cfg.message_cpu_ms, 0.0)
    local = _finite("local_message_cpu_ms", cfg.local_message_cpu_ms, 0.0)
    shared = bool(cfg.shared_links) or len(set(devices)) < len(devices)
    return Topology(devices, rpn, intra, inter, cs, cpu, shared, local, cores, copies)
