"""`ppsim plan --search policy` (and `policy-per-stage`): the split and the memory
policy planned together, the best of each space beside the best global mode."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from ppsim.cli.flags import config_from_args, emit_json, outputs_apart
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.plan import EXIT_NO_FIT, Planned, candidate_dict, check_top, result_dict
from ppsim.cli.render import compact_table, split_cell
from ppsim.cli.sim_picture import plan_png
from ppsim.cli.simulate import print_exports
from ppsim.clock import process_start
from ppsim.config import limits, validate
from ppsim.config.model import TransformerModel
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import Config
from ppsim.errors import UserError
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.pipeline.problem import build_problem
from ppsim.plan.advice import no_fit_message, no_fit_tips
from ppsim.plan.planner import PlanResult
from ppsim.policy.megatron import NO_POLICY_FLAGS, PolicyExport
from ppsim.policy.report import policy_flags, with_policy_flags
from ppsim.policy.search import (
    PER_RANK,
    SpaceBest,
    best_problem,
    lowest_peak,
    plan_global,
    plan_megatron,
    plan_per_stage,
    refine_per_rank,
    space_key,
)
from ppsim.policy.setup import policy_costs
from ppsim.units import fmt_bytes

POLICY_AXES = ("policy", "policy-per-stage")
SHARES = {"global": 0.3, "per-stage": 0.3}
"""Parts of the time budget the per-stage and global spaces get; the Megatron space
plans with what they leave (less a margin for the output)."""


def held_back(r: PlanResult) -> dict[str, int]:
    """The rank whose memory is nearest its limit and the rank that computes longest."""
    assert r.best is not None
    ranks = r.best.summary.ranks
    return {"memory_rank": max(ranks, key=lambda x: x.peak_memory_bytes).rank,
            "busiest_rank": max(ranks, key=lambda x: x.busy_ms).rank}


def _export(sb: SpaceBest) -> PolicyExport:
    r = sb.result
    return policy_flags(r.problem.with_split(r.best.split), sb.policies)  # type: ignore


def space_exports(sb: SpaceBest) -> dict[str, Any]:
    """The exports of a space's best split (as `plan` prints a split's), its memory
    policy's Megatron flags after the split's; none, with the policy's notes, where
    Megatron cannot run the policy (the split's flags alone would run another one)."""
    r = sb.result
    assert r is not None and r.best is not None
    p = r.problem
    return with_policy_flags(exports_of(p.pattern, r.best.split, p.schedule.microbatch_group),
                             p.with_split(r.best.split), sb.policies)


def _splits(*spaces: SpaceBest) -> list[tuple[int, ...]]:
    return [sb.result.best.split.counts for sb in spaces if sb.result and sb.result.best]


def search_spaces(cfg: Config, axes: list[str], budget_s: float, started: float
                  ) -> list[SpaceBest]:
    """The best of the global modes, of the Megatron-expressible space and (with
    policy-per-stage) of the per-stage space, within the budget from `started`."""
    base = with_overrides(cfg, split={})
    problem = build_problem(base)
    pc = policy_costs(base)

    def left(share: float) -> float:
        return max(0.05, (budget_s - (time.perf_counter() - started)) * share)

    per_stage = "policy-per-stage" in axes and problem.split.vpp == 1
    ps = plan_per_stage(problem, pc, left(SHARES["per-stage"])) if per_stage else None
    glob = plan_global(problem, pc, left(SHARES["global"] / (1 - SHARES["per-stage"])
                                         if per_stage else SHARES["global"]))
    even = problem.split.counts
    meg = plan_megatron(problem, pc, left(0.75), _splits(*(x for x in (ps, glob) if x)) + [
        even])
    if "policy-per-stage" in axes and not per_stage:  # several chunks per rank
        ps = refine_per_rank(problem, pc, min((meg, glob), key=space_key))
    return [glob, meg] + ([ps] if ps else [])


def space_dict(sb: SpaceBest, glob: SpaceBest) -> dict[str, Any]:
    r = sb.result
    out: dict[str, Any] = {"space": sb.space, "label": sb.label, "proven_optimal": sb.proven,
                           "best": None, **({"copies": sb.copies} if sb.copies else {})}
    if r is None or r.best is None:
        return out
    out["best"] = candidate_dict(r.best)
    out["best"]["policy"] = [p.to_dict(st.index, st.layers)
                             for p, st in zip(sb.policies, r.best.split.stages, strict=True)]
    out.update(held_back(r))
    g = glob.result
    if g is not None and g.best is not None:
        out["gain_vs_global"] = g.best.summary.iteration_time_ms / \
            r.best.summary.iteration_time_ms
    ex = _export(sb)
    out["megatron_policy_flags"] = shlex.join(ex.megatron_flags) if ex.megatron_flags \
        is not None else None
    out["policy_notes"], out["frameworks"] = ex.notes, ex.frameworks
    return out


def best_space(spaces: list[SpaceBest]) -> SpaceBest | None:
    """The space whose best plan is fastest; None when none planned a split that fits."""
    return min((s for s in spaces if s.result and s.result.best), key=space_key, default=None)


def policy_result_json(spaces: list[SpaceBest]) -> dict[str, Any]:
    """The best space's plan as `plan --json` gives a plan, its policy per stage in
    best.policy and its flags in best.megatron_flags; every space in policy_search."""
    best = best_space(spaces)
    out = {"policy_search": [space_dict(s, spaces[0]) for s in spaces]}
    if best is None:
        near = min(spaces, key=lowest_peak)
        res = result_dict(Planned((near if near.result else spaces[0]).result, None, []))
        peak, rank = (near.result.smallest_peak if near.result else None) or (0, 0)
        return {**res, "smallest_peak_bytes": peak, "smallest_peak_rank": rank, **out}
    res = result_dict(Planned(best.result, None, []))  # type: ignore[arg-type]
    entry = next(d for d in out["policy_search"] if d["space"] == best.space)
    res["best"]["policy"] = entry["best"]["policy"]
    res["best"]["policy_space"] = best.space
    exports = space_exports(best)
    res["best"]["megatron_flags"] = exports["megatron_flags"]
    if "megatron_note" in exports:
        res["best"]["megatron_note"] = exports["megatron_note"]
    return {**res, **out}


def print_spaces(spaces: list[SpaceBest]) -> int:
    from rich.console import Console
    console = Console()
    glob = spaces[0]
    t = compact_table("memory policy search")
    t.add_column("space", no_wrap=True)
    t.add_column("split", no_wrap=True)
    for col in ("iter ms", "gain", "memory\nrank", "busiest\nrank", "proven"):
        t.add_column(col, justify="right", no_wrap=True)
    base = glob.result.best.summary.iteration_time_ms if glob.result and glob.result.best \
        else None
    for sb in spaces:
        r = sb.result
        if r is None or r.best is None:
            t.add_row(sb.space, "no fit" if r else "-", "-", "-", "-", "-", "-")
            continue
        hb = held_back(r)
        ms = r.best.summary.iteration_time_ms
        t.add_row(sb.space, split_cell(r.best.split.counts, 30), f"{ms:.1f}",
                  f"{base / ms:.3f}" if base else "-", str(hb["memory_rank"]),
                  str(hb["busiest_rank"]), "yes" if sb.proven else "no")
    console.print(t)
    for sb in spaces:
        if sb.result is None or sb.result.best is None:
            peak = sb.result.smallest_peak if sb.result is not None else None
            if peak:
                console.print(f"{sb.space}: no split fits; the lowest peak planned, under "
                              f"{sb.label}: {peak[0] / 1e9:.2f} GB on rank {peak[1]}",
                              markup=False)
            elif sb.label:
                console.print(f"{sb.space}: {sb.label}", markup=False)
            continue
        if sb.space != "per-stage":
            console.print(f"{sb.space} policy: {sb.label}", markup=False)
        elif sb.label == PER_RANK:  # several chunks per rank: not a search over splits
            console.print(f"per-stage: {PER_RANK}: each rank's chunks their fastest policy "
                          "that fits", markup=False)
        if sb.copies:
            console.print(f"{sb.space}: {sb.copies}", markup=False)
        if sb.space == "global":
            continue
        ex = _export(sb)
        if sb.space == "per-stage":
            console.print("per stage: " + "; ".join(
                f"{i}: {p.label()}" for i, p in enumerate(sb.policies)), markup=False)
        flags = "n/a" if ex.megatron_flags is None else (
            shlex.join(ex.megatron_flags) or NO_POLICY_FLAGS)
        console.print(f"{sb.space} policy as flags: {flags}"
                      + (f" ({'; '.join(ex.notes)})" if ex.notes else "")
                      + f"; runs on: {', '.join(ex.frameworks) or 'none of them as given'}",
                      markup=False, soft_wrap=True)
    best = best_space(spaces)
    if best is None:
        sys.stderr.write(f"ppsim plan: {no_fit_line(spaces)}\n")
        return EXIT_NO_FIT
    console.print(f"fastest: {best.space} ({best.label}); its split"
                  + (" and policy" if _export(best).megatron_flags else "") + " as flags:",
                  markup=False)
    print_exports(console, space_exports(best))
    return 0


def no_fit_line(spaces: list[SpaceBest]) -> str:
    """Why no space fits, from the one nearest to fitting, and what to try."""
    near = min(spaces, key=lowest_peak)
    r = near.result
    if r is None or r.smallest_peak is None:
        return "no split that fits was found within the time budget; give more --time-budget"
    limit, (peak, rank) = r.problem.hardware.memory_bytes, r.smallest_peak
    if r.floor is not None and r.floor.static_bytes > limit:
        return no_fit_message(r)  # the weights and state alone: no policy can help
    lowest = f"{peak / 1e9:.2f} GB on rank {rank} ({near.space} {near.label})"
    if peak <= limit:
        return (f"no split that fits {fmt_bytes(limit)} per rank was found within the "
                f"time budget (the lowest peak seen is {lowest}); give more --time-budget")
    return (f"no split fits {fmt_bytes(limit)} per rank under any memory policy searched: "
            f"the lowest peak is {lowest}; try "
            + ", ".join(no_fit_tips(r.problem, policy_searched=True)))


def check_axes(axes: list[str], cfg: Config) -> None:
    other = [a for a in axes if a not in POLICY_AXES]
    if other:
        raise UserError("--search", f"policy search takes no other axes ({', '.join(other)})",
                        "search policy alone, or the other axes without it")
    if cfg.pipeline.actions_csv:
        raise UserError("--search", "policy search plans the configured schedule, not an "
                        "actions CSV", "drop --actions-csv")
    if not isinstance(cfg.model, TransformerModel) or cfg.costs_file:
        raise UserError("--search", "policy prices each module of a transformer model, "
                        "which a uniform model or a cost file does not give",
                        "give --preset NAME (or a transformer [model]) without a cost file, "
                        "or drop --search policy")


def cmd_plan_policy(args: argparse.Namespace) -> int:
    started = process_start()  # the budget covers the whole command
    cfg, assumed = assume_hardware(args, config_from_args(args))
    outputs_apart(args, {"--png": args.png}, cfg=cfg)
    check_top(args.top)
    validate.seconds("--time-budget", args.time_budget)
    axes = [a.strip() for a in args.search.split(",") if a.strip()]
    check_axes(axes, cfg)
    if args.compare:
        raise UserError("--compare", "the policy search times no reference splits",
                        "plan without --search policy to compare splits")
    ops = limits.check_request(cfg, limits.PLAN)
    if ops is not None:
        limits.check_plan_budget(ops, args.time_budget)
    if assumed:  # after the checks: bad input stays one line on stderr
        sys.stderr.write(f"ppsim plan: {assumed}\n")
    spaces = search_spaces(cfg, axes, args.time_budget, started)
    best = best_space(spaces)
    if args.png and best is not None:
        plan_png(args.png, best_problem(best), ("Megatron even, configured policy",
                                                build_problem(with_overrides(cfg, split={}))))
    if args.json:
        out = policy_result_json(spaces)
        out["policy_search_seconds"] = time.perf_counter() - started
        emit_json(out)
        return 0 if out["best"] is not None else EXIT_NO_FIT
    code = print_spaces(spaces)
    if args.png and best is not None:
        print(f"timeline picture written to {args.png}")
    return code


def register(commands: dict) -> None:
    """Wrap `ppsim plan`: --search policy or policy-per-stage plans here."""
    about, add, plain = commands["plan"]

    def handler(args: argparse.Namespace) -> int:
        axes = [a.strip() for a in (args.search or "").split(",")]
        if any(a in POLICY_AXES for a in axes) and getattr(args, "gpus", None) is None:
            return cmd_plan_policy(args)
        return plain(args)

    commands["plan"] = (about, add, handler)
