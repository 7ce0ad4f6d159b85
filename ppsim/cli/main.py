"""`ppsim` command line: presets, split, simulate, plan, run, diff, profile, calibrate, tui."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ppsim.config import validate
from ppsim.config.overrides import MODEL_KEYS, PIPELINE_KEYS, with_overrides
from ppsim.config.schema import SPLIT_KEYS, Config, load_config
from ppsim.errors import UserError

RESHAPING = ("pp", "vpp", "num_layers", "preset")
"""Flags that change how many layers or stages there are (a saved split no longer fits)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        # prog is "ppsim" or "ppsim <command>": name it once, as UserErrors do.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _ints(text: str, flag: str) -> list[int] | str:
    if text.strip() == "even":
        return "even"
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UserError(flag, f"{text!r} is not a comma-separated list of integers",
                        "write e.g. 6,2") from None


def add_config_flags(p: argparse.ArgumentParser, split_flags: bool = True) -> None:
    g = p.add_argument_group("config (flags override the file)")
    g.add_argument("--config", metavar="FILE", help="TOML config; default: embedded preset")
    g.add_argument("--preset", metavar="NAME", help="model preset (replaces [model])")
    g.add_argument("--hardware", metavar="NAME", help="hardware preset")
    g.add_argument("--num-layers", type=int, metavar="N")
    g.add_argument("--pp", type=int, metavar="N", help="pipeline ranks")
    g.add_argument("--vpp", type=int, metavar="N", help="chunks (virtual stages) per rank")
    g.add_argument("--microbatches", type=int, metavar="N")
    g.add_argument("--schedule", metavar="NAME")
    g.add_argument("--recompute", metavar="MODE", help="none | selective | full")
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size")
    g.add_argument("--memory-gb", type=float, metavar="GB", help="memory limit per rank")
    g.add_argument("--costs", metavar="FILE", help="measured cost file (ppsim profile)")
    g.add_argument("--actions-csv", metavar="FILE", help="run this per-rank order instead of "
                   "--schedule's (a torch.distributed.pipelining schedule CSV)")
    g.add_argument("--devices", metavar="D,D,...",
                   help="device of each rank, e.g. 0,0 for two ranks sharing one device")
    if split_flags:
        s = p.add_argument_group("split (one of)")
        s.add_argument("--split", metavar="N,N,...",
                       help="layers per virtual stage, or 'even' (Megatron's default)")
        s.add_argument("--layout", metavar="STR", help="Megatron pipeline layout string")
        s.add_argument("--first-stage-layers", type=int, metavar="N")
        s.add_argument("--last-stage-layers", type=int, metavar="N")
        s.add_argument("--account-for-embedding", action="store_true", default=None)
        s.add_argument("--account-for-loss", action="store_true", default=None)


def config_from_args(args: argparse.Namespace) -> Config:
    """Load --config (or the default) and apply the flags on top (ppsim.config.overrides)."""
    cfg = load_config(args.config)
    flag = lambda key: getattr(args, key, None)  # noqa: E731 - a command may lack a flag
    chosen = {k: flag(k) for k in SPLIT_KEYS}
    split: dict[str, Any] | None = None
    if any(v is not None for v in chosen.values()):
        # A split given on the command line replaces whatever the file chose.
        if chosen["split"] is not None:
            chosen["split"] = _ints(chosen["split"], "--split")
        split = chosen
    elif args.config is None and any(flag(k) is not None for k in RESHAPING):
        split = {}  # the embedded default's split fits only the embedded default
    memory = flag("memory_gb")
    if memory is not None:
        memory = validate.number(
            "--memory-gb (hardware.memory_bytes)", memory, lo=0.0, lo_open=True,
            hi=validate.MAX_BYTES / 1e9, fix="give the memory one rank may use, e.g. 80") * 1e9
    devices = None
    if flag("devices") is not None:
        devices = _ints(args.devices, "--devices")
        if isinstance(devices, str):
            raise UserError("--devices", "needs one device index per rank", "e.g. 0,0")
    return with_overrides(cfg, preset=flag("preset"),
                          model={k: flag(k) for k in MODEL_KEYS},
                          pipeline={k: flag(k) for k in PIPELINE_KEYS}, split=split,
                          hardware=flag("hardware"), memory_bytes=memory,
                          costs_file=flag("costs"), devices=devices)


def emit_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite is written as null, never as NaN/Infinity."""
    sys.stdout.write(json.dumps(validate.finite_json(obj), indent=2, allow_nan=False) + "\n")


# ------------------------------------------------------------------ commands


def cmd_presets(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ppsim.config.presets import HARDWARE_NOTES, HARDWARE_PRESETS, MODEL_NOTES, MODEL_PRESETS

    if args.json:
        emit_json({"models": MODEL_PRESETS, "hardware": HARDWARE_PRESETS})
        return 0
    console = Console()
    t = Table(title="model presets", title_justify="left")
    for col in ("name", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq", "tp", "note"):
        t.add_column(col)
    for name, m in MODEL_PRESETS.items():
        t.add_row(name, str(m["num_layers"]), str(m["hidden_size"]),
                  f"{m['num_heads']}/{m['num_kv_heads']}", str(m["ffn_hidden_size"]),
                  str(m["vocab_size"]), str(m["seq_length"]), str(m.get("tp", 1)),
                  MODEL_NOTES[name])
    console.print(t)
    h = Table(title="hardware presets", title_justify="left")
    for col in ("name", "memory", "peak TFLOP/s", "efficiency", "P2P GB/s", "note"):
        h.add_column(col)
    for name, hw in HARDWARE_PRESETS.items():
        h.add_row(name, f"{hw['memory_bytes'] / 1e9:.0f} GB", f"{hw['peak_tflops']:g}",
                  f"{hw['efficiency']:g}", f"{hw['p2p_bandwidth_gbps']:g}", HARDWARE_NOTES[name])
    console.print(h)
    return 0


def cmd_split(args: argparse.Namespace) -> int:
    from ppsim.config.limits import check_request
    from ppsim.pipeline.exports import split_exports
    from ppsim.pipeline.problem import resolve_split
    from ppsim.schedules.generators import schedule_placement

    cfg = config_from_args(args)
    check_request(cfg, None)
    split = resolve_split(cfg, None, schedule_placement(cfg.pipeline.schedule))
    stages = [{"rank": s.rank, "chunk": s.chunk, "layers": s.layers, "offset": s.offset}
              for s in split.stages]
    exports = split_exports(split)
    if args.json:
        emit_json({"num_layers": split.num_layers, "pp": split.pp, "vpp": split.vpp,
                   "stages": stages, **exports})
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"{split.num_layers} layers on pp={split.pp}, vpp={split.vpp}",
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
    from ppsim.pipeline.problem import model_costs

    try:
        return model_costs(cfg).kinds
    except UserError:
        return ()


def _stage_kinds(kinds: tuple[str, ...], offset: int, count: int) -> str:
    """"layers 3..4: 2 moe" — the stage's layer range and its kinds, run-length coded."""
    span = f"layers {offset}..{offset + count - 1}"
    if not kinds:
        return span
    runs: list[list] = []
    for k in kinds[offset:offset + count]:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return span + ": " + ", ".join(f"{n} {k}" for k, n in runs)


def print_exports(console: Any, exports: dict[str, Any]) -> None:
    mf = exports["megatron_flags"]
    console.print(f"[bold]Megatron:[/bold]   {mf}" if mf is not None
                  else f"[bold]Megatron:[/bold]   n/a ({exports.get('megatron_note')})",
                  soft_wrap=True)
    console.print(f"[bold]layout:[/bold]     --pipeline-model-parallel-layout "
                  f"{shlex.quote(exports['megatron_layout'])}", soft_wrap=True)
    console.print("[bold]torchtitan:[/bold] module_fqns_per_model_part = "
                  + json.dumps(exports["torchtitan_module_fqns_per_model_part"]), soft_wrap=True)
    ds = exports["deepspeed_boundaries"]
    console.print(f"[bold]DeepSpeed:[/bold]  partition boundaries {ds}" if ds is not None
                  else f"[bold]DeepSpeed:[/bold]  n/a ({exports.get('deepspeed_note')})",
                  soft_wrap=True)


def cmd_simulate(args: argparse.Namespace) -> int:
    from ppsim.cli.render import summary_dict
    from ppsim.cli.schedule import print_notes
    from ppsim.config import limits
    from ppsim.pipeline.problem import build_problem, placement_warning
    from ppsim.sim.engines import simulator

    simulate = simulator(args.engine)
    cfg = config_from_args(args)
    ops = limits.check_request(cfg, limits.SIMULATE)
    if args.trace or args.png:
        limits.check_request(cfg, limits.TRACE)
    problem = build_problem(cfg)
    print_notes(problem.schedule, "simulate")
    warning = placement_warning(cfg)
    if warning:
        print(warning, file=sys.stderr)
    # Per-op records only where something shows them: memory stays flat otherwise.
    timeline = not args.json and (ops or 0) <= limits.TIMELINE_OPS
    sim = simulate(problem, record=bool(args.trace or args.png or timeline))
    if args.trace:
        from ppsim.trace.schema import simulation_trace, write_trace

        write_trace(args.trace, simulation_trace(sim))
    s = sim.summary
    if args.png:
        from ppsim.cli.picture import render_png

        assert sim.timeline is not None
        lanes = [[(op.start, op.end - op.start, op.action.kind, op.action.microbatch)
                  for op in ops] for ops in sim.timeline.ops]
        with validate.output("--png", args.png):
            render_png([(f"{problem.schedule.name}, split {list(problem.split.counts)}",
                         lanes)], args.png, title=f"simulated iteration "
                       f"{s.iteration_time_ms:.2f} ms, bubble {s.bubble_fraction:.1%}")
    if args.json:
        emit_json({"schedule": problem.schedule.name, "pp": problem.split.pp,
                   "vpp": problem.split.vpp, "microbatches": problem.schedule.microbatches,
                   "split": list(problem.split.counts),
                   "memory_limit_bytes": problem.hardware.memory_bytes, **summary_dict(s)})
        return 0
    _print_simulation(sim)
    if args.trace:
        print(f"trace written to {args.trace} (open in https://ui.perfetto.dev)")
    if args.png:
        print(f"timeline picture written to {args.png}")
    return 0


def _print_simulation(sim: Any) -> None:
    from rich.console import Console

    from ppsim.cli.render import rank_table, text_timeline
    from ppsim.config import limits

    problem, s = sim.problem, sim.summary
    console = Console()
    console.print(f"[bold]{problem.schedule.name}[/bold]  pp={problem.split.pp} "
                  f"vpp={problem.split.vpp} microbatches={problem.schedule.microbatches}  "
                  f"split={list(problem.split.counts)}")
    console.print(f"iteration time [bold]{s.iteration_time_ms:.3f} ms[/bold]   "
                  f"bubble [bold]{s.bubble_fraction:.1%}[/bold]   peak memory "
                  f"{s.peak_memory_bytes / 1e9:.2f} GB of {problem.hardware.memory_bytes / 1e9:.0f}"
                  f" GB   {'fits' if s.fits else '[red]does NOT fit[/red]'}")
    console.print(rank_table(s, problem.hardware.memory_bytes))
    if sim.timeline is None:
        console.print(f"(no text timeline above {limits.TIMELINE_OPS:,} ops; --trace keeps "
                      "every op)")
        return
    console.print("timeline (F/B/W = forward/backward/weight-grad, . = idle):")
    for line in text_timeline(sim.timeline.ops, s.iteration_time_ms,
                              width=max(40, min(120, console.width - 10))):
        console.print(line)


COMMAND_MODULES = ("ppsim.cli.plan", "ppsim.cli.run", "ppsim.cli.diff", "ppsim.cli.demo",
                   "ppsim.cli.tui",
                   "ppsim.cli.profile", "ppsim.cli.costs", "ppsim.cli.schedule")

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {}


def _register() -> None:
    def presets(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true")

    def split(p: argparse.ArgumentParser) -> None:
        add_config_flags(p)
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")

    def simulate(p: argparse.ArgumentParser) -> None:
        add_config_flags(p)
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (Perfetto)")
        p.add_argument("--png", metavar="OUT.png", help="write the timeline as a picture")
        p.add_argument("--engine", choices=("event", "simpy"), default="event",
                       # "fast" is accepted as another name for the default engine.
                       type=lambda name: "event" if name == "fast" else name,
                       help="event: the heap engine (ppsim/sim/engine.py, fast; default); "
                       "simpy: the same model in simpy (ppsim/sim/simpy_engine.py, the "
                       "readable reference); both give the same numbers")

    COMMANDS["presets"] = ("list model and hardware presets", presets, cmd_presets)
    COMMANDS["split"] = ("show a split's stages and its Megatron/torchtitan/DeepSpeed forms",
                         split, cmd_split)
    COMMANDS["simulate"] = ("simulate one iteration: time, bubbles, memory", simulate,
                            cmd_simulate)
    # Each further command lives with its feature and registers itself; a
    # module must import cheaply (torch is imported inside its handler only).
    import importlib

    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    if not COMMANDS:
        _register()
    parser = _Parser(prog="ppsim", description="Plan, simulate, run and diff uneven "
                     "pipeline-parallel splits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, add, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        if not any("--force" in a.option_strings for a in p._actions):
            p.add_argument("--force", action="store_true",
                           help="write outputs through a symbolic link (refused otherwise)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ppsim import fileio

    fileio.FOLLOW_LINKS = bool(getattr(args, "force", False))
    try:
        return COMMANDS[args.command][2](args)
    except UserError as exc:
        sys.stderr.write(f"ppsim {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        # `ppsim schedule | head`: the reader left; say nothing more, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
