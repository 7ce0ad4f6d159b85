"""Rich output for the terminal: per-rank tables and a compact text timeline."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

from ppsim.cli.loglines import for_log
from ppsim.job import throughput as job_throughput
from ppsim.sim.summary import Summary
from ppsim.units import fmt_bytes

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

KIND_STYLE = {"F": "bold blue", "B": "bold green", "W": "bold yellow"}

StepReport = Callable[[str, int, int], None]
"""Told (what, done, total) before each step of a long command."""


@contextlib.contextmanager
def step_bar(command: str, *, silent: bool = False) -> Iterator[StepReport]:
    """Progress a long command's steps move, on stderr: on a terminal a transient bar (what
    is done now, how many of how many, the time so far), in a log throttled lines
    (`LogLines`), nothing when `silent` (--json)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not silent and (lines := for_log(command)) is not None:
        yield lines.steps
        return
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:.0f} of {task.total:.0f}"), TimeElapsedColumn(),
                  disable=silent, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("", total=1)  # a count needs a total before the first step

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        yield update


def compact_table(title: str = "") -> Table:
    """A table without vertical rules or edge padding: the figures a row holds stay on one
    line at 80 columns (rich only where a table is drawn: --json stays light)."""
    from rich import box
    from rich.table import Table

    return Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD,
                 padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)


def split_cell(counts: Sequence[int], width: int = 23) -> str:
    """A split's layer counts in at most `width` characters, so splits that differ read
    apart in a table: "10,11,10,9" whole where it fits, else runs of three or more
    equal counts as "4×12" (4 layers on each of 12 stages in a row), else cut with
    "…"."""
    plain = ",".join(map(str, counts))
    if len(plain) <= width:
        return plain
    short = split_runs(counts)
    return short if len(short) <= width else short[:width - 1] + "…"


def split_runs(counts: Sequence[int]) -> str:
    """A split's layer counts with runs of three or more equal counts as "4×12" (4 layers
    on each of 12 stages in a row): every count still there, in a fraction of the width."""
    runs = []
    for count, group in groupby(counts):
        n = len(list(group))
        runs.append(f"{count}×{n}" if n > 2 else ",".join([str(count)] * n))
    return ",".join(runs)


def ms_text(ms: float) -> str:
    """Milliseconds to four significant figures or more: 0.1234, 12.34, 1234.6, 123457."""
    if ms == 0:
        return "0"
    return f"{ms:.{max(0, 3 - len(str(int(abs(ms)))) + 1 if abs(ms) >= 1 else 4)}f}"


def rank_table(summary: Summary, title: str = "") -> Table:
    t = compact_table(title)
    for col in ("rank", "layers", "busy ms", "bubble", "static", "activ.", "peak mem",
                "in-flight", "fits"):
        t.add_column(col, justify="right")
    for r in summary.ranks:
        t.add_row(str(r.rank), str(r.layers), ms_text(r.busy_ms), f"{r.bubble_fraction:.1%}",
                  fmt_bytes(r.static_bytes), fmt_bytes(r.peak_activation_bytes),
                  fmt_bytes(r.peak_memory_bytes), str(r.peak_inflight),
                  "yes" if r.fits else "[red]NO[/red]")
    return t


def summary_dict(summary: Summary) -> dict[str, Any]:
    return {
        "iteration_time_ms": summary.iteration_time_ms,
        "bubble_fraction": summary.bubble_fraction,
        "fits": summary.fits,
        "ranks": [{"rank": r.rank, "layers": r.layers, "busy_ms": r.busy_ms,
                   "bubble_fraction": r.bubble_fraction, "static_bytes": r.static_bytes,
                   "peak_activation_bytes": r.peak_activation_bytes,
                   "peak_memory_bytes": r.peak_memory_bytes, "peak_inflight": r.peak_inflight,
                   "fits": r.fits} for r in summary.ranks],
    }


def job_dict(job: Any, iteration_ms: float) -> dict[str, Any]:
    """`throughput` (tokens/s, per GPU, TFLOP/s/GPU, MFU) and `job` for JSON; nulls for
    a uniform model."""
    if job is None:
        return {"throughput": None, "job": None}
    t = job.throughput(iteration_ms)
    return {"throughput": t.to_dict() if t else None, "job": job.describe()}


def job_line(job: Any, iteration_ms: float) -> str:
    """The job and its throughput in one line of text."""
    if job is None:
        return job_throughput.line(None)
    d = job.describe()
    buffers = f" ({d['fsdp_buffer_bytes'] / 1e9:.2f} GB of buffers)" \
        if d["fsdp_buffer_bytes"] else ""
    fsdp = "" if d["data_parallel"] != "fsdp" else \
        f" Megatron-FSDP{buffers}" if d["fsdp_framework"] == "megatron-fsdp" else " FSDP"
    fsdp += f" x{d['dp_replicas']} copies" if d["dp_replicas"] > 1 else ""
    cp = f" {d['cp_comm_type']}" if d["cp"] > 1 and d["cp_comm_type"] != "p2p" else ""
    ep = f"{d['ep']} etp {d['etp']}" if d["ep"] > 1 and d["etp"] != d["tp"] else d["ep"]
    tp = f"{d['tp']} (no sequence parallelism)" if d["tp"] > 1 \
        and not d["sequence_parallel"] else d["tp"]
    shape = (f"{d['gpus']:,} GPUs (tp {tp} cp {d['cp']}{cp} ep {ep} dp {d['dp']}"
             f"{fsdp} pp {d['pp']}), global batch {d['global_batch_size']:,}")
    if d["fp8"]:
        shape += f", {job.arch.quantized_kind} {d['fp8']['format']} {d['fp8']['recipe']}"
    if d["optimizer"] == "muon":
        shape += ", Muon"
    if d["deepep_buffer_bytes"]:
        sms = (f"{job.deepep_sms} of {job.sm_count} SMs, " if job.sm_count
               else f"{job.deepep_sms} SMs, ")
        shape += f", DeepEP ({sms}its buffer {d['deepep_buffer_bytes'] / 1e9:.2f} GB)"
    if d["ep_overlap"]:
        shape += ", EP all-to-alls overlapped (combined 1F1B)"
    return f"{shape}: {job_throughput.line(job.throughput(iteration_ms))}"


def print_job(console: Any, job: Any, iteration_ms: float) -> None:
    console.print(job_line(job, iteration_ms), markup=False)


def timeline_cells(ops: Any, end_ms: float, width: int) -> str:
    """One rank's ops as `width` cells: each cell shows the kind of op that fills most
    of its time; '░' where the rank works for less than half of it, '.' where it is idle
    throughout (as the TUI's timeline). Upper case when that kind's longest piece in the
    cell is of an even microbatch, lower case for odd, so neighbouring ops stay
    distinguishable. By time share rather than by whichever op lands on a cell, so a
    cell spanning many microbatches shows what the rank mostly did (a 1F1B steady state
    reads as two Bs to each F, not as the op that aliases)."""
    if end_ms <= 0 or width < 1:
        return "." * max(width, 0)
    cell_ms = end_ms / width
    share = [dict.fromkeys("FBW", 0.0) for _ in range(width)]
    longest: list[dict[str, tuple[float, int]]] = [{} for _ in range(width)]
    for op in ops:
        kind, mb = op.action.kind, op.action.microbatch
        first = max(0, int(op.start / cell_ms))
        for x in range(first, min(width, int(op.end / cell_ms) + 1)):
            part = min(op.end, (x + 1) * cell_ms) - max(op.start, x * cell_ms)
            if part <= 0:
                continue
            share[x][kind] = share[x].get(kind, 0.0) + part
            if part > longest[x].get(kind, (0.0, 0))[0]:
                longest[x][kind] = (part, mb)
    cells = []
    for x in range(width):
        busy = sum(share[x].values())
        if busy < cell_ms / 2:
            cells.append("░" if busy > 0 else ".")
            continue
        kind = max(share[x], key=share[x].__getitem__)
        cells.append(kind if longest[x][kind][1] % 2 == 0 else kind.lower())
    return "".join(cells)


def text_timeline(ops_per_rank: Any, end_ms: float, width: int = 96) -> list[Text]:
    """One line per rank of `timeline_cells`, each kind in its colour."""
    from rich.text import Text

    lines = []
    for r, ops in enumerate(ops_per_rank):
        line = Text(f"rank {r:<3}", style="dim")
        for ch in timeline_cells(ops, end_ms, width):
            line.append(ch, style=KIND_STYLE.get(ch.upper(), "dim"))
        lines.append(line)
    return lines
