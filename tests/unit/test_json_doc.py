"""docs/json.md names every field each command's `--json` prints: the top level and the
nested objects it spells out (a field added to the output fails here until documented)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ppsim.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces" / "1f1b-5-3-m8"
TINY = ["--preset", "tiny-gpt"]


def _bullets() -> dict[str, str]:
    """Each `- \\`command\\`: ...` bullet of docs/json.md by its command text."""
    text = (ROOT / "docs" / "json.md").read_text(encoding="utf-8")
    out = {}
    for item in re.split(r"\n- ", text)[1:]:
        head = re.match(r"`([^`]+)`", item)
        if head:
            out[head.group(1)] = item
    return out


def _named(text: str) -> set[str]:
    """Every field name the text writes in backticks (`a`, `{a, b: [c]}`, `x: {y, z}`)."""
    words: set[str] = set()
    for quoted in re.findall(r"`([^`]+)`", text):
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", quoted))
    # A long `{...}` list may run over several backticked spans: take its bare words too.
    words.update(re.findall(r"(?<![A-Za-z0-9_])[a-z][a-z0-9]*_[a-z0-9_]+", text))
    # `speedup_vs_<key>`: one field per key the text names
    for prefix in re.findall(r"([a-z_]+_)<key>", text):
        words.add(prefix + "<key>")
    return words


def _is_named(key: str, named: set[str]) -> bool:
    if key in named:
        return True
    return any(key.startswith(w[:-5]) and key[len(w) - 5:] in named
               for w in named if w.endswith("<key>"))


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main([*args, "--json"])
    assert code == 0, (args, code)
    return json.loads(capsys.readouterr().out)


def _first(value: Any) -> dict[str, Any]:
    return value[0] if isinstance(value, list) else value


# command line -> (its bullet(s) in docs/json.md, the nested objects the bullet spells out)
CASES: dict[str, tuple[list[str], tuple[str, ...], tuple[str, ...]]] = {
    "presets": (["presets"], ("presets",), ()),
    "presets NAME": (["presets", "llama3-8b"], ("presets",), ()),
    "simulate": ([], ("simulate",), ("job", "throughput", "ranks")),
    "split": (["split"], ("split",), ("stages",)),
    "split notes": (["split", "--preset", "deepseek-v3", "--pp", "16", "--vpp", "2"],
                    ("split",), ()),
    "split hybrid": (["split", "--preset", "nemotron-h-8b", "--pp", "4"], ("split",), ()),
    "plan": (["plan"], ("plan", "simulate"), ("best", "baselines", "candidates", "job")),
    "plan policy": (["plan", *TINY, "--search", "policy,policy-per-stage"],
                    ("plan", "plan --search policy[,policy-per-stage]"),
                    ("best", "policy_search")),
    "plan gpus": (["plan", *TINY, "--gpus", "4", "--global-batch-size", "16"],
                  ("plan --gpus N --global-batch-size B",), ("candidates",)),
    "schedule": (["schedule"], ("schedule",), ()),
    "costs": (["costs"], ("costs",), ("head",)),
    "costs tied": (["costs", "--preset", "gpt3-1.3b"], ("costs",), ("tied",)),
    "costs mtp": (["costs", "--preset", "deepseek-v3"], ("costs",),
                  ("mtp", "priced_collectives")),
    "diff": (["diff", str(TRACES / "sim.json"), str(TRACES / "real.json")], ("diff",),
             ("ranks", "duration_error.F", "largest_divergences")),
}


def _calibrate_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`calibrate --log` on a Megatron log of the job, 20% slower than it simulates."""
    from tests.unit.test_joblog import megatron_line

    job = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
           "--microbatches", "4"]
    sim = _json(["simulate", *job], capsys)
    ms, gbs = sim["iteration_time_ms"] * 1.2, sim["job"]["global_batch_size"]
    log = tmp_path / "train.log"
    log.write_text("\n".join(megatron_line(i, ms, None, gbs) for i in (10, 20, 30)) + "\n")
    return ["calibrate", "--log", str(log), *job, "--hardware-out", str(tmp_path / "hw.toml")]


@pytest.mark.parametrize("case", [*CASES, "calibrate", "calibrate --log"])
def test_json_md_names_every_field(case: str, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if case == "calibrate":
        args, docs, nested = ["calibrate", str(TRACES / "real.json"), "--out",
                              str(tmp_path / "c.json")], ("calibrate",), ("factors",)
        args += ["--config", str(TRACES / "config.toml")]
    elif case == "calibrate --log":
        args, docs, nested = _calibrate_log(tmp_path, capsys), ("calibrate --log",), ()
    else:
        args, docs, nested = CASES[case]
        args = args or ["simulate"]
    bullets = _bullets()
    missing_bullets = [d for d in docs if d not in bullets]
    assert not missing_bullets, f"docs/json.md has no bullet for {missing_bullets}"
    named = set().union(*(_named(bullets[d]) for d in docs))
    out = _json(args, capsys)
    where = {"": out}
    for path in nested:
        obj: Any = out
        for part in path.split("."):
            obj = _first(obj)[part]
        where[path] = _first(obj)
    unnamed = sorted(f"{path + '.' if path else ''}{key}" for path, obj in where.items()
                     for key in obj if not _is_named(key, named))
    assert not unnamed, f"`{' '.join(args)} --json` prints fields docs/json.md does not " \
        f"name: {unnamed}"
