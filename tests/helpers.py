"""Builders shared by tests: small configs and problems."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.costs.stack import layer_kinds
from ppsim.pipeline.problem import Problem, build_problem
from ppsim.schedules.generators import build_schedule


def uniform_problem(pp: int, vpp: int, m: int, schedule: str, counts: list[int] | None = None,
                    layers_per_stage: int = 1, f: float = 1.0, b: float = 2.0, w: float = 0.0,
                    act: int = 100, out: int = 10, static: int = 1000, wg: int = 0,
                    hw: dict | None = None,
                    head: dict | None = None, emb: dict | None = None,
                    memory: float = 1e15, split_b: float = 0.0, transient: int = 0) -> Problem:
    n = sum(counts) if counts is not None else pp * vpp * layers_per_stage
    model: dict[str, Any] = {"kind": "uniform", "num_layers": n, "forward_ms": f,
                             "backward_ms": b, "weight_grad_ms": w, "activation_bytes": act,
                             "weight_grad_bytes": wg, "transient_bytes": transient,
                             "output_bytes": out, "static_bytes": static,
                             "split_backward_ms": split_b}
    if head:
        model["head"] = head
    if emb:
        model["embedding"] = emb
    pipe: dict[str, Any] = {"pp": pp, "vpp": vpp, "microbatches": m, "schedule": schedule}
    if counts is not None:
        pipe["split"] = counts
    return build_problem(config_from_dict({"model": model, "pipeline": pipe,
                                           "hardware": {"memory_bytes": memory, **(hw or {})}}))


def combined(problem: Problem, savings: list[float]) -> Problem:
    """`problem` under Megatron's combined 1F1B (its schedule with pairs), layer i's F and
    B each saving savings[i % len(savings)] ms in a pair (at most either's time)."""
    s = problem.schedule
    layers = tuple(replace(c, pair_saving_ms=min(savings[i % len(savings)], c.forward_ms,
                                                 c.backward_ms))
                   for i, c in enumerate(problem.costs.layers))
    return replace(problem, costs=replace(problem.costs, layers=layers),
                   schedule=build_schedule(s.name, s.pp, s.vpp, s.microbatches,
                                           combined=True))


def all_counts(layers: int, stages: int):
    for cuts in itertools.combinations_with_replacement(range(layers + 1), stages - 1):
        edges = (0, *cuts, layers)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


def every_split(problem: Problem) -> list[tuple[tuple[int, ...], Any]]:
    """(counts, simulated summary) of every split of `problem`'s layers over its stages:
    the brute force a planner's answer is checked against."""
    from ppsim.pipeline.split import split_from_counts
    from ppsim.sim.simulate import simulate

    s = problem.split
    return [(counts, simulate(problem.with_split(split_from_counts(
        counts, s.pp, s.vpp, s.num_layers, s.placement))).summary)
        for counts in all_counts(s.num_layers, s.num_stages)]


@st.composite
def small_shapes(draw, names: list[str] | tuple[str, ...], min_pp: int = 1,
                 max_m: int = 6) -> tuple[str, int, int, int]:
    """(schedule, pp, vpp, microbatches) that each schedule takes: interleaved on 2 ranks
    of 2 chunks, the V schedules on 2 ranks with 4-6 microbatches, the rest on 1 chunk."""
    name = draw(st.sampled_from(names))
    if name == "interleaved-1f1b":
        return name, 2, 2, 2 * draw(st.integers(1, 3))
    if name in ("zbv", "dualpipev"):
        return name, 2, 2, draw(st.integers(4, 6))
    return name, draw(st.integers(min_pp, 4)), 1, draw(st.integers(1, max_m))


@st.composite
def schedule_args(draw) -> tuple[str, int, int, int]:
    """(schedule, pp, vpp, microbatches) that build_schedule accepts, over every generator."""
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
                                 "dualpipev", "interleaved-zb"]))
    pp = draw(st.integers(1, 6))
    if name == "interleaved-1f1b":
        vpp = draw(st.integers(2, 3))
        m = draw(st.integers(1, 4 * pp + 3))  # any count, multiple of pp or not
    elif name == "interleaved-zb":
        vpp = draw(st.integers(1, 4))
        m = draw(st.integers(1, 4 * pp + 3))
    elif name in ("zbv", "dualpipev"):
        vpp = 2
        m = draw(st.integers(2 * pp if name == "dualpipev" else 1, 16))
    elif name == "zb-h1":
        vpp, m = 1, draw(st.integers(1, 12))
    else:
        vpp = draw(st.integers(1, 3)) if name == "gpipe" else 1
        m = draw(st.integers(1, 12))
    return name, pp, vpp, m


@st.composite
def random_problems(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv",
                                 "dualpipev"]))
    pp = draw(st.integers(1, 5))
    vpp = draw(st.integers(2, 3)) if name == "interleaved-1f1b" else 1
    m = pp * draw(st.integers(1, 3)) if name == "interleaved-1f1b" else draw(st.integers(1, 9))
    if name in ("zbv", "dualpipev"):
        vpp = 2
        m = max(m, 2 * pp) if name == "dualpipev" else m
    counts = draw(st.lists(st.integers(0, 4), min_size=pp * vpp, max_size=pp * vpp))
    if sum(counts) == 0:
        counts[0] = 1
    floats = st.floats(0.01, 10.0, allow_nan=False)
    part = {"forward_ms": draw(floats), "backward_ms": draw(floats),
            "activation_bytes": draw(st.integers(0, 10**6)),
            "transient_bytes": draw(st.sampled_from([0, 0, 10**6, 5 * 10**7]))}
    hw = {"p2p_latency_ms": draw(st.sampled_from([0.0, 0.013, 0.5])),
          "p2p_bandwidth_gbps": draw(st.sampled_from([0.0, 0.37, 12.5]))}
    b = draw(floats)
    return uniform_problem(pp, vpp, m, name, counts=counts, f=draw(floats), b=b,
                           w=b * draw(st.sampled_from([0.0, 0.25, 0.5])),
                           wg=draw(st.integers(0, 10**7)), act=draw(st.integers(0, 10**7)),
                           out=draw(st.integers(0, 10**7)),
                           static=draw(st.integers(0, 10**8)), hw=hw, head=part,
                           emb={"forward_ms": draw(floats)},
                           memory=draw(st.floats(1e3, 1e9)),
                           transient=draw(st.sampled_from([0, 0, 10**5, 10**7])))


def simulate_json(path: Path | str) -> dict[str, Any]:
    """`ppsim simulate --json --config path` run as its own process: an independent
    reference for what another front end (the TUI) shows for the same file."""
    out = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--json",
                          "--config", str(path)], capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout)


def fake_planner(monkeypatch: pytest.MonkeyPatch, release: threading.Event,
                 counts: tuple[int, ...], evaluated: int = 1234) -> None:
    """A planner that reports `evaluated` splits until released, then answers `counts`."""
    import ppsim.tui.planning
    from ppsim.pipeline.split import Split

    class Best:
        split = Split(counts, 2, 1)

        class summary:  # noqa: N801 - shaped like ppsim.planner's result
            iteration_time_ms = 1.0

    class Res:
        best = Best
        proven_optimal = True
        evaluated = 95
        total_splits = 5_843_355_957

    def plan(base, state, progress):
        # A report at once, then a few a second: reports every few milliseconds keep
        # the app from ever idling, and each Pilot key press then waits its whole second.
        progress(evaluated, 0)
        while not release.wait(0.2):
            progress(evaluated, 0)
        return Res

    monkeypatch.setattr(ppsim.tui.planning, "run_planner", plan)
    monkeypatch.setattr(ppsim.tui.planning, "IN_PROCESS", False)  # the stand-in lives here
    monkeypatch.setattr(ppsim.tui.planning, "planner_available", lambda: True)


def arch_meaning(a: Any) -> dict[str, Any]:
    """An Architecture's fields, those with two spellings (the kinds spec; an empty norm
    or position that the MLP decides, a position table's rows as 0 or the sequence) by what
    they mean, and dp (Megatron takes it from the world size) left out: what must survive
    a round trip through Megatron's flags."""
    out = asdict(a)
    for spelled in ("dp", "layers", "norm", "position", "max_position_embeddings"):
        out.pop(spelled)
    return {**out, "kinds": layer_kinds(a), "rmsnorm": a.rmsnorm, "rotary": a.rotary,
            "learned": a.learned_positions, "position_params": a.position_params}


def mla_fields(draw: Any, heads: int) -> dict[str, Any]:
    """Hypothesis: the fields of a small MLA attention over `heads` heads."""
    return dict(attention="mla", num_kv_heads=heads,
                q_lora_rank=draw(st.sampled_from([0, 32])),
                kv_lora_rank=draw(st.integers(8, 64)),
                head_dim=draw(st.sampled_from([16, 32])),
                qk_rope_head_dim=draw(st.sampled_from([8, 16])),
                v_head_dim=draw(st.sampled_from([16, 32])),
                qk_layernorm=draw(st.booleans()))


def kept_under_policy(fields: dict[str, Any], index: int, policy: Any) -> tuple[int, int]:
    """(device bytes kept, bytes offloaded) by decoder layer `index` of the default
    builder's model (a hybrid stack's too) under a memory policy: saved tensors and
    checkpoint inputs, parameters left out."""
    import torch  # only the executor's tests call this

    from ppsim.executor.builders import DEFAULT_BUILDER, load_builder
    from ppsim.executor.builders import policy as executor_policy
    from ppsim.executor.builders.stage import Stage, saved_bytes

    b = load_builder(DEFAULT_BUILDER, fields)
    stage = Stage(b, index, 1, False, False)
    executor_policy.apply_policy(stage.layers, policy)
    stage = stage.to(b.dtype)
    # A fixed input: the routing (so each expert's share of the pairs) is the same each run.
    x = torch.randn(b.activation_shape, generator=torch.Generator().manual_seed(0)).to(
        b.dtype).requires_grad_()
    static = {t.untyped_storage().data_ptr() for t in [*stage.parameters(), *stage.buffers()]}
    executor_policy.offloaded[0] = 0
    with saved_bytes(static) as seen:
        stage(x)
    return sum(seen.values()), executor_policy.offloaded[0]


def between_ops_peaks(argv: list[str]) -> list[int]:
    """`ppsim simulate ARGV`'s activation peaks of what the ops hold between them
    (ppsim.sim.simulate.between_ops_peaks): what a run's trace samples."""
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.sim.simulate import between_ops_peaks as peaks

    return peaks(build_problem(config_from_args(build_parser().parse_args(["simulate",
                                                                          *argv]))))


@dataclass(frozen=True)
class Ran:
    """What `ppsim ARGV` gave, run in this process."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(argv: list[str]) -> Ran:
    """`ppsim ARGV` in this process."""
    return Ran(*run_main(argv))


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """`ppsim ARGV` in this process: (exit status, stdout, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from ppsim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def cp_layer_traffic(c: Any) -> tuple[float, float, float, float]:
    """A dense layer's context-parallel traffic under the config `c`: (forward total,
    forward exposed, backward total, backward exposed) ms."""
    from ppsim.costs.transformer import accelerator, transformer_costs
    from ppsim.job.layers import layer_collectives, per_rank_arch
    from ppsim.job.model import build_job

    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    a = per_rank_arch(job.arch)
    comm = layer_collectives(job, a, acc, "dense", transformer_costs(a, acc).layers[0])
    f = next(x for x in comm.forward if x.group == "cp")
    b = next(x for x in comm.backward if x.group == "cp")
    return f.total_ms, f.exposed_ms, b.total_ms, b.exposed_ms


ROOT = Path(__file__).resolve().parents[1]


def assert_collectives_compared(diff: dict[str, Any], group: str, ops: int) -> None:
    """`ppsim diff`'s JSON sets `group`'s collectives alone side by side, inside `ops` F
    and `ops` B ops of both traces, each side's median wait above 0."""
    rows = {(r["group"], r["op"]): r for r in diff["collectives"]}
    assert set(rows) == {(group, "F"), (group, "B")}, rows
    assert all(r["count"] == ops and min(r["ms"]) > 0 for r in rows.values()), rows


def diff_with_simulation(run: Any, costs: Path, tmp_path: Path) -> dict[str, Any]:
    """`ppsim diff` of a pooled launch's trace (tests/e2e/launches.py) against its
    simulation from `costs` with the launch's own flags: the JSON it prints."""
    argv = [a.replace("{tmp}", str(run.tmp)) for a in run.argv]
    sim = tmp_path / "sim.json"
    code, _, err = run_main(["simulate", "--costs", str(costs), *argv, "--trace", str(sim),
                             "--json"])
    assert code == 0, err
    code, out, err = run_main(["diff", str(run.tmp / "out" / "trace.json"), str(sim), "--json"])
    assert code == 0, err
    return json.loads(out)


JOB_ARGS = ["--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
            "--gpus", "16", "--global-batch-size", "32", "--time-budget", "8"]
"""Llama-3-8B cut to 8 layers on 16 H100s, global batch 32: a job search of seconds."""

TIGHT_JOB = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
             "--gpus", "16", "--global-batch-size", "32", "--time-budget", "8", "--top", "3",
             "--memory-gb", "4", "--json"]
"""A job whose shapes fit 4 GB only with more recompute than the preset's selective."""


def tp_job(tp: int, preset: str = "llama3-8b", **model: Any) -> tuple[Any, Any]:
    """A 4-layer `preset` at tensor parallelism `tp` (and the `model` fields) on one
    pipeline rank, 4 microbatches, the H100 preset: (its config, its Job)."""
    from ppsim.job.model import build_job

    c = config_from_dict({"model": {"preset": preset, "num_layers": 4, "tp": tp, **model},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    return c, job


def run_in_process(capsys: pytest.CaptureFixture[str], argv: list[str]
                   ) -> tuple[int, str, str]:
    """`ppsim ARGV` in this process (seconds where a subprocess takes longer): its exit
    status (argparse's too), stdout and stderr."""
    from ppsim.cli.main import main
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
