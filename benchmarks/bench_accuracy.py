"""How close is the plan to reality? Profile, simulate, run for real, diff.

For schedules x uneven splits x microbatch counts on the tiny preset: predicted
iteration time from `ppsim profile` alone (no calibration; the profile measures
under the run's conditions: one process per device at once, gloo's per-message
CPU time, k processes per shared device, the optimizer step), the same costs
calibrated on one held-out run, the measured iteration time, per-rank bubble and
peak memory, and the errors. Each case is tried 3 times (profile -> run; --repeats)
and its median trial reported, since this VM's speed swings more between two minutes
than the model errs; the spread of every trial is printed too. Goals (issue 14): 2 CPU
ranks, median |error| <= 10 %, worst <= 20 %; 4 ranks on 2 cores (--ranks 4:
placement [0, 0, 1, 1], two ranks pinned to each core), median <= 15 %. Peak memory exact.

--device cuda: gpt3-1.3b-shaped layers (8 layers, s 2048), pp 2 and pp 4 with every
rank on the one GPU (placement all 0), profile -> simulate -> run -> diff; goal median
<= 10 %; about 5 minutes on an H200.

Run:    .venv/bin/python benchmarks/bench_accuracy.py [--ranks 2|4] [--device cuda]
        [--iterations 12] [--repeats 3] [--record traces]
`--record DIR` also writes each case's config, real trace and simulated trace
to DIR/<case>/ (that is how traces/ in this repository was made).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from ppsim.config.schema import load_config
from ppsim.config.to_toml import config_to_toml
from ppsim.fileio import write_bytes_atomic, write_text_atomic
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import diff_traces
from ppsim.trace.read import read_trace
from ppsim.trace.schema import simulation_trace, write_trace

# (name, schedule, vpp, split, microbatches)
CASES = [
    ("1f1b-5-3-m8", "1f1b", 1, [5, 3], 8),
    ("1f1b-6-2-m8", "1f1b", 1, [6, 2], 8),
    ("1f1b-3-5-m4", "1f1b", 1, [3, 5], 4),
    ("1f1b-5-3-m16", "1f1b", 1, [5, 3], 16),
    ("gpipe-5-3-m8", "gpipe", 1, [5, 3], 8),
    ("interleaved-3-1-2-2-m8", "interleaved-1f1b", 2, [3, 1, 2, 2], 8),
    ("interleaved-2-2-3-1-m4", "interleaved-1f1b", 2, [2, 2, 3, 1], 4),
    ("zb-h1-5-3-m8", "zb-h1", 1, [5, 3], 8),
    ("zbv-2-2-1-3-m8", "zbv", 2, [2, 2, 1, 3], 8),
]
CASES_4 = [
    ("pp4-1f1b-3-2-2-1-m8", "1f1b", 1, [3, 2, 2, 1], 8),
    ("pp4-1f1b-2-2-2-2-m8", "1f1b", 1, [2, 2, 2, 2], 8),
    ("pp4-1f1b-1-2-2-3-m4", "1f1b", 1, [1, 2, 2, 3], 4),
    ("pp4-gpipe-3-2-2-1-m8", "gpipe", 1, [3, 2, 2, 1], 8),
    ("pp4-interleaved-1x8-m8", "interleaved-1f1b", 2, [1] * 8, 8),
    ("pp4-zb-h1-2-2-2-2-m8", "zb-h1", 1, [2, 2, 2, 2], 8),
]
CASES_CUDA = [
    ("cuda-pp2-1f1b-5-3-m8", "1f1b", 1, [5, 3], 8),
    ("cuda-pp4-1f1b-3-2-2-1-m8", "1f1b", 1, [3, 2, 2, 1], 8),
]
CUDA_MODEL = """[model]
preset = "gpt3-1.3b"
num_layers = 8
"""
CALIBRATE_ON = "1f1b-6-2-m8"  # held out from the calibrated column's median


def ppsim(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "ppsim.cli", *args], capture_output=True,
                         text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"ppsim {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def case_config(base: str, schedule: str, vpp: int, split: list[int], m: int, costs: str,
                folder: str) -> str:
    cfg = load_config(base)
    cfg.pipeline.schedule, cfg.pipeline.vpp = schedule, vpp
    cfg.pipeline.split, cfg.pipeline.microbatches = split, m
    cfg.costs_file = os.path.abspath(costs)
    path = os.path.join(folder, "config.toml")
    with open(path, "w") as fh:
        fh.write(config_to_toml(cfg))
    return path


def base_config(work: str, ranks: int, device: str) -> str:
    """The embedded default (tiny GPT) or gpt3-1.3b-shaped layers on the GPU; pp ranks,
    two per core (4 on 2 cores) or all on one GPU."""
    cfg = load_config(None)
    if device == "cuda":
        model = os.path.join(work, "model.toml")
        with open(model, "w") as fh:
            fh.write(CUDA_MODEL)
        cfg = load_config(model)
        cfg.placement.devices = [0] * ranks
    elif ranks == 4:
        cfg.placement.devices = [0, 0, 1, 1]
    cfg.pipeline.pp = ranks
    path = os.path.join(work, "base.toml")
    with open(path, "w") as fh:
        fh.write(config_to_toml(cfg))
    return path


def trial(base: str, case: tuple, device: str, iterations: int, folder: str,
          costs: str, profile_first: bool) -> dict:
    """One profile (with profile_first) -> simulate -> run -> diff of one case."""
    name, schedule, vpp, split, m = case
    os.makedirs(folder)
    if profile_first:
        costs = os.path.join(folder, "costs.json")
        ppsim("profile", "--config", base, "--device", device, "--out", costs)
    cfg_path = case_config(base, schedule, vpp, split, m, costs, folder)
    ppsim("run", "--config", cfg_path, "--iterations", str(iterations), "--warmup",
          "1", "--device", device, "--trace-dir", os.path.join(folder, "run"), "--json")
    real = os.path.join(folder, "run", "trace.json")
    sim = simulate(build_problem(load_config(cfg_path)))
    sim_path = os.path.join(folder, "sim.json")
    write_trace(sim_path, simulation_trace(sim))
    d = diff_traces(read_trace(sim_path), read_trace(real)).to_dict()
    pred, got = d["iteration_time_ms"]
    return {"name": name, "config": cfg_path, "real": real, "sim": sim_path, "diff": d,
            "error": (pred - got) / got}


def measure(cases: list, base: str, device: str, iterations: int, work: str,
            costs: str, profile_each: bool = False, repeats: int = 1) -> list[dict]:
    """Each case's trial with the median error of `repeats` trials (all errors kept under
    "errors"). With profile_each, every trial profiles just before its run: this VM's
    speed drifts by 10-60 % over tens of seconds, more than the model's error, so one
    trial says more about the machine than about the model."""
    rows = []
    for case in cases:
        trials = [trial(base, case, device, iterations, os.path.join(work, case[0], str(t)),
                        costs, profile_each) for t in range(repeats)]
        trials.sort(key=lambda t: t["error"])
        row = {**trials[len(trials) // 2], "errors": [t["error"] for t in trials]}
        rows.append(row)
        pred, real = row["diff"]["iteration_time_ms"]
        print(f"  {case[0]}: predicted {pred:.2f} ms, real {real:.2f} ms; errors "
              + ", ".join(f"{e:+.1%}" for e in row["errors"]), file=sys.stderr)
    return rows


def report(rows: list[dict], calibrated_on: str | None) -> None:
    print(f"{'case':26} {'pred ms':>8} {'calib ms':>8} {'real ms':>8} {'err':>7} {'cal err':>7} "
          f"{'bubble r0 p/r':>14} {'bubble r1 p/r':>14} {'peak r0 p/r MB':>15} {'matched':>7}")
    errs, cal_errs, mem_errs = [], [], []
    for r in rows:
        d = r["diff"]
        pred, real = d["iteration_time_ms"]
        cal = r.get("calibrated_ms", float("nan"))
        err, cal_err = (pred - real) / real, (cal - real) / real
        errs.append(abs(err))
        if calibrated_on and r["name"] != calibrated_on:
            cal_errs.append(abs(cal_err))
        r0, r1 = d["ranks"][0], d["ranks"][1]
        ma, mb = r0["peak_memory_bytes"]
        mem_errs += [abs(a - b) / b for a, b in (r["peak_memory_bytes"] for r in d["ranks"])]
        shown = (f"{cal:8.2f}", f"{cal_err:+7.1%}") if cal == cal else (f"{'-':>8}", f"{'-':>7}")
        print(f"{r['name']:26} {pred:8.2f} {shown[0]} {real:8.2f} {err:+7.1%} {shown[1]} "
              f"{r0['bubble_fraction'][0]:6.1%}/{r0['bubble_fraction'][1]:6.1%} "
              f"{r1['bubble_fraction'][0]:6.1%}/{r1['bubble_fraction'][1]:6.1%} "
              f"{ma / 1e6:7.2f}/{mb / 1e6:6.2f} {d['ops_matched']:7}")
    line = (f"from the profile alone: median |iteration-time error| {statistics.median(errs):.1%},"
            f" worst {max(errs):.1%}")
    if cal_errs:
        line += f"; calibrated on {calibrated_on} (others) {statistics.median(cal_errs):.1%}"
    print(line + f"; |peak-memory error| over every rank: median "
          f"{statistics.median(mem_errs):.2%}, worst {max(mem_errs):.2%}")
    every = [abs(e) for r in rows for e in r.get("errors", [])]
    if len(every) > len(rows):
        print(f"every trial ({len(every)}): median |error| {statistics.median(every):.1%}, "
              f"worst {max(every):.1%} (a case's row is its median trial)")


def _record(rows: list[dict], dest: str) -> None:
    """Keep the recorded cases' configs, cost files and traces in `dest` (traces/), each
    file written whole or not at all."""
    os.makedirs(dest, exist_ok=True)

    def keep(src: str, out: str, name: str) -> None:
        with open(src, "rb") as fh:
            write_bytes_atomic(os.path.join(out, name), fh.read(), force=True)

    for r in rows:
        if r["name"] not in ("1f1b-5-3-m8", "interleaved-3-1-2-2-m8"):
            continue
        out = os.path.join(dest, r["name"])
        os.makedirs(out, exist_ok=True)
        cfg = load_config(r["config"])
        keep(cfg.costs_file, out, "costs.json")
        cfg.costs_file = "costs.json"
        write_text_atomic(os.path.join(out, "config.toml"), config_to_toml(cfg), force=True)
        keep(r["real"], out, "real.json")
        keep(r["sim"], out, "sim.json")
        write_text_atomic(os.path.join(out, "diff.json"), json.dumps(r["diff"], indent=1),
                          force=True)
    print(f"recorded traces in {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="DIR", help="also keep configs and traces here")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--ranks", type=int, choices=(2, 4), default=2)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--repeats", type=int, default=None,
                    help="trials per case (profile -> run), the median one reported "
                    "(default 3 on CPU, 1 on a GPU)")
    ap.add_argument("--one-profile", action="store_true",
                    help="one profile for every case (default on CPU: a profile just before "
                    "each case's run, so the VM's drift does not decide the error)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ppsim-accuracy-")
    cases = CASES_CUDA if args.device == "cuda" else CASES_4 if args.ranks == 4 else CASES
    costs = os.path.join(work, "costs.json")
    rows = []
    if args.device == "cuda":
        for ranks in (2, 4):  # every rank on the one GPU: profile for that placement
            base = base_config(work, ranks, "cuda")
            ppsim("profile", "--config", base, "--device", "cuda", "--out", costs)
            rows += measure([c for c in cases if f"pp{ranks}" in c[0]], base, "cuda",
                            args.iterations, work, costs, repeats=args.repeats or 1)
    else:
        base = base_config(work, args.ranks, "cpu")
        if args.one_profile:
            ppsim("profile", "--config", base, "--out", costs)
        rows = measure(cases, base, "cpu", args.iterations, work, costs,
                       profile_each=not args.one_profile,
                       repeats=args.repeats if args.repeats is not None else 3)
    if args.device == "cuda" or args.ranks == 4:
        report(rows, None)
        shutil.rmtree(work, ignore_errors=True)
        return
    # Calibrate on one run, then predict every run with the calibrated costs.
    calibrated = os.path.join(work, "calibrated.json")
    held = next(r for r in rows if r["name"] == CALIBRATE_ON)
    ppsim("calibrate", held["real"], "--config", held["config"], "--out", calibrated)
    for r in rows:
        cfg = load_config(r["config"])
        cfg.costs_file = calibrated
        sim = simulate(build_problem(cfg))
        r["calibrated_ms"] = sim.summary.iteration_time_ms
    report(rows, CALIBRATE_ON)
    if args.record:
        _record(rows, args.record)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
