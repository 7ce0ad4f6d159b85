"""A pp edit of a job given by its global batch keeps the cluster, as a Megatron user's
is fixed (`--gpus N` means dp = N / (tp x cp x pp)): the new pp changes dp, and dp the
microbatches the global batch gives, never the GPU count or the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppsim.config.model import parse_model
from ppsim.config.schema import Config
from ppsim.errors import UserError
from ppsim.job.shape import arch_of, dp_for_gpus, microbatches_for
from ppsim.tui.editing import EditRefused


@dataclass(frozen=True)
class Replicas:
    """Data-parallel replicas and the microbatches each runs per iteration."""

    dp: int
    microbatches: int


def state_arch(base: Config, preset: str | None) -> Any:
    """The architecture a state's model has (None for a uniform model): the base's
    unless the state chose another preset."""
    if preset in (None, base.model.preset):
        return arch_of(base.model)
    return arch_of(parse_model({"preset": preset}))


def replicas_for_pp(base: Config, preset: str | None, pp: int, now: Replicas,
                    new_pp: int) -> Replicas:
    """dp and microbatches at `new_pp` for the same GPUs and global batch, where the
    base config gives the job a global batch; else `now` (the microbatches stay the
    user's, dp the config's). EditRefused on pp where the GPUs or the batch do not
    divide."""
    a = state_arch(base, preset)
    if a is None or not base.pipeline.global_batch_size or new_pp == pp:
        return now
    gpus = a.tp * a.cp * pp * now.dp
    try:
        dp = dp_for_gpus(gpus, a.tp, a.cp, new_pp)
    except UserError as exc:
        raise EditRefused("pp", f"{exc.problem}: the job's {gpus} GPUs stay, so pp must "
                          f"divide {gpus // (a.tp * a.cp)} (GPUs / (tp {a.tp} x cp {a.cp}))"
                          ) from None
    batch = now.microbatches * a.micro_batch_size * now.dp  # the batch the job trains on
    try:
        return Replicas(dp, microbatches_for(batch, a.micro_batch_size, dp))
    except UserError as exc:
        raise EditRefused("pp", f"{exc.problem} at pp {new_pp} on the job's {gpus} GPUs "
                          f"(for the global batch: {exc.fix})") from None
