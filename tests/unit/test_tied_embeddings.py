"""Tied embeddings: the LM head's weight is the embedding's table. A stage that holds
both keeps one table (Megatron's single shared weight when pp = 1); with the ends on two
ranks each keeps its copy and the two reduce its gradient (tests/unit/test_job_comm.py);
with the ends on two stages of one rank (ZB-V, DualPipeV, or several stages of pp = 1)
the rank keeps one table, as torch pipelining keeps both stage modules, and so the one
shared parameter, in the rank's process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.plan.search import SplitSearch
from ppsim.sim.simulate import simulate

TABLE = 50304 * 2048
"""gpt3-1.3b's table: GPT-2's 50,257 tokens padded to a multiple of 128 x hidden 2,048."""
BYTES_PER_PARAM = 2 + 4 + 12
"""Megatron's mixed precision without the distributed optimizer: a bf16 weight, a fp32
gradient, Adam's fp32 master weight, momentum and variance."""


def problem(tied: bool, pp: int, split: list[int] | None = None, policy: bool = False,
            schedule: str = "1f1b"):
    vpp = 2 if schedule in ("zbv", "dualpipev", "interleaved-1f1b") else 1
    pipeline = {"pp": pp, "vpp": vpp, "microbatches": 4, "schedule": schedule,
                **({"split": split} if split else {})}
    data = {"model": {"preset": "gpt3-1.3b", "tie_embeddings": tied},
            "pipeline": pipeline, "hardware": {"preset": "h100-80gb"}}
    if policy:
        data["memory"] = {"recompute_modules": ["core_attn"],
                          "stage": [{"stage": 0, "recompute_layers": 3}]}
    return build_problem(config_from_dict(data))


def test_one_stage_holds_a_tied_table_once() -> None:
    untied, tied = problem(False, 1), problem(True, 1)
    a, b = untied.stage_costs[0], tied.stage_costs[0]
    assert a.params - b.params == TABLE
    assert a.static_bytes - b.static_bytes == TABLE * BYTES_PER_PARAM
    peaks = [simulate(p).summary.peak_memory_bytes for p in (untied, tied)]
    assert peaks[0] - peaks[1] == TABLE * BYTES_PER_PARAM
    # The head's matmul runs all the same: time does not change.
    assert (a.forward_ms, a.backward_ms) == (b.forward_ms, b.backward_ms)


def test_two_stages_each_keep_their_copy() -> None:
    for a, b in zip(problem(False, 2).stage_costs, problem(True, 2).stage_costs, strict=True):
        assert (a.params, a.static_bytes) == (b.params, b.static_bytes)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.integers(1, 23), st.booleans(), st.booleans())
def test_the_planner_prices_each_stage_as_the_cost_model(pp: int, cut: int, tied: bool,
                                                         policy: bool) -> None:
    """The planner's O(1) stage bytes (prefix sums; a memory policy's own) equal the
    cost model's sum for every stage, tied or not, one stage or two."""
    p = problem(tied, pp, [cut, 24 - cut] if pp == 2 else None, policy)
    search = SplitSearch(p)
    for st_, cost in zip(p.split.stages, p.stage_costs, strict=True):
        static, _, _ = search.stage_bytes(st_.offset, st_.layers, st_.index)
        assert static == cost.static_bytes


@pytest.mark.parametrize(("pp", "schedule"), [(2, "zbv"), (2, "dualpipev"),
                                              (1, "interleaved-1f1b")])
def test_a_rank_holding_both_ends_keeps_one_table(pp: int, schedule: str) -> None:
    """Rank 0 holds the embedding (stage 0) and the head (the last stage): untied it keeps
    two tables, tied one, so it holds one table's weight, gradient and optimizer state
    less; a rank without the ends holds the same either way."""
    untied, tied = problem(False, pp, schedule=schedule), problem(True, pp, schedule=schedule)
    assert tied.split.stage_rank(0) == tied.split.stage_rank(2 * pp - 1) == 0
    a, b = simulate(untied).summary.ranks, simulate(tied).summary.ranks
    assert a[0].static_bytes - b[0].static_bytes == TABLE * BYTES_PER_PARAM
    assert [r.static_bytes for r in a[1:]] == [r.static_bytes for r in b[1:]]
    params = [sum(c.params for c in p.stage_costs) for p in (untied, tied)]
    assert params[0] - params[1] == TABLE


def test_one_rank_holds_the_same_whether_it_runs_one_stage_or_two() -> None:
    """pp = 1: the rank holds the whole model (one table) whatever its stages."""
    one, two = problem(True, 1), problem(True, 1, schedule="interleaved-1f1b")
    # gpt3-1.3b by hand: per layer QKV 3h^2, projection h^2, MLP 2 x 4h^2 and two
    # LayerNorms' 4h (linear biases cost nothing: docs/model.md, --disable-bias-linear);
    # one table, 2,048 learned positions and the final LayerNorm once.
    h = 2048
    params = 24 * (12 * h * h + 4 * h) + TABLE + 2048 * h + 2 * h
    for p in (one, two):
        assert simulate(p).summary.ranks[0].static_bytes == params * BYTES_PER_PARAM


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_no_embedding_all_reduce_when_one_rank_holds_both_ends(schedule: str) -> None:
    """Megatron all-reduces the tied gradient between the first and last stage's ranks
    (_allreduce_word_embedding_grads); on one rank both stages accumulate into the one
    parameter, so no rank reduces anything at dp 1."""
    res = simulate(problem(True, 2, schedule=schedule))
    assert [r for _, r, _ in res.timeline.step] == [0.0, 0.0]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=3, max_size=3).filter(lambda c: sum(c) <= 24),
       st.booleans(), st.sampled_from(["zbv", "dualpipev"]))
def test_the_planner_prices_a_v_split_as_simulate(counts: list[int], policy: bool,
                                                   schedule: str) -> None:
    """The planner's stage bytes and its evaluation of a tied V split are simulate's."""
    split = [*counts, 24 - sum(counts)]
    p = problem(True, 2, split, policy, schedule)
    search = SplitSearch(p)
    for st_, cost in zip(p.split.stages, p.stage_costs, strict=True):
        static, _, _ = search.stage_bytes(st_.offset, st_.layers, st_.index)
        assert static == cost.static_bytes == search.stage(st_.offset, st_.layers,
                                                           st_.index).static_bytes
    assert search.evaluate(tuple(split)).peak_memory_bytes \
        == simulate(p).summary.peak_memory_bytes


def test_a_plan_offers_v_schedules_for_a_tied_model(tmp_path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """simulate takes ZB-V with a tied table, and a plan searching schedules offers the
    same variants tied as untied."""
    cfg = tmp_path / "tied.toml"
    cfg.write_text('[model]\npreset = "gpt3-1.3b"\ntie_embeddings = true\n'
                   '[pipeline]\npp = 2\nmicrobatches = 8\n[hardware]\npreset = "h100-80gb"\n')
    assert main(["simulate", "--config", str(cfg), "--schedule", "zbv", "--vpp", "2"]) == 0
    capsys.readouterr()

    def variants(tied: bool) -> list[str]:
        cfg.write_text(cfg.read_text().replace(f"tie_embeddings = {str(not tied).lower()}",
                                               f"tie_embeddings = {str(tied).lower()}"))
        assert main(["plan", "--config", str(cfg), "--search", "schedule,vpp",
                     "--time-budget", "1", "--json"]) == 0
        return [v["variant"] for v in json.loads(capsys.readouterr().out)["variants"]]

    tied, untied = variants(True), variants(False)
    assert {"zbv vpp=2 m=8", "dualpipev vpp=2 m=8"} <= set(tied)
    assert set(tied) == set(untied)


NOT_TYING = """from ppsim.executor.builders.gpt import build as gpt


def build(fields):
    builder = gpt(fields)
    builder.tie_embeddings = False
    return builder
"""
"""A builder of one's own that builds the head apart from the table."""

WRAPPED = """from torch import nn

from ppsim.executor.builders.gpt import build as gpt


class Head(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class Wrapped:
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def head(self):
        return Head(self.inner.head())


def build(fields):
    return Wrapped(gpt(fields))
"""
"""A builder of one's own that says it ties but wraps its head: no `out` to share."""

HALVED = """import sys

from torch import nn

sys.path.insert(0, TESTS)
import model_tp  # noqa: E402


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(model_tp.VOCAB, model_tp.HIDDEN)

    def forward(self, ids):
        return self.tokens(ids)


class Head(model_tp.Head):
    def __init__(self):
        super().__init__()
        self.out = self.output


class Builder(model_tp.Builder):
    tie_embeddings = True

    def embedding(self):
        return Embedding()

    def head(self):
        return Head()

    def parallelize(self, module, piece, tp):
        if piece == "head":  # the vocabulary split in the head alone
            tp.head(module.out)
        elif piece != "embedding":
            super().parallelize(module, piece, tp)


def build(fields):
    return Builder(fields)
"""
"""A builder of one's own tying `tokens` and `out` whose tensor-parallel split keeps half
the head's rows and the whole table: no one tensor for the two."""


@pytest.mark.parametrize("flags", [["--model", "{tmp}/untied.py:build"],
                                   ["--model", "{tmp}/wrapped.py:build"],
                                   ["--model", "{tmp}/halved.py:build", "--tp", "2"]])
def test_run_refuses_what_does_not_tie(tmp_path, capsys: pytest.CaptureFixture[str],
                                       flags: list[str]) -> None:
    """A builder whose head keeps its own table would train an untied model where
    simulate counts a tied one, and a builder tying a
    head without `out`, or split over tensor ranks apart from its table, would fail in
    its ranks: `run` refuses them before any process starts (exit 2, the error one line
    naming the field)."""
    (tmp_path / "untied.py").write_text(NOT_TYING)
    (tmp_path / "wrapped.py").write_text(WRAPPED)
    tests = str(Path(__file__).resolve().parents[1])
    (tmp_path / "halved.py").write_text(HALVED.replace("TESTS", repr(tests)))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\ntie_embeddings = true\n')
    argv = ["run", "--config", str(cfg), "--pp", "2", "--microbatches", "4",
            *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "model.tie_embeddings: " in err[-1] and "Traceback" not in "".join(err), err


@pytest.mark.parametrize("flags", [["--engine", "torch"], ["--alongside-torch"]])
def test_run_takes_a_tied_model_on_the_torch_engine(tmp_path, flags: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """torch.distributed.pipelining's stages tie as the ppsim engine's do
    (ppsim.executor.peer): `run` takes a tied model on it, alone or alongside (the launch
    printed, nothing run)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\ntie_embeddings = true\n')
    assert main(["run", "--config", str(cfg), "--pp", "2", "--microbatches", "4",
                 "--print-launch", *flags]) == 0, capsys.readouterr().err
    assert "torchrun" in capsys.readouterr().out


def test_a_stage_holding_both_ends_holds_one_table() -> None:
    """The one-process model (and a pp = 1 rank) of a tied model: the head's projection is
    the embedding's table, one parameter fewer than untied."""
    pytest.importorskip("torch")
    from ppsim.executor.builders.gpt import build
    from ppsim.executor.builders.stage import full_model

    fields = config_from_dict({"model": {"preset": "tiny-gpt"}}).model.fields()
    tied, untied = (full_model(build({**fields, "tie_embeddings": t})) for t in (True, False))
    assert tied.head.out.weight is tied.embedding.tokens.weight
    assert len(list(untied.parameters())) - len(list(tied.parameters())) == 1


def test_a_job_plan_runs_a_tied_model_under_zbv(capsys: pytest.CaptureFixture[str]) -> None:
    """plan --gpus --schedule zbv times the shapes ZB-V runs (two chunks a rank) for a
    tied preset."""
    assert main(["plan", "--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--gpus", "4",
                 "--global-batch-size", "16", "--schedule", "zbv", "--time-budget", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"] and all((c["schedule"], c["vpp"]) == ("zbv", 2)
                                     for c in out["candidates"])


def test_a_tied_model_refuses_a_cost_file_measured_untied(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file measured for the untied model has no tied table to drop: on the rank of a V
    that holds both ends it would count two, so a tied config refuses it (one line), and
    takes the file of the tied model."""
    files = {}
    for tied in (False, True):
        cfg = tmp_path / f"tied-{tied}.toml"
        cfg.write_text(f'[model]\npreset = "tiny-gpt"\ntie_embeddings = {str(tied).lower()}\n')
        assert main(["costs", "--config", str(cfg), "--json"]) == 0
        files[tied] = tmp_path / f"costs-{tied}.json"
        files[tied].write_text(capsys.readouterr().out)
    tied_cfg = str(tmp_path / "tied-True.toml")
    v = ["--pp", "2", "--schedule", "zbv", "--vpp", "2", "--microbatches", "4"]
    assert main(["simulate", "--config", tied_cfg, "--costs", str(files[False]), *v]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": tied: " in err[0] and "untied" in err[0], err
    assert main(["simulate", "--config", tied_cfg, "--costs", str(files[True]), *v]) == 0
    # an untied config reads either file: its head keeps its own table either way
    untied_cfg = str(tmp_path / "tied-False.toml")
    assert main(["simulate", "--config", untied_cfg, "--costs", str(files[True]), *v]) == 0
