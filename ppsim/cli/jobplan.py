"""`ppsim plan --gpus N --global-batch-size B`: the job's shapes, fastest first."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ppsim.cli.deepspeed_export import deepspeed_text
from ppsim.cli.flags import config_from_args, emit_json, outputs_apart
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.job_flags import check_global_batch
from ppsim.cli.job_launch import deepspeed_fields, job_flags, shape_exports, torchtitan_fields
from ppsim.cli.render import compact_table, step_bar
from ppsim.cli.sim_picture import shape_png
from ppsim.cli.torchtitan_job import torchtitan_text
from ppsim.config import limits, validate
from ppsim.config.schema import SPLIT_KEYS
from ppsim.errors import UserError
from ppsim.job.exposure import overlap_hint, overlaps_off
from ppsim.job.host_optimizer import host_rates_known, host_share_bytes
from ppsim.job.model import data_parallel, fsdp_framework
from ppsim.job.policy_search import POLICY_AXES
from ppsim.job.search import JOB_AXES, JobSearch, ShapeResult, longer_budget, search_job
from ppsim.job.shapes import FIXABLE
from ppsim.policy.megatron import NO_POLICY_FLAGS
from ppsim.units import fmt_bytes


def shape_dict(r: ShapeResult) -> dict[str, Any]:
    s, sm, job = r.shape, r.summary, r.problem.hardware.job
    return {"tp": s.tp, "cp": s.cp, "ep": s.ep, "etp": s.expert_tp, "pp": s.pp, "dp": s.dp,
            "vpp": s.vpp,
            "micro_batch_size": s.mbs, "microbatches": s.microbatches,
            "schedule": r.problem.schedule.name, "split": list(r.problem.split.counts),
            "split_planned": r.planned, "split_proven": r.split_proven,
            "long_shot": r.long_shot,
            "iteration_time_ms": sm.iteration_time_ms,
            "bubble_fraction": sm.bubble_fraction, "exposed_comm_ms": r.comm_ms,
            "fits": sm.fits, "peak_memory_bytes": sm.peak_memory_bytes,
            "throughput": r.throughput.to_dict() if r.throughput else None,
            "held_back_by": r.held_back_by, "memory_policy": r.policy or None,
            "data_parallel": data_parallel(job.arch) if job else None,
            "dp_replicas": job.arch.dp_replicas if job else 1,
            "fsdp_framework": fsdp_framework(job.arch) if job else None,
            "moe_token_dispatcher_type": job.moe_token_dispatcher_type if job else None,
            "cp_comm_type": job.arch.cp_comm_type if job else None,
            "optimizer_offload_fraction": job.host_optimizer.fraction
            if job and job.host_optimizer else 0.0,
            "megatron_policy_flags": r.policy_flags}


def overflow_text(res: JobSearch, memory_bytes: float, hosting: bool = False,
                  sharding: bool = False) -> str | None:
    """Why nothing was simulated, when the weights alone overflow every shape; `hosting`:
    the optimizer on the host, not searched, might make some fit; `sharding`: so might
    sharding the state over data-parallel ranks, not searched."""
    if res.leanest is None:
        return None
    lean = res.leanest
    # A search the budget cut short priced only some shapes: say so, not "every shape".
    which = "every shape" if res.complete else (
        f"each of the {res.overflowing:,} shapes priced before the time budget ran out")
    if lean.static_bytes <= memory_bytes:  # what overflows is the host's share
        return (f"nothing fits: on {which} the optimizer state kept on the host "
                f"overflows the rank's share of its node's host memory "
                f"({fmt_bytes(host_share_bytes(lean.cfg.hardware))}; "
                f"{fmt_bytes(lean.host_bytes)} at {lean.shape.label()}); put less of it "
                "there (--optimizer-offload-fraction), give more GPUs (--gpus), or a "
                "[hardware] with more host memory")
    return (f"nothing fits: on {which} the weights, gradients and optimizer states "
            f"alone overflow {fmt_bytes(memory_bytes)} per GPU, however the layers are split "
            f"(the least is {fmt_bytes(res.leanest.static_bytes)}, at "
            f"{res.leanest.shape.label()}); give more GPUs (--gpus), or a [hardware] with more "
            "memory" + (", or shard them over the data-parallel ranks (--search sharding)"
                        if sharding and _shards_under(lean, memory_bytes) else "")
            + (", or search the optimizer on the host (--search host-optimizer)"
               if hosting else ""))


def _shards_under(lean: Any, memory_bytes: float) -> bool:
    """Whether the leanest shape's state, sharded whole over its data- and
    context-parallel ranks (FSDP's floor), would fit the memory."""
    return lean.static_bytes / (lean.shape.dp * lean.shape.cp) <= memory_bytes


def size_name(key: str) -> str:
    """The argument (and JSON) name of a FIXABLE size: micro_batch_size for mbs."""
    return "micro_batch_size" if key == "mbs" else key


def held_text(held: dict[str, int]) -> str:
    """The sizes the search held as given, and how to free one ('' when none)."""
    if not held:
        return ""
    sizes = " ".join(f"--{size_name(k).replace('_', '-')} {v}" for k, v in held.items())
    return f"held as given: {sizes} (drop a flag to search that size)"


def job_plan_dict(res: JobSearch, gpus: int, gbs: int, top: int,
                  held: dict[str, int] | None = None) -> dict[str, Any]:
    fits = [r for r in res.candidates if r.summary.fits]
    best = None
    if fits:
        best = shape_dict(fits[0])
        best.update(shape_exports(fits[0]))
        best["megatron_job_flags"] = job_flags(fits[0], gbs)
        best["overlaps_off"] = overlaps_off(fits[0].problem.hardware.job)
        best["torchtitan_job"] = torchtitan_fields(fits[0], gbs)
        best["deepspeed_job"] = deepspeed_fields(fits[0], gbs)
    return {"gpus": gpus, "global_batch_size": gbs,
            "held": {size_name(k): v for k, v in (held or {}).items()}, "best": best,
            "candidates": [shape_dict(r) for r in res.candidates[:top]],
            "evaluated": res.evaluated, "total_shapes": res.total, "complete": res.complete,
            "long_shots": res.long_shots, "long_shots_unplanned": res.long_shots_unplanned,
            "static_overflows": res.overflowing, "floor_overflows": res.over_floor,
            "refused": res.refused,
            "bounded_out": res.unsimulated if res.complete else 0,
            "not_reached": 0 if res.complete else res.unsimulated,
            "seconds": res.seconds,
            "static_overflow": None if res.leanest is None else {
                "shape": res.leanest.shape.label(), "static_bytes": res.leanest.static_bytes}}


def _shape_cell(r: ShapeResult) -> str:
    """The parallel sizes over the batch's: two short lines rather than one long one."""
    return f"{r.shape.sizes_label()}\n{r.shape.batch_label()}"


def unsimulated_text(res: JobSearch) -> str:
    """Why the shapes not simulated were not ('' when every one was)."""
    bounded = res.unsimulated
    first = (bounded, "not reached when the time budget ran out") if not res.complete else (
        bounded, "bounded out (their default split's busiest rank alone is no faster than "
                 "the top ones)")
    parts = [f"{n:,} {why}" for n, why in (
        first,
        (res.over_floor, "over memory under any split with the activations their schedule "
                         "holds"),
        (res.overflowing, "over memory on weights, gradients and optimizer states alone"),
        (res.refused, "refused by the model's own checks")) if n]
    return "; " + ", ".join(parts) if parts else ""


def _row_tag(i: int, r: ShapeResult) -> str:
    return "best" if i == 0 and r.summary.fits else f"#{i + 1}"


def print_job_plan(res: JobSearch, gpus: int, gbs: int, top: int,
                   memory_bytes: float, configured: str = "",
                   held: dict[str, int] | None = None, hosting: bool = False,
                   sharding: bool = False) -> None:
    """The table of shapes; `configured`: the global recompute mode when the memory
    policy was searched (below the table, each shape whose policy differs from it);
    `held`: the sizes given as flags; `hosting`, `sharding`: the optimizer on the host,
    or sharding, may help where nothing fits (overflow_text)."""
    from rich.console import Console

    console = Console()
    console.print(f"{gpus:,} GPUs, global batch {gbs:,}: {res.evaluated:,} of {res.total:,} "
                  f"shapes simulated in {res.seconds:.1f} s{unsimulated_text(res)}",
                  markup=False)
    if held:
        console.print(held_text(held), markup=False)
    why = overflow_text(res, memory_bytes, hosting, sharding)
    if why:
        console.print(why, markup=False)
        return
    t = compact_table()
    for col in ("", "shape", "iter\nms", "TFLOP/s\n/GPU", "MFU", "tok/s\n/GPU", "peak\nGB"):
        t.add_column(col, justify="left" if col == "shape" else "right", no_wrap=True)
    t.add_column("held back by", justify="right")  # the one column that wraps
    for i, r in enumerate(res.candidates[:top]):
        tp = r.throughput
        t.add_row(_row_tag(i, r), _shape_cell(r),
                  f"{r.summary.iteration_time_ms:.0f}",
                  f"{tp.tflops_per_gpu:.0f}" if tp else "-", f"{tp.mfu:.1%}" if tp else "-",
                  f"{tp.tokens_per_s_per_gpu:,.0f}" if tp else "-",
                  f"{r.summary.peak_memory_bytes / 1e9:.1f}",
                  r.held_back_by)
    console.print(t)
    if configured:
        _print_policies(console, configured, res.candidates[:top])
    best = res.candidates[0] if res.candidates and res.candidates[0].summary.fits else None
    if best is None:
        return
    console.print(split_text(best), markup=False)
    if res.long_shots or res.long_shots_unplanned:
        console.print(long_shots_text(res, best), markup=False)
    hint = overlap_hint(best.problem.hardware.job, best.comm_ms,
                        best.summary.iteration_time_ms, "the best", "plan")
    if hint:
        console.print(hint, markup=False)
    if best.policy_flags is not None:
        console.print(f"best's memory policy ({best.policy}), Megatron flags: "
                      f"{best.policy_flags or NO_POLICY_FLAGS}", markup=False, soft_wrap=True)
    titan = torchtitan_fields(best, gbs)
    if titan is not None:
        console.print(f"torchtitan ({gpus:,} GPUs): {torchtitan_text(titan)}", markup=False,
                      soft_wrap=True)
    else:
        flags = job_flags(best, gbs)
        console.print(f"Megatron ({gpus:,} GPUs): " + (flags or "n/a (Megatron cannot build "
                      "this split or run this memory policy; see ppsim plan without "
                      "--gpus)"), markup=False, soft_wrap=True)
    console.print(f"DeepSpeed ({gpus:,} GPUs): {deepspeed_text(deepspeed_fields(best, gbs))}",
                  markup=False, soft_wrap=True)


def split_text(r: ShapeResult) -> str:
    """Whether the best shape's split is proven the fastest of that shape's splits."""
    if r.split_proven:
        return "the best's split: proven the fastest of its shape's (within the cost model)"
    return ("the best's split: the fastest found within its share of the time budget, not "
            "proven; a longer --time-budget may find a faster one")


def long_shots_text(res: JobSearch, best: ShapeResult) -> str:
    """What the long shots came to (ppsim.job.choice.long_shots), and how many the
    budget left no time for."""
    count, left = res.long_shots, res.long_shots_unplanned
    what = "(shapes an uneven split might make faster than the fastest at their default split)"
    said = []
    if count:
        won = "the best is one" if best.long_shot else "none beat the best"
        said.append(f"{count} long shot{'s' * (count > 1)} planned {what}: {won}")
    if left:
        said.append(f"{left} long shot{'s' * (left > 1)} {'' if count else what + ' '}not "
                    f"planned: the time budget ran out before {'them' if left > 1 else 'it'}; "
                    f"--time-budget {longer_budget(res.budget_s):g} may find a faster shape")
    return "; ".join(said)


def _search_axes(search: str | None) -> set[str]:
    """The axes --search names."""
    return {a.strip() for a in (search or "").split(",") if a.strip()}


def _policy_axis(given: set[str], cfg: Any) -> str:
    """What the --search axes `given` ask of the job search about the memory policy: "",
    "recompute" or "policy" (the job search varies vpp and the micro-batch size anyway,
    the global batch sets the microbatches, and sharding is an axis of its own)."""
    axes = given - {"vpp", *JOB_AXES}
    other = sorted(axes - set(POLICY_AXES))
    if other:
        takes = ", ".join(("recompute", "policy", *JOB_AXES))
        raise UserError("--search", f"the job search (--gpus) takes {takes}, not "
                        f"{', '.join(other)}", f"search {takes}; it varies vpp and the "
                        "micro-batch size itself, and the global batch sets the microbatches")
    if axes and cfg.memory is not None:
        raise UserError("--search", "searches the memory policy, but one is configured",
                        "drop [memory] and the --recompute-modules, --recompute-num-layers "
                        "and --offload-modules flags")
    return "policy" if "policy" in axes else "recompute" if axes else ""


def fixed_sizes(args: argparse.Namespace) -> dict[str, int]:
    """The sizes the command line sets (--tp 8 ...): the job search holds them (a
    pipeline size is checked only when a problem is built, so each is checked here)."""
    out = {}
    for key in FIXABLE:
        attr = size_name(key)
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = validate.count("--" + attr.replace("_", "-"), value,
                                      hi=limits.MAX_GPUS)
    return out


def split_flags_given(args: argparse.Namespace) -> list[str]:
    """The split flags given (a launch line's: its layout, first and last stages' layers,
    embedding and loss accounted), as attribute names."""
    return [k for k in SPLIT_KEYS if k != "split" and getattr(args, k, None) not in (None, False)]


def _check_job_args(args: argparse.Namespace) -> None:
    """The job search's flags, each refused in one line where it cannot apply."""
    gbs = args.global_batch_size
    if gbs is None:
        raise UserError("--global-batch-size", "is needed with --gpus",
                        "give the sequences per iteration, e.g. --global-batch-size 1024, "
                        "or [pipeline] global_batch_size in --config")
    validate.count("--gpus", args.gpus, hi=limits.MAX_GPUS,
                   fix="give the job's world size, e.g. --gpus 1024")
    check_global_batch(gbs)
    if args.top < 1:
        raise UserError("--top", f"must be at least 1, got {args.top}", "use --top 5")
    if split_flags_given(args):
        print("note: the job search plans each shape's own split; the launch line's split "
              "is compared by `ppsim plan` with its shape and without --gpus", file=sys.stderr)
    validate.seconds("--time-budget", args.time_budget)
    if args.compare:
        raise UserError("--compare", "compares splits of one shape, not a job's shapes",
                        "drop --gpus to compare splits, or --compare to plan the job")
    if getattr(args, "microbatches", None) is not None:
        raise UserError("--microbatches", "the job search gives each shape global batch / "
                        "(micro-batch size x dp) microbatches", "drop it; hold "
                        "--micro-batch-size or --dp to hold that")
    if getattr(args, "layers_per_virtual_stage", None) is not None \
            and getattr(args, "pp", None) is None:  # a held pp gives the chunks (held too)
        raise UserError("--num-layers-per-virtual-pipeline-stage", "the job search varies "
                        "pp, and with it the chunks a rank's layers make", "give --vpp N to "
                        "hold the chunks per rank, or drop it")


def cmd_job_plan(args: argparse.Namespace) -> int:
    """Plan the job's shape: what `ppsim plan` does when --gpus is given. Sizes given as
    flags (--tp, --cp, --ep, --pp, --vpp, --dp, --micro-batch-size) are held; the config's
    own are only where the search starts (the world is not applied to it; the file's global
    batch is the job's where --global-batch-size is not given)."""
    cfg, assumed = assume_hardware(args, config_from_args(argparse.Namespace(
        **{**vars(args), "gpus": None, "global_batch_size": None})))
    if args.global_batch_size is None:  # the file's batch, as `simulate --gpus` takes it
        args.global_batch_size = cfg.pipeline.global_batch_size or None
    gbs = args.global_batch_size
    _check_job_args(args)
    outputs_apart(args, {"--png": args.png}, cfg=cfg)
    axes = _search_axes(args.search)
    policy = _policy_axis(axes, cfg)
    held = fixed_sizes(args)
    if getattr(args, "layers_per_virtual_stage", None) is not None:
        held["vpp"] = cfg.pipeline.vpp  # Megatron's layers per chunk over the held pp
    if not getattr(getattr(cfg.model, "arch", None), "num_experts", 0):
        held.pop("etp", None)  # no experts to split: Megatron reads it and splits nothing
    with step_bar("ppsim plan", silent=args.json) as progress:
        res = search_job(cfg, args.gpus, gbs, top_k=args.top, budget_s=args.time_budget,
                         policy=policy, fixed=held, progress=progress,
                         axes=frozenset(axes & set(JOB_AXES)))
    if assumed:  # after the search's checks: bad input stays one line on stderr
        sys.stderr.write(f"ppsim plan: {assumed}\n")
    if args.json:
        emit_json(job_plan_dict(res, args.gpus, gbs, args.top, held))
    else:
        hosting = "host-optimizer" not in axes and host_rates_known(cfg.hardware) \
            and cfg.model.arch.optimizer == "adam"
        sharding = "sharding" not in axes and not cfg.model.arch.fsdp
        print_job_plan(res, args.gpus, gbs, args.top, cfg.hardware.memory_bytes,
                       (cfg.model.recompute or "none") if policy else "", held, hosting,
                       sharding)
    if any(r.summary.fits for r in res.candidates):
        if args.png:
            shape_png(args.png, res.candidates[0])
            if not args.json:
                print(f"timeline picture written to {args.png}")
        return 0
    _say_nothing_fits(res, args.time_budget, cfg.hardware.memory_bytes, bool(policy))
    return 3


def _say_nothing_fits(res: JobSearch, budget_s: float, memory_bytes: float,
                      policy: bool) -> None:
    """Why no shape is planned, on stderr: the budget, the activations, or the memory."""
    if not res.complete:  # the budget ran out: not the same as "nothing fits"
        sys.stderr.write(f"ppsim plan: no shape that fits was found within the time budget "
                         f"({res.evaluated:,} of {res.total:,} shapes simulated); give it more "
                         f"time, e.g. --time-budget {longer_budget(budget_s):g}\n")
    elif res.over_floor and not policy:
        sys.stderr.write(f"ppsim plan: {activations_text(res, memory_bytes)}\n")
    elif policy and res.candidates:
        sys.stderr.write(f"ppsim plan: no shape fits {fmt_bytes(memory_bytes)} per GPU, "
                         "whatever memory policy the search tried on it; give more GPUs "
                         "(--gpus)\n")


def activations_text(res: JobSearch, memory_bytes: float) -> str:
    """What to try when no shape fits and some were passed over for their activations."""
    return (f"no shape fits {fmt_bytes(memory_bytes)} per GPU with the activations its "
            f"schedule holds ({res.over_floor:,} overflow under any split); search the "
            "memory policy too (--search policy) to recompute or offload them, or give "
            "more GPUs (--gpus)")


def _print_policies(console: Any, configured: str, shown: list[ShapeResult]) -> None:
    """Each shown shape's memory policy: the configured mode, with the rows that differ;
    one line when every row takes the same other policy."""
    own = [(_row_tag(i, r), r.policy) for i, r in enumerate(shown)
           if r.policy and r.policy != configured]
    if own and len(own) == len(shown) and len({label for _, label in own}) == 1:
        console.print(f"memory policy: {own[0][1]} on every shape shown (configured: "
                      f"recompute {configured})", markup=False, soft_wrap=True)
        return
    console.print(f"memory policy: recompute {configured}"
                  + (", except" if own else " on every shape"), markup=False)
    for tag, label in own:
        console.print(f"  {tag:5} {label}", markup=False, soft_wrap=True)
