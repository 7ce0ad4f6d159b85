"""The simulator's engines by name, for any command that lets its user choose one.

"event" is the heap engine (`ppsim.sim.engine` through `ppsim.sim.simulate`, fast: the
default); "simpy" is the same model written in simpy (`ppsim.sim.simpy_engine`, the
readable reference).
Both return a `Simulation` with the same numbers to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable

from ppsim.pipeline.problem import Problem
from ppsim.sim import simpy_engine, simulate
from ppsim.sim.engine import Simulation

Simulate = Callable[..., Simulation]
"""simulate(problem, record=True) -> Simulation"""

ENGINES: dict[str, Simulate] = {"event": simulate.simulate, "simpy": simpy_engine.simulate}
DEFAULT = "event"


def simulator(name: str = DEFAULT) -> Simulate:
    """The `simulate` function of the engine called `name`."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None


def run(problem: Problem, name: str = DEFAULT, record: bool = True) -> Simulation:
    """Simulate `problem` with the engine called `name`."""
    return simulator(name)(problem, record=record)
