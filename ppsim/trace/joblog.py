"""What a real job's training log says of its speed, to set beside a simulation.

Megatron-LM prints, every `--log-interval` iterations (megatron/training/training.py,
training_log), a line of ` | `-separated fields, among them `iteration N/ M`,
`elapsed time per iteration (ms): T` and, with `--log-throughput`,
`throughput per GPU (TFLOP/s/GPU): F` (its own FLOP count, ppsim.job.flops), each an
average over the interval (forks that print `compute per GPU (TFLOP/s/GPU)` and tokens
per GPU, as AMD's Primus does, are read too). torchtitan prints
(torchtitan/components/metrics.py, maybe with ANSI colours)
`step: N  loss: ...  memory: 41.27GiB(43.44%)  tps: 5,762  tflops: 334.70  mfu: 33.84%`:
its logging rank's (rank 0's) most reserved memory since the line before (the caching
allocator's segments, at least what it allocated), tokens per second per device (`wps`
in its releases before mid-2024), TFLOP/s per device by its count, and MFU. DeepSpeed's
engine prints every `steps_per_print` steps (deepspeed/utils/timer.py, ThroughputTimer)
`epoch=E/micro_step=M/global_step=S, RunningAvgSamplesPerSec=R, CurrSamplesPerSec=C,
MemAllocated=AGB, MaxMemAllocated=XGB`: C is the whole job's samples (its train batch
size) per second over that step, X rank 0's peak in GiB. NeMo (1 and 2) prints its
progress bar, a step per update (updates split by carriage returns), with
`global_step=49.00` and `train_step_timing in s=24.00`; NeMo 2's ProgressPrinter
(nemo/lightning/pytorch/callbacks/progress_printer.py) a line a step, ` | `-separated,
`Training epoch 0, iteration 45/99 | lr: ... | global_batch_size: 128 | global_step: 45 |
... | train_step_timing in s: 6.08 | ...`. A Megatron-DeepSpeed log holds
both Megatron's and DeepSpeed's lines; Megatron's are read.

The first logged line of a run holds its warm-up (compilation, allocator growth, the
first all-gathers), so it is left out where later lines follow; the median of the rest
is what a simulation of the steady iteration is compared with.

Pure logic: no torch.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from ppsim.config import files
from ppsim.errors import UserError

MAX_LOG_BYTES = 1 << 30
"""A training log is read line by line; past this it is refused."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
_MEGATRON = {"iteration": re.compile(r"\biteration\s+([0-9]+)\s*/"),
             "iteration_ms": re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUMBER),
             "tflops_per_gpu": re.compile(r"(?:throughput|compute) per GPU \(TFLOP/s/GPU\):\s*"
                                          + _NUMBER),
             "tokens_per_s_per_gpu": re.compile(r"(?:tokens per GPU \(tokens/s/GPU\)|Tokens per "
                                                r"second per GPU \(Tok/s/GPU\)):\s*" + _NUMBER),
             "global_batch_size": re.compile(r"global batch size:\s*([0-9]+)")}
_MEMORY = re.compile(r"\[Rank ([0-9]+)\].*memory \(MB\).*\| max allocated:\s*" + _NUMBER)
"""megatron/training/utils report_memory, printed by each data-parallel rank 0 after the
first iterations: `[Rank R] (after N iterations) memory (MB) | allocated: A | max
allocated: M | ...` (MB of 2^20 bytes)."""
_DEEPSPEED = {"iteration": re.compile(r"\bglobal_step=([0-9]+)"),
              "samples_per_s": re.compile(r"\bCurrSamplesPerSec=" + _NUMBER),
              "max_allocated_gib": re.compile(r"\bMaxMemAllocated=" + _NUMBER + "GB")}
_NEMO = {"iteration": re.compile(r"\bglobal_step(?:=|:\s*)" + _NUMBER),
         "iteration_s": re.compile(r"\btrain_step_timing in s(?:=|:\s*)" + _NUMBER),
         "global_batch_size": re.compile(r"\bglobal_batch_size:\s*" + _NUMBER)}
_TORCHTITAN = {"iteration": re.compile(r"\bstep:\s*([0-9]+)\b"),
               "tokens_per_s_per_gpu": re.compile(r"\b[tw]ps:\s*" + _NUMBER),
               "tflops_per_gpu": re.compile(r"\btflops:\s*" + _NUMBER),
               "mfu": re.compile(r"\bmfu:\s*" + _NUMBER + "%"),
               "max_reserved_gib": re.compile(r"\bmemory:\s*" + _NUMBER + r"\s*GiB")}


@dataclass(frozen=True, kw_only=True)
class LoggedStep:
    """One logged line: an average over the iterations since the line before."""

    framework: str
    """"Megatron-LM", "torchtitan", "DeepSpeed" or "NeMo": whose line it is."""
    iteration: int
    iteration_ms: float | None = None
    """Megatron's `elapsed time per iteration (ms)`, NeMo's `train_step_timing`."""
    tflops_per_gpu: float | None = None
    """Megatron's `throughput per GPU (TFLOP/s/GPU)`, or torchtitan's `tflops`."""
    tokens_per_s_per_gpu: float | None = None
    """torchtitan's `tps` (per device)."""
    mfu: float | None = None
    """torchtitan's `mfu`, a fraction."""
    global_batch_size: float | None = None
    """Megatron's `global batch size`, NeMo 2's `global_batch_size` (sequences an
    iteration)."""
    samples_per_s: float | None = None
    """DeepSpeed's `CurrSamplesPerSec` (the whole job's)."""
    max_allocated_gib: float | None = None
    """DeepSpeed's `MaxMemAllocated` (rank 0's, GiB)."""
    max_reserved_gib: float | None = None
    """torchtitan's `memory` (its logging rank's most reserved, GiB)."""


@dataclass(frozen=True, kw_only=True)
class LoggedRun:
    """The steady lines of one training log."""

    framework: str
    """"Megatron-LM", "torchtitan", "DeepSpeed" or "NeMo"."""
    steps: tuple[LoggedStep, ...]
    """The lines compared: every logged line but the first where more follow."""
    left_out: int
    """Lines left out as warm-up (0 or 1)."""
    max_allocated: dict[int, float] = field(default_factory=dict)
    """Megatron's `max allocated` per global rank that reported it, in bytes (the largest
    report: the one after the optimizer's state exists); DeepSpeed's rank 0's, and
    torchtitan's most reserved on rank 0 (what each measures: memory_measure)."""
    earlier_runs: int = 0
    """Runs the log holds before the one compared (a log a later launch appended to)."""

    def median(self, name: str) -> float | None:
        """The median of one field over the steady lines that print it."""
        values = [v for s in self.steps if (v := getattr(s, name)) is not None]
        return statistics.median(values) if values else None


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_line(line: str) -> LoggedStep | None:
    """The step one log line reports; None for any other line."""
    line = _ANSI.sub("", line)
    for framework, fields, needs in (("Megatron-LM", _MEGATRON, "iteration_ms"),
                                     ("torchtitan", _TORCHTITAN, "tokens_per_s_per_gpu"),
                                     ("DeepSpeed", _DEEPSPEED, "samples_per_s"),
                                     ("NeMo", _NEMO, "iteration_s")):
        found = {k: m.group(1) for k, rx in fields.items() if (m := rx.search(line))}
        if "iteration" in found and needs in found:
            values = {k: _number(v) for k, v in found.items() if k != "iteration"}
            if "mfu" in values:
                values["mfu"] /= 100
            if "iteration_s" in values:
                values["iteration_ms"] = values.pop("iteration_s") * 1e3
            return LoggedStep(framework=framework, iteration=int(_number(found["iteration"])),
                              **values)
    return None


def logged_run(lines: Iterable[str], path: str = "log", flag: str = "--compare-log"
               ) -> LoggedRun:
    """The steady lines of a log (one framework's, Megatron's where DeepSpeed's are beside
    them; of a log holding several runs, the last; the first line left out where more
    follow). A log with no speed lines, or with torchtitan's beside another's, is a
    UserError naming `flag`."""
    found: list[LoggedStep | tuple[int, float]] = []  # speed lines and memory reports
    for line in (part for whole in lines for part in whole.split("\r")):
        step = parse_line(line)
        if step is not None:
            found.append(step)
        elif (m := _MEMORY.search(line)) is not None:
            found.append((int(m.group(1)), _number(m.group(2)) * 2**20))
    frameworks = {s.framework for s in found if isinstance(s, LoggedStep)}
    if not frameworks:
        raise UserError(flag, f"{path} has no line Megatron-LM ('elapsed time per "
                        "iteration (ms)'), torchtitan ('step: ... tps: ...'), DeepSpeed "
                        "('CurrSamplesPerSec=') or NeMo ('train_step_timing in s=') prints",
                        "pass the training log of the job this simulates")
    if "torchtitan" in frameworks and len(frameworks) > 1:
        raise UserError(flag, f"{path} holds torchtitan's lines beside "
                        f"{' and '.join(sorted(frameworks - {'torchtitan'}))}'s",
                        "pass one job's log")
    # Megatron-DeepSpeed: Megatron's lines
    framework = next(f for f in ("Megatron-LM", "torchtitan", "NeMo", "DeepSpeed")
                     if f in frameworks)
    steps, memory, earlier = _last_run(found, framework)
    left_out = 1 if len(steps) > 1 else 0
    return LoggedRun(framework=framework, steps=tuple(steps[left_out:]), left_out=left_out,
                     max_allocated=memory, earlier_runs=earlier)


def _last_run(found: list[LoggedStep | tuple[int, float]], framework: str
              ) -> tuple[list[LoggedStep], dict[int, float], int]:
    """`framework`'s lines of the log's last run, the peaks reported in it (per global
    rank, bytes) and how many runs came before it: a run starts again where its
    iteration count goes back (a log appended to by a later launch)."""
    steps: list[LoggedStep] = []
    memory: dict[int, float] = {}
    earlier = 0
    for item in found:
        if isinstance(item, tuple):
            rank, nbytes = item
        elif item.framework == framework and steps and item.iteration < steps[-1].iteration:
            steps, memory, earlier = [item], {}, earlier + 1
            rank, nbytes = 0, _peak_bytes(item)
        else:
            if item.framework == framework:
                steps.append(item)
            rank, nbytes = 0, _peak_bytes(item)  # DeepSpeed and torchtitan log on rank 0
        if nbytes:
            memory[rank] = max(memory.get(rank, 0.0), nbytes)
    return steps, memory, earlier


def _peak_bytes(step: LoggedStep) -> float:
    """The peak a speed line reports (DeepSpeed's allocated, torchtitan's reserved), in
    bytes; 0 where it reports none."""
    gib = step.max_allocated_gib if step.max_allocated_gib is not None \
        else step.max_reserved_gib
    return 0.0 if gib is None else gib * 2**30


def memory_measure(framework: str) -> str:
    """What a framework's logged peaks measure: torchtitan's are the most reserved (the
    allocator's cached segments too, so a simulated peak reads below them), the others'
    the most allocated."""
    return "max reserved" if framework == "torchtitan" else "max allocated"


def read_job_log(path: str, flag: str = "--compare-log") -> LoggedRun:
    """A training log's steady lines, read line by line (ppsim.config.files); `flag`:
    what an error names."""
    return logged_run(files.text_lines(flag, path, MAX_LOG_BYTES, "training log"), path,
                      flag)
