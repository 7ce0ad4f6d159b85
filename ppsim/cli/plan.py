"""`ppsim plan`: search splits (and optionally schedule, vpp, microbatches, recompute)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ppsim.cli import deepspeed_job
from ppsim.cli.flags import (
    add_config_flags,
    add_split_flags,
    config_from_args,
    emit_json,
    outputs_apart,
)
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.jobplan import cmd_job_plan, split_flags_given
from ppsim.cli.loglines import for_log
from ppsim.cli.plan_render import print_result
from ppsim.cli.plan_variants import SEARCH_AXES, variants
from ppsim.cli.render import job_dict
from ppsim.cli.schedule import print_notes
from ppsim.cli.sim_picture import plan_png
from ppsim.cli.simulate import add_deepspeed_specs_flag, warn_host
from ppsim.cli.torchtitan_flags import apply_torchtitan
from ppsim.clock import process_start
from ppsim.config import limits, validate
from ppsim.config.schema import Config
from ppsim.errors import UserError
from ppsim.job.search import JOB_AXES
from ppsim.pipeline.exports import (
    DEFAULT_SPECS,
    DeepSpeedSpecs,
    parse_deepspeed_specs,
)
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.pipeline.megatron_rules import refusals
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.pipeline.split import Split
from ppsim.plan.advice import no_fit_message
from ppsim.plan.baselines import FrameworkSplit
from ppsim.plan.bounds import CHUNKED_BOUND_NOTE
from ppsim.plan.gap import chunked_gap
from ppsim.plan.planner import Candidate, PlanResult, plan
from ppsim.plan.ranking import ordered
from ppsim.plan.references import (
    Reference,
    compare,
    framework_baselines,
    megatron_baseline,
    megatron_missing,
    time_split,
    why_faster,
)
from ppsim.plan.search import Deadline
from ppsim.policy.costs import Fixed
from ppsim.policy.report import policy_json, stage_policies, with_policy_flags

EXIT_NO_FIT = 3


@dataclass(frozen=True)
class Planned:
    """A plan with the references it is measured against."""

    result: PlanResult
    baseline: Reference | None
    """Megatron's even split, or its best first/last split when there is no even one."""
    compared: list[Reference]
    """The --compare splits, in the order given."""
    frameworks: list[Reference] = field(default_factory=list)
    """DeepSpeed's and torchtitan's own splits (ppsim.plan.baselines), timed."""
    without: list[FrameworkSplit] = field(default_factory=list)
    """The frameworks with no split for this shape, and why."""

    def baselines(self) -> list[Reference]:
        """Every framework's split, Megatron's first: the rows `plan` measures against."""
        return ([self.baseline] if self.baseline else []) + self.frameworks


FRAMEWORK_SHARE = 0.1
"""Of the time budget, what the frameworks' own splits may take (DeepSpeed's dynamic
program is cubic in the layers)."""


def plan_with_references(problem: Problem, compare_texts: list[str], top_k: int,
                         budget_s: float, progress: Any = None,
                         started: float | None = None,
                         specs: DeepSpeedSpecs = DEFAULT_SPECS,
                         given: Split | None = None) -> Planned:
    """Plan, seeded with the baselines and the references so it is never slower;
    `given`: a launch line's split, a reference too."""
    base = megatron_baseline(problem)
    refs = compare(problem, compare_texts)
    if given is not None:
        refs.insert(0, Reference(GIVEN, given, time_split(problem, given)))
    deadline = Deadline(time.perf_counter() + FRAMEWORK_SHARE * budget_s)
    frameworks, without = framework_baselines(problem, specs, deadline)
    if base is None:
        without.insert(0, megatron_missing(problem))
    seeds = [r.split.counts for r in ([base] if base else []) + frameworks + refs
             if r.split.standard_ends]
    res = plan(problem, top_k=top_k, progress=progress, time_budget_s=budget_s, seeds=seeds,
               started=started)
    # With no Megatron baseline there is nothing to call "even": no row, no speed-up.
    res = replace(res, baseline=Candidate(base.split, base.summary) if base else None)
    if problem.topology is not None:
        res = _retime_shared(problem, res, refs)
    return Planned(res, base, refs, frameworks, without)


def _retime_shared(problem: Problem, res: PlanResult, refs: list[Reference]) -> PlanResult:
    """Re-time the planner's candidates (unshared times) with the shared simulator."""
    splits = [c.split for c in res.candidates] + [r.split for r in refs]
    seen, retimed = set(), []
    for sp in splits:
        if sp.counts not in seen:
            seen.add(sp.counts)
            retimed.append(Candidate(sp, time_split(problem, sp)))
    fits = ordered([c for c in retimed if c.summary.fits], lambda c: c.rank)
    return replace(res, candidates=fits, best=fits[0] if fits else None,
                   proven_optimal=False)


def run_search(cfg: Config, axes: list[str], top_k: int, budget_s: float,
               silent: bool, compare_texts: list[str] | None = None,
               started: float | None = None, specs: DeepSpeedSpecs = DEFAULT_SPECS,
               given: Split | None = None) -> tuple[Planned, list[tuple[str, PlanResult]]]:
    """Plan every variant; the best result overall, and each variant's result (`given`:
    a launch line's split, a reference row of the configured shape; `silent`: no
    progress, for --json)."""
    vs = variants(cfg, axes)
    lines = None if silent else for_log("ppsim plan")
    results: list[tuple[str, Planned]] = []
    # One deadline for the whole search: each variant's set-up (its problem, schedule
    # and bound) is spent from it, and each gets a fair share of what is left.
    deadline = (time.perf_counter() if started is None else started) + budget_s
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[evaluated]} splits timed"), TimeElapsedColumn(),
                  disable=silent or lines is not None, transient=True,
                  console=_stderr()) as bar:
        task = bar.add_task("planning", total=len(vs), evaluated=0)
        for n, v in enumerate(vs):
            bar.update(task, description=f"planning {v.label}")
            begun = time.perf_counter()
            share = max(0.0, deadline - begun) / (len(vs) - n)
            try:
                problem = build_problem(v.cfg)
            except UserError:
                if v is vs[0]:
                    raise
                continue

            def tick(done: int, _total: int, task: Any = task, label: str = v.label) -> None:
                bar.update(task, evaluated=done)
                if lines is not None:
                    lines(f"planning {label}", f"{done} splits timed")

            # References belong to the configured shape; variants are planned bare.
            texts = (compare_texts or []) if v is vs[0] else []
            results.append((v.label, plan_with_references(
                problem, texts, top_k, share, tick, started=begun, specs=specs,
                given=given if v is vs[0] else None)))
            bar.advance(task)
    fitting = [r for _, r in results if r.result.best is not None]
    best = ordered(fitting, lambda r: r.result.best.rank)[0] if fitting else \
        min((r for _, r in results), key=_lowest_peak)  # type: ignore
    return _with_configured_refs(best, results[0][1]), [(label, r.result)
                                                        for label, r in results]


CONFIGURED = " (as configured)"
"""What a --compare or launch-line row's label ends with when another variant won: it
was timed in the configured shape, not the winner's."""


def _with_configured_refs(best: Planned, configured: Planned) -> Planned:
    """The winning variant with the configured variant's --compare and launch-line splits
    (timed in the configured shape, so labelled so): they were asked for, whichever
    variant wins."""
    if best is configured or not configured.compared:
        return best
    return replace(best, compared=[replace(r, label=r.label + CONFIGURED)
                                   for r in configured.compared])


def _lowest_peak(r: Planned) -> float:
    """Where no variant fits, the one to report: the lowest peak any of its splits reached
    (a variant whose floor alone overflows, or that found no peak, last)."""
    peak = r.result.smallest_peak
    return float(peak[0]) if peak else math.inf


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def candidate_dict(c: Candidate, job: Any = None) -> dict[str, Any]:
    s = c.summary
    return {"split": list(c.split.counts), "iteration_time_ms": s.iteration_time_ms,
            "bubble_fraction": s.bubble_fraction, "fits": s.fits,
            "peak_memory_bytes": [r.peak_memory_bytes for r in s.ranks],
            "throughput": job_dict(job, s.iteration_time_ms)["throughput"]}


def reference_dict(ref: Reference, best: Candidate | None, job: Any = None) -> dict[str, Any]:
    out = candidate_dict(Candidate(ref.split, ref.summary), job)
    out["label"] = ref.label
    if best is not None:
        out["best_speedup"] = ref.summary.iteration_time_ms / best.summary.iteration_time_ms
        out["why"] = why_faster(best.summary, ref)
    return out


def result_dict(planned: Planned, specs: DeepSpeedSpecs = DEFAULT_SPECS) -> dict[str, Any]:
    res = planned.result
    p = res.problem
    ds = next((r for r in planned.frameworks if r.key == "deepspeed_parameters"), None)
    job = p.hardware.job
    out: dict[str, Any] = {
        "schedule": p.schedule.name, "pp": p.schedule.pp, "vpp": p.schedule.vpp,
        "microbatches": p.schedule.microbatches, "memory_limit_bytes": p.hardware.memory_bytes,
        "best": None, "baseline": candidate_dict(res.baseline, job) if res.baseline else None,
        "deepspeed": candidate_dict(Candidate(ds.split, ds.summary), job) if ds else None,
        "baselines": [{"key": r.key, **reference_dict(r, res.best, job)}
                      for r in planned.baselines()],
        "baselines_missing": [{"key": f.key, "label": f.label, "note": f.note}
                              for f in planned.without],
        "candidates": [candidate_dict(c, job) for c in res.candidates],
        "proven_optimal": res.proven_optimal, "lower_bound_ms": res.lower_bound_ms,
        "evaluated": res.evaluated, "total_splits": res.total_splits, "seconds": res.seconds,
        "baseline_label": planned.baseline.label if planned.baseline else None,
        "compared": [reference_dict(r, res.best, job) for r in planned.compared],
        "job": job_dict(job, 0.0)["job"],
        "evaluator": "shared: unshared search, re-timed with sharing" if p.topology
        else "exact",
    }
    if res.best is not None:
        best = candidate_dict(res.best, job)
        best.update(exports_of(p.pattern, res.best.split, p.schedule.microbatch_group,
                               specs))
        t = res.best.summary.iteration_time_ms
        best["gap_to_lower_bound"] = (t - res.lower_bound_ms) / t if t else 0.0
        if p.schedule.vpp > 1 and not res.proven_optimal:
            gap = chunked_gap(res.best.summary, res.lower_bound_ms)
            out["bound_note"] = f"{CHUNKED_BOUND_NOTE}; {gap.text()}"
            out["bound_gap"] = {"rank": gap.rank, "busy_ms": gap.busy_ms,
                                "mean_busy_ms": gap.mean_busy_ms, "idle_ms": gap.idle_ms,
                                "imbalance_ms": gap.imbalance_ms,
                                "bound_below_mean_ms": gap.bound_below_mean_ms}
        if isinstance(p.memory, Fixed):  # a configured memory policy: its flags too
            at = p.with_split(res.best.split)
            best["policy"] = stage_policies(at)
            best.update(with_policy_flags(best, at, p.memory.policies))
        host = policy_json(p.with_split(res.best.split))
        best.update({k: host[k] for k in ("optimizer_host_bytes", "host_fits") if k in host})
        if res.baseline is not None:
            best["speedup_vs_baseline"] = res.baseline.summary.iteration_time_ms / t
        for ref in planned.baselines():
            best[f"speedup_vs_{ref.key}"] = ref.summary.iteration_time_ms / t
        if ds is not None:
            best["speedup_vs_deepspeed"] = best["speedup_vs_deepspeed_parameters"]
        out["best"] = best
    return out


GIVEN = "given split"
"""The label of the split a pasted launch line gives (--pipeline-model-parallel-layout,
--decoder-first/last-pipeline-num-layers, --account-for-*-in-pipeline-split)."""


def given_split(args: argparse.Namespace, cfg: Config) -> Split | None:
    """The split the flags give (a launch line's, which plan compares; refused as Megatron
    refuses it), or None."""
    return build_problem(cfg).split if split_flags_given(args) else None


def check_top(top: int) -> None:
    """--top counts candidates: at least one."""
    if top < 1:
        raise UserError("--top", f"must be at least 1, got {top}", "use --top 5")


def cmd_plan(args: argparse.Namespace) -> int:
    started = process_start()  # the budget covers the whole command
    deepspeed_job.apply(args)  # before --gpus reads the batch
    if getattr(args, "gpus", None) is not None:  # the whole job's shape, with its split
        apply_torchtitan(args, job_search=True)  # the fields given hold their sizes
        return cmd_job_plan(args)
    cfg, assumed = assume_hardware(args, config_from_args(args))
    outputs_apart(args, {"--png": args.png}, cfg=cfg)
    check_top(args.top)
    validate.seconds("--time-budget", args.time_budget)  # NaN or inf would mean no budget
    ops = limits.check_request(cfg, limits.PLAN)
    if ops is not None:
        limits.check_plan_budget(ops, args.time_budget)
    axes = [a.strip() for a in args.search.split(",") if a.strip()] if args.search else []
    if cfg.pipeline.actions_csv and set(axes) - {"recompute"}:
        raise UserError("--search", "the actions CSV fixes the schedule, vpp and microbatches",
                        "search recompute only, or drop --actions-csv")
    specs = parse_deepspeed_specs(args.deepspeed_specs)
    planned, per_variant = run_search(cfg, axes, args.top, args.time_budget,
                                      silent=args.json,
                                      compare_texts=args.compare or [], started=started,
                                      specs=specs, given=given_split(args, cfg))
    best = planned.result

    if assumed:  # after the checks: bad input stays one line on stderr
        sys.stderr.write(f"ppsim plan: {assumed}\n")
    if axes and len(per_variant) == 1:  # else the plan would read as the search's answer
        sys.stderr.write(f"ppsim plan: note: --search {','.join(axes)}: no variant but "
                         f"the configured one ({cfg.pipeline.schedule}, pp={cfg.pipeline.pp}) "
                         "runs here (the schedule refuses the others, or the axis does not "
                         "apply to this model); the plan below is the configured one\n")
    print_notes(best.problem.schedule, "plan")
    for line in refusals(best.problem.schedule, cfg.pipeline.microbatch_group_size is not None):
        sys.stderr.write(f"ppsim plan: warning: {line}\n")
    if args.png and best.best is not None:
        _png(args.png, planned)
    if args.json:
        emit_json(_json_out(planned, per_variant, specs, started))
        return 0 if best.best is not None else EXIT_NO_FIT
    if best.best is None:
        searched = [label for label, r in per_variant if r is best]
        at = f" (the lowest of the {len(per_variant)} variants searched: {searched[0]})" \
            if len(per_variant) > 1 and searched else ""
        sys.stderr.write(f"ppsim plan: {no_fit_message(best)}{at}\n")
        return EXIT_NO_FIT
    print_result(planned, per_variant, args.top, specs)
    warn_host(policy_json(best.problem.with_split(best.best.split)), cfg.hardware)
    if args.png:
        print(f"timeline picture written to {args.png}")
    return 0


def _json_out(planned: Planned, per_variant: list[tuple[str, PlanResult]],
              specs: DeepSpeedSpecs, started: float) -> dict[str, Any]:
    """`--json`: the plan's object, with the variants searched and, when none fits, the
    lowest peak and the memory floor."""
    best = planned.result
    out = result_dict(planned, specs)
    out["seconds"] = time.perf_counter() - started  # the whole command's wall time
    if len(per_variant) > 1:
        out["variant"] = next(label for label, r in per_variant if r is best)
        out["variants"] = [{"variant": label, "best": candidate_dict(r.best,
                                                                      r.problem.hardware.job)
                            if r.best else None, "proven_optimal": r.proven_optimal}
                           for label, r in per_variant]
    if best.best is None:
        peak, rank = best.smallest_peak or (0, 0)
        out["smallest_peak_bytes"], out["smallest_peak_rank"] = peak, rank
        if best.floor is not None:
            out["memory_floor"] = {"static_bytes": best.floor.static_bytes,
                                   "peak_bytes": best.floor.peak_bytes,
                                   "inflight": list(best.floor.inflight)}
    return out


def _png(path: str, planned: Planned) -> None:
    """`--png`: the best split above Megatron's."""
    res, base = planned.result, planned.baseline
    assert res.best is not None
    plan_png(path, res.problem.with_split(res.best.split),
             (base.label, res.problem.with_split(base.split)) if base else None)


def register(commands: dict) -> None:
    def add(p: argparse.ArgumentParser) -> None:
        add_config_flags(p, split_flags=False)
        add_split_flags(p, counts=False)  # a pasted launch line's split: a row to beat
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        p.add_argument("--top", type=int, default=5, metavar="K",
                       help="candidates to show (default 5; with --gpus, shapes planned)")
        p.add_argument("--search", metavar="AXES",
                       help="also search over: " + ",".join(SEARCH_AXES) + "; or plan "
                       "the memory policy with the split: policy (Megatron-expressible) "
                       "or policy,policy-per-stage; with --gpus also "
                       + ", ".join(a for a in JOB_AXES if a not in SEARCH_AXES))
        p.add_argument("--time-budget", type=float, default=60.0, metavar="S",
                       help="stop proving optimality after S seconds (default 60)")
        add_deepspeed_specs_flag(p)  # plan times DeepSpeed's splits itself (no --partition-method)
        p.add_argument("--png", metavar="OUT.png",
                       help="draw the best split's timeline above Megatron's even split's "
                       "(with --gpus: the best shape's)")
        p.add_argument("--compare", action="append", metavar="LAYOUT_OR_SPLIT",
                       help="also time this split (a Megatron layout string or counts like "
                       "7,8,8,7); repeatable")

    commands["plan"] = ("find the fastest split that fits memory", add, cmd_plan)
