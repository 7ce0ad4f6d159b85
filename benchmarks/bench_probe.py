"""Issue 27's probe, as a user's shell runs it: every case exits 0, 2 or 3 (1 where the
stream itself fails) within 30 s and 2 GB, with no traceback (two demos, which profile
and run for real, within 300 s).

Each case is one `bash -c` line in a scratch folder holding a tiny config, a simulated
trace, a cost file and the hostile files the cases need; seconds and peak RSS are the
case's own (its process tree, from wait4). Prints one line per case, then the count
that held and the slowest and largest case.

    .venv/bin/python benchmarks/bench_probe.py
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

PPSIM = shlex.quote(os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "ppsim"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLEEPY = shlex.quote(os.path.join(ROOT, "tests", "model_sleepy.py")) + ":build"
LIMIT_S = 30.0
LIMIT_MB = 2000.0


@dataclass(kw_only=True)
class Case:
    name: str
    """What the issue's probe did (defect number first)."""
    shell: str
    """The command line, run by bash in the scratch folder; `P` is the ppsim script."""
    codes: tuple[int, ...] = (0, 2, 3)
    """Exit statuses that hold."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment."""
    limit_s: float = LIMIT_S
    """Seconds it may take: 30, but for the workflows that profile and run for real."""


def _cases() -> list[Case]:
    hijack = ("rm -rf x && mkdir -p x/executor && cd x && touch executor/__init__.py && "
              "printf 'open(\"HIJACKED\",\"a\").write(\"x\")\\nraise SystemExit(1)\\n' > "
              "executor/worker.py && $P run --config ../c.toml --iterations 2 "
              "--trace-dir out; test ! -e HIJACKED")
    term = ("($P run --config c.toml --iterations 5000 --trace-dir sig & pid=$!; sleep 6; "
            "kill -{sig} $pid; wait $pid; true); test -z \"$(ls -A sig 2>/dev/null)\"")
    return [
        Case(name="1 ranks import from the working directory", shell=hijack),
        Case(name="2 builder file with --print-launch",
             shell="$P run --config evil.toml --print-launch; test ! -e EVIL"),
        Case(name="2 builder subprocess:run", shell="$P run --config sub.toml --print-launch"),
        Case(name="3 diff --png over an input", shell="$P diff sim.json real.json --png real.json"),
        Case(name="3 calibrate --out over its trace",
             shell="$P calibrate real.json --config c.toml --out real.json"),
        Case(name="3 simulate --trace and --png one file",
             shell="$P simulate --config c.toml --trace o.json --png o.json"),
        Case(name="3 two demos in one folder, each in its own",
             shell="$P demo --out demos && $P demo --out demos && "
                   "test \"$(ls demos | grep -vc latest)\" = 2", limit_s=300.0),
        Case(name="4 FIFO as --actions-csv", shell="$P simulate --actions-csv fifo.csv"),
        Case(name="4 FIFO as [pipeline] actions_csv", shell="$P simulate --config fifo.toml"),
        Case(name="4 120 MB trace of empty events", shell="$P diff empty.json empty.json"),
        Case(name="4 64 MB CSV of 0F0 cells", shell="$P simulate --actions-csv cells.csv"),
        Case(name="4 mtp_layers = 10000000", shell="$P plan --config mtp.toml --time-budget 10"),
        Case(name="5 plan 405B over four axes, budget 2",
             shell="$P plan --preset llama3.1-405b --search schedule,vpp,microbatches,recompute"
                   " --time-budget 2"),
        *[Case(name=f"6 {cmd} --json > /dev/full", shell=f"$P {cmd} --json > /dev/full",
               codes=(1, 2)) for cmd in ("simulate", "plan --config c.toml",
                                         "diff sim.json real.json")],
        Case(name="6 stdout closed", shell="$P simulate >&-", codes=(1, 2)),
        *[Case(name=f"6 PYTHONIOENCODING={enc}", shell="$P simulate && $P plan --config c.toml",
               env={"PYTHONIOENCODING": enc}) for enc in ("ascii", "latin-1")],
        Case(name="7 a stalled rank",
             shell=f"$P run --model {SLEEPY} --microbatches 4 --iterations 3 --timeout-s 10 "
                   "--trace-dir stall 2>err.txt; grep -q 'rank 1' err.txt"),
        *[Case(name=f"8 {what}", shell=f"$P simulate {flags}") for what, flags in (
            ("mixtral top_k 9 of 8", "--config topk.toml"),
            ("ep 3 over 8 experts", "--config ep.toml"),
            ("tp 1000000 on 4 heads", "--config c.toml --tp 1000000"),
            ("peak_tflops 1e-300", "--config tflops.toml"),
            ("bandwidth 1e-300", "--config gbps.toml"),
            ("cost file optimizer gbps 1e-300", "--config c.toml --costs slow-costs.json"),
            ("cost file devices [1e30, 0]", "--config c.toml --costs devices-costs.json"))],
        *[Case(name=f"8 trace {what}", shell=f"$P diff sim.json {path}") for what, path in (
            ("iteration_boundary_ms -1e308", "boundary.json"),
            ("whole_iteration_ms [1e300]", "whole.json"))],
        Case(name="8 run --dp 1000 --print-launch",
             shell="$P run --config c.toml --dp 1000 --print-launch 2>&1 >/dev/null | "
                   "grep -q 'warning: pp x dp'"),
        Case(name="8 run --dp 1000 on one node", shell="$P run --config c.toml --dp 1000"),
        Case(name="9 costs --json read back by --costs",
             shell="$P simulate --config c.toml --costs costs.json"),
        Case(name="9 a model with MTP layers and a cost file",
             shell="$P costs --config mtp1.toml --json > mtp-costs.json && "
                   "$P simulate --config mtp1.toml --costs mtp-costs.json"),
        *[Case(name=f"9 SIG{sig} of run cleans its folder", shell=term.format(sig=sig))
          for sig in ("TERM", "HUP")],
    ]


def _edited(doc: dict, path: list[str], value: object) -> dict:
    out = json.loads(json.dumps(doc))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _setup(folder: str) -> None:
    def write(name: str, text: str) -> None:
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(text)

    tiny = '[model]\npreset = "tiny-gpt"\n'
    write("c.toml", tiny)
    write("evil.toml", tiny + f'builder = "{folder}/evil.py:build"\n')
    write("evil.py", f'open("{folder}/EVIL", "a").write("x")\n\ndef build(fields):\n    return 1\n')
    write("sub.toml", tiny + 'builder = "subprocess:run"\n')
    write("fifo.toml", tiny + '[pipeline]\nactions_csv = "fifo.csv"\n')
    write("mtp.toml", tiny + "mtp_layers = 10000000\n")
    write("mtp1.toml", '[model]\npreset = "tiny-llm"\nmtp_layers = 1\n')
    write("topk.toml", '[model]\npreset = "mixtral-8x7b"\ntop_k = 9\n')
    write("ep.toml", '[model]\npreset = "mixtral-8x7b"\nep = 3\n')
    write("tflops.toml", tiny + '[hardware]\npeak_tflops = 1e-300\n')
    write("gbps.toml", tiny + '[hardware]\nintra_node_bandwidth_gbps = 1e-300\n')
    os.mkfifo(os.path.join(folder, "fifo.csv"))
    run = {"cwd": folder, "check": True, "capture_output": True}
    subprocess.run(f"{PPSIM} simulate --config c.toml --trace sim.json && cp sim.json real.json"
                   f" && {PPSIM} costs --config c.toml --json > costs.json", shell=True, **run)
    with open(os.path.join(folder, "sim.json")) as fh:
        trace = json.load(fh)
    with open(os.path.join(folder, "costs.json")) as fh:
        costs = {**json.load(fh), "conditions": {"devices": [0, 1], "processes": 2,
                                                 "optimizer": {"fixed_ms": 0.1, "gbps": 1.0}}}
    for name, doc in (
            ("boundary.json", _edited(trace, ["otherData", "iteration_boundary_ms"], -1e308)),
            ("whole.json", _edited(trace, ["otherData", "whole_iteration_ms"], [1e300])),
            ("slow-costs.json", _edited(costs, ["conditions", "optimizer", "gbps"], 1e-300)),
            ("devices-costs.json", _edited(costs, ["conditions", "devices"], [1e30, 0]))):
        write(name, json.dumps(doc))
    with open(os.path.join(folder, "empty.json"), "w") as fh:
        fh.write('{"traceEvents": [')
        fh.writelines("{}," for _ in range(40_000_000 - 1))
        fh.write("{}]}")
    with open(os.path.join(folder, "cells.csv"), "w") as fh:
        fh.writelines("0F0," for _ in range(16_000_000 - 1))
        fh.write("0F0\n")


def _run(case: Case, folder: str) -> tuple[float, float, int, str]:
    """Seconds, peak RSS (MB) of the case's largest process, exit status, stderr."""
    env = {**os.environ, **case.env, "P": PPSIM.strip("'")}
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(["bash", "-c", case.shell.replace("$P", '"$P"')],
                                cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        timer = threading.Timer(case.limit_s * 2, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # wait4: this case's own peak
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        err.seek(0)
        said = err.read().decode(errors="replace")
    return seconds, usage.ru_maxrss / 1e3, proc.returncode, said


def main() -> None:
    held = 0
    slowest = largest = (0.0, "")
    cases = _cases()
    with tempfile.TemporaryDirectory() as folder:
        _setup(folder)
        for case in cases:
            s, mb, code, said = _run(case, folder)
            traceback = "Traceback" in said
            ok = code in case.codes and s < case.limit_s and mb < LIMIT_MB and not traceback
            held += ok
            slowest, largest = max(slowest, (s, case.name)), max(largest, (mb, case.name))
            print(f"{'ok  ' if ok else 'FAIL'} {case.name}: exit {code}, {s:.1f} s, "
                  f"{mb:.0f} MB{', traceback' if traceback else ''}", flush=True)
            if said.strip():
                print(f"     {said.strip().splitlines()[-1][:150]}")
    print(f"{held} of {len(cases)} cases held; slowest {slowest[0]:.1f} s ({slowest[1]}), "
          f"largest {largest[0]:.0f} MB ({largest[1]})")


if __name__ == "__main__":
    main()
