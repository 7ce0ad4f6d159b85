"""`ppsim demo`: the whole loop on one config — profile, plan, run, diff.

1. profile the model on this machine (measured per-layer costs),
2. plan the fastest split under those costs,
3. run the planned split and Megatron's even split for real (torchrun),
4. simulate both splits and diff each plan against its real trace,
5. calibrate the costs on the even split's run and predict the planned one again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from ppsim import fileio
from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.cli.render import job_line
from ppsim.cli.run_frameworks import check_runs
from ppsim.config import validate
from ppsim.config.to_toml import config_to_toml
from ppsim.errors import UserError
from ppsim.executor import rundir
from ppsim.fileio import write_text_atomic
from ppsim.pipeline.problem import build_problem
from ppsim.pipeline.split import even_counts
from ppsim.plan.planner import Candidate, plan
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import diff_traces
from ppsim.trace.read import read_trace
from ppsim.trace.schema import simulation_trace, write_trace


def _ppsim(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([sys.executable, "-P", "-m", "ppsim.cli", *args], capture_output=True,
                          text=True, env=env)


def _checked(step: str, res: subprocess.CompletedProcess) -> str:
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        said = f"ppsim {step.split()[0]}: error: "
        if res.returncode == 2 and tail.startswith(said):
            # the step's own one-line refusal names the field and its fix already
            raise UserError(f"demo {step}", tail[len(said):])
        raise UserError(f"demo {step}", f"failed: {tail}", "run that step alone to see why")
    return res.stdout


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    validate.count("--rounds", args.rounds, lo=1, hi=20)
    validate.count("--iterations", args.iterations, lo=2, hi=1000)
    cfg = config_from_args(args)
    check_runs(args, cfg)  # before the profile: what the runs would refuse
    out = _fresh_out(args.out)
    base = os.path.join(out, "config.toml")
    write_text_atomic(base, config_to_toml(cfg))

    console.rule("1. profile this machine")
    costs = os.path.join(out, "costs.json")
    _checked("profile", _ppsim("profile", "--config", base, "--out", costs))
    cfg = replace(cfg, costs_file=costs)
    console.print(f"measured costs in {costs}")

    console.rule("2. plan")
    problem = build_problem(replace(cfg, pipeline=replace(cfg.pipeline, split=None)))
    sp = problem.split
    even = even_counts(sp.num_layers, sp.pp, sp.vpp, sp.mtp)
    best = _planned(console, problem, even)

    console.rule("3. run both splits for real")
    real, pairs = _run_both(console, base, out, {"planned": best.split.counts, "even": even},
                     args.iterations, args.rounds)

    console.rule("4. plan against reality")
    diffs = _against_reality(console, problem, real, out)

    console.rule("5. calibrate on the even run, predict the planned run again")
    calibrated = os.path.join(out, "costs-calibrated.json")
    _checked("calibrate", _ppsim("calibrate", real["even"]["trace"], "--config", base,
                                 "--costs", costs, "--out", calibrated))
    planned_problem = build_problem(replace(cfg, costs_file=calibrated, pipeline=replace(
        cfg.pipeline, split=list(best.split.counts))))
    again = simulate(planned_problem).summary.iteration_time_ms
    first, measured = diffs["planned"]["iteration_time_ms"]
    console.print(f"planned split: measured {measured:.2f} ms; predicted {first:.2f} ms from "
                  f"the profile (measured {(measured - first) / first:+.1%}), {again:.2f} ms "
                  f"calibrated on the other run (measured {(measured - again) / again:+.1%})")
    console.print("measured, " + job_line(planned_problem.hardware.job, measured), markup=False)
    pred = diffs["even"]["iteration_time_ms"][0] / diffs["planned"]["iteration_time_ms"][0]
    # Measured: the time of the even iterations over the planned ones, every recorded
    # iteration of every launch (they alternate, so each sum meets the same drift).
    meas = sum(even for _, even in pairs) / sum(planned for planned, _ in pairs)
    console.print(f"speed-up of the planned split over the even split: predicted {pred:.3f}x, "
                  f"measured {meas:.3f}x (the summed time of all {len(pairs)} alternating "
                  "iteration pairs, where the table above holds each split's fastest launch)")
    console.print(f"details: ppsim diff {out}/planned/sim.json {real['planned']['trace']} "
                  f"--png {out}/planned/diff.png")
    rundir.link_latest(rundir.RunDir(out, created=True, fresh=True, lock=""))
    return 0


def _fresh_out(given: str) -> str:
    """The demo's own new folder under --out."""
    # Each demo writes a folder of its own, so an earlier demo's printed `ppsim diff`
    # line keeps pointing at that demo's files; `<out>/latest` points at the newest.
    fileio.refuse_unnamed({"--out": given})
    out = rundir.fresh(given, "--out")
    if out.startswith("-"):  # the steps' own flags would read "-x/..." as an option
        out = os.path.join(".", out)
    return out


def _planned(console: Any, problem: Any, even: tuple[int, ...]) -> Candidate:
    """The fastest split that fits (UserError when none does), printed beside the even one."""
    res = plan(problem, top_k=3)
    if res.best is None:
        raise UserError("demo plan", "no split fits memory", "raise memory_bytes or add stages")
    best = res.best
    console.print(f"planned split {list(best.split.counts)} "
                  f"({'optimal' if res.proven_optimal else 'best found'}, "
                  f"{res.evaluated} of {res.total_splits} splits timed); even split {list(even)}")
    return best


def _against_reality(console: Any, problem: Any, real: dict[str, dict[str, Any]],
                     out: str) -> dict[str, dict[str, Any]]:
    """Simulate each split run for real, diff it against its trace, print the table;
    returns each split's diff."""
    from rich.table import Table

    t = Table(title="predicted (simulated with measured costs) vs measured", title_justify="left")
    for col in ("split", "", "iteration ms", "bubble", "peak memory r0", "error"):
        t.add_column(col, justify="right")
    diffs = {}
    for name, r in real.items():
        split_problem = problem.with_split(replace(problem.split, counts=tuple(r["counts"])))
        sim = simulate(split_problem)
        sim_path = os.path.join(out, name, "sim.json")
        write_trace(sim_path, simulation_trace(sim))
        d = diff_traces(read_trace(sim_path), read_trace(r["trace"])).to_dict()
        diffs[name] = d
        ta, tb = d["iteration_time_ms"]
        r0 = d["ranks"][0]
        ma, mb = r0["peak_memory_bytes"]
        t.add_row(f"{name} {list(r['counts'])}", "predicted", f"{ta:.2f}",
                  f"{r0['bubble_fraction'][0]:.1%}", f"{(ma or 0) / 1e6:.2f} MB", "")
        t.add_row("", "measured", f"{tb:.2f}", f"{r0['bubble_fraction'][1]:.1%}",
                  f"{(mb or 0) / 1e6:.2f} MB", f"{d['iteration_time_error']:+.1%}")
    console.print(t)
    return diffs


def _run_both(console: Any, base: str, out: str, splits: dict[str, tuple[int, ...]],
              iterations: int, rounds: int
              ) -> tuple[dict[str, dict[str, Any]], list[tuple[float, float]]]:
    """Run the two splits for real, `rounds` launches, each alternating the splits
    iteration by iteration in the same processes (`ppsim run --versus`), so the
    machine's drift (10-40 % over seconds on a shared VM) hits both alike. Keeps each
    split's fastest launch for the diff; returns them and every pair of adjacent
    iterations (a's time, b's time), for the speed-up."""
    (a, ca), (b, cb) = splits.items()
    real: dict[str, dict[str, Any]] = {}
    pairs: list[tuple[float, float]] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")  # ppsim run never overwrites an earlier run
    for i in range(rounds):
        folder = os.path.join(out, "runs", f"run-{stamp}-{i + 1}")
        summary = json.loads(_checked("run", _ppsim(
            "run", "--config", base, "--split", ",".join(map(str, ca)),
            "--versus", ",".join(map(str, cb)), "--iterations", str(iterations),
            "--warmup", "1", "--trace-dir", folder, "--json")))
        got = {a: (ca, summary), b: (cb, summary["versus"])}
        ta, tb = (got[n][1]["iteration_times_ms"] for n in (a, b))
        pairs += list(zip(ta, tb, strict=True))
        console.print(f"round {i + 1} of {rounds}: " + ", ".join(
            f"{n} {got[n][1]['iteration_time_ms']:.2f} ms" for n in (a, b)) +
            " per iteration (alternating)")
        for name, (counts, res) in got.items():
            if name not in real or res["iteration_time_ms"] < \
                    real[name]["summary"]["iteration_time_ms"]:
                real[name] = {"counts": counts, "summary": res, "trace": res["trace"]}
    for name, r in real.items():
        console.print(f"{name}: kept {r['summary']['iteration_time_ms']:.2f} ms, trace in "
                      f"{r['trace']}")
    return real, pairs


def register(commands: dict) -> None:
    def add(p: argparse.ArgumentParser) -> None:
        add_config_flags(p, split_flags=False)
        p.add_argument("--out", default="ppsim-demo", metavar="DIR",
                       help="where each demo's folder goes: DIR/<time> holds its costs, traces "
                       "and configs, DIR/latest the newest (default ./ppsim-demo)")
        p.add_argument("--iterations", type=int, default=24, metavar="N",
                       help="real iterations per split and launch (the first is warm-up)")
        p.add_argument("--rounds", type=int, default=2, metavar="N",
                       help="launches, each alternating the two splits iteration by "
                       "iteration; the speed-up is the even split's summed iteration time "
                       "over the planned one's, over every launch (default 2)")

    commands["demo"] = ("profile, plan, run and diff on one config (the quickstart)", add,
                        cmd_demo)
