"""`ppsim plan`'s terminal output: the variants searched, the top splits beside each
framework's own, why the best is faster, and whether it is proven optimal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ppsim.cli.render import compact_table, print_job, split_cell
from ppsim.cli.simulate import print_exports
from ppsim.job.exposure import exposed_comm_ms, overlap_hint
from ppsim.pipeline.exports import DEFAULT_SPECS, DeepSpeedSpecs
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.plan.bounds import CHUNKED_BOUND_NOTE
from ppsim.plan.gap import chunked_gap
from ppsim.plan.planner import Candidate, PlanResult
from ppsim.plan.ranking import ordered
from ppsim.plan.references import why_faster
from ppsim.policy.costs import Fixed
from ppsim.policy.report import with_policy_flags
from ppsim.units import byte_unit, fmt_bytes

if TYPE_CHECKING:
    from rich.table import Table

    from ppsim.cli.plan import Planned

SHARED_NOTE = ("the placement shares devices or links: splits were searched with the "
               "unshared model, a lower bound on the shared one, and the top candidates and "
               "references re-simulated with sharing; optimality is not proven")


def _variants_table(per_variant: list[tuple[str, PlanResult]]) -> Table:
    t = compact_table("search")
    for col in ("variant", "best ms", "split", "proven"):
        t.add_column(col)
    fitting = ordered([v for v in per_variant if v[1].best], lambda v: v[1].best.rank)
    for label, r in fitting + [v for v in per_variant if not v[1].best]:
        t.add_row(label, f"{r.best.summary.iteration_time_ms:.2f}" if r.best else "no fit",
                  split_cell(r.best.split.counts, 30) if r.best else "-",
                  "yes" if r.proven_optimal else
                  f">= {r.lower_bound_ms:.2f}" if r.best else "-")
    return t


def _splits_table(planned: Planned, top: int, width: int) -> Table:
    """The top splits and each framework's own, a row each on one line at 80 columns
    (`width`: the console's; from 120 columns up to 8 ranks list every rank's peak)."""
    res = planned.result
    p = res.problem
    base_t = res.baseline.summary.iteration_time_ms if res.baseline else None
    t = compact_table(f"{p.schedule.name} pp={p.schedule.pp} vpp={p.schedule.vpp} "
                      f"m={p.schedule.microbatches}, limit "
                      f"{fmt_bytes(p.hardware.memory_bytes)} per rank")
    refs = planned.baselines() + planned.compared
    # One unit for the column, the largest peak's: a CPU-sized model reads in MB, not 0.0 GB.
    unit, size = byte_unit(max([c.summary.peak_memory_bytes for c in res.candidates[:top]]
                               + [r.summary.peak_memory_bytes for r in refs]))
    each_rank = p.schedule.pp <= 8 and width >= 120
    t.add_column("", no_wrap=True)
    t.add_column("split", no_wrap=True)
    for col in ("iter ms", "bubble", f"peak {unit}\n{'per rank' if each_rank else 'at rank'}",
                "speed-\nup"):
        t.add_column(col, justify="right", no_wrap=True)

    def red_unless(fits: bool, text: str) -> str:
        return text if fits else f"[red]{text}[/red]"

    def row(label: str, c: Candidate) -> None:
        if each_rank:
            peaks = " ".join(red_unless(r.fits, f"{r.peak_memory_bytes / size:.1f}")
                             for r in c.summary.ranks)
        else:
            worst = max(c.summary.ranks, key=lambda r: r.peak_memory_bytes)
            peaks = red_unless(worst.fits, f"{worst.peak_memory_bytes / size:.1f} r{worst.rank}")
        speed = f"{base_t / c.summary.iteration_time_ms:.3f}x" if base_t else "-"
        t.add_row(label, split_cell(c.split.counts, 40 if width >= 120 else 23),
                  f"{c.summary.iteration_time_ms:.2f}", f"{c.summary.bubble_fraction:.1%}",
                  peaks, speed)

    for i, c in enumerate(res.candidates[:top]):
        row("best" if i == 0 else f"#{i + 1}", c)
    for ref in refs:
        row(ref.label + ("" if ref.summary.fits else " [red](OOM)[/red]"),
            Candidate(ref.split, ref.summary))
    return t


def _print_baselines(console: Any, planned: Planned) -> None:
    """Which baseline the speed-ups are against, and the best against each framework."""
    res = planned.result
    p = res.problem
    layers = p.costs.num_layers - p.costs.mtp_layers
    if planned.baseline is not None and planned.baseline.label != "Megatron even":
        console.print(f"baseline: no even split ({layers} layers over pp={p.schedule.pp}"
                      + (f" x vpp={p.schedule.vpp}" if p.schedule.vpp > 1 else "")
                      + "); the fastest split Megatron's first/last flags express", markup=False)
    assert res.best is not None
    bt = res.best.summary.iteration_time_ms
    if planned.baselines():
        console.print("best against each framework's own split: " + ", ".join(
            f"{ref.summary.iteration_time_ms / bt:.3f}x vs {ref.label}"
            + ("" if ref.summary.fits else " (which does not fit)")
            for ref in planned.baselines()), markup=False)
    for fw in planned.without:
        console.print(f"{fw.label}: none ({fw.note})", markup=False)
    for ref in planned.compared:
        console.print(f"vs {ref.label}: {why_faster(res.best.summary, ref)}", markup=False)


def _print_proof(console: Any, res: PlanResult) -> None:
    """Whether the best is optimal for the cost model, or how far the bound leaves it."""
    p = res.problem
    assert res.best is not None
    bt = res.best.summary.iteration_time_ms
    if p.topology is not None:
        console.print(f"{SHARED_NOTE} (unshared lower bound {res.lower_bound_ms:.2f} ms; "
                      f"{res.evaluated:,} splits timed in {res.seconds:.2f} s)", markup=False)
    elif res.proven_optimal:
        console.print(f"[green]optimal[/green] for the cost model: {res.evaluated:,} of "
                      f"{res.total_splits:,} splits timed in {res.seconds:.2f} s")
    else:
        console.print(f"[yellow]not proven optimal[/yellow] within the time budget: lower bound "
                      f"{res.lower_bound_ms:.2f} ms, gap {(bt - res.lower_bound_ms) / bt:.2%}; "
                      f"{res.evaluated:,} of {res.total_splits:,} splits timed in "
                      f"{res.seconds:.2f} s")
        if p.schedule.vpp > 1:
            console.print(CHUNKED_BOUND_NOTE, markup=False)
            console.print(chunked_gap(res.best.summary, res.lower_bound_ms).text(),
                          markup=False)


def print_result(planned: Planned, per_variant: list[tuple[str, PlanResult]], top: int,
                 specs: DeepSpeedSpecs = DEFAULT_SPECS) -> None:
    from rich.console import Console

    console = Console()
    res = planned.result
    assert res.best is not None
    if len(per_variant) > 1:
        console.print(_variants_table(per_variant))
    console.print(_splits_table(planned, top, console.width))
    _print_baselines(console, planned)
    _print_proof(console, res)
    p = res.problem
    print_job(console, p.hardware.job, res.best.summary.iteration_time_ms)
    best = p.with_split(res.best.split)
    hint = overlap_hint(p.hardware.job, exposed_comm_ms(best, res.best.summary),
                        res.best.summary.iteration_time_ms, "the best split", "plan")
    if hint:
        console.print(hint, markup=False)
    exports = exports_of(p.pattern, res.best.split, p.schedule.microbatch_group, specs)
    if isinstance(p.memory, Fixed):  # a configured memory policy: its flags, as --json's
        exports = with_policy_flags(exports, best, p.memory.policies)
    print_exports(console, exports)
