"""`ppsim profile` (measure a cost file) and `ppsim calibrate TRACE` (fit one to a real run).

Both write the same cost file format (ppsim.costfile) that `--costs FILE` or the
config's `costs_file = "..."` feed to simulate, plan and the TUI. Importing this
module is cheap: torch is imported inside `ppsim profile`'s handler only, and
calibration is pure logic (trace in, costs out).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ppsim.cli import runchecks
from ppsim.cli.builder_checks import check_tensor_parallel, load_checked
from ppsim.cli.calibrate_log import DEFAULT_OUT, cmd_calibrate_log
from ppsim.cli.context_checks import check_context_model
from ppsim.cli.costs import hardware_profile
from ppsim.cli.flag_values import nonempty
from ppsim.cli.flags import add_config_flags, config_from_args, emit_json, outputs_apart
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.loglines import for_log
from ppsim.cli.profile_text import print_costs
from ppsim.cli.runchecks import RANKS_PER_DEVICE, check_profile_memory, host_devices
from ppsim.config import validate
from ppsim.config.model import TransformerModel
from ppsim.config.schema import Config
from ppsim.costs.arch import DTYPE_BYTES
from ppsim.costs.costfile import PROFILE_REPEATS, cost_document, read_cost_file, write_costs
from ppsim.errors import UserError
from ppsim.pipeline.placement import topology
from ppsim.pipeline.problem import model_costs
from ppsim.trace.calibrate import ESTIMATORS, Calibration, calibrate, kept_conditions
from ppsim.trace.read import read_trace

PROFILE_HELP = "measure per-layer F/B/W time, bytes and P2P on this machine; write a cost file"
MAX_REPEATS = 100_000
CALIBRATE_HELP = ("fit the cost model to a real trace (per-kind scale, P2P delay; a cost "
                  "file), or the hardware's kernel rates to a training log (--log)")


def register(commands: dict[str, Any]) -> None:
    commands["profile"] = (PROFILE_HELP, _profile_args, cmd_profile)
    commands["calibrate"] = (CALIBRATE_HELP, _calibrate_args, cmd_calibrate)


def _profile_args(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, split_flags=False)
    g = p.add_argument_group("profile")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to measure (default cpu)")
    g.add_argument("--model", metavar="MODULE:FUNCTION", type=nonempty("a builder"),
                   help="model builder, as ppsim run takes it (default: [model] builder, "
                   "else the built-in GPT); a builder is code: naming one runs it")
    g.add_argument("--out", metavar="FILE", help="cost file to write (default ./costs.json)")
    g.add_argument("--repeats", type=int, default=PROFILE_REPEATS, metavar="N",
                   help="timed repeats per op after warm-up; their mean is kept (the "
                   "message and latency samples scale with it, all of them from the default, "
                   f"{PROFILE_REPEATS})")
    g.add_argument("--warmup", type=int, default=3, metavar="N",
                   help="untimed repeats first (default 3)")
    g.add_argument("--no-p2p", action="store_true",
                   help="skip the two-process P2P measurement (keep the config's values)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")
    g.add_argument("--hardware-out", metavar="FILE", help="measure this device's roofline "
                   "(matmuls, attention, bandwidth) into a [hardware] TOML instead of a model; "
                   "with --config or --preset, at that model's own matmuls and attention")
    g.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="with --hardware-out: warm the device up this long first and time "
                   "each kernel over a window, for the rate a training job holds (GPU: 5)")


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", nargs="?", help="a trace written by ppsim run")
    add_config_flags(p, split_flags=False)
    g = p.add_argument_group("calibrate")
    g.add_argument("--out", metavar="FILE",
                   help="cost file to write (default ./costs-calibrated.json)")
    g.add_argument("--log", metavar="LOG", type=nonempty("a training log"),
                   help="instead of a trace, the job's own training log (Megatron-LM, "
                   "torchtitan, DeepSpeed, NeMo): scale the hardware's kernel rates to the "
                   "iteration it logged")
    g.add_argument("--hardware-out", metavar="FILE", help="with --log: the [hardware] table "
                   f"to write (default ./{DEFAULT_OUT})")
    g.add_argument("--estimator", choices=ESTIMATORS, default="mean",
                   help="how per-op ratios become one factor per kind (default: mean)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")


# ------------------------------------------------------------------ profile


def _transformer_fields(cfg: Config, command: str) -> dict[str, Any]:
    if not isinstance(cfg.model, TransformerModel):
        raise UserError("model.kind", f"ppsim {command} measures a transformer, not a uniform "
                        "cost model", "use a preset (e.g. --preset tiny-gpt) or kind = "
                        "\"transformer\"")
    runchecks.check_recompute_runs(cfg.model.arch)
    return cfg.model.fields()


def cmd_profile(args: argparse.Namespace) -> int:
    if args.hardware_out is not None:  # "" too: refused by its name there
        return hardware_profile(args)
    if args.sustained:  # any value but the default 0 (nan and negatives included)
        raise UserError("--sustained", "is the warm-up of --hardware-out's roofline; a cost "
                        "file's profile takes none", "drop --sustained, or add --hardware-out "
                        "FILE")
    cfg, args.out = config_from_args(args), "costs.json" if args.out is None else args.out
    # The config's costs_file is not read here (profile measures): writing it is a refresh.
    outputs_apart(args, {"--out": args.out})
    fields = _transformer_fields(cfg, "profile")
    topology(cfg.placement, cfg.pipeline.pp, 0.0, 0.0)  # --devices checked as simulate does
    if args.model:
        fields = {**fields, "builder": args.model}  # where every measuring process looks
    validate.count("--repeats", args.repeats, lo=1, hi=MAX_REPEATS)
    validate.count("--warmup", args.warmup, lo=0, hi=MAX_REPEATS)
    from ppsim.executor.measure import builder_blamed, profile  # loads torch

    devices = _checked_devices(args, cfg, fields)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    dp_steps = 1 if cfg.model.arch.dp * cfg.model.arch.cp > 1 and args.device == "cpu" else 0
    total = args.warmup + args.repeats + (0 if args.no_p2p else 1) + dp_steps
    lines = for_log("ppsim profile", quiet_s=0)
    with builder_blamed(fields, "--model" if args.model else "model.builder"), \
            Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                     console=err, transient=True, disable=lines is not None) as bar:
        task = bar.add_task("building pieces", total=total)
        if lines is not None:
            lines("building pieces", f"{total} steps to time")

        def progress(what: str, steps: int) -> None:
            bar.update(task, advance=steps, description=what)
            if lines is not None:
                lines(what, f"{bar.tasks[0].completed:.0f} of {total} steps")

        doc = profile(fields, args.device, args.repeats, args.warmup,
                      cfg.pipeline.microbatches, p2p=not args.no_p2p, progress=progress,
                      devices=devices, pin=bool(cfg.placement.devices))
    write_costs(args.out, doc)
    if args.json:
        emit_json({"out": args.out, **doc})
        return 0
    print_costs(doc, f"profiled on {doc['device']} (torch {doc['torch_version']}, "
                 f"{doc['threads']} thread(s)) in {doc['measurement']['seconds']:.1f} s")
    print(f"cost file written to {args.out} (use: ppsim simulate --costs {args.out})")
    return 0


def _checked_devices(args: argparse.Namespace, cfg: Config, fields: dict[str, Any]
                     ) -> list[int]:
    """What a profile needs before it measures (the builder, the processes, the device,
    the host's memory), refused in one line; the device of each rank."""
    import torch

    from ppsim.executor.builders import (  # torch loads only when profiling
        builder_spec,
        code_note,
    )
    from ppsim.executor.measure import processes_at_once  # torch loads only when profiling

    if note := code_note(builder_spec(None, fields)):
        sys.stderr.write(f"ppsim profile: note: {note}\n")
    where = "--model" if args.model else "model.builder"  # refused in that one's name
    builder = load_checked(builder_spec(None, fields), fields, where)
    _check_processes(cfg, args.device)
    check_context_model(cfg)
    _check_parallel_on_cpu(cfg.model.arch, args.device)
    if cfg.model.arch.tp > 1:
        check_tensor_parallel(builder, fields, cfg.model.arch.tp,
                              cfg.model.arch.sequence_parallel)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device", "cuda requested but torch sees no GPU here",
                        "use --device cpu")
    devices = list(cfg.placement.devices) if cfg.placement.devices \
        else list(range(cfg.pipeline.pp))
    if args.device == "cpu":
        analytic = model_costs(dataclasses.replace(cfg, costs_file=None))
        check_profile_memory(analytic, DTYPE_BYTES[cfg.model.arch.dtype],
                             processes_at_once(fields, args.device, devices))
    return devices


def _check_parallel_on_cpu(a: Any, device: str) -> None:
    """Tensor, context and expert parallelism are measured in gloo processes on CPU."""
    if device == "cpu":
        return
    if a.tp > 1:
        raise UserError("--device", f"tensor parallelism (tp = {a.tp}) is measured on CPU "
                        "over gloo", "use --device cpu, or --tp 1")
    if a.cp > 1:
        raise UserError("--device", f"context parallelism (cp = {a.cp}) is measured on CPU "
                        "over gloo", "use --device cpu, or set [model] cp = 1")
    if a.num_experts and a.ep > 1:
        raise UserError("--device", f"expert parallelism (ep = {a.ep}) is measured on CPU "
                        "over gloo", "use --device cpu, or set [model] ep = 1")


def _check_processes(cfg: Config, device: str) -> None:
    """With dp > 1 on CPU the collectives are timed in pp x tp x dp processes: no more
    than `ppsim run` would start on this host."""
    a = cfg.model.arch
    if a.dp * a.cp <= 1 or device != "cpu":
        return
    world = cfg.pipeline.pp * a.tp * a.dp * a.cp
    cores = host_devices("cpu")
    if world > RANKS_PER_DEVICE * cores:
        raise UserError("--dp", f"the data-parallel collectives would be timed in pp x tp x "
                        f"dp x cp = {world:,} processes, more than {RANKS_PER_DEVICE} per CPU core "
                        f"of this host ({cores:,})", "profile with a smaller --dp; the timed "
                        "collectives hold for that group size only")


def trace_argument(args: argparse.Namespace) -> str:
    """TRACE, also where a flag taking several values (--recompute-modules a b) took it as
    its last value, as argparse does when TRACE comes after such a flag."""
    if args.trace is not None:
        return args.trace
    for name, value in vars(args).items():
        if isinstance(value, list) and value and isinstance(value[-1], str) \
                and value[-1].endswith((".json", ".json.gz")):
            args.trace = value.pop()
            if not value:
                setattr(args, name, None)
            return args.trace
    raise UserError("TRACE", "missing", "give the trace ppsim run wrote: ppsim calibrate "
                    "TRACE [flags]")


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.log is not None:
        if args.out is not None:
            raise UserError("--out", "--log writes a [hardware] table, not a cost file",
                            "name it with --hardware-out FILE")
        return cmd_calibrate_log(args)
    if args.hardware_out is not None:
        raise UserError("--hardware-out", "a trace calibrates a cost file", "name it with "
                        "--out FILE, or calibrate the hardware on a training log (--log LOG)")
    args.out = "costs-calibrated.json" if args.out is None else args.out
    trace_argument(args)
    cfg, assumed = assume_hardware(args, config_from_args(args))
    outputs_apart(args, {"--out": args.out}, {"TRACE": args.trace}, cfg=cfg)
    if assumed:
        sys.stderr.write(f"ppsim calibrate: {assumed}\n")
    trace = read_trace(args.trace)
    cal = calibrate(trace, cfg, args.estimator)
    err_before = (cal.before_ms - cal.measured_ms) / cal.measured_ms
    err_after = (cal.after_ms - cal.measured_ms) / cal.measured_ms
    summary = {
        "trace": args.trace, "iterations": cal.iterations, "base": cfg.costs_file or "analytic",
        "estimator": cal.estimator, "factors": cal.factors, "head_factors": cal.head_factors,
        "samples": cal.samples,
        "p2p_delay_ms": cal.p2p_delay_ms,
        "p2p_samples": cal.p2p_samples, "measured_iteration_ms": cal.measured_ms,
        "predicted_before_ms": cal.before_ms, "predicted_after_ms": cal.after_ms,
        "error_before": err_before, "error_after": err_after,
        "optimizer_step_ms": cal.optimizer_ms, "warmup_iterations_fitted": cal.warmup_fitted,
    }
    # The base file's timed collectives, and the conditions the fit leaves out, are
    # measurements the trace does not refit: they stay.
    base = read_cost_file(cfg.costs_file).raw if cfg.costs_file else {}
    kept = {k: base[k] for k in ("collectives", "dp_collectives") if base.get(k)}
    if conditions := kept_conditions(base.get("conditions")):
        kept["conditions"] = conditions
    doc = cost_document(
        cal.costs, source="calibrate",
        model=cfg.model.fields() if isinstance(cfg.model, TransformerModel) else None,
        p2p={"latency_ms": cal.hardware.p2p_latency_ms,
             "bandwidth_gbps": cal.hardware.p2p_bandwidth_gbps,
             "from": "trace" if cal.p2p_delay_ms is not None else "base"},
        device=trace.info.get("device"), calibration=summary,
        **kept)
    write_costs(args.out, doc)
    if cal.warmup_fitted:  # after the write: a refused --out is the one line on stderr
        its = ", ".join(str(i) for i in cal.warmup_fitted)
        sys.stderr.write(f"ppsim calibrate: warning: iteration(s) {its} of "
                         f"{args.trace} include warm-up (allocator growth, first kernels), so "
                         "the factors read high; fit iterations past it: ppsim run "
                         "--iterations 2 or more, with --warmup 1 or more (its default)\n")
    if args.json:
        emit_json({"out": args.out, **summary})
        return 0
    _print_calibration(args, cal, summary)
    sys.stdout.flush()
    return 0


def _print_calibration(args: argparse.Namespace, cal: Calibration,
                       summary: dict[str, Any]) -> None:
    """What `ppsim calibrate` found, for a person."""
    from rich.console import Console
    from rich.markup import escape

    c = Console()
    f, before, after = cal.factors, summary["error_before"], summary["error_after"]
    c.print(f"calibrated on {escape(args.trace)}, iteration(s) {cal.iterations} (base: "
            f"{escape(summary['base'])})")
    c.print(f"scale factors ({cal.estimator} of measured / predicted): " + "  ".join(
        f"{k} {v:.3f} ({cal.samples[k]} ops)" if v is not None else f"{k} n/a"
        for k, v in f.items()))
    if cal.head_factors != cal.factors:
        c.print("head (norm + LM head + loss) factors: " + "  ".join(
            f"{k} {v:.3f}" for k, v in cal.head_factors.items() if v is not None))
    if cal.p2p_delay_ms is not None:
        bw = cal.hardware.p2p_bandwidth_gbps
        c.print(f"P2P delay {cal.p2p_delay_ms * 1e3:.1f} us (median of {cal.p2p_samples} "
                f"waits) -> latency {cal.hardware.p2p_latency_ms * 1e3:.1f} us, bandwidth "
                + (f"{bw:.2f} GB/s" if bw > 0 else "unlimited (0 in the file: the bytes "
                   "take no time)"))
    else:
        c.print("P2P: no transfer with a waiting receiver; kept the base latency")
    mean = "mean, warm-up included" if cal.warmup_fitted else "steady-state mean"
    c.print(f"iteration time: measured {cal.measured_ms:.2f} ms ({mean}, compute "
            f"span)   predicted before {cal.before_ms:.2f} ms ({before:+.1%})   after "
            f"[bold]{cal.after_ms:.2f} ms ({after:+.1%})[/bold]")
    if cal.optimizer_ms is not None:
        c.print(f"(optimizer step {cal.optimizer_ms:.2f} ms per iteration, not simulated)")
    c.print(f"cost file written to {escape(args.out)} (use: ppsim simulate --costs "
            f"{escape(args.out)})")
