"""`ppsim diff A.json B.json`: where did reality leave the plan?"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ppsim.cli.flags import emit_json, outputs_apart
from ppsim.cli.picture import COLLECTIVE, STEP_COLLECTIVE, render_png
from ppsim.cli.render import compact_table, ms_text
from ppsim.config.files import output
from ppsim.errors import UserError
from ppsim.job.throughput import Throughput, from_info, line, trace_throughput
from ppsim.trace.diff import Window, diff_traces
from ppsim.trace.read import read_trace
from ppsim.units import fmt_bytes


def lanes(w: Window) -> list[list[tuple[float, float, str, int]]]:
    """Each rank's ops of the window, the collectives inside them and its step's
    data-parallel ones (strips along the lane's foot), and its step's R and S ops, for
    the picture."""
    pp = 1 + max(k[0] for k in w.ops)
    out: list[list[tuple[float, float, str, int]]] = [[] for _ in range(pp)]
    for k, op in w.ops.items():
        out[k[0]].append((w.start(k), w.dur(k), op.kind, op.microbatch))
    for c in w.collectives():
        if c.rank < pp and c.dur_us > 0:
            out[c.rank].append(((c.start_us - w.origin_us) / 1e3, c.dur_us / 1e3,
                                STEP_COLLECTIVE if c.op == "R" else COLLECTIVE, c.microbatch))
    for op in w.step:
        if op.rank < pp:
            out[op.rank].append(((op.start_us - w.origin_us) / 1e3, op.dur_us / 1e3, op.kind,
                                 -1))
    return out


def print_diff(d: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape

    c = Console()
    a, b = (escape(x) for x in d["traces"])  # file names are not markup
    ta, tb = d["iteration_time_ms"]
    c.print(f"A = {a} (iteration {d['iterations'][0]})\nB = {b} (iteration {d['iterations'][1]})")
    c.print(f"iteration time  A {ta:.3f} ms   B {tb:.3f} ms   B-A {tb - ta:+.3f} ms "
            f"([bold]{d['iteration_time_error']:+.1%}[/bold])")
    c.print(f"ops matched {d['ops_matched']}, only in A {d['ops_only_in'][0]}, only in B "
            f"{d['ops_only_in'][1]}")
    c.print("(whole iterations: first op to the next iteration's first op, the optimizer "
            "step and the boundary between iterations included)")
    for side, t in zip("AB", d.get("throughput") or (), strict=False):
        if t is not None:
            c.print(f"{side}: {line(Throughput(**t))}", markup=False)
    c.print("per rank")
    t = compact_table()
    for col in ("rank", "busy ms\nA", "busy ms\nB", "busy\nerror", "bubble\nA", "bubble\nB",
                "peak\nA", "peak\nB", "drift at\nend ms"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in d["ranks"]:
        peaks = [fmt_bytes(x, figures=3) if x is not None else "-"
                 for x in r["peak_memory_bytes"]]
        t.add_row(str(r["rank"]), *map(ms_text, r["busy_ms"]), f"{r['busy_error']:+.1%}",
                  *(f"{x:.1%}" for x in r["bubble_fraction"]), *peaks,
                  f"{r['final_start_drift_ms']:+.2f}")
    c.print(t)
    c.print("op duration error, B relative to A")
    k = compact_table()
    for col in ("kind", "ops", "median", "p90 |err|", "max |err|", "median B-A ms"):
        k.add_column(col, justify="right")
    for kind, e in d["duration_error"].items():
        k.add_row(kind, str(e["count"]), f"{e['median']:+.1%}", f"{e['p90']:.1%}",
                  f"{e['max']:.1%}", f"{e['median_delta_ms']:+.3f}")
    c.print(k)
    _print_collectives(c, d["collectives"])
    (ra, rb), (sa, sb) = d["step_ops_ms"]["R"], d["step_ops_ms"]["S"]
    if ra or rb:
        c.print(f"step, the longest rank's: reduce (R) A {ra:.3f} ms, B {rb:.3f} ms\n"
                f"  optimizer (S) A {sa:.3f} ms, B {sb:.3f} ms{_replica_waits(d)}")
    if d["largest_divergences"]:
        c.print("largest divergences (op, its start in A, its duration in A -> B):")
        for x in d["largest_divergences"][:5]:
            c.print(f"  rank {x['rank']} {x['kind']}{x['microbatch']} (chunk {x['chunk']}) at "
                    f"{x['start_ms'][0]:.1f} ms: {x['duration_ms'][0]:.2f} -> "
                    f"{x['duration_ms'][1]:.2f} ms")
    cpa, cpb = d["critical_path"]

    def fmt(cp: list[dict]) -> str:
        return " -> ".join(f"r{x['rank']}" for x in cp)

    c.print(f"critical path A: {fmt(cpa)}", soft_wrap=True)
    c.print(f"critical path B: {fmt(cpb)}"
            + ("   [yellow](changed)[/yellow]" if d["critical_path_changed"] else ""),
            soft_wrap=True)


def cmd_diff(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UserError("--top", f"must be at least 1, got {args.top}", "use --top 10")
    outputs_apart(args, {"--png": args.png}, {"A.json": args.a, "B.json": args.b})
    a, b = read_trace(args.a), read_trace(args.b)
    diff = diff_traces(a, b, args.iteration)
    d = diff.to_dict(top=args.top)
    ja = from_info(a.info.get("job"), f"{args.a}: otherData.job")
    jb = from_info(b.info.get("job"), f"{args.b}: otherData.job")
    if ja and jb and (differ := job_difference(ja, jb)):
        sys.stderr.write(f"ppsim diff: warning: A and B record different jobs ({differ}), so "
                         "their times are of different work (diff a simulation of the "
                         "run's own config)\n")
    # Each side's throughput is of the job it records (the other's where it has none).
    tps = [trace_throughput(job, t)
           for job, t in zip((ja or jb, jb or ja), d["iteration_time_ms"], strict=True)]
    d["throughput"] = [t.to_dict() if t else None for t in tps]
    if args.png:
        with output("--png", args.png):
            render_png([(f"A: {args.a}", lanes(diff.a)), (f"B: {args.b}", lanes(diff.b))],
                       args.png, title=f"iteration time A {d['iteration_time_ms'][0]:.2f} ms, "
                       f"B {d['iteration_time_ms'][1]:.2f} ms ({d['iteration_time_error']:+.1%})")
    if args.json:
        emit_json(d)
    else:
        print_diff(d)
        if args.png:
            print(f"timeline picture written to {args.png}")
    return 0


def register(commands: dict) -> None:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("a", metavar="A.json", help="reference trace (e.g. simulated)")
        p.add_argument("b", metavar="B.json", help="trace to compare (e.g. real)")
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        p.add_argument("--iteration", type=int, metavar="N",
                       help="iteration to compare (default: each trace's median steady-state one)")
        p.add_argument("--png", metavar="OUT.png", help="write both timelines as a picture")
        p.add_argument("--top", type=int, default=10, metavar="N",
                       help="largest divergences to list")

    commands["diff"] = ("compare two traces op by op (simulated vs real, or any two)", add,
                        cmd_diff)


def job_difference(a: dict[str, float], b: dict[str, float]) -> str:
    """What differs between two traces' recorded jobs (otherData.job), as words; empty
    when they record the same model, batch and GPU count."""
    said = []
    fa, fb = a["flops"] / a["tokens"], b["flops"] / b["tokens"]
    if not math.isclose(fa, fb, rel_tol=1e-6):
        said.append(f"model FLOPs a token {fa:,.4g} vs {fb:,.4g}")
    for key, what in (("tokens", "tokens an iteration"), ("gpus", "GPUs")):
        if a[key] != b[key]:
            said.append(f"{what} {a[key]:,.0f} vs {b[key]:,.0f}")
    return "; ".join(said)


def _replica_waits(d: dict) -> str:
    """What of each trace's R waited for the last replica to start it (a run's skew)."""
    waits = d["step_wait_ms"]["R"]
    said = [f"{name} {w:.3f} ms" for name, w in zip("AB", waits, strict=True) if w]
    return f"\n  of R, waiting for the last replica to start it: {', '.join(said)}" \
        if said else ""


def _print_collectives(c: Any, rows: list[dict]) -> None:
    """The tp / cp / ep collectives inside the ops, where both traces hold them."""
    if not rows:
        return
    c.print("collectives inside the ops (what each op waited for), B relative to A")
    t = compact_table()
    for col in ("group", "op", "ops", "median A ms", "median B ms", "median error"):
        t.add_column(col, justify="right")
    for r in rows:
        error = "-" if r["error"] is None else f"{r['error']:+.1%}"
        t.add_row(r["group"], r["op"], str(r["count"]), *(f"{x:.3f}" for x in r["ms"]), error)
    c.print(t)
