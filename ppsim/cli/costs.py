"""`ppsim costs`: the per-piece costs the simulator will use, before trusting a plan.

Analytic (the model on the hardware preset) or read from a cost file (--costs),
printed per piece: `embedding`, `head` and each distinct kind of layer with the
layers that have it, each with forward/backward/weight-grad ms and
static/activation/weight-grad/output bytes. `--json` writes a cost file (what
`--costs` reads, so a hand-edited copy can be simulated), with those distinct
pieces under `groups`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ppsim.cli.costs_comm import comm_json, comm_lines, comm_table
from ppsim.cli.flags import (
    add_config_flags,
    add_split_flags,
    config_from_args,
    emit_json,
    outputs_apart,
)
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.render import compact_table, ms_text, step_bar
from ppsim.config import validate
from ppsim.config.files import output
from ppsim.config.model import TransformerModel
from ppsim.costs.costfile import cost_document, layer_dict
from ppsim.costs.model import ModelCosts
from ppsim.errors import UserError
from ppsim.fileio import write_text_atomic
from ppsim.job.comm_rows import CommRow
from ppsim.pipeline.comm_table import problem_rows
from ppsim.pipeline.problem import build_problem, model_costs, resolve_split
from ppsim.policy.costs import Fixed
from ppsim.policy.model import ALL_LAYERS
from ppsim.units import fmt_bytes

if TYPE_CHECKING:
    from rich.table import Table


def _ranges(idx: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    start = prev = idx[0]
    for i in idx[1:] + [-2]:
        if i != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ", ".join(out)


def costs_document(costs: ModelCosts, source: str) -> dict[str, Any]:
    """Distinct layers (by kind, else by value) with the indices that share them."""
    groups: dict[Any, list[int]] = {}
    for i, c in enumerate(costs.layers):
        groups.setdefault((costs.kind_of(i), c), []).append(i)
    layers = [{"kind": kind, "layers": idx, **layer_dict(c)}
              for (kind, c), idx in groups.items()]
    return {"source": source, "num_layers": costs.num_layers, "mtp_layers": costs.mtp_layers,
            "layers": layers, "embedding": layer_dict(costs.embedding),
            "head": layer_dict(costs.head)}


COSTS_NOTE = ("B is the input-gradient part of the backward; backward_ms = B + W; kept W: "
              "what the weight gradient still needs after B.")


def costs_table(title: str, rows: list[tuple[str, str, dict[str, Any]]]) -> Table:
    """Pieces' F, B, W and bytes, one per row: (name, layers, a cost file's piece)."""
    t = compact_table(title)
    for col in ("piece", "F ms", "B ms", "W ms", "static", "activ.", "kept W", "output"):
        t.add_column(col, justify="left" if col == "piece" else "right", no_wrap=True)
    spans = any(where for _, where, _ in rows)
    if spans:
        t.add_column("layers", justify="left", no_wrap=True)
    for name, where, x in rows:
        b = x["backward_ms"] - x["weight_grad_ms"]
        sizes = (fmt_bytes(x[k], figures=3) for k in ("static_bytes", "activation_bytes",
                                                       "weight_grad_bytes", "output_bytes"))
        t.add_row(name, ms_text(x["forward_ms"]), ms_text(b), ms_text(x["weight_grad_ms"]),
                  *sizes, *([where] if spans else []))
    return t


def pair_lines(costs: ModelCosts) -> list[str]:
    """What each kind's F and B save in a combined pair, one line a kind that saves."""
    saved: dict[str, float] = {}
    for i, c in enumerate(costs.layers):
        if c.pair_saving_ms:
            saved.setdefault(costs.kind_of(i), c.pair_saving_ms)
    return [f"in a combined pair (--overlap-moe-expert-parallel-comm) each F and B of a "
            f"{kind} layer takes {ms_text(ms)} ms less: its all-to-alls behind the other's "
            "compute" for kind, ms in saved.items()]


def print_costs(doc: dict[str, Any], pairs: list[str] | None = None,
                comm: list[CommRow] | None = None, measured: bool = False) -> None:
    """The cost table, then (given `comm`) the collectives table (costs_comm)."""
    from rich.console import Console

    rows = [("embedding", "", doc["embedding"])]
    spread = []  # a hybrid's kinds alternate: their ranges go below the table
    for x in doc["layers"]:
        where = _ranges(x["layers"])
        if len(where) > 10:
            spread.append(f"{x['kind']} layers: {where}")
            where = str(len(x["layers"]))
        rows.append((x["kind"], where, x))
    rows.append(("head", "", doc["head"]))
    c = Console()
    c.print(costs_table(f"per-piece costs ({doc['source']}), one microbatch", rows))
    for line in (*spread, *(pairs or ()), *transient_lines(rows)):
        c.print(line, markup=False)
    c.print(COSTS_NOTE)
    if comm is None:
        return
    if comm:
        c.print(comm_table(comm))
    for line in comm_lines(comm, measured):
        c.print(line, markup=False)


def transient_lines(rows: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """What each piece's backward holds while it runs beyond its activations, where any."""
    held = [f"{name} {fmt_bytes(x['transient_bytes'], figures=3)}" for name, _, x in rows
            if x.get("transient_bytes")]
    return [f"inside its B a piece also holds (a recompute's tensors, the logit gradient): "
            f"{', '.join(held)}"] if held else []


def policy_layers(memory: Fixed) -> tuple[ModelCosts, str | None]:
    """The layers as a configured memory policy prices them: every layer under its
    recompute modules (or whole, the uniform method); where its block N, offload or
    per-stage tables make a layer's cost depend on its stage, the layers under the
    modules every stage shares, and a note saying so (None otherwise)."""
    pols = memory.policies
    p = pols[0]
    if len(set(pols)) == 1 and not p.offloads and p.recompute_layers in (0, ALL_LAYERS):
        return (memory.costs.full if p.recompute_layers else
                memory.costs.layers_under(p.recompute_modules)), None
    mods = p.recompute_modules if len({q.recompute_modules for q in pols}) == 1 else ()
    return memory.costs.layers_under(mods), (
        "note: the memory policy's block N, offload or per-stage tables set a layer's cost "
        "by its stage; these are the layers under " + (" ".join(mods) or "no recompute")
        + " alone (simulate prices each stage)")


def cmd_costs(args: argparse.Namespace) -> int:
    cfg, assumed = assume_hardware(args, config_from_args(args))
    costs = model_costs(cfg)
    resolve_split(cfg, costs.num_layers)  # a launch line's split, checked as simulate does
    problem = build_problem(cfg, costs)
    comm = problem_rows(problem, layers=not cfg.costs_file)
    if isinstance(problem.memory, Fixed):  # [memory] or its flags: as simulate prices them
        costs, note = policy_layers(problem.memory)
        if note:
            print(f"ppsim costs: {note}", file=sys.stderr)
    if assumed:  # after the checks: bad input stays one line on stderr
        print(f"ppsim costs: {assumed}", file=sys.stderr)
    source = f"cost file {cfg.costs_file}" if cfg.costs_file else (
        "analytic, hardware " + (cfg.hardware.preset or "from the config"))
    doc = costs_document(costs, source)
    if args.json:
        model = cfg.model.fields() if isinstance(cfg.model, TransformerModel) else None
        emit_json(cost_document(costs, source=source, model=model, num_layers=costs.num_layers,
                                mtp_layers=costs.mtp_layers, groups=doc["layers"],
                                priced_collectives=comm_json(comm)))
    else:
        print_costs(doc, pair_lines(costs), comm, measured=bool(cfg.costs_file))
    return 0


def hardware_profile(args: argparse.Namespace) -> int:
    """`ppsim profile --hardware-out FILE`: this device's roofline as a [hardware] table."""
    for flag, given in (("--out", args.out is not None), ("--model", args.model),
                        ("--no-p2p", args.no_p2p)):
        if given:  # each shapes a cost file's measurement, which --hardware-out makes none of
            raise UserError(flag, "--hardware-out measures the device's roofline and writes "
                            "no cost file", f"drop {flag}, or profile the model's costs in a "
                            "run of its own without --hardware-out")
    import torch

    from ppsim.executor.hwprofile import (  # torch loads only when measuring
        hardware_toml,
        measure_hardware,
    )

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device", "cuda requested but torch sees no GPU here",
                        "use --device cpu")
    sustained = validate.number("--sustained", args.sustained, hi=600.0,
                                fix="give the warm-up in seconds, e.g. 5")
    cfg = config_from_args(args) if args.config or args.preset else None
    outputs_apart(args, {"--hardware-out": args.hardware_out}, cfg=cfg)
    model = None
    if cfg is not None:
        if not isinstance(cfg.model, TransformerModel):
            raise UserError("model.kind", "ppsim profile --hardware-out measures a "
                            "transformer's kernels, not a uniform cost model",
                            "use a preset (e.g. --preset llama3-8b) or kind = \"transformer\"")
        model = cfg.model.arch
    with step_bar("ppsim costs") as progress:
        result = measure_hardware(args.device, model=model, sustained_s=sustained,
                                  progress=progress)

    with output("--hardware-out", args.hardware_out):
        write_text_atomic(args.hardware_out, hardware_toml(result))
    if args.json:
        emit_json({"out": args.hardware_out, **result})
        return 0
    _print_hardware(result)
    print(f"[hardware] table written to {args.hardware_out} (paste it into a config)")
    return 0


def _print_hardware(result: dict[str, Any]) -> None:
    hw, m = result["hardware"], result["measurements"]
    print(f"{result['device']}: peak {hw['peak_tflops']:.1f} TFLOP/s; matmuls reach "
          + ", ".join(f"{e:.0%} at {g:g} GFLOP" for g, e in hw["matmul_efficiency"])
          + f"; attention {hw['attention_efficiency']:.0%}; memory "
          f"{hw['memory_bandwidth_gbps']:.0f} GB/s; {hw['kernel_overhead_us']:.1f} us per "
          f"kernel ({m['seconds']:.1f} s)")
    if m["model_attention"]:
        att, rates = m["model_attention"], [x["tflops"] for x in m["model_matmuls"]]
        print(f"at the model's shapes: {len(rates)} matmuls, {min(rates):.3g}-"
              f"{max(rates):.3g} TFLOP/s; attention ({att['heads']} heads x "
              f"{att['head_dim']}, {att['seq_length']} tokens, dropout {att['dropout']:g}, "
              f"{att['kernel']} kernel) {att['tflops']:.3g} TFLOP/s forward + backward")
    if m["settled_tflops"]:
        print(f"after {m['sustained_s']:g} s of warm-up the largest matmul held "
              f"{m['settled_tflops']:.3g} TFLOP/s")


def register(commands: dict) -> None:
    def add(p: argparse.ArgumentParser) -> None:
        add_config_flags(p, split_flags=False)
        add_split_flags(p, counts=False)  # a pasted launch line's split
        p.add_argument("--json", action="store_true", help="a cost file on stdout (what "
                       "--costs reads), the distinct pieces under \"groups\"")

    commands["costs"] = ("per-piece costs the simulator uses (analytic or a cost file)", add,
                         cmd_costs)
