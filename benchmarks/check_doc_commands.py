"""Every `ppsim <command> ...` line the user docs show, run as a user would copy it.

The lines come from README.md, docs/model.md, docs/json.md, docs/benchmarks.md and
tui/README.md (doc_commands.py extracts them). Each one is:
- skipped, with why: a placeholder (FILE, N, OUT.json, [--optional], "..."), a command
  that starts torch processes or a screen (`run` but `run --print-launch`, `profile`,
  `demo`, `tui`), the bare name of a command in prose, a fragment naming a flag without
  its value, or a line that reads what a skipped line writes. Its command and flags must
  still exist, and so must the flags its table row names;
- ok: run in a forked process (`ppsim.cli.main.main`, output captured, COLUMNS=80, a
  timeout), it exits as the text around it says (0, or "exit 3", or 2 for a refusal)
  and prints every figure the docs say it prints;
- STALE: an unknown command or flag, another exit status, a traceback, a timeout;
- FIGURE: it runs, but a figure the docs say it prints is not in its output.

The commands of one code block share a temporary working directory, in order; paths
that exist in the repository are given whole.

Run: .venv/bin/python benchmarks/check_doc_commands.py [--quick] [--timeout S] [--show]
(one line per command; exits 1 on a STALE or FIGURE line)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import multiprocessing
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass

from doc_commands import PLACEHOLDER, ROOT, DocCommand, extract_all, subparsers

from ppsim.cli.main import main as ppsim

SLOW = {
    "ppsim plan --preset llama3.1-405b --hardware h100-80gb --gpus 8192 "
    "--global-batch-size 2048 --tp 8 --search policy",  # 25 s
    "ppsim plan --preset deepseek-v3 --hardware h100-80gb --recompute full --pp 16 --vpp 2 "
    "--schedule interleaved-1f1b --microbatches 64 --compare Et*3|(tt|)*29,m|L "
    "--time-budget 10",  # 10 s
}
"""Lines (their words, space-joined) over the unit test's budget, measured on the CPU VM:
the script runs them, tests/unit/test_doc_commands.py leaves them out (--quick)."""
TRACE = "traces/1f1b-5-3-m8"
SAMPLES = {
    "NAME": "llama3-70b", "N": "2", "K": "3", "S": "2", "B": "8", "SPLIT": "4,4",
    "OUT.json": "out.json", "OUT.png": "out.png", "OUT.csv": "out.csv",
    "A.json": f"{TRACE}/sim.json", "B.json": f"{TRACE}/real.json", "TRACE": f"{TRACE}/real.json",
}
"""What a synopsis's placeholders stand for when the checker runs it (the embedded
default's model: 8 layers on 2 ranks). Others (LOG, DIR, WORLD) leave the line skipped."""
FILE = re.compile(r"/|\.(?:json|gz|toml|csv|png|log)$")
"""A word that names a file (what a skipped line writes)."""
FRAGMENT = ("expected one argument", "the following arguments are required")


@dataclass(frozen=True, kw_only=True)
class Ran:
    status: int | str
    """The exit status, or "traceback" / "timeout"."""
    out: str
    err: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Outcome:
    kind: str
    """ok, skipped, STALE or FIGURE."""
    why: str = ""
    seconds: float = 0.0


def known_flags(command: str) -> dict[str, argparse.Action] | None:
    """The options `ppsim COMMAND` takes, hidden ones too; None: no such command."""
    parser = subparsers(command).get(command)
    return None if parser is None else parser._option_string_actions  # noqa: SLF001


def _pairs(words: list[str]) -> list[tuple[str, str]]:
    """(flag, the word after it or after its '=') for each `--flag` word."""
    words = [w.strip("[]") for w in words]
    pairs = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            pairs.append((flag, value or (words[i + 1] if i + 1 < len(words) else "")))
    return pairs


def unknown_flags(cmd: DocCommand) -> list[str] | None:
    """The flags (and choices: `--device cpu|cuda` names two) the line and its table row
    name that its command does not take; None: no such command."""
    flags = known_flags(cmd.command)
    if flags is None:
        return None
    pairs = _pairs(cmd.words[2:])
    if cmd.first_cell():  # the row's backticked flags describe the command
        pairs += [p for span in row_spans(cmd.row()[1:]) for p in _pairs(span.split())]
    bad = {flag for flag, _ in pairs if flag not in flags}
    for flag, value in pairs:
        action = flags.get(flag)
        if action is not None and action.choices and action.nargs != 0 \
                and not value.startswith("-"):
            bad |= {f"{flag} {v}" for v in value.split("|")
                    if v not in action.choices and not PLACEHOLDER.search(v)}
    return sorted(bad)


def row_spans(cells: list[str]) -> list[str]:
    """The cells' backticked spans that start with a flag (`--tp N`)."""
    return [span for cell in cells for span in cell.split("`")[1::2] if span.startswith("--")]


OUTPUT_FOLDERS = ("ppsim-run", "ppsim-demo")
"""Where `ppsim run` and `ppsim demo` write (ignored by git): what lies there is this
checkout's history, not the repository's, so a line never reads it from the checkout."""


def _shipped(path: str) -> bool:
    """`path` is under a folder the repository ships (traces/...), not an output one."""
    top = path.split("/")[0]
    return top not in OUTPUT_FOLDERS and (ROOT / top).is_dir()


def missing_paths(cmd: DocCommand) -> list[str]:
    """Words that name a file under one of the repository's folders (traces/...) that is
    not there: checked on every line, run or not (`tui --trace` reads one too)."""
    values = [w.partition("=")[2] if w.startswith("--") else w for w in cmd.words[2:]]
    return [v for v in values if "/" in v and _shipped(v)
            and not PLACEHOLDER.search(v) and not (ROOT / v).exists()]


def _absolute(word: str) -> str:
    """A word that names a repository path, made whole (the commands run elsewhere)."""
    flag, eq, value = word.rpartition("=") if word.startswith("--") else ("", "", word)
    if value and _shipped(value) and (ROOT / value).exists():
        return f"{flag}{eq}{ROOT / value}"
    return word


def _child(words: list[str], cwd: str, conn: multiprocessing.connection.Connection) -> None:
    os.chdir(cwd)
    os.environ["COLUMNS"] = "80"
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status: int | str = ppsim(words)
            except SystemExit as exc:  # argparse: a bad flag, --help
                status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - what a user would see as a traceback
        status = "traceback"
        err.write(traceback.format_exc())
    conn.send(Ran(status=status, out=out.getvalue(), err=err.getvalue(),
                  seconds=time.perf_counter() - start))
    conn.close()


def run_line(cmd: DocCommand, cwd: str, timeout: float) -> Ran:
    """`cmd` in a forked process (ppsim's modules already imported), killed at timeout."""
    words = [_absolute(w) for w in cmd.words[1:]]
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(words, cwd, send))
    start = time.perf_counter()
    child.start()
    send.close()
    if receive.poll(timeout):
        ran = receive.recv()
        child.join()
        return ran
    child.kill()
    child.join()
    return Ran(status="timeout", out="", err=f"over {timeout:.0f} s",
               seconds=time.perf_counter() - start)


def _first_error(ran: Ran) -> str:
    lines = ran.err.strip().splitlines()
    if ran.status == "traceback":
        return "traceback: " + (lines[-1] if lines else "")
    return lines[0] if lines else f"exit {ran.status}, nothing on stderr"


def judge(cmd: DocCommand, ran: Ran) -> Outcome:
    """What one line's run says about its doc."""
    expected = cmd.expected_exits()
    if cmd.inline and ran.status == 2 and any(f in ran.err for f in FRAGMENT):
        return Outcome(kind="skipped", why="a fragment: names a flag, not a whole line",
                       seconds=ran.seconds)
    if ran.status not in expected:
        said = " or ".join(map(str, sorted(expected)))
        return Outcome(kind="STALE", why=f"exit {ran.status}, the doc says {said}: "
                       f"{_first_error(ran)}", seconds=ran.seconds)
    printed = (ran.out + ran.err).replace("−", "-")
    missing = [f for f in cmd.figures if f not in printed]
    if missing:
        return Outcome(kind="FIGURE", why=f"not printed: {', '.join(missing)}",
                       seconds=ran.seconds)
    return Outcome(kind="ok", why=f"exit {ran.status}", seconds=ran.seconds)


def with_samples(cmd: DocCommand) -> DocCommand | None:
    """A synopsis (`ppsim diff A.json B.json [--iteration N]`) as one line to run: every
    optional part given, each placeholder its sample, the first of the choices `a|b`;
    None where a placeholder has no sample."""
    words = []
    for word in cmd.words:
        word = word.replace("[", "").replace("]", "")  # policy[,policy-per-stage]: both
        if word in ("...", "…"):
            continue
        if PLACEHOLDER.search(word):
            if "|" in word and word[0].islower():  # cpu|cuda
                word = word.split("|")[0]
            elif word in SAMPLES:
                word = SAMPLES[word]
            else:
                return None
        words.append(word)
    return dataclasses.replace(cmd, words=words, text=" ".join(words))


def why_skip(cmd: DocCommand, unavailable: set[str]) -> str | None:
    """Why `cmd` is not run (None: it is)."""
    if cmd.inline and len(cmd.words) == 2:
        return "names the command"
    if cmd.mention:
        return cmd.not_run()
    if (holes := cmd.placeholders()) and with_samples(cmd) is None:
        return f"placeholders {' '.join(holes)}"
    if reason := cmd.not_run():
        return reason
    if needs := [w for w in cmd.words[2:] if w in unavailable]:
        return f"reads {', '.join(needs)}, which a skipped line writes"
    return None


def static_problem(cmd: DocCommand) -> str | None:
    """What is stale in a line before it runs: its command, a flag, a choice, a file."""
    bad = unknown_flags(cmd)
    if bad is None:
        return f"no command {cmd.command!r}"
    if bad:
        return f"`ppsim {cmd.command}` takes no {', '.join(bad)}"
    if gone := missing_paths(cmd):
        return f"no file {', '.join(gone)}"
    return None


def check(cmds: list[DocCommand], timeout: float,
          quick: bool = False) -> list[tuple[DocCommand, Outcome]]:
    """Each line's outcome, the lines of one code block in one working directory."""
    results, dirs = [], {}
    unavailable: dict[tuple[str, int], set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ppsim-doc-") as tmp:
        for cmd in cmds:
            if problem := static_problem(cmd):
                results.append((cmd, Outcome(kind="STALE", why=problem)))
                continue
            missing = unavailable.setdefault((cmd.doc, cmd.block), set())
            if (why := why_skip(cmd, missing)) is None and quick and " ".join(cmd.words) in SLOW:
                why = "over the quick budget"
            if why is not None:
                # What a skipped line would have written is missing for the lines after it.
                missing |= {w for w in cmd.words[2:] if FILE.search(w)}
                missing |= {"ppsim-run/latest/trace.json"} if cmd.command == "run" else set()
                results.append((cmd, Outcome(kind="skipped", why=why)))
                continue
            cwd = dirs.setdefault((cmd.doc, cmd.block), tempfile.mkdtemp(dir=tmp))
            line = with_samples(cmd) if cmd.placeholders() else cmd
            outcome = judge(line, run_line(line, cwd, timeout))
            if line is not cmd and outcome.kind == "ok":
                outcome = dataclasses.replace(outcome, why=f"as {line.text}")
            results.append((cmd, outcome))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="leave out the SLOW lines")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per line")
    parser.add_argument("--show", action="store_true", help="print the skipped lines too")
    args = parser.parse_args()
    start = time.perf_counter()
    results = check(extract_all(), args.timeout, args.quick)
    for cmd, outcome in results:
        if args.show or outcome.kind != "skipped":
            print(f"{outcome.kind:8} {outcome.seconds:6.2f}s {cmd.where}: {cmd.text}"
                  f"{'  -- ' + outcome.why if not outcome.why.startswith('exit') else ''}")
    counts = Counter(o.kind for _, o in results)
    reasons = Counter(o.why.split(" ")[0] if o.why.startswith("placeholders") else o.why
                      for _, o in results if o.kind == "skipped")
    print(f"{len(results)} lines: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
          + f" ({time.perf_counter() - start:.1f} s)")
    print("skipped: " + "; ".join(f"{why} ({n})" for why, n in reasons.most_common()))
    return 1 if counts["STALE"] or counts["FIGURE"] else 0


if __name__ == "__main__":
    sys.exit(main())
