"""`ppsim calibrate --log LOG`: the device's compute rates scaled so the job simulates in
the time its own training log says an iteration took (ppsim.config.compute_scale), written
as a [hardware] table that plans every other split and shape at that rate."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from ppsim.cli.flags import config_from_args, emit_json, outputs_apart
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.logcheck import LogComparison, compared_with, time_key, time_ratio
from ppsim.config.compute_scale import (
    SCALE_RANGE,
    NoScale,
    fastest_scale,
    fit_scale,
    scaled_compute,
)
from ppsim.config.files import output
from ppsim.config.model import TransformerModel
from ppsim.config.schema import Config
from ppsim.config.to_toml import section_toml
from ppsim.errors import UserError
from ppsim.fileio import write_text_atomic
from ppsim.pipeline.problem import build_problem
from ppsim.sim.engines import simulator
from ppsim.trace.joblog import read_job_log

DEFAULT_OUT = "hardware-calibrated.toml"

def _iteration_ms(cfg: Config, factor: float) -> float:
    scaled = replace(cfg, hardware=scaled_compute(cfg.hardware, factor))
    return simulator()(build_problem(scaled), record=False).summary.iteration_time_ms


def log_refusal(cfg: Config) -> UserError | None:
    """Why --log cannot calibrate this job's rates (None: it can); simulate --compare-log
    names calibrate --log only where this is None."""
    if cfg.costs_file:
        return UserError("--costs", "--log scales the hardware's kernel rates, which a cost "
                         "file replaces", "drop --costs (a cost file calibrates on a trace: "
                         "ppsim calibrate TRACE)")
    if not isinstance(cfg.model, TransformerModel):
        return UserError("model.kind", "--log scales a transformer's kernel rates; a uniform "
                         "model's costs are given", "give a preset or Megatron's model flags")
    return None


def _same_job(c: LogComparison, log: str) -> str:
    """The key the fit compares on; refuses a log of another job or of warm-up alone."""
    if c.global_batch_sizes is not None:
        logged, simulated = c.global_batch_sizes
        raise UserError("--log", f"{log} logs global batch size {logged:,}, the job "
                        f"{simulated:,}", f"give the logged job's flags (--global-batch-size "
                        f"{logged}, its parallel sizes)")
    if c.rank_beyond is not None:
        raise UserError("--log", f"{log} reports rank {c.rank_beyond[0]:,}, beyond the job's "
                        f"{c.rank_beyond[1]:,} GPUs", "give the logged job's sizes (--gpus, "
                        "--tp, --pp, --dp)")
    if c.first_only:
        raise UserError("--log", f"{log}'s one line is the first iteration, which warm-up "
                        "slows", "calibrate on a log of several iterations")
    key = time_key(c)
    if key is None:
        raise UserError("--log", f"{log} gives no iteration time or throughput this job's "
                        "simulation gives", "give a transformer job (a preset or Megatron's "
                        "model flags) and its log")
    return key


def _no_scale(miss: NoScale, target_ms: float, peak: bool) -> UserError:
    """`peak`: the fastest factor tried puts the best matmul at the device's peak (else it
    is SCALE_RANGE's end)."""
    if miss.fastest_ms > target_ms:
        at = ", the best matmul at the device's peak" if peak else ""
        return UserError("--log", f"the logged iteration, {target_ms:,.1f} ms, is shorter than "
                         f"the job simulates with its kernels at {1 / miss.low:.2f}x the "
                         f"hardware's rates ({miss.fastest_ms:,.1f} ms{at})", "check the "
                         "job's shape, batch and overlaps against the logged run's, and the "
                         "[hardware] peak and links")
    return UserError("--log", f"the logged iteration, {target_ms:,.1f} ms, is longer than the "
                     f"job simulates with its kernels {miss.high:.0f}x slower "
                     f"({miss.slowest_ms:,.1f} ms)", "check the job's shape and batch against "
                     "the logged run's")


def cmd_calibrate_log(args: argparse.Namespace) -> int:
    if args.trace is not None:
        raise UserError("--log", f"given with the trace {args.trace}", "calibrate on one: "
                        "TRACE (a run of ppsim run) or --log (the job's training log)")
    out = DEFAULT_OUT if args.hardware_out is None else args.hardware_out
    cfg, assumed = assume_hardware(args, config_from_args(args))
    outputs_apart(args, {"--hardware-out": out}, {"--log": args.log}, cfg=cfg)
    if (refused := log_refusal(cfg)) is not None:
        raise refused
    logged = read_job_log(args.log, "--log")
    problem = build_problem(cfg)
    before = simulator()(problem, record=False).summary
    c = compared_with(logged, problem, before)
    key = _same_job(c, args.log)
    if assumed:  # after the checks: bad input stays one line on stderr
        sys.stderr.write(f"ppsim calibrate: {assumed}\n")
    target_ms = before.iteration_time_ms / time_ratio(c, key)  # the logged iteration
    low = max(SCALE_RANGE[0], fastest_scale(cfg.hardware))
    fit = fit_scale(lambda k: _iteration_ms(cfg, k), target_ms, low, SCALE_RANGE[1])
    if isinstance(fit, NoScale):
        raise _no_scale(fit, target_ms, low > SCALE_RANGE[0])
    hardware = scaled_compute(cfg.hardware, fit.factor)
    with output("--hardware-out", out):
        write_text_atomic(out, _table(args.log, c, key, fit.factor, hardware))
    summary = {"log": args.log, "framework": c.framework, "lines": c.lines,
               "left_out": c.left_out, "fitted_on": key, "logged": c.logged[key],
               "logged_iteration_ms": target_ms, "before_ms": before.iteration_time_ms,
               "compute_scale": fit.factor, "after_ms": fit.iteration_ms,
               "simulations": fit.steps, "out": out}
    if args.json:
        emit_json(summary)
    else:
        _print(summary, _rates(args, cfg, assumed))
    return 0


def _table(log: str, c: LogComparison, key: str, factor: float, hardware: Any) -> str:
    named = " ".join(log.splitlines())  # a comment line stays one line
    head = [f"# ppsim calibrate --log {named}: {c.framework}'s {key}, median of {c.lines} "
            "line(s);",
            f"# every kernel {factor:.4f}x the time the given hardware took (its links as "
            "given).",
            "# Plan with it: ppsim plan --hardware THIS_FILE and the job's other flags, or "
            "paste it into the job's config."]
    return "\n".join(head + section_toml("hardware", hardware)) + "\n"


def _print(s: dict[str, Any], rates: str) -> None:
    warm = ", the first left out as warm-up" if s["left_out"] else ""
    error = s["before_ms"] / s["logged_iteration_ms"] - 1
    print(f"calibrated on {s['log']} ({s['framework']}, median of {s['lines']} line(s){warm}): "
          f"iteration {s['logged_iteration_ms']:,.1f} ms logged, {s['before_ms']:,.1f} ms "
          f"simulated at {rates} ({error:+.1%})")
    print(f"compute scale {s['compute_scale']:.3f} (every kernel's time): simulated "
          f"{s['after_ms']:,.1f} ms in {s['simulations']} simulations")
    print(f"[hardware] table written to {s['out']} (plan with it: ppsim plan --hardware "
          f"{s['out']} and the job's other flags)")


def _rates(args: argparse.Namespace, cfg: Config, assumed: str) -> str:
    """Whose kernel rates the job was simulated at before the fit."""
    if args.hardware:
        return f"{args.hardware}'s rates"
    if args.config and not assumed:
        return f"{args.config}'s [hardware] rates"
    return f"{cfg.hardware.preset or 'the default hardware'}'s rates"
