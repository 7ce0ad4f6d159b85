"""The user docs stay short, name only files that exist, and carry no history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tui" / "README.md"]

# A source path as the docs write it: ppsim/sim/engine.py, executor/alloc.py, ...
PATH = re.compile(r"(?<![\w./-])((?:ppsim|executor|tui|benchmarks|tests)/[\w./-]*?\.(?:py|sh))\b")
# A dotted module as the docs write it: ppsim.executor.builders.gpt:build, ppsim.config.limits.X
MODULE = re.compile(r"(?<![\w./-])ppsim(?:\.[A-Za-z_]\w*)+")
# ppsim.executor and ppsim.tui install from the top-level folders (pyproject package-dir).
PACKAGE_DIRS = {"executor": ROOT / "executor", "tui": ROOT / "tui"}
# How a changelog creeps into docs: which session, what a figure "was", "today".
HISTORY = re.compile(
    r"\b(?:first|second|third|fourth|fifth|sixth|this|last|earlier|previous|any) sessions?\b"
    r"|\(was\b|\bwas \[|\btoday\b|\bthis round\b|\blast round\b"
    r"|\bbefore this round\b", re.IGNORECASE)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _module_exists(dotted: str) -> bool:
    """True when all of `dotted` but at most a trailing attribute names a module or package."""
    parts = dotted.split(":")[0].split(".")[1:]
    if not parts:
        return True
    base = PACKAGE_DIRS.get(parts[0])
    path, rest = (base, parts[1:]) if base else (ROOT / "ppsim", parts)
    for i, name in enumerate(rest):
        if (path / name).is_dir():
            path = path / name
        elif (path / f"{name}.py").is_file():
            return i >= len(rest) - 2  # at most one attribute after the module
        else:  # a name a package exports: the last part, defined in its __init__.py
            init = path / "__init__.py"
            return i == len(rest) - 1 and init.is_file() and name in _text(init)
    return True


def test_readme_is_short_and_links_the_docs():
    readme = ROOT / "README.md"
    assert readme.stat().st_size < 15_000, f"README.md is {readme.stat().st_size} bytes"
    text = _text(readme)
    for target in ("docs/model.md", "docs/benchmarks.md", "make demo", "make test"):
        assert target in text, f"README.md does not mention {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_in_the_docs_exists(doc: Path):
    text = _text(doc)
    missing = sorted({p for p in PATH.findall(text) if not (ROOT / p).is_file()})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"
    bad = sorted({m for m in MODULE.findall(text) if not _module_exists(m)})
    assert not bad, f"{doc.name} names modules that do not exist: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_carry_no_history(doc: Path):
    hits = [line.strip()[:80] for line in _text(doc).splitlines() if HISTORY.search(line)]
    assert not hits, f"{doc.name} tells history instead of the current state: {hits}"


def test_every_benchmark_has_a_table_with_command_date_and_machine():
    text = _text(ROOT / "docs" / "benchmarks.md")
    sections = {s.split("\n", 1)[0].strip(): s for s in text.split("\n## ")[1:]}
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        section = sections.get(script.name)
        assert section is not None, f"docs/benchmarks.md has no section '## {script.name}'"
        for row in ("measures", "command", "date", "machine", "figure"):
            assert f"| {row} |" in section, f"{script.name}'s table has no '{row}' row"
        assert f"benchmarks/{script.name}" in section, f"{script.name}: no command runs it"


def test_the_readme_plan_example_is_what_the_command_prints(monkeypatch, capsys):
    """The README's abridged `ppsim plan` output (Llama-3-70B) against the command's own
    at 80 columns: the table's lines verbatim, each row's figures as its JSON gives
    them, and the throughput line."""
    import json

    from ppsim.cli.main import main

    block = _text(ROOT / "README.md").split("`ppsim plan` on Llama-3-70B")[1].split("```")[1]
    args = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
            "--microbatches", "64"]
    monkeypatch.setenv("COLUMNS", "80")
    assert main(args) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    table = block.strip("\n").split("\nbest against")[0].splitlines()
    assert len(table) >= 8 and all(line in printed for line in table), (table, printed)
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {"best": doc["best"], **{b["label"]: b for b in doc["baselines"]}}
    for label, row in rows.items():
        split = ",".join(map(str, row["split"]))
        assert f"{label:<21} {split:<24} {row['iteration_time_ms']:.2f}" in block, label
    t = doc["best"]["throughput"]
    words = " ".join(block.split())
    assert f"{t['tokens_per_s']:,.0f} tokens/s ({t['tokens_per_s_per_gpu']:,.0f} per GPU)" \
        in words
    assert f"{t['tflops_per_gpu']:.1f} TFLOP/s/GPU, MFU {t['mfu']:.1%}" in words


def test_the_commands_the_readme_says_take_config_do():
    """README: 'Every command but `presets` and `diff` takes `--config FILE`': each
    command's parser, against the commands the sentence leaves out."""
    from ppsim.cli.main import build_parser

    sentence = _text(ROOT / "README.md").split("Every command")[1].split("takes `--config")[0]
    left_out = set(re.findall(r"`(\w+)`", sentence))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "plan" in a.choices)
    takes = {name for name, p in sub.choices.items()
             if any("--config" in a.option_strings for a in p._actions)}
    assert takes == set(sub.choices) - left_out, (sorted(takes), sorted(left_out))


def test_every_flag_the_readme_names_is_in_a_commands_help():
    """A flag the README tells users to type is one some command's --help names (Megatron's
    and torchtitan's model fields, hidden one by one, are named in their groups' text)."""
    from ppsim.cli.main import build_parser

    def sub(command: str | None = None) -> dict:
        parser = build_parser(command)
        return next(a for a in parser._actions if a.choices and "plan" in a.choices).choices

    helps = " ".join(sub(name)[name].format_help() for name in sub())
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w.-]*[a-z0-9]", _text(ROOT / "README.md")))
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w.-])", helps))
    assert not missing, f"README.md names flags no --help mentions: {missing}"
