"""`ppsim tui`: registered into ppsim's CLI; imports Textual only when run."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ppsim.cli import add_config_flags

    add_config_flags(parser)
    parser.add_argument("--trace", metavar="TRACE.json",
                        help="a real trace to show beside the simulated timeline")


def run(args: argparse.Namespace) -> int:
    from ppsim.cli import config_from_args
    from tui.session import state_from_config

    cfg = config_from_args(args)
    state_from_config(cfg)  # a bad split is a one-line error before the screen opens
    if args.trace:
        from ppsim.trace import read_trace

        read_trace(args.trace)
    from tui.app import PPSimApp

    PPSimApp(cfg, config_path=args.config, trace_path=args.trace).run()
    return 0


def register(commands: dict[str, tuple[str, Callable, Callable]]) -> None:
    commands["tui"] = ("edit a split interactively and watch the pipeline change", add_arguments,
                       run)
