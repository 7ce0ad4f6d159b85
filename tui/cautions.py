"""The lines `ppsim simulate` and `ppsim split` print on stderr for the state the screen
shows (ppsim.cautions: Megatron's refusals, the actions CSV's notes, ...), each once, as
the CLI words them after its command's name. Pure: the simulation worker calls it with
the problem it built, and the screen shows what it returns."""

from __future__ import annotations

from ppsim.cautions import host_caution, simulate_cautions, split_cautions
from ppsim.config.schema import Config
from ppsim.pipeline.problem import Problem


def state_warnings(cfg: Config, problem: Problem) -> tuple[str, ...]:
    """What `ppsim simulate` (its numbers' lines too) and `ppsim split` say about the
    state `cfg` holds (ppsim.tui.session.config_for) and `problem` is built from; a line
    both say (the interleaved order's refusal) once."""
    lines = simulate_cautions(cfg, problem)
    host = host_caution(cfg, problem)
    lines += [host] if host else []
    return tuple(lines + [line for line in split_cautions(cfg, problem.split)
                          if line not in lines])
