"""The Megatron launch lines users already run, fed to `ppsim simulate`.

The other direction of check_megatron_args.py (ppsim's lines into Megatron's checks):
here Megatron-LM's own jobs come into ppsim. The lines are collected from a checkout: its
CI jobs (tests/functional_tests/test_cases/*/*/model_config.yaml, MODEL_ARGS) and its
example scripts (examples/**/*.sh: bash arrays and strings of flags, read statically, a
variable's default taken for `${X:-d}`). Each line loses what is about data, files,
logging, checkpoints and setup (ppsim takes those too, but their values are paths the
checkout does not resolve), then goes to `ppsim simulate --gpus WORLD` in this process
(WORLD: the CI job's nodes x 8, the script's GPUS_PER_NODE x NUM_NODES, else 8). A line
with no vocabulary (a tokenizer file ppsim cannot read) gets a stand-in `--vocab-size`.

Each outcome is one of:
- priced: ppsim simulated the job;
- refused: exit 2 with one line `ppsim simulate: error: ...` (right when Megatron would
  refuse too, or ppsim names a feature it does not price: judge the reasons printed);
- DEFECT: a traceback, another exit status, or an error that is not one line.

Megatron-LM is not a dependency: give a checkout (`--megatron DIR`). With --plan each
priced line also goes to `ppsim plan --gpus WORLD` (a short search).

Run: .venv/bin/python benchmarks/check_megatron_lines.py --megatron ../Megatron-LM
[--plan] [--show] (about a second a line; prints one line per case, the reasons grouped,
and exits 1 on a DEFECT)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import shlex
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ppsim.cli.main import main as ppsim
from ppsim.cli.megatron_run import RUN

STRIPPED = {f"--{f}" for group in ("checkpointing", "data", "logging and validation",
                                    "profiling and setup") for f in RUN[group]}
STRIPPED |= {"--vocab-file", "--merge-file", "--tokenizer-model", "--langrl-env-config",
             "--pretrained-checkpoint"}
"""Flags whose values are paths or switches about files, logs and setup."""
VOCAB_STAND_IN = ["--vocab-size", "131072"]
"""Given where a line names no vocabulary (its tokenizer is a file)."""
CI_MODELS = ("gpt", "moe", "mixtral", "hybrid", "nemotron", "gpt-nemo")
"""CI suites of decoder-only language models (BERT, T5 and the multimodal ones are other
models, and their pretrain scripts, not flags, say so)."""
NOT_TRAINING = ("inference", "export", "convert", "text_generation", "text_gen", "generate",
                "eval", "mmlu", "quantize", "prune", "validate", "server")
"""Names of jobs and scripts that do not train (Megatron's inference and conversion)."""
SCRIPT_DIRS = ("gpt3", "llama", "mixtral", "mamba", "gptoss", "megatron_fsdp", "rl",
               "post_training/modelopt/conf")


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    words: list[str]
    """The model, parallel and batch flags as a shell splits them."""
    world: int
    stand_in: bool = False
    """Whether the line was given VOCAB_STAND_IN."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    kind: str
    """priced, refused or DEFECT."""
    text: str
    """The iteration's summary, the refusal's line, or what went wrong."""


# --- the CI jobs ------------------------------------------------------------------------

def _yaml_value(text: str) -> list[str]:
    """One MODEL_ARGS value as the words Megatron's CI launcher (_run_training.sh) passes:
    none for `true`, a [..] list's words unbracketed, anything else with a space one word."""
    text = re.sub(r"\s+#.*$", "", text).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].strip()
    if text == "true":
        return []
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1].replace(",", " ").split()
    return [text]


def model_args(path: Path) -> list[str]:
    """A model_config.yaml's MODEL_ARGS as words (a flat `--flag: value` map)."""
    words: list[str] = []
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith((" ", "\t")) and line.strip():
            inside = line.startswith("MODEL_ARGS:")
            continue
        m = re.match(r"\s+(--[\w-]+):\s*(.*)$", line)
        if inside and m:
            words += [m.group(1), *_yaml_value(m.group(2))]
    return words


def ci_world(name: str, words: list[str]) -> int:
    """GPUs of a CI job: by its name (`1N8G`, `2nodes`; the recipes run 8 a node), else
    the fewest nodes of 8 its parallel sizes fit (release jobs' recipes are not public)."""
    m = re.search(r"(\d+)N(\d+)G", name)
    if m:
        return int(m.group(1)) * int(m.group(2))
    m = re.search(r"(\d+)nodes?", name)
    if m:
        return 8 * int(m.group(1))
    return fitting_world(8, words)


def fitting_world(world: int, words: list[str]) -> int:
    """The fewest multiples of `world` GPUs the line's parallel sizes fit (a script
    written for many nodes says one node, to be changed)."""
    size = {w: int(v) for w, v in zip(words, words[1:], strict=False) if v.isdigit()}
    tp, pp = size.get("--tensor-model-parallel-size", 1), size.get(
        "--pipeline-model-parallel-size", 1)
    dense = tp * pp * size.get("--context-parallel-size", 1)
    experts = size.get("--expert-model-parallel-size", 1) * size.get(
        "--expert-tensor-parallel-size", tp) * pp
    return math.lcm(world, dense, experts)


def ci_cases(root: Path) -> list[Case]:
    cases = []
    for model in CI_MODELS:
        for path in sorted((root / "tests/functional_tests/test_cases" / model).glob(
                "*/model_config.yaml")):
            name = path.parent.name
            if any(word in name for word in NOT_TRAINING):
                continue
            words = model_args(path)
            if {"--num-layers", "--hybrid-layer-pattern", "--hybrid-override-pattern"} \
                    & set(words):
                cases.append(Case(name=f"ci/{model}/{name}", words=words,
                                  world=ci_world(name, words)))
    return cases


# --- the example scripts ----------------------------------------------------------------

def _expand(text: str, env: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """Bash's parameter expansion, as far as a static read goes."""
    text = re.sub(r'"?\$\{(\w+)\[@\]\}"?', lambda m: shlex.join(arrays.get(m.group(1), [])),
                  text)
    text = re.sub(r"\$\{(\w+):?-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text)
    text = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), text)
    return re.sub(r"\$\(\((.*?)\)\)", lambda m: _arith(m.group(1)), text)


def _arith(text: str) -> str:
    """`$((text))` where it is whole numbers and + - * / alone, else left as it was."""
    if not re.fullmatch(r"[\d\s+*/()-]+", text):
        return f"$(({text}))"
    return str(int(eval(text.replace("/", "//"), {"__builtins__": {}})))  # noqa: S307


def _logical_lines(text: str) -> list[str]:
    text = re.sub(r"\\\n", " ", text)
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines.append(re.sub(r"\s+#\s.*$", "", line))
    return lines


def script_words(path: Path) -> tuple[list[str], int]:
    """A script's flags (every array and string of `--` flags it builds, in order) and its
    world size."""
    env: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    lines = _logical_lines(path.read_text(encoding="utf-8", errors="replace"))
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"(?:export\s+)?(\w+)(\+?)=(.*)$", line)
        i += 1
        if not m:
            continue
        name, append, value = m.groups()
        if value.startswith("("):
            body = value[1:]
            while not body.rstrip().endswith(")") and i < len(lines):
                body += " " + lines[i]
                i += 1
            items = _split(_expand(body.rstrip()[:-1], env, arrays))
            words = [w for item in items for w in _split(item)]
            arrays[name] = (arrays.get(name, []) if append else []) + words
        elif name not in env:  # the first, default assignment
            value = _expand(value, env, arrays)
            words = [w for item in _split(value) for w in item.split()]  # unquoted use
            env[name] = " ".join(words) if len(words) != 1 else words[0]
            if any(w.startswith("--") for w in words):
                arrays[name] = words
    # torchrun's own (--nproc_per_node, --nnodes, ...) are not the training script's
    words = [w for name, a in arrays.items() if any(x.startswith("--") for x in a)
             and name != "DISTRIBUTED_ARGS" and "--nproc_per_node" not in a for w in a]
    gpus = _int(env.get("GPUS_PER_NODE")) or _int(env.get("NUM_GPUS")) or 8
    nodes = _int(env.get("NUM_NODES")) or _int(env.get("NNODES")) or 1
    return words, gpus * nodes


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _int(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0


def script_cases(root: Path) -> list[Case]:
    cases = []
    for sub in SCRIPT_DIRS:
        for path in sorted((root / "examples" / sub).rglob("*.sh")):
            rel = str(path.relative_to(root / "examples"))
            if any(word in rel.lower() for word in NOT_TRAINING) or "common" in rel \
                    or "arguments.sh" in rel or "sbatch" in rel:
                continue
            words, world = script_words(path)
            if {"--num-layers", "--hybrid-layer-pattern", "--hybrid-override-pattern"} \
                    & set(words):
                cases.append(Case(name=f"examples/{rel}", words=words,
                                  world=fitting_world(world, words)))
    return cases


# --- feeding ppsim ----------------------------------------------------------------------

def strip(words: list[str]) -> tuple[list[str], bool]:
    """`words` without STRIPPED flags and their values, and with a stand-in vocabulary
    where none is named; whether it was given."""
    out: list[str] = []
    dropping = False
    for w in words:
        if w.startswith("--"):
            dropping = w.split("=")[0] in STRIPPED
        if not dropping:
            out.append(w)
    vocab = {"--vocab-size", "--padded-vocab-size"} & set(out)
    gpt2 = "GPT2BPETokenizer" in out
    if vocab or gpt2:
        return out, False
    return out + VOCAB_STAND_IN, True


SUMMARY_COLUMNS = "400"
"""The width ppsim's console renders at here: its summary on one line, so the verdict
("fits", "does NOT fit") is not wrapped off the line this reports."""


def run_ppsim(argv: list[str]) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _columns(SUMMARY_COLUMNS):
            code = ppsim(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001 - a crash is what this looks for
        return Outcome(kind="DEFECT", text="crash: " + traceback.format_exc().splitlines()[-1])
    errors = [line for line in err.getvalue().splitlines() if "error" in line]
    if code == 3:  # plan's answer when no shape fits the memory: priced all the same
        return Outcome(kind="priced", text="no shape fits")
    if code == 0:
        summary = next((line for line in out.getvalue().splitlines()
                        if line.startswith(("iteration time", "best"))), "")
        return Outcome(kind="priced", text=summary)
    if code == 2 and len(errors) == 1 and errors[0].startswith(f"ppsim {argv[0]}: error: ") \
            and "Traceback" not in err.getvalue():
        return Outcome(kind="refused", text=errors[0].split(": error: ", 1)[1])
    return Outcome(kind="DEFECT", text=f"exit {code}: " + " | ".join(
        err.getvalue().strip().splitlines()[-3:]))


@contextlib.contextmanager
def _columns(width: str):
    """COLUMNS set to `width` for the block (rich reads it off a terminal), then restored."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def check(case: Case, plan: bool) -> Outcome:
    argv = ["simulate", *case.words, "--gpus", str(case.world)]
    got = run_ppsim(argv)
    if plan and got.kind == "priced":
        planned = run_ppsim(["plan", *case.words, "--gpus", str(case.world),
                             "--time-budget", "5"])
        if planned.kind == "DEFECT":
            return Outcome(kind="DEFECT", text="plan: " + planned.text)
        return Outcome(kind=got.kind, text=f"plan {planned.kind}: {planned.text} | {got.text}")
    return got


def _reason(text: str) -> str:
    """A refusal grouped by its flag and the start of its problem."""
    return re.sub(r"\d+", "N", text)[:110]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megatron", type=Path, required=True, help="a Megatron-LM checkout")
    p.add_argument("--plan", action="store_true", help="plan --gpus each priced line too")
    p.add_argument("--show", action="store_true", help="print each line fed to ppsim")
    p.add_argument("--only", default="", help="cases whose name holds this")
    args = p.parse_args(argv)
    cases = [c for c in ci_cases(args.megatron) + script_cases(args.megatron)
             if args.only in c.name]
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for case in cases:
        words, stand_in = strip(case.words)
        case = Case(name=case.name, words=words, world=case.world, stand_in=stand_in)
        got = check(case, args.plan)
        counts[got.kind] += 1
        if got.kind == "refused":
            reasons[_reason(got.text)] += 1
        mark = "+vocab" * case.stand_in
        print(f"{got.kind:8} {case.world:4} {case.name[:88]:88} {mark:6} {got.text[:160]}")
        if args.show:
            print("         " + shlex.join(case.words))
    print(f"\n{len(cases)} lines: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    print("refusals by reason:")
    for reason, n in reasons.most_common():
        print(f"  {n:3}  {reason}")
    return 1 if counts["DEFECT"] else 0


if __name__ == "__main__":
    sys.exit(main())
