"""`ppsim simulate --compare-log LOG`: the simulated iteration beside what the job's own
training log printed (ppsim.trace.joblog), in the units that log uses: Megatron-LM's
iteration time and TFLOP/s per GPU, torchtitan's tokens/s per device, TFLOP/s and MFU
by its own FLOP count, DeepSpeed's samples/s; and each stage's logged peak memory."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ppsim.job.ranks import Sizes, pipeline_rank
from ppsim.job.throughput import Throughput
from ppsim.trace.joblog import LoggedRun, memory_measure

_UNITS = {"iteration_ms": ("iteration", "ms", ",.1f"),
          "samples_per_s": ("", "samples/s", ",.2f"),
          "tflops_per_gpu": ("", "TFLOP/s/GPU", ",.1f"),
          "tokens_per_s_per_gpu": ("", "tokens/s/GPU", ",.0f"),
          "mfu": ("MFU", "", ".1%")}


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """One pipeline rank's peak: the log's `max allocated` (Megatron's; DeepSpeed's rank
    0's; the most of the ranks that hold that stage and reported), or torchtitan's rank
    0's most reserved, beside the simulated peak."""

    pipeline_rank: int
    logged_bytes: float
    simulated_bytes: float
    error: float
    """simulated / logged - 1."""


@dataclass(frozen=True, kw_only=True)
class LogComparison:
    """The fields both the log and the simulation give, side by side."""

    framework: str
    """Whose log: "Megatron-LM", "torchtitan", "DeepSpeed" or "NeMo"."""
    lines: int
    """Logged lines compared (their median)."""
    left_out: int
    """Lines left out as warm-up."""
    logged: dict[str, float]
    simulated: dict[str, float]
    error: dict[str, float]
    """simulated / logged - 1, per field."""
    global_batch_sizes: tuple[int, int] | None = None
    """(logged, simulated) where they differ: the two are not the same job."""
    memory: tuple[StageMemory, ...] = ()
    """Each pipeline rank some rank of which reported its memory."""
    rank_beyond: tuple[int, int] | None = None
    """(a rank the log reports memory for, the simulated job's GPUs) where that rank is
    not in the simulated job: not the same job, and no stage compared."""
    earlier_runs: int = 0
    """Runs the log holds before the one compared (joblog.LoggedRun.earlier_runs)."""
    first_only: bool = False
    """The one line compared is the first iteration's, which warm-up (allocation,
    compilation, NCCL set-up) slows: not a steady figure."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory_measure": memory_measure(self.framework)}


def _simulated(framework: str, iteration_ms: float, t: Throughput | None,
               global_batch_size: int | None) -> dict[str, float]:
    """The simulation in the log's own units (torchtitan counts FLOPs its own way)."""
    out = {"iteration_ms": iteration_ms}
    if global_batch_size:
        out["samples_per_s"] = global_batch_size / (iteration_ms / 1e3)
    if t is None:
        return out
    out["tokens_per_s_per_gpu"] = t.tokens_per_s_per_gpu
    if framework == "torchtitan":
        if t.torchtitan_tflops_per_gpu is not None and t.torchtitan_mfu is not None:
            out |= {"tflops_per_gpu": t.torchtitan_tflops_per_gpu, "mfu": t.torchtitan_mfu}
    else:
        out |= {"tflops_per_gpu": t.tflops_per_gpu, "mfu": t.mfu}
    return out


def stage_memory(run: LoggedRun, peaks: list[int], stage_of: Callable[[int], int]
                 ) -> tuple[StageMemory, ...]:
    """Each pipeline rank's logged peak (the most of its reporting ranks, `stage_of`
    mapping a global rank to its pipeline rank) beside `peaks`, the simulated ones."""
    logged: dict[int, float] = {}
    for rank, nbytes in run.max_allocated.items():
        r = stage_of(rank)
        logged[r] = max(logged.get(r, 0.0), nbytes)
    return tuple(StageMemory(pipeline_rank=r, logged_bytes=v, simulated_bytes=peaks[r],
                             error=peaks[r] / v - 1)
                 for r, v in sorted(logged.items()) if v > 0 and r < len(peaks))


def compare(run: LoggedRun, iteration_ms: float, t: Throughput | None,
            global_batch_size: int | None = None,
            memory: tuple[StageMemory, ...] = (),
            rank_beyond: tuple[int, int] | None = None) -> LogComparison:
    """The fields the log prints and the simulation gives, with the simulation's error;
    the two global batch sizes where the log prints one and it differs; `memory`, each
    stage's peaks (stage_memory); `rank_beyond`, a logged rank outside the job."""
    simulated = _simulated(run.framework, iteration_ms, t, global_batch_size)
    logged = {k: v for k in simulated if (v := run.median(k)) is not None and v > 0}
    gbs = run.median("global_batch_size")
    return LogComparison(framework=run.framework, lines=len(run.steps), left_out=run.left_out,
                         logged=logged, simulated={k: simulated[k] for k in logged},
                         error={k: simulated[k] / v - 1 for k, v in logged.items()},
                         global_batch_sizes=(int(gbs), global_batch_size)
                         if gbs and global_batch_size and gbs != global_batch_size else None,
                         memory=memory, rank_beyond=rank_beyond,
                         earlier_runs=run.earlier_runs,
                         first_only=len(run.steps) == 1 and run.steps[0].iteration <= 1)


def _value(name: str, v: float) -> str:
    label, unit, fmt = _UNITS[name]
    return " ".join(x for x in (label, format(v, fmt), unit) if x)


def compared_with(logged: LoggedRun, problem: Any, s: Any) -> LogComparison:
    """A simulated problem (its summary `s`) beside the job's log: its speed, and each
    stage's peak where the log reports memory (global ranks placed by the job's order)."""
    job, peaks = problem.hardware.job, [r.peak_memory_bytes for r in s.ranks]
    d = job.describe() if job is not None else {"gpus": len(peaks)}
    top = max(logged.max_allocated, default=-1)
    beyond = (top, d["gpus"]) if top >= d["gpus"] else None
    if job is None:
        return compare(logged, s.iteration_time_ms, None, memory=() if beyond else
                       stage_memory(logged, peaks, lambda rank: rank), rank_beyond=beyond)
    sizes = Sizes(tp=d["tp"], cp=d["cp"], dp=d["dp"], pp=d["pp"])
    return compare(logged, s.iteration_time_ms, job.throughput(s.iteration_time_ms),
                   d["global_batch_size"], () if beyond else stage_memory(
                       logged, peaks, lambda rank: pipeline_rank(rank, sizes, d["rank_order"])),
                   beyond)


def memory_line(c: LogComparison) -> str | None:
    """The stages' peaks, logged / simulated GB (10^9 bytes); None where none was logged."""
    if not c.memory:
        return None
    measure = memory_measure(c.framework)
    return (f"peak memory by pipeline rank (the log's {measure} / simulated, GB): "
            + ", ".join(f"r{m.pipeline_rank} {m.logged_bytes / 1e9:.1f} / "
                        f"{m.simulated_bytes / 1e9:.1f} ({m.error:+.1%})" for m in c.memory))


def comparison_line(c: LogComparison) -> str:
    """One line of text: what the log printed, then the simulation with its error."""
    first = ", the first left out as warm-up" if c.left_out else ""
    if c.earlier_runs:
        first += (f"; the last run of the log, after {c.earlier_runs} earlier one(s) it "
                  "leaves out")
    if not c.logged:
        return (f"logged by {c.framework} ({c.lines} line(s){first}): nothing this "
                "simulation gives (a uniform model has no tokens or FLOPs)")
    logged = ", ".join(_value(k, v) for k, v in c.logged.items())
    simulated = ", ".join(f"{_value(k, c.simulated[k])} ({c.error[k]:+.1%})" for k in c.logged)
    other = "" if c.global_batch_sizes is None else (
        f" (but the log's global batch size is {c.global_batch_sizes[0]:,}, the simulated "
        f"job's {c.global_batch_sizes[1]:,}: not the same job)")
    if c.rank_beyond is not None:
        other += (f" (but the log reports rank {c.rank_beyond[0]:,}, beyond the simulated "
                  f"job's {c.rank_beyond[1]:,} GPUs: not the same job)")
    if c.first_only:
        other += (" (but the log's one line is the first iteration, which warm-up slows: "
                  "log more iterations to compare a steady one)")
    return (f"logged by {c.framework} (median of {c.lines} line(s){first}): {logged}; "
            f"simulated: {simulated}{other}")


TIME_KEYS = ("iteration_ms", "samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
"""What says how long a logged iteration took, in the order it is read: the iteration time
where the log prints one, else a rate (the inverse of a time)."""


def time_key(c: LogComparison) -> str | None:
    """The first of TIME_KEYS the log gives (None: nothing this simulation gives)."""
    return next((k for k in TIME_KEYS if k in c.logged), None)


def time_ratio(c: LogComparison, key: str) -> float:
    """The simulated iteration over the logged one, read from `key`."""
    return 1 + c.error[key] if key == "iteration_ms" else 1 / (1 + c.error[key])


CALIBRATE_HINT_ERROR = 0.05
"""How far the simulated iteration may read from the logged one before the comparison
names `ppsim calibrate --log`: about the drift of one logged interval to the next."""


def calibrate_hint(c: LogComparison, log: str) -> str | None:
    """A line naming `ppsim calibrate --log` where the simulated iteration reads more
    than CALIBRATE_HINT_ERROR off the logged one (and the two are the same job)."""
    key = time_key(c)
    if c.global_batch_sizes or c.rank_beyond or c.first_only or key is None:
        return None
    if abs(time_ratio(c, key) - 1) <= CALIBRATE_HINT_ERROR:
        return None
    return (f"to price plans at the rate this log measured: ppsim calibrate --log "
            f"{shlex.quote(log)} "
            "with these flags, then --hardware with the table it writes")
