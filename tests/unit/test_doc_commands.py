"""The `ppsim ...` lines the docs show run as the docs say (benchmarks/check_doc_commands.py,
less its SLOW lines), and the checker tells a stale line from a good one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import check_doc_commands as checker  # noqa: E402
from doc_commands import DOCS, DocCommand, extract, extract_all  # noqa: E402


def _line(text: str, *, inline: bool = False, context: str = "",
          figures: tuple[str, ...] = ()) -> DocCommand:
    import shlex

    return DocCommand(doc="test.md", line=1, text=text, words=shlex.split(text),
                      inline=inline, block=1, context=context, figures=list(figures))


def test_extraction_joins_continuations_and_drops_comments():
    readme = {c.line: c for c in extract("README.md")}
    assert readme[39].words[-2:] == ["--png", "timeline.png"]  # the continuation line's
    assert readme[38].text == "ppsim presets"  # its comment dropped
    assert readme[44].words[-1] == "Et*10|t*11|(t*10|)*5t*9L"  # quoted as a shell reads it
    # The README's abridged output block belongs to its third line, the first `plan`.
    assert "8955.90" in readme[41].figures and "1.008" in readme[41].figures
    assert "0.15" not in readme[41].figures  # a wall time is the machine's, not a figure
    # A table row whose cells escape pipes (`cpu\|cuda`) describes its command's flags.
    run_row = next(c for c in readme.values() if c.text.startswith("ppsim run [--iter"))
    assert run_row.first_cell()
    assert "--rank-start exec" in checker.row_spans(run_row.row()[1:])


def test_every_doc_yields_commands_and_placeholders_are_skipped():
    cmds = extract_all()
    assert {c.doc for c in cmds} == set(DOCS)
    synopsis = next(c for c in cmds if c.text.startswith("ppsim simulate [--trace OUT"))
    assert checker.why_skip(synopsis, set()).startswith("placeholders ")
    launch = _line("ppsim run --print-launch")
    assert checker.why_skip(launch, set()) is None  # run's one form that starts nothing
    # A synopsis whose placeholders have samples runs with them, every option given.
    usage = _line("ppsim diff A.json B.json [--iteration N] [--png OUT.png]", inline=True)
    assert checker.why_skip(usage, set()) is None
    assert checker.with_samples(usage).words[-4:] == ["--iteration", "2", "--png", "out.png"]
    assert checker.with_samples(_line("ppsim plan --search policy[,policy-per-stage]")) \
        .words[-1] == "policy,policy-per-stage"
    assert checker.why_skip(_line("ppsim simulate --compare-log LOG"), set()) \
        == "placeholders LOG"  # no sample: a training log is the user's


def test_no_doc_command_is_stale():
    results = checker.check(extract_all(), timeout=60, quick=True)
    bad = [f"{c.where}: {c.text} -- {o.why}" for c, o in results
           if o.kind in ("STALE", "FIGURE")]
    assert not bad, "\n".join(bad)
    ran = [c.text for c, o in results if o.kind == "ok"]
    assert len(ran) >= 8, ran
    assert any(c.figures for c, o in results if o.kind == "ok")  # a figure was checked


@pytest.mark.parametrize(("line", "why"), [
    (_line("ppsim simulate --microbatch 4"), "takes no --microbatch"),
    (_line("ppsim simulat --pp 2"), "no command 'simulat'"),
    (_line("ppsim simulate --engine simpy|fast [--pp N]"), "--engine fast"),
    (_line("ppsim tui --trace traces/1f1b-5-3-m8/gone.json"), "no file traces/1f1b-5-3-m8/gone"),
    (_line("ppsim run [--iterations N]", inline=True,
           context="| `ppsim run [--iterations N]` | `--versus-torch` alternates |"),
     "--versus-torch"),
])
def test_a_flag_or_choice_the_command_lacks_is_stale(line: DocCommand, why: str):
    [(_, outcome)] = checker.check([line], timeout=30)
    assert outcome.kind == "STALE" and why in outcome.why, outcome


def test_an_exit_or_a_figure_the_doc_gets_wrong_is_reported():
    split = "ppsim split --num-layers 8 --pp 2"
    wrong_exit = _line(split, inline=True, context=f"`{split}` exits 3: nothing fits")
    wrong_figure = _line(split, figures=("Et*4|t*4L", "1.234"))
    refused = _line("ppsim split --num-layers 8 --pp 0", inline=True,
                    context="`ppsim split --num-layers 8 --pp 0` is refused")
    # "exit 3 if nothing fits" allows 0; a row that says what a command refuses expects 0.
    allowed = _line(split, inline=True, context=f"| `{split}` | n/a where one refuses; "
                    "exit 3 if nothing fits |")
    outcomes = [o for _, o in checker.check([wrong_exit, wrong_figure, refused, allowed], 30)]
    assert [o.kind for o in outcomes] == ["STALE", "FIGURE", "ok", "ok"], outcomes
    assert outcomes[1].why == "not printed: 1.234"


def test_a_line_that_reads_what_a_skipped_line_writes_is_skipped():
    block = [_line("ppsim profile --out c.json"), _line("ppsim simulate --costs c.json")]
    outcomes = [o for _, o in checker.check(block, timeout=30)]
    assert [o.kind for o in outcomes] == ["skipped", "skipped"]
    assert "reads c.json" in outcomes[1].why


def test_what_a_run_left_in_the_checkout_is_not_the_repositorys(tmp_path, monkeypatch):
    """A checkout where `ppsim run` wrote ppsim-run/ (ignored by git) checks the README's
    `diff ... ppsim-run/latest/trace.json` as a fresh clone does: the path is the output
    of the skipped `run` line, not a shipped file that went missing."""
    (tmp_path / "ppsim-run" / "latest").mkdir(parents=True)
    (tmp_path / "traces").mkdir()
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    diff = _line("ppsim diff sim.json ppsim-run/latest/trace.json")
    assert checker.missing_paths(diff) == []
    assert checker.missing_paths(_line("ppsim diff traces/a.json traces/b.json")) \
        == ["traces/a.json", "traces/b.json"]
