"""The `ppsim <command> ...` lines the user docs show, as check_doc_commands.py runs them.

A line comes from a code block (a line that starts with `ppsim `, its backslash
continuations joined, its `# comment` dropped) or from inline backticks. Each carries what
the text around it claims: the figures it prints (an output block after "prints:", a
table's "(printed)" column) and the exit status it names ("exit 3", a refusal).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ppsim.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/model.md", "docs/json.md", "docs/benchmarks.md", "tui/README.md")

INLINE = re.compile(r"`(ppsim [a-z][^`]*)`")


def subparsers(command: str) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by name, `command`'s with its flags (the others bare)."""
    parser = build_parser(command)
    return next(a for a in parser._actions  # noqa: SLF001
                if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001


MENTION = re.compile(rf"`((?:{'|'.join(subparsers(''))}) --[^`]*)`")
"""A command's flags named in prose without `ppsim` (`plan --gpus`): checked, not run."""
FENCE = re.compile(r"^\s*```")
CELL = re.compile(r"(?<!\\)\|")
"""A table's cell border: a pipe the cell does not escape."""
PLACEHOLDER = re.compile(
    r"^[A-Z][A-Z0-9_]*(?![a-z])"  # FILE, N, OUT.json, A.json, M:F, D,D,..
    r"|\.\.\.|…|[<>\[\]]"  # "...", <...>, [--optional]
    r"|^[a-z]+(\|[a-z]+)+$")  # cpu|cuda: the choices, not one of them
NOT_RUN = {"run": "starts torch processes", "profile": "starts torch processes",
           "demo": "starts torch processes", "tui": "an interactive screen"}
"""Commands the checker does not run (`run --print-launch` it does)."""
EXIT_SAID = re.compile(r"\bexits?(?: with)?(?: status)? (\d)\b( (?:if|when)\b)?")
REFUSAL_SAID = re.compile(r"\b(?:is|are|gets|get) refused\b")
"""A line the text shows being refused (a row that says what its command refuses is not)."""
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
ORDINAL = re.compile(rf"\(the ({'|'.join(ORDINALS)}) line\)")
FIGURE = re.compile(r"[−-]?\d(?:[\d,]*\d)?(?:\.\d+)?")


@dataclass(frozen=True, kw_only=True)
class DocCommand:
    doc: str
    """The file, relative to the repository."""
    line: int
    text: str
    """The command as the doc writes it (continuations joined, comment dropped)."""
    words: list[str]
    inline: bool
    """From backticks in prose or a table (a fragment may name a flag without its value)."""
    mention: bool = False
    """Written without `ppsim` (`plan --gpus`): its flags are checked, it is not run."""
    block: int
    """The code block's first line (inline: the line): commands of one block share a
    working directory, in order."""
    context: str = ""
    """The paragraph or table row around an inline command; a code block's comment."""
    figures: list[str] = field(default_factory=list)
    """What the docs say this command prints."""

    @property
    def command(self) -> str:
        return self.words[1] if len(self.words) > 1 else ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def placeholders(self) -> list[str]:
        return [w for w in self.words[2:] if PLACEHOLDER.search(w)]

    def row(self) -> list[str]:
        """The cells of the table row the command is in ([] in prose)."""
        if not self.context.lstrip().startswith("|"):
            return []
        return [c.replace("\\|", "|") for c in CELL.split(self.context.strip().strip("|"))]

    def first_cell(self) -> bool:
        """Whether the command heads a table row (the row then describes it)."""
        cells = self.row()
        return bool(cells) and self.text in cells[0].replace("`", "")

    def not_run(self) -> str | None:
        """Why the checker does not run this command, or None."""
        if self.mention:
            return "a command's flags named in prose"
        if self.context.lstrip().startswith("| measures |"):
            return "a benchmark's measurement, in short (its command row reproduces it)"
        if self.command in NOT_RUN and "--print-launch" not in self.words:
            return f"`ppsim {self.command}` {NOT_RUN[self.command]}"
        return None

    def expected_exits(self) -> set[int]:
        """The statuses the text around the command allows: 0 unless it names another
        ("exits 3"; "exit 3 if nothing fits" allows 0 too; a refusal is 2)."""
        if said := EXIT_SAID.search(self.context):
            return {int(said.group(1))} | ({0} if said.group(2) else set())
        return {2} if REFUSAL_SAID.search(self.context) else {0}


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: the words as written
        return text.split()


def _paragraph(lines: list[str], i: int) -> str:
    """The paragraph (or table row) around line i, as one string."""
    if lines[i].lstrip().startswith("|"):
        return lines[i]
    start, end = i, i
    while start > 0 and lines[start - 1].strip() and not FENCE.match(lines[start - 1]):
        start -= 1
    while end + 1 < len(lines) and lines[end + 1].strip() and not FENCE.match(lines[end + 1]):
        end += 1
    return " ".join(s.strip() for s in lines[start:end + 1])


def _block_commands(doc: str, lines: list[str], first: int, last: int) -> list[DocCommand]:
    """The commands of the code block whose text is lines[first:last]."""
    found, i = [], first
    while i < last:
        start, text = i, lines[i].strip().removeprefix("$ ")
        while text.endswith("\\") and i + 1 < last:
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        if text.startswith("ppsim "):
            comment = text.split(" #", 1)[1] if " #" in text else ""
            words = _split(text)
            found.append(DocCommand(doc=doc, line=start + 1, text=text.split(" #")[0].strip(),
                                    words=words, inline=False, block=first, context=comment))
    return found


def _sentence(paragraph: str, at: str) -> str:
    """The sentence of a paragraph (a table row: the row) that holds `at`."""
    if paragraph.lstrip().startswith("|"):
        return paragraph
    for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z`(])", paragraph):
        if at in sentence:
            return sentence
    return paragraph


def _inline_commands(doc: str, lines: list[str], i: int) -> list[DocCommand]:
    text = lines[i].replace("\\|", "|")  # a pipe escaped in a table cell
    paragraph = _paragraph(lines, i)  # a table row keeps its escaped pipes
    found = [DocCommand(doc=doc, line=i + 1, text=m.group(1), words=_split(m.group(1)),
                        inline=True, block=i + 1, context=_sentence(paragraph, m.group(0)))
             for m in INLINE.finditer(text)]
    return found + [DocCommand(doc=doc, line=i + 1, text=m.group(1), inline=True,
                               words=["ppsim", *_split(m.group(1))], mention=True,
                               block=i + 1, context=_sentence(paragraph, m.group(0)))
                    for m in MENTION.finditer(text)]


def _output_blocks(lines: list[str]) -> list[tuple[str, str, int]]:
    """(the sentence naming the command, the block, its line) for each output block: a code block
    right after a paragraph that ends with "prints:" or "prints (abridged):"."""
    blocks, i = [], 0
    while i < len(lines):
        before = next((j for j in range(i - 1, -1, -1) if lines[j].strip()), None)
        if FENCE.match(lines[i]) and before is not None \
                and re.search(r"prints(?: \(abridged\))?:\s*$", lines[before]):
            end = next(j for j in range(i + 1, len(lines)) if FENCE.match(lines[j]))
            blocks.append((_paragraph(lines, before), "\n".join(lines[i + 1:end]), i))
            i = end
        i += 1
    return blocks


def _printed_cells(lines: list[str], i: int) -> list[str]:
    """A table row's cells under a header marked "(printed)"."""
    start = i
    while start > 0 and lines[start - 1].lstrip().startswith("|"):
        start -= 1
    header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    row = [c.strip() for c in lines[i].replace("\\|", "/").strip().strip("|").split("|")]
    return [cell for head, cell in zip(header, row, strict=False) if "(printed)" in head]


def figures_of(text: str) -> list[str]:
    """The numbers in a claim, as a command would print them (− as -)."""
    return [f.replace("−", "-") for f in FIGURE.findall(text)]


def extract(doc: str) -> list[DocCommand]:
    """Every `ppsim <command>` line of one doc, in order, with its claimed figures."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    found: list[DocCommand] = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            end = next(j for j in range(i + 1, len(lines)) if FENCE.match(lines[j]))
            found += _block_commands(doc, lines, i + 1, end)
            i = end + 1
            continue
        for cmd in _inline_commands(doc, lines, i):
            if lines[i].lstrip().startswith("|"):
                cmd.figures.extend(f for cell in _printed_cells(lines, i)
                                   for f in figures_of(cell))
            found.append(cmd)
        i += 1
    for sentence, block, at in _output_blocks(lines):
        _attach([c for c in found if c.line <= at], sentence, block)
    return found


def _attach(found: list[DocCommand], sentence: str, block: str) -> None:
    """An output block's figures go to the command its sentence names: "(the third
    line)" of the code block before it, else the last code-block line that starts with
    the inline command the sentence names."""
    lines = [c for c in found if not c.inline]
    if (nth := ORDINAL.search(sentence)) and lines:
        last = [c for c in lines if c.block == lines[-1].block]
        target = last[ORDINALS.index(nth.group(1))]
    else:
        named = next((c for c in found if c.inline and c.text in sentence), None)
        matches = [c for c in lines if named and c.words[:len(named.words)] == named.words]
        if not matches:
            return
        target = matches[-1]
    # Wall-clock seconds ("timed in 0.15 s") are the machine's, not the command's.
    target.figures.extend(dict.fromkeys(figures_of(re.sub(r"[\d.]+ s\b", "", block))))


def extract_all() -> list[DocCommand]:
    return [cmd for doc in DOCS for cmd in extract(doc)]
