"""`ppsim run`'s text summary: the run, and a --versus split or torch's engine run in the
same launch beside it with the measured ratio."""

from __future__ import annotations

from typing import Any

from ppsim.units import fmt_bytes


def print_summary(res: dict[str, Any]) -> None:
    """A run's summary.json as text (rich imports only when printing)."""
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"[bold]{res['engine']}[/bold] engine  {res['schedule']}  pp={res['pp']} "
            f"vpp={res['vpp']} "
            + "".join(f"{k}={res[k]} " for k in ("tp", "cp", "dp") if res.get(k, 1) > 1)
            + f"microbatches={res['microbatches']} split={res['split']}\n"
            f"device={res.get('device')} ({res.get('backend')}, transfers via "
            f"{res.get('wire')})")
    losses = res.get("losses") or []
    # One fact a line: at 80 columns a longer line breaks mid-phrase.
    c.print(f"iteration time [bold]{res['iteration_time_ms']:.2f} ms[/bold] (mean of "
            f"{res['iterations'] - res['warmup_iterations']} after {res['warmup_iterations']} "
            f"warm-up)   tokens/s [bold]{res['tokens_per_s']:,.0f}[/bold]\nloss "
            + (f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "n/a"))
    if "ranks" in res:
        c.print(f"bubble {res['bubble_fraction']:.1%}   peak memory "
                f"{fmt_bytes(res['peak_memory_bytes'])}")
        t = Table()
        reduce = any(r.get("grad_reduce_ms") for r in res["ranks"])
        for col in ("rank", "layers", "busy ms", "bubble", "peak mem") + (
                ("grad reduce ms",) if reduce else ()):
            t.add_column(col, justify="right")
        for r in res["ranks"]:
            t.add_row(str(r["rank"]), str(r["layers"]), f"{r['busy_ms']:.2f}",
                      f"{r['bubble_fraction']:.1%}", fmt_bytes(r["peak_memory_bytes"]),
                      *((f"{r['grad_reduce_ms']:.2f}",) if reduce else ()))
        c.print(t)
    if res.get("trace"):
        c.print(f"trace written to {res['trace']} (open in https://ui.perfetto.dev; compare "
                "with ppsim diff)")
    elif res["engine"] == "torch":
        c.print("(this torch's pipeline stages could not be timed op by op: the torch "
                "engine is timed per iteration only, without a per-op trace)")
    for key, what in (("versus", "the --versus split"), ("peer", "torch's engine")):
        if other := res.get(key):
            c.print(f"\n[bold]{what}[/bold], its iterations alternating with the first's:")
            print_summary(other)
            ms, theirs = res["iteration_time_ms"], other["iteration_time_ms"]
            c.print(f"measured: {res['engine']} {res['split']} {ms:.2f} ms against "
                    f"{other['engine']} {other['split']} {theirs:.2f} ms: "
                    f"[bold]{theirs / ms:.3f}x[/bold] the speed")
