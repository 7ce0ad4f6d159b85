"""Every Megatron line ppsim prints, put through Megatron-LM's own argument checks.

ppsim prints Megatron's flags for each model preset (`ppsim presets NAME`), for the best
shape of a job search (`plan --gpus`: its parallel sizes, sharding, overlaps, recompute
and split) and for a planned split (`plan`: the layout or the first/last stage counts).
This script builds those lines over the presets and a set of jobs, then parses each with
Megatron's `parse_args` and runs its `validate_args` at the job's world size, as
`pretrain_gpt.py` would before it builds anything: a line Megatron refuses is a defect.

Megatron-LM is not a dependency: give a checkout (`--megatron DIR`, a directory holding
megatron/training/arguments.py). Importing it on a machine without a GPU needs what it
imports unconditionally: its MoE and SSM ops' Triton kernels (stubbed modules here, never
called by the checks; torch's own view of Triton left alone), `typing.override` (Python
3.12) and the CUDA device queries (an H100's answers). Transformer Engine, Apex and the
rest are left missing, as Megatron allows. The launch environment is what Megatron's scripts export:
CUDA_DEVICE_MAX_CONNECTIONS=1, unset under FSDP (which asserts so).

With --random N it also draws N random launch lines (a preset's model line and parallel
sizes, sharding, overlaps, FP8, recompute, MoE and optimizer flags, each by chance) and
checks every one `ppsim simulate` takes: ppsim refuses much Megatron takes (what it does
not price), but a line ppsim prices and Megatron refuses is a defect.

Run: .venv/bin/python benchmarks/check_megatron_args.py --megatron ../Megatron-LM
[--random N [--seed S]] (1.5 minutes, and about 1 s a random line; prints one line per
case and exits 1 if Megatron refused any)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import os
import random
import shlex
import sys
import traceback
import typing
import warnings
from dataclasses import dataclass
from types import ModuleType
from unittest import mock

from bench_job import ppsim_json

from ppsim.cli.main import main as ppsim
from ppsim.config.model import parse_model

H100 = "--hardware h100-80gb"
JOBS = [
    ("llama3-8b", "--gpus 16 --global-batch-size 32"),
    ("llama3-8b", "--gpus 16 --global-batch-size 32 --use-distributed-optimizer "
                  "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap"),
    ("llama3-70b", "--gpus 64 --global-batch-size 128 --use-distributed-optimizer "
                   "--overlap-grad-reduce --overlap-param-gather "
                   "--overlap-param-gather-with-optimizer-step"),
    ("llama3-8b", "--gpus 16 --global-batch-size 32 --use-torch-fsdp2 "
                  "--no-gradient-accumulation-fusion"),
    ("llama3-8b", "--gpus 16 --global-batch-size 64 --optimizer muon "
                  "--use-distributed-optimizer"),
    ("llama3-8b", "--gpus 16 --global-batch-size 64 --use-precision-aware-optimizer "
                  "--use-distributed-optimizer --exp-avg-dtype bf16"),
    ("llama3-8b", "--gpus 16 --global-batch-size 64 --search host-optimizer "
                  "--use-distributed-optimizer"),
    ("llama3-70b", "--gpus 64 --global-batch-size 256 --seq-length 8192 --use-megatron-fsdp"),
    ("llama3-8b", "--gpus 8 --global-batch-size 128 --seq-length 8192 --use-megatron-fsdp "
                  "--fp8-format hybrid --fp8-param-gather"),
    ("llama3-70b", "--gpus 64 --global-batch-size 128 --fp8-format hybrid --fp8-recipe "
                   "tensorwise --use-distributed-optimizer --fp8-param-gather"),
    ("llama3-70b", "--gpus 64 --global-batch-size 128 --search policy"),
    ("llama3.1-405b", "--gpus 512 --global-batch-size 256 --seq-length 32768 "
                      "--search cp-comm --time-budget 30"),
    ("deepseek-v3", "--gpus 256 --global-batch-size 1024 --use-distributed-optimizer "
                    "--moe-token-dispatcher-type flex --time-budget 30"),
    ("qwen3-30b-a3b", "--gpus 16 --global-batch-size 256 --use-distributed-optimizer "
                      "--search sharding"),
    ("gpt-oss-120b", "--gpus 64 --global-batch-size 256 --grad-reduce-in-bf16 "
                     "--use-distributed-optimizer"),
    ("mixtral-8x7b", "--gpus 64 --global-batch-size 256"),
    ("nemotron-3-nano-30b-a3b", "--gpus 16 --global-batch-size 256"),
    ("qwen3-next-80b-a3b", "--gpus 64 --global-batch-size 256"),
]
"""Job searches (`plan --gpus`): the best shape's line is checked, after the Megatron
flags the search was given (FP8's, the overlaps: the user's own, which ppsim's line
leaves to them)."""
PPSIM_ONLY = {"--gpus": 1, "--time-budget": 1, "--search": 1, "--top": 1}
"""ppsim's own flags of a job search, each with how many values it takes."""
SPLITS = [
    ("deepseek-v3", "--pp 16 --ep 64 --dp 64 --microbatches 32 --vpp 2 --recompute full"),
    ("llama3.1-405b", "--tp 8 --pp 16 --dp 8 --microbatches 32 --search policy"),
    ("llama3-70b", "--tp 4 --pp 4 --dp 4 --microbatches 16 --recompute-granularity full "
                   "--recompute-method block --recompute-num-layers 2 "
                   "--use-distributed-optimizer"),
    ("nemotron-h-56b", "--tp 8 --pp 4 --dp 4 --microbatches 16"),
    ("gpt-oss-120b", "--pp 4 --ep 8 --dp 16 --microbatches 20 --vpp 3 --recompute full"),
    ("kimi-k2", "--pp 16 --ep 64 --dp 64 --microbatches 32 --vpp 2 --recompute full"),
]
"""Split plans (`plan` over a given shape): the model's line, the planned split's flags
and the shape's tp and ep."""
PRESET_WORLD = 64
"""The world size a preset's own line is checked at: its tp x ep divide it."""


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    line: str
    """Megatron's arguments, as a shell would split them."""
    world: int


def _megatron_flags(flags: str) -> str:
    """Of a job search's flags, Megatron's: all but PPSIM_ONLY's; a --seq-length with the
    --max-position-embeddings ppsim's model line gives it (the preset's is its own
    sequence's)."""
    words, kept = shlex.split(flags), []
    while words:
        word = words.pop(0)
        if word in PPSIM_ONLY:
            del words[:PPSIM_ONLY[word]]
        else:
            kept.append(word)
        if word == "--seq-length":
            kept += [words[0], "--max-position-embeddings"]
    return shlex.join(kept)


def _model_line(preset: str) -> str:
    return ppsim_json(["presets", preset, "--json"])["megatron_model_args"]


RANDOM_PRESETS = {"llama3-8b": False, "llama3-70b": False, "gpt3-1.3b": False,
                  "nemotron-h-8b": False, "qwen3-30b-a3b": True, "deepseek-v3": True,
                  "mixtral-8x7b": True, "gpt-oss-120b": True, "qwen3-next-80b-a3b": True}
"""The presets random lines start from, each with whether it has experts."""
OPTIONAL = [
    (0.5, "--overlap-grad-reduce"), (0.4, "--overlap-param-gather"), (0.3, "--tp-comm-overlap"),
    (0.3, "--grad-reduce-in-bf16"), (0.1, "--main-grads-dtype bf16"),
    (0.15, "--use-precision-aware-optimizer --exp-avg-dtype bf16"),
    (0.1, "--optimizer-cpu-offload --optimizer-offload-fraction 0.5"),
    (0.2, "--recompute-granularity full --recompute-method block --recompute-num-layers 1"),
    (0.2, "--recompute-granularity selective --recompute-modules core_attn mlp"),
    (0.1, "--recompute-activations"), (0.1, "--moe-layer-recompute"),
    (0.2, "--moe-token-dispatcher-type flex"), (0.15, "--overlap-moe-expert-parallel-comm"),
    (0.1, "--moe-shared-expert-overlap"), (0.1, "--delay-wgrad-compute"),
    (0.1, "--num-distributed-optimizer-instances 2"), (0.1, "--cp-comm-type a2a"),
    (0.1, "--moe-pad-expert-input-to-capacity --moe-expert-capacity-factor 1.0"),
    (0.1, "--no-bias-swiglu-fusion"), (0.1, "--attention-backend unfused"),
    (0.1, "--mtp-num-layers 1"), (0.05, "--optimizer muon"),
    (0.1, "--fp32-residual-connection"),
    (0.15, "--overlap-param-gather-with-optimizer-step --ckpt-format torch"),
]
"""Flags a random line carries, each with its chance."""


def random_line(rng: random.Random) -> tuple[str, list[str], int]:
    """A preset, Megatron flags over its model line, and the world they run on."""
    preset = rng.choice(sorted(RANDOM_PRESETS))
    tp, pp, cp, dp = (rng.choice(s) for s in ((1, 1, 2, 4, 8), (1, 1, 2, 4), (1, 1, 2),
                                               (1, 2, 4, 8)))
    ep = rng.choice([n for n in (1, 2, 4, 8) if n <= tp * cp * dp]) \
        if RANDOM_PRESETS[preset] else 1
    mbs = rng.choice((1, 1, 2))
    f = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
         "--context-parallel-size", str(cp), "--expert-model-parallel-size", str(ep),
         "--micro-batch-size", str(mbs), "--global-batch-size",
         str(mbs * dp * rng.choice((1, 4, 8)))]
    f += ["--sequence-parallel"] * (tp > 1 and rng.random() < 0.8)
    f += rng.choice([["--use-distributed-optimizer"], [], ["--use-megatron-fsdp", "--ckpt-format",
                     "fsdp_dtensor"], ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]])
    if pp > 1 and rng.random() < 0.4:
        f += ["--num-layers-per-virtual-pipeline-stage", str(rng.choice((1, 2, 4)))]
    if rng.random() < 0.25:
        f += ["--fp8-format", "hybrid", "--fp8-recipe", rng.choice(("delayed", "tensorwise"))]
        f += ["--fp8-param-gather"] * (rng.random() < 0.5)
    for chance, flags in OPTIONAL:
        f += flags.split() * (rng.random() < chance)
    return preset, f, tp * pp * cp * dp


def random_cases(n: int, seed: int) -> list[Case]:
    """Of n random lines, those `ppsim simulate` takes (on their world of H100s), but
    those whose layers do not divide by pp: ppsim then chooses a split where Megatron
    asserts one given (as ppsim's own --pp asks it to)."""
    rng, found = random.Random(seed), []
    for i in range(n):
        preset, flags, world = random_line(rng)
        pp = int(flags[flags.index("--pipeline-model-parallel-size") + 1])
        if parse_model({"preset": preset}).num_layers % pp:
            continue
        argv = ["simulate", "--preset", preset, *H100.split(), "--gpus", str(world), *flags]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            taken = ppsim(argv) == 0
        if taken:
            model = shlex.split(_model_line(preset))
            if "--use-torch-fsdp2" in flags:  # it replaces a preset's distributed optimizer
                model = [w for w in model if w != "--use-distributed-optimizer"]
            found.append(Case(name=f"random {i} {preset} {shlex.join(flags)}", world=world,
                              line=shlex.join(model + flags)))
    print(f"  {len(found)} of {n} random lines taken by ppsim", file=sys.stderr)
    return found


def cases() -> list[Case]:
    """The lines ppsim prints: each preset's, each job's best, each planned split's."""
    found = [Case(name=f"preset {p}", line=_model_line(p), world=PRESET_WORLD)
             for p in ppsim_json(["presets", "--json"])["models"]]
    for preset, flags in JOBS:
        budget = [] if "--time-budget" in flags else ["--time-budget", "5"]
        doc = ppsim_json(["plan", "--preset", preset, *H100.split(), *shlex.split(flags),
                      *budget, "--json"])
        line = (f"{_model_line(preset)} {_megatron_flags(flags)} "
                f"{doc['best']['megatron_job_flags']}")
        found.append(Case(name=f"plan {preset} {flags}", world=doc["gpus"], line=line))
        print(f"  planned {found[-1].name}", file=sys.stderr)
    for preset, flags in SPLITS:
        f = shlex.split(flags)
        doc = ppsim_json(["plan", "--preset", preset, *H100.split(), *f, "--time-budget", "5",
                      "--json"])
        sizes = {flag: int(f[f.index(flag) + 1]) if flag in f else 1
                 for flag in ("--tp", "--ep", "--pp", "--dp")}
        parallel = (f"--tensor-model-parallel-size {sizes['--tp']} "
                    f"--expert-model-parallel-size {sizes['--ep']}")
        found.append(Case(name=f"split {preset} {flags}", world=sizes["--tp"] * sizes["--pp"]
                          * sizes["--dp"], line=f"{_model_line(preset)} "
                          f"{doc['best']['megatron_flags'] or ''} {parallel}"))
        print(f"  planned {found[-1].name}", file=sys.stderr)
    return found


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for what Megatron imports unconditionally and no check calls."""

    PREFIXES = ("megatron.core.transformer.moe.ops",
                "megatron.core.transformer.moe.paged_stash", "megatron.core.ssm.ops")

    def find_spec(self, name: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if any(name == p or name.startswith(p + ".") for p in self.PREFIXES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__version__ = [], spec, "3.4.0"
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


def _megatron(checkout: str) -> tuple[typing.Any, typing.Any]:
    """Megatron's parse_args and validate_args, imported from `checkout`."""
    import torch

    sys.meta_path.insert(0, _Stubs())
    typing.override = getattr(typing, "override", lambda f: f)  # type: ignore[attr-defined]
    props = type("Props", (), {"major": 9, "minor": 0, "name": "H100",
                               "multi_processor_count": 132, "total_memory": 80 * 2**30})
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: props()
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 8
    sys.path.insert(0, checkout)
    warnings.filterwarnings("ignore")
    from megatron.training.arguments import parse_args, validate_args

    return parse_args, validate_args


def verdict(case: Case, parse_args: typing.Any, validate_args: typing.Any) -> str:
    """"OK", or what Megatron said and where."""
    os.environ.update(WORLD_SIZE=str(case.world), RANK="0", LOCAL_RANK="0",
                      CUDA_DEVICE_MAX_CONNECTIONS="1")
    if "fsdp" in case.line:
        del os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]
    sys.argv = ["pretrain_gpt.py", *shlex.split(case.line)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            validate_args(parse_args(), {})
    except SystemExit as e:
        return f"refused: exit {e}"
    except Exception as e:  # noqa: BLE001 - Megatron asserts, raises and exits alike
        where = traceback.extract_tb(e.__traceback__)[-1]
        return f"refused: {type(e).__name__}: {e} ({os.path.basename(where.filename)}:" \
               f"{where.lineno})"
    return "OK"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True, help="a Megatron-LM checkout")
    p.add_argument("--random", type=int, default=0, metavar="N",
                   help="also N random launch lines")
    p.add_argument("--seed", type=int, default=0, help="of the random lines")
    args = p.parse_args()
    if not os.path.isfile(os.path.join(args.megatron, "megatron", "training", "arguments.py")):
        p.error(f"--megatron: {args.megatron} holds no megatron/training/arguments.py (give a "
                "Megatron-LM checkout)")
    found = cases() + random_cases(args.random, args.seed)
    parse_args, validate_args = _megatron(args.megatron)
    refused = 0
    for case in found:
        said = verdict(case, parse_args, validate_args)
        refused += said != "OK"
        print(f"{said:8.200}  {case.name} (world {case.world})", flush=True)
    print(f"{len(found) - refused} of {len(found)} lines pass Megatron's validate_args")
    sys.exit(1 if refused else 0)


if __name__ == "__main__":
    main()
