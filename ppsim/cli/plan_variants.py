"""What `ppsim plan --search` widens the search to (without --gpus): the configured shape
and each variant of it the axes allow: schedules, chunks per rank, microbatches, the
global recompute mode, the optimizer partly on the host."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ppsim.config.model import TransformerModel
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config
from ppsim.errors import UserError
from ppsim.job.host_optimizer import host_fields
from ppsim.job.pending import HOST_SHARES, host_refusal
from ppsim.job.search import JOB_AXES
from ppsim.policy.model import mode_ladder
from ppsim.schedules.generators import SCHEDULES, chunks_for_schedule, schedule_for_vpp

SEARCH_AXES = ("schedule", "vpp", "microbatches", "recompute", "host-optimizer")


@dataclass(frozen=True)
class Variant:
    """One point of the widened search: a config and what changed in it."""

    cfg: Config
    label: str


def _runs(schedule: str, pp: int, vpp: int, microbatches: int) -> bool:
    """The schedule takes this shape: ScheduleSpec.check, the rule building the problem
    applies, so plan proposes exactly what simulate accepts."""
    spec = SCHEDULES.get(schedule)
    try:
        if spec is None:  # the configured variant reports an unknown name
            return False
        spec.check(pp, vpp, microbatches)
    except UserError:
        return False
    return True


def variants(cfg: Config, axes: list[str]) -> list[Variant]:
    """Configs the --search axes allow, the given one first; invalid combos skipped."""
    for a in axes:
        if a not in SEARCH_AXES:
            job_only = a in JOB_AXES
            raise UserError("--search", f"{a!r} is an axis of the job search (--gpus)"
                            if job_only else f"unknown axis {a!r}", "use any of "
                            + ", ".join(SEARCH_AXES) + "; or policy, policy-per-stage alone")
    base = with_overrides(cfg, split={})
    transformer = isinstance(base.model, TransformerModel)
    layers = base.model.num_layers
    p = base.pipeline
    shapes = _shapes(p.schedule, p.pp, p.vpp, layers, axes)
    mbs_options: list[tuple[int, int | None]] = [(p.microbatches, None)]
    if "microbatches" in axes and transformer:
        # Keep the global batch: fewer, larger microbatches or more, smaller ones.
        tokens = p.microbatches * base.model.arch.micro_batch_size  # type: ignore[union-attr]
        mbs_options = [(tokens // b, b) for b in (1, 2, 4, 8) if tokens % b == 0]
    recomputes: list[str | None] = [None]
    if "recompute" in axes and transformer:
        recomputes = list(mode_ladder(base.model.arch))  # type: ignore[union-attr]
    fsdp = transformer and base.model.arch.fsdp  # type: ignore[union-attr]
    out = [Variant(base, "as configured")]
    for name, vpp in shapes:
        for m, mbs in mbs_options:
            if not _runs(name, p.pp, vpp, m):
                continue
            for rc, host in itertools.product(recomputes, _host_shares(base, axes)):
                c = with_overrides(base, model={"micro_batch_size": mbs, "recompute": rc,
                                                **(host_fields(host, fsdp) if host else {})},
                                   pipeline={"schedule": name, "vpp": vpp, "microbatches": m})
                label = f"{name} vpp={vpp} m={m}" + (f" mbs={mbs}" if mbs else "") + \
                    (f" recompute={rc}" if rc else "") + \
                    (f" optimizer {host:g} on the host" if host else "")
                if (c.model, c.pipeline) != (base.model, base.pipeline):
                    out.append(Variant(c, label))
    return out


def _shapes(schedule: str, pp: int, vpp: int, layers: int, axes: list[str]
            ) -> list[tuple[str, int]]:
    """The (schedule, vpp) pairs the schedule and vpp axes try, each once."""
    if "schedule" not in axes and "vpp" not in axes:
        return [(schedule, vpp)]
    vpps = [v for v in (1, 2, 3, 4) if layers >= pp * v] if "vpp" in axes else [vpp]
    if "schedule" in axes:  # a V schedule runs its two chunks whatever vpp says
        pairs = [(n, v if "vpp" in axes else chunks_for_schedule(n) or v)
                 for n in SCHEDULES for v in vpps]
    else:  # Megatron's 1F1B at more chunks a rank is its interleaved form (--vpp alone)
        pairs = [(schedule_for_vpp(schedule, v), v) for v in vpps]
    return list(dict.fromkeys(pairs))


def _host_shares(cfg: Config, axes: list[str]) -> list[float | None]:
    """The shares of the optimizer on the host the search tries (ppsim.job.pending), or
    [None] where it does not; UserError where it cannot."""
    if "host-optimizer" not in axes:
        return [None]
    if not isinstance(cfg.model, TransformerModel):
        raise UserError("--search", "host-optimizer: the optimizer's state is a "
                        "transformer model's", "give --preset NAME, or drop it")
    host_refusal(cfg)
    a = cfg.model.arch
    return [None, 1.0] if a.fsdp else [None, *HOST_SHARES]  # FSDP2: all of it or none
