"""PNG timelines of simulated iterations (`simulate --png`, `plan --png`): each rank's
ops, the collectives inside them and its step's data-parallel ones as strips, then its
step's R and S (ppsim.cli.picture draws them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ppsim.cli.picture import STEP_COLLECTIVE, Lane, render_png
from ppsim.cli.render import job_line
from ppsim.config import files
from ppsim.job.lanes import step_collective_spans
from ppsim.sim.simulate import simulate
from ppsim.trace.schema import collective_strips, step_spans
from ppsim.units import fmt_bytes


def simulation_lanes(sim: Any) -> list[Lane]:
    """One lane per rank of a recorded simulation (ppsim.sim.engine.Simulation)."""
    problem, timeline = sim.problem, sim.timeline
    assert timeline is not None, "simulate with record=True"
    stepped = step_collective_spans(problem, timeline)
    return [[(op.start, op.end - op.start, op.action.kind, op.action.microbatch)
             for op in ops] + collective_strips(problem, ops)
            + [(c.start_ms, c.ms, STEP_COLLECTIVE, -1) for c in mine]
            + [(start, ms, kind, -1) for kind, start, ms in step_spans(*step)]
            for ops, step, mine in zip(timeline.ops, timeline.step, stepped, strict=True)]


def panel_label(label: str, sim: Any) -> str:
    """A panel's heading: what it is, its schedule and split, its iteration and bubble."""
    p, s = sim.problem, sim.summary
    return (f"{label}{': ' if label else ''}{p.schedule.name}, split {list(p.split.counts)}, "
            f"{s.iteration_time_ms:.2f} ms, bubble {s.bubble_fraction:.1%}")


def write_simulation_png(path: str, panels: Sequence[tuple[str, Any]], title: str,
                         flag: str = "--png") -> None:
    """Recorded simulations, one panel each (label, simulation) on one time axis, under
    `title` and the first one's job line, to `path` (written atomically)."""
    first = panels[0][1]
    job = first.problem.hardware.job
    if job is not None:
        title += f"\n{job_line(job, first.summary.iteration_time_ms)}"
    with files.output(flag, path):
        render_png([(panel_label(label, sim), simulation_lanes(sim)) for label, sim in panels],
                   path, title=title)


def plan_png(path: str, best: Any, reference: tuple[str, Any] | None = None) -> None:
    """`plan --png`: the best split's timeline (`best`, a Problem at that split) above a
    reference's ((label, Problem): Megatron's even split), unless the two are the same
    split timed the same (a memory policy may differ where the split does not)."""
    panels = [("planned", simulate(best, record=True))]
    if reference is not None:
        other = simulate(reference[1], record=True)
        if reference[1].split.counts != best.split.counts or \
                other.summary.iteration_time_ms != panels[0][1].summary.iteration_time_ms:
            panels.append((reference[0], other))
    limit = reference[1].hardware.memory_bytes if reference is not None else 0.0
    title = plan_title([(label, sim.summary) for label, sim in panels], limit)
    write_simulation_png(path, panels, title)


def plan_title(panels: Sequence[tuple[str, Any]], limit_bytes: float) -> str:
    """The plan picture's title: the planned split's time and, with a reference panel
    ((label, Summary)), its time, its ratio and, where it does not fit in `limit_bytes`,
    that (why a faster reference was not the plan)."""
    ms = [summary.iteration_time_ms for _, summary in panels]
    title = f"planned split {ms[0]:.2f} ms"
    if len(panels) > 1:
        label, ref = panels[1]
        title += f", {label} {ms[1]:.2f} ms: {ms[1] / ms[0]:.3f}x"
        if not ref.fits:
            title += (f" (does not fit: peak {fmt_bytes(ref.peak_memory_bytes)} of "
                      f"{fmt_bytes(limit_bytes)})")
    return title


def shape_png(path: str, best: Any) -> None:
    """`plan --gpus --png`: the best shape's timeline at its planned split (`best`, a
    ppsim.job.search.ShapeResult)."""
    sim = simulate(best.problem, record=True)
    write_simulation_png(path, [(best.shape.label(), sim)],
                         f"best shape {best.shape.label()}: "
                         f"{sim.summary.iteration_time_ms:.2f} ms")
