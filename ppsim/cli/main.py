"""`ppsim`: the parser of every command and the one place a user error becomes exit 2."""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ppsim import clock, fileio
from ppsim.cli import (
    costs,
    demo,
    diff,
    flag_aliases,
    megatron_run,
    plan,
    plan_policy,
    presets,
    profile,
    run,
    schedule,
    simulate,
    streams,
    torchtitan_flags,
    tui,
)
from ppsim.errors import UserError

COMMAND_MODULES = (presets, simulate, plan, plan_policy, run, diff, demo, tui, profile, costs,
                   schedule)
"""Each command lives with its feature and registers itself (torch and textual are
imported inside its handler only, so `ppsim --help` stays light)."""

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, exit status 2, and takes no flag by a
    prefix: `run --cp 2` must not read as the hidden Megatron flag --cp-comm-type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # prog is "ppsim" or "ppsim <command>": name it once, as UserErrors do.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _register() -> None:
    for module in COMMAND_MODULES:
        module.register(COMMANDS)


@functools.cache
def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; given the command a line names, only that one gets its
    flags (the others are listed by name: a command's flags cost ~1 ms to declare).
    Built once a process for each command (~20 ms with Megatron's launch flags): parsing
    leaves a parser as it was, and no flag's default is a mutable object."""
    if not COMMANDS:
        _register()
    parser = _Parser(prog="ppsim", description="Plan, simulate, run and diff uneven "
                     "pipeline-parallel splits.")
    parser.add_argument("--version", action="version", version=f"ppsim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, add, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command not in COMMANDS or name == command:
            add(p)
            if "--hidden-size" in p._option_string_actions \
                    and name not in megatron_run.TRAINING_COMMANDS:  # noqa: SLF001
                # A command that prices Megatron's model arguments takes the rest of
                # the launch line too, after its own flags.
                megatron_run.add_run_flags(p)
        if not any("--force" in a.option_strings for a in p._actions):
            p.add_argument("--force", action="store_true",
                           help="write outputs through a symbolic link (refused otherwise)")
    return parser


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" where ppsim
    runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ppsim")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    with streams.guarded():
        try:
            try:
                code = _main(argv)
            except SystemExit:  # argparse: --help, or a bad flag
                sys.stdout.flush()
                raise
            sys.stdout.flush()  # a full disk is reported here, not at interpreter exit
            return code
        except streams.StreamFailed as exc:
            streams.silence_stdout()
            streams.say(f"ppsim: error: {exc} (write the output to a file or another stream)\n")
            return 2
        except BrokenPipeError:
            # `ppsim schedule | head`: the reader left; say nothing more, as Unix tools do.
            streams.silence_stdout()
            return 141


def entry() -> NoReturn:
    """The `ppsim` script and `python -m ppsim.cli`: main(), then the exit status.

    Once `ppsim run` has imported torch, the interpreter's teardown takes 0.6-2.3 s
    (torch._dynamo's pools) and writes nothing of ours: with every output flushed,
    the process ends at once."""
    clock.started_by_script()
    code = main()
    if "torch" in sys.modules:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            code = code or 1
        os._exit(code)
    sys.exit(code)


def _refuse_unknown(parser: argparse.ArgumentParser, command: str,
                    extra: list[str]) -> NoReturn:
    """Flags the command does not take, in its name, each with the close flags it does take
    (`--presets` for --preset): argparse names neither."""
    every = [(o, a.help != argparse.SUPPRESS) for a in _subparser(parser, command)._actions
             for o in a.option_strings if o.startswith("--")]
    hints = []
    for word in extra:
        name = word.split("=", 1)[0]
        # hidden flags are not offered, but torchtitan's dotted fields (hidden from --help,
        # listed in docs/model.md) are, to a dotted name
        flags = [o for o, shown in every if shown or ("." in o and "." in name)]
        if name.startswith("--") and (close := difflib.get_close_matches(name, flags, n=1)):
            hints.append(f"{name}: did you mean {close[0]}?")
    said = f" ({'; '.join(hints)})" if hints else ""
    parser.exit(2, f"ppsim {command}: error: unrecognized arguments: {' '.join(extra)}{said} "
                "(see --help)\n")


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices[command]
    return parser


def _main(argv: Sequence[str] | None) -> int:
    words = torchtitan_flags.subcommand_words(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(words[0] if words else None)
    args, extra = parser.parse_known_args(words)
    if extra:
        _refuse_unknown(parser, args.command, extra)
    fileio.FOLLOW_LINKS = bool(getattr(args, "force", False))
    try:
        flag_aliases.refuse_two_values(_subparser(parser, args.command), words[1:])
        return COMMANDS[args.command][2](args)
    except UserError as exc:
        exc = megatron_run.data_split_hint(args, exc)
        streams.say(f"ppsim {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        streams.say("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
