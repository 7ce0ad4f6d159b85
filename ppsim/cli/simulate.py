"""`ppsim presets`, `ppsim split` and `ppsim simulate`: one split, its forms, its timeline."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from ppsim.cautions import flags_group, simulate_cautions, split_cautions
from ppsim.cli.calibrate_log import log_refusal
from ppsim.cli.flag_values import nonempty
from ppsim.cli.flags import (
    add_config_flags,
    config_from_args,
    emit_json,
    outputs_apart,
)
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.logcheck import calibrate_hint, compared_with, comparison_line, memory_line
from ppsim.cli.render import (
    job_dict,
    print_job,
    rank_table,
    split_runs,
    summary_dict,
    text_timeline,
)
from ppsim.cli.sim_picture import write_simulation_png
from ppsim.config import limits
from ppsim.config.limits import check_request
from ppsim.config.schema import Config
from ppsim.costs.hybrid import KIND_SYMBOLS
from ppsim.errors import UserError
from ppsim.job.exposure import exposed_comm_ms, overlap_hint, overlaps_off
from ppsim.job.lanes import step_collectives
from ppsim.pipeline.exports import parse_deepspeed_specs
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.pipeline.problem import (
    build_problem,
    hybrid_pattern,
    model_costs,
    resolve_split,
)
from ppsim.plan.advice import fit_hint
from ppsim.policy.report import copy_events, host_step_line, host_warning, policy_json
from ppsim.schedules.generators import schedule_placement
from ppsim.sim.engines import simulator
from ppsim.trace.joblog import read_job_log
from ppsim.trace.schema import simulation_trace, write_trace
from ppsim.units import fmt_bytes


def add_deepspeed_specs_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deepspeed-specs", metavar="BEFORE,AFTER", default="1,1",
                   help="entries of the DeepSpeed layer-spec list before the first decoder "
                   "layer and after the last (default 1,1: embedding, head; e.g. 2,4 for "
                   "Megatron-DeepSpeed GPT)")


def cmd_split(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    check_request(cfg, None)
    split = resolve_split(cfg, None, schedule_placement(cfg.pipeline.schedule))
    stages = [{"rank": s.rank, "chunk": s.chunk, "layers": s.layers, "offset": s.offset}
              for s in split.stages]
    exports = exports_of(hybrid_pattern(cfg), split, flags_group(cfg, split),
                         parse_deepspeed_specs(args.deepspeed_specs))
    if getattr(args, "partition_method", None) and exports["deepspeed_boundaries"]:
        # the split is PipelineModule's own partition: its method says it, no override
        exports["deepspeed_partition_method"] = args.partition_method
    for line in split_cautions(cfg, split):
        print(f"ppsim split: {line}", file=sys.stderr)
    if args.json:
        emit_json({"num_layers": split.num_layers, "pp": split.pp, "vpp": split.vpp,
                   "stages": stages, **exports})
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    # decoder layers as Megatron's --num-layers counts them, MTP depths beside
    mtp = f" + {split.mtp} MTP" if split.mtp else ""
    t = Table(title=f"{split.num_layers - split.mtp} layers{mtp} on pp={split.pp}, "
                    f"vpp={split.vpp}",
              title_justify="left")
    for col in ("stage", "rank", "chunk", "layers", "offset", "holds"):
        t.add_column(col, justify="right")
    kinds = _layer_kinds(cfg)
    for st in split.stages:
        body = _stage_kinds(kinds, st.offset, st.layers) if st.layers else ""
        holds = " + ".join(x for x in ("embedding" if st.has_embedding else "", body,
                                       "head+loss" if st.has_head else "") if x) or "-"
        t.add_row(str(st.index), str(st.rank), str(st.chunk), str(st.layers), str(st.offset),
                  holds)
    console.print(t)
    print_exports(console, exports)
    return 0


def _layer_kinds(cfg: Config) -> tuple[str, ...]:
    """Each layer's kind for display; () when the model names none."""

    try:
        return model_costs(cfg).kinds
    except UserError:
        return ()


def _stage_kinds(kinds: tuple[str, ...], offset: int, count: int) -> str:
    """"layers 3..4: 2 moe" — the stage's layer range and its kinds, run-length coded."""
    span = f"layers {offset}..{offset + count - 1}"
    if not kinds:
        return span
    mine = kinds[offset:offset + count]
    if set(mine) - {"mtp"} and set(mine) <= set(KIND_SYMBOLS) | {"mtp"}:
        # a hybrid stack: its pattern reads best (`/` an MTP depth)
        return span + ": " + "".join(KIND_SYMBOLS.get(k, "/") for k in mine)
    runs: list[list] = []
    for k in kinds[offset:offset + count]:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return span + ": " + ", ".join(f"{n} {k}" for k, n in runs)


def _entries(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"


def print_exports(console: Any, exports: dict[str, Any]) -> None:
    mf = exports["megatron_flags"]
    console.print(f"[bold]Megatron:[/bold]   {mf}" if mf is not None
                  else f"[bold]Megatron:[/bold]   n/a ({exports.get('megatron_note')})",
                  soft_wrap=True)
    if exports.get("hybrid_layer_pattern"):
        console.print("[bold]pattern:[/bold]    --hybrid-layer-pattern "
                      + shlex.quote(exports["hybrid_layer_pattern"]), soft_wrap=True)
    layout = exports["megatron_layout"]
    console.print(f"[bold]layout:[/bold]     --pipeline-model-parallel-layout "
                  f"{shlex.quote(layout)}"
                  + ("" if mf is not None else " (Megatron cannot run it, see above)")
                  if layout is not None else
                  f"[bold]layout:[/bold]     n/a ({exports.get('megatron_layout_note')})",
                  soft_wrap=True)
    tt = exports["torchtitan_module_fqns_per_model_part"]
    console.print("[bold]torchtitan:[/bold] module_fqns_per_model_part = " + json.dumps(tt)
                  if tt is not None else
                  f"[bold]torchtitan:[/bold] n/a ({exports.get('torchtitan_note')})",
                  soft_wrap=True)
    ds = exports["deepspeed_boundaries"]
    if ds is None:
        console.print(f"[bold]DeepSpeed:[/bold]  n/a ({exports.get('deepspeed_note')})",
                      soft_wrap=True)
        return
    shape = exports["deepspeed_specs"]
    layers = ds[-1] - shape["before"] - shape["after"]
    if method := exports.get("deepspeed_partition_method"):
        console.print(f"[bold]DeepSpeed:[/bold]  PipelineModule(num_stages={len(ds) - 1}, "
                      f"partition_method='{method}') (boundaries {ds} over the spec list)",
                      soft_wrap=True)
        return
    console.print(f"[bold]DeepSpeed:[/bold]  partition boundaries {ds} over the spec list "
                  f"({_entries(shape['before'])}, the {layers} layers, "
                  f"{_entries(shape['after'])}); "
                  "DeepSpeed takes no boundaries, so override _partition_layers:",
                  soft_wrap=True)
    console.print(exports["deepspeed_partition_override"].rstrip(), markup=False,
                  highlight=False, soft_wrap=True)


def cmd_simulate(args: argparse.Namespace) -> int:
    simulate = simulator(args.engine)
    cfg, assumed = assume_hardware(args, config_from_args(args))
    outputs_apart(args, {"--trace": args.trace, "--png": args.png},
                  {"--compare-log": args.compare_log}, cfg=cfg)
    ops = limits.check_request(cfg, limits.SIMULATE)
    if args.trace or args.png:
        limits.check_request(cfg, limits.TRACE)
    problem = build_problem(cfg)
    logged = read_job_log(args.compare_log) if args.compare_log else None
    if assumed:  # after the checks: bad input stays one line on stderr
        print(f"ppsim simulate: {assumed}", file=sys.stderr)
    for line in simulate_cautions(cfg, problem):
        print(f"ppsim simulate: {line}", file=sys.stderr)
    # Per-op records only where something shows them: memory stays flat otherwise.
    timeline = not args.json and (ops or 0) <= limits.TIMELINE_OPS
    sim = simulate(problem, record=bool(args.trace or args.png or timeline))
    if args.trace:
        trace = simulation_trace(sim)
        trace["traceEvents"] += copy_events(sim)  # a memory policy's host copies
        write_trace(args.trace, trace)
    s = sim.summary
    if args.png:
        write_simulation_png(args.png, [("", sim)], f"simulated iteration "
                             f"{s.iteration_time_ms:.2f} ms, bubble {s.bubble_fraction:.1%}")
    if args.json:
        emit_json({"schedule": problem.schedule.name, "pp": problem.split.pp,
                   "vpp": problem.split.vpp, "microbatches": problem.schedule.microbatches,
                   "split": list(problem.split.counts),
                   "memory_limit_bytes": problem.hardware.memory_bytes, **summary_dict(s),
                   **policy_json(problem),
                   **job_dict(problem.hardware.job, s.iteration_time_ms),
                   **_waits(problem, s),
                   **({} if s.fits else {"fit_hint": fit_hint(problem)}),
                   **({"compared_with_log": compared_with(logged, problem, s).to_dict()}
                      if logged else {})})
        return 0
    _print_simulation(sim)
    if logged:
        compared = compared_with(logged, problem, s)
        hint = calibrate_hint(compared, args.compare_log) if log_refusal(cfg) is None \
            else None  # calibrate --log would refuse this job
        for line in (comparison_line(compared), memory_line(compared), hint):
            if line:
                print(line)
    warn_host(policy_json(problem), cfg.hardware)
    if args.trace:
        print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    if args.png:
        print(f"timeline picture written to {args.png}")
    return 0


def warn_host(host: dict[str, Any], hw: Any) -> None:
    """On stderr, where what the host holds for a rank passes its share of the node's
    host memory (ppsim.policy.report.host_warning)."""
    line = host_warning(host, hw)
    if line:
        print(line, file=sys.stderr)


def _waits(problem: Any, s: Any) -> dict[str, Any]:
    """A job's exposed communication on its busiest rank, the overlaps it leaves off and
    its step's data-parallel collectives (none for a uniform model)."""
    job = problem.hardware.job
    if job is None:
        return {}
    step = [{"rank": r, "what": c.what, "ms": c.total_ms, "exposed_ms": c.unhidden_ms,
             "beside": c.beside or None}
            for r, mine in enumerate(step_collectives(problem)) for c in mine]
    return {"exposed_comm_ms": exposed_comm_ms(problem, s), "overlaps_off": overlaps_off(job),
            "step_collectives": step}


def _print_simulation(sim: Any) -> None:
    from rich.console import Console


    problem, s = sim.problem, sim.summary
    console = Console()
    head = (f"{problem.schedule.name}  pp={problem.split.pp} vpp={problem.split.vpp} "
            f"microbatches={problem.schedule.microbatches}  split=")
    counts = str(list(problem.split.counts))
    if len(head + counts) > console.width:  # one line, every count: runs as "2×40"
        counts = split_runs(problem.split.counts)
    console.print(f"[bold]{problem.schedule.name}[/bold]{head[len(problem.schedule.name):]}"
                  f"{counts}")
    device = fmt_bytes(problem.hardware.memory_bytes, 2)
    console.print(f"iteration time [bold]{s.iteration_time_ms:.3f} ms[/bold]   "
                  f"bubble [bold]{s.bubble_fraction:.1%}[/bold]   peak memory "
                  f"{fmt_bytes(s.peak_memory_bytes)} of {device}"
                  f"   {'fits' if s.fits else '[red]does NOT fit[/red]'}")
    if not s.fits:
        console.print(fit_hint(problem), markup=False)
    print_job(console, problem.hardware.job, s.iteration_time_ms)
    waits = _waits(problem, s)
    hint = overlap_hint(problem.hardware.job, waits.get("exposed_comm_ms", 0.0),
                        s.iteration_time_ms, "the job", "simulate")
    for line in (hint, host_step_line(problem, s.iteration_time_ms)):
        if line:
            console.print(line, markup=False)
    console.print(rank_table(s))
    if sim.timeline is None:
        console.print(f"(no text timeline above {limits.TIMELINE_OPS:,} ops; --trace keeps "
                      "every op)")
        return
    console.print("timeline (each cell the kind that fills most of it: F/B/W = forward/"
                  "backward/weight-grad, lower case f/b/w for an odd microbatch, ░ = busy "
                  "under half, . = idle):")
    for line in text_timeline(sim.timeline.ops, s.iteration_time_ms,
                              width=max(40, min(120, console.width - 10))):
        console.print(line)


def register(commands: dict[str, Any]) -> None:
    def split(p: argparse.ArgumentParser) -> None:
        add_config_flags(p)
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        add_deepspeed_specs_flag(p)

    def simulate(p: argparse.ArgumentParser) -> None:
        add_config_flags(p)
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (Perfetto)")
        p.add_argument("--png", metavar="OUT.png", help="write the timeline as a picture")
        p.add_argument("--compare-log", metavar="LOG", type=nonempty("a log file's path"),
                       help="the job's own training log "
                       "(Megatron-LM's, torchtitan's, DeepSpeed's or NeMo's): its logged "
                       "iteration time, "
                       "TFLOP/s/GPU, tokens/s and MFU beside the simulation's")
        p.add_argument("--engine", choices=("event", "simpy"), default="event",
                       # "fast" is accepted as another name for the default engine.
                       type=lambda name: "event" if name == "fast" else name,
                       help="event: the heap engine (ppsim/sim/engine.py, fast; default); "
                       "simpy: the same model in simpy (ppsim/sim/simpy_engine.py, the "
                       "readable reference); both give the same numbers")
        add_deepspeed_specs_flag(p)

    commands["split"] = ("show a split's stages and its Megatron/torchtitan/DeepSpeed forms",
                         split, cmd_split)
    commands["simulate"] = ("simulate one iteration: time, bubbles, memory", simulate,
                            cmd_simulate)
