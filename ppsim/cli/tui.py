"""`ppsim tui`: registered into ppsim's CLI; imports Textual only when run.

Everything the screen needs is checked before it opens (the shared size
limits, the whole problem, the trace), so bad input is one line and exit 2
like every other command; a crash inside the app exits non-zero too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ppsim.cli.flags import RESHAPING, add_config_flags, config_from_args, input_paths
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.config.overrides import with_split
from ppsim.config.schema import SPLIT_KEYS, Config
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem
from ppsim.trace.read import read_trace
from ppsim.tui.session import config_for, state_from_config

if TYPE_CHECKING:
    from ppsim.tui.app import PPSimApp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--trace", metavar="TRACE.json",
                        help="a real trace to show beside the simulated timeline")


def resplit_note(args: argparse.Namespace, cfg: object) -> str:
    """A saved split does not survive --pp/--vpp/--num-layers/--preset: the config's
    split is dropped (the TUI starts from the even split) and the note says so."""
    p = cfg.pipeline  # type: ignore[attr-defined]
    given = [name for k, name in RESHAPING.items() if getattr(args, k, None) is not None]
    own = any(getattr(args, k, None) not in (None, False) for k in SPLIT_KEYS)
    saved = with_split(p) != p
    if not given or own or not saved or not getattr(args, "config", None):
        return ""
    what = p.split if p.split else (p.layout or "Megatron counts")
    cfg.pipeline = with_split(p)  # type: ignore[attr-defined]
    return (f"{' '.join(given)} re-split the layers evenly; the saved split {what} "
            f"of {args.config} is not used")


def opening_config(args: argparse.Namespace) -> tuple[Config, str, bool]:
    """The config the app opens on, as simulate reads the same flags; the note its
    status line shows; whether the split was re-made (unsaved)."""
    cfg, assumed = assume_hardware(args, config_from_args(args))
    resplit = resplit_note(args, cfg)
    return cfg, " · ".join(n for n in (assumed, resplit) if n), bool(resplit)


def build_app(args: argparse.Namespace, cfg: Config, note: str = "",
              resplit: bool = False) -> PPSimApp:
    """The app on `cfg`, told the files the flags read (a save or export never replaces
    one; the app guards its own config itself: a save may replace that)."""
    from ppsim.tui.app import PPSimApp  # textual loads only for the TUI

    inputs = input_paths(args, cfg)
    inputs.pop("--config", None)
    return PPSimApp(cfg, config_path=args.config, trace_path=args.trace, note=note,
                    unsaved=resplit, inputs=inputs)


def run(args: argparse.Namespace) -> int:
    cfg, note, resplit = opening_config(args)
    state = state_from_config(cfg)  # limits first: nothing big is built before them
    build_problem(config_for(cfg, state))  # any bad value: one line, exit 2
    if args.trace:
        from ppsim.tui.files import check_trace_info  # textual loads only for the TUI

        check_trace_info(read_trace(args.trace))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # it drew into a pipe and waited
        raise UserError("tui", "needs a terminal: standard input or output is a pipe or a "
                        "file here", "run it in a terminal; ppsim simulate and ppsim plan "
                        "print its figures anywhere")
    app = build_app(args, cfg, note, resplit)
    app.run()
    error = getattr(app, "_exception", None)
    if isinstance(error, UserError):
        sys.stderr.write(f"ppsim tui: error: {error}\n")
        return 2
    return app.return_code or 0


def register(commands: dict[str, tuple[str, Callable, Callable]]) -> None:
    commands["tui"] = ("edit a split interactively and watch the pipeline change", add_arguments,
                       run)
