"""What installing ppsim puts on a user's machine, and what it declares it needs."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)
# How a distribution's name differs from the module it installs.
MODULE_OF = {"pillow": "PIL"}


def test_installed_ppsim_has_no_top_level_executor_or_tui(tmp_path: Path) -> None:
    # -P and an empty working directory: only what the install put on the path is found.
    code = ("import importlib.util as u, sys; "
            "sys.exit(0 if u.find_spec('executor') is None and u.find_spec('tui') is None "
            "and u.find_spec('ppsim.executor.worker') and u.find_spec('ppsim.tui.app') else 1)")
    assert subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path).returncode == 0


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party modules each shipped folder imports."""
    found: dict[str, set[str]] = {}
    for folder in ("ppsim", "ppsim/cli", "executor", "tui"):
        names: set[str] = set()
        for path in (ROOT / folder).rglob("*.py"):
            if folder == "ppsim" and path.parent.name == "cli":
                continue  # the commands: counted apart, they may use the `run` extra
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names.add(node.module.split(".")[0])
        found[folder] = {n for n in names if n not in STDLIB and n != "ppsim"}
    return found


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def modules(reqs: list[str]) -> set[str]:
        out = set()
        for req in reqs:
            name = req.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
            out.add(MODULE_OF.get(name, name))
        return out

    return modules(project["dependencies"]), modules(project["optional-dependencies"]["run"])


def test_declared_dependencies_are_what_the_shipped_code_imports() -> None:
    required, run_extra = _declared()
    imported = _third_party_imports()
    # The core and the TUI need only the required set; the executor and the commands that
    # run it (run, profile) add the `run` extra.
    assert imported["ppsim"] | imported["tui"] <= required
    assert imported["executor"] | imported["ppsim/cli"] <= required | run_extra
    # Nothing declared that nothing imports (numpy: torch warns at import without it).
    assert required <= set().union(*imported.values())
    assert run_extra - {"numpy"} <= imported["executor"]


def test_every_package_folder_is_in_the_wheel() -> None:
    # setuptools installs only the packages listed; an editable install finds the others
    # through the source tree, so a missing one fails only for users of a wheel.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    where = {folder: name for name, folder in setuptools["package-dir"].items()}
    folders = {init.parent.relative_to(ROOT) for top in ("ppsim", "executor", "tui")
               for init in (ROOT / top).rglob("__init__.py")}
    on_disk = set()
    for folder in folders:
        top, *rest = folder.parts
        on_disk.add(".".join([where.get(top, top), *rest]))
    assert set(setuptools["packages"]) == on_disk
