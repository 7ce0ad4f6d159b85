"""The package's layers, read from the source with `ast`: no import cycle, no upward import.

Layers, lowest first: the pure core (every `ppsim` module outside the three below), then
`ppsim.executor` and `ppsim.tui` (each may use the core, neither the other), then
`ppsim.cli` (may use everything). A first-party import inside a function is allowed only
where it keeps a heavy optional dependency (torch, textual, PIL) out of a light import,
and says so in a comment on its line or the line above.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"ppsim": "ppsim", "executor": "ppsim.executor", "tui": "ppsim.tui"}
HEAVY = ("torch", "textual", "PIL")


@dataclass(frozen=True, kw_only=True)
class Import:
    source: str
    target: str
    line: int
    inner: bool
    commented: bool


def module_files() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _inner_nodes(tree: ast.AST) -> set[int]:
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner.update(id(sub) for sub in ast.walk(node))
    return inner


def _resolve(name: str, package: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base])
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    skip, inner = _type_checking_lines(tree), _inner_nodes(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
            continue
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        for target in _resolve(name, package, node):
            if target in known or target.split(".")[0] in HEAVY:
                out.append(Import(source=name, target=target, line=node.lineno,
                                  inner=id(node) in inner,
                                  commented="#" in here or above.startswith("#")))
    return out


def layer(name: str) -> str:
    for top in ("ppsim.cli", "ppsim.executor", "ppsim.tui"):
        if name == top or name.startswith(top + "."):
            return top
    return "core"


ALLOWED = {"core": {"core"}, "ppsim.executor": {"core", "ppsim.executor"},
           "ppsim.tui": {"core", "ppsim.tui"},
           "ppsim.cli": {"core", "ppsim.executor", "ppsim.tui", "ppsim.cli"}}


@functools.cache  # the tree is read once for the four checks (~2 s each)
def graph() -> dict[str, list[Import]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def test_no_upward_import() -> None:
    wrong = [f"{i.source}:{i.line} imports {i.target}" for edges in graph().values()
             for i in edges if i.target.split(".")[0] not in HEAVY
             and layer(i.target) not in ALLOWED[layer(i.source)]]
    assert not wrong, "\n".join(wrong)


def _heavy(g: dict[str, list[Import]]) -> set[str]:
    """Modules whose import (at module level, transitively) loads torch, textual or PIL."""
    heavy = {m for m, edges in g.items()
             if any(not i.inner and i.target.split(".")[0] in HEAVY for i in edges)}
    while True:
        more = {m for m, edges in g.items() if m not in heavy
                and any(not i.inner and i.target in heavy for i in edges)}
        if not more:
            return heavy
        heavy |= more


def test_function_level_imports_only_keep_heavy_dependencies_away() -> None:
    g = graph()
    heavy = _heavy(g)
    wrong = [f"{i.source}:{i.line} imports {i.target} inside a function"
             + ("" if i.commented else " (and says not why)")
             for edges in g.values() for i in edges
             if i.inner and i.target.split(".")[0] not in HEAVY
             and (i.target not in heavy or not i.commented)]
    assert not wrong, f"{len(wrong)} function-level imports:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    g = graph()
    edges = {m: sorted({i.target for i in es if i.target in g and i.target != m})
             for m, es in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t):], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_the_check_sees_the_whole_tree() -> None:
    # A checker that finds nothing because it reads nothing would pass every test above.
    g = graph()
    assert {"ppsim.sim.engine", "ppsim.executor.runtime", "ppsim.tui.app",
            "ppsim.cli.main"} <= set(g)
    assert any(i.target == "ppsim.pipeline.problem" for i in g["ppsim.sim.engine"])
