"""What `ppsim profile` measured of the run's conditions beside the ops (a cost file's
`conditions` object: ppsim.costs.costfile), and how a cost file's numbers are checked.

Pure logic: no torch import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ppsim.config import limits, validate
from ppsim.costs.choices import OPTIMIZERS
from ppsim.errors import UserError


@dataclass(frozen=True)
class Conditions:
    """What the profile measured of the run's conditions (ppsim profile on CPU)."""

    devices: tuple[int, ...] | None
    """The placement the op times were measured for (one process per distinct device)."""
    message_cpu_ms: float
    """CPU time one gloo message costs each end."""
    context_switch_ms: float
    """Extra work an op pays beside others on its device, beyond processor sharing."""
    iteration_boundary_ms: float
    """The loss all-reduce that ends an iteration, across processes."""
    optimizer_fixed_ms: float
    optimizer_gbps: float
    """The AdamW step: fixed time plus bytes over this bandwidth; 0: not measured."""
    message_latency_ms: float = 0.0
    """One-way time of a boundary-sized message sent as its sender computes on, to a
    waiting receiver (the link's latency under load); 0: not measured."""
    local_message_cpu_ms: float = 0.0
    """CPU time one gloo message between two ranks on one device costs each end (that
    device); 0: not measured."""
    cores: int = 0
    """CPU cores the profile's processes could run on (unpinned ranks share them); 0:
    not measured."""
    optimizer_kind: str = "adam"
    """The optimizer the step was timed with: "adam", or "muon" (its decoder layers'
    matrices on Muon, the rest on AdamW)."""


def number_field(path: str, where: str, value: Any, integer: bool) -> float | int:
    """A cost file's number at `where`: a byte count (`integer`), a bandwidth (a name
    ending in gbps) or a time, refused as every user number is (ppsim.config.validate)."""
    fix = "re-run ppsim profile, or fix the value"
    if integer:
        x = validate.number(f"{path}: {where}", value, hi=validate.MAX_BYTES, fix=fix)
        if not x.is_integer():
            raise UserError(f"{path}: {where}", f"is a byte count, got {value!r}",
                            "write a whole number")
        return int(x)
    if where.endswith("gbps"):
        return validate.bandwidth(f"{path}: {where}", value, "for free transfers")
    return validate.number(f"{path}: {where}", value, hi=validate.MAX_MS, fix=fix)



def conditions_from_dict(path: str, raw: Any) -> Conditions | None:
    """The cost file's `conditions` object, checked; None where it has none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: conditions", "must be an object or null", "re-run ppsim profile")
    devices = raw.get("devices")
    if devices is not None and (not isinstance(devices, list) or len(devices) > limits.MAX_STAGES
                                or not all(type(d) is int for d in devices)):
        raise UserError(f"{path}: conditions.devices", f"must be a list of at most "
                        f"{limits.MAX_STAGES:,} device indices, got {devices!r}"[:200],
                        "re-run ppsim profile")
    for i, d in enumerate(devices or ()):
        validate.count(f"{path}: conditions.devices[{i}]", d, lo=0, hi=limits.MAX_STAGES - 1,
                       fix="re-run ppsim profile")
    opt = raw.get("optimizer") or {}
    if not isinstance(opt, dict):
        raise UserError(f"{path}: conditions.optimizer", "must be an object or null",
                        "re-run ppsim profile")
    num = functools.partial(number_field, path, integer=False)
    return Conditions(tuple(devices) if devices is not None else None,
                      float(num(where="conditions.message_cpu_ms",
                                value=raw.get("message_cpu_ms", 0.0))),
                      float(num(where="conditions.context_switch_ms",
                                value=raw.get("context_switch_ms", 0.0))),
                      float(num(where="conditions.iteration_boundary_ms",
                                value=raw.get("iteration_boundary_ms", 0.0))),
                      float(num(where="conditions.optimizer.fixed_ms",
                                value=opt.get("fixed_ms", 0.0))),
                      float(num(where="conditions.optimizer.gbps", value=opt.get("gbps", 0.0))),
                      float(num(where="conditions.message_latency_ms",
                                value=raw.get("message_latency_ms", 0.0))),
                      float(num(where="conditions.local_message_cpu_ms",
                                value=raw.get("local_message_cpu_ms", 0.0))),
                      validate.count(f"{path}: conditions.cores", raw.get("cores", 0), lo=0,
                                     hi=1 << 20, fix="re-run ppsim profile"),
                      _optimizer_kind(path, opt.get("kind", "adam")))


def _optimizer_kind(path: str, kind: Any) -> str:
    if kind not in OPTIMIZERS:
        raise UserError(f"{path}: conditions.optimizer.kind", f"unknown optimizer {kind!r}"[:200],
                        "use " + " or ".join(OPTIMIZERS) + ", or re-run ppsim profile")
    return str(kind)
