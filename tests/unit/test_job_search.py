"""`ppsim plan --gpus N --global-batch-size B`: shapes Megatron accepts, fastest first."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers import JOB_ARGS as ARGS
from helpers import TIGHT_JOB as SMALL

from ppsim.cli.main import main


@pytest.fixture(scope="module")
def planned() -> dict:

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", *ARGS, "--top", "400", "--json"]) == 0
    return json.loads(out.getvalue())


def test_every_shape_is_one_megatron_accepts(planned: dict) -> None:
    cands = planned["candidates"]
    assert len(cands) == planned["evaluated"] > 20
    for c in cands:
        assert c["tp"] * c["cp"] * c["pp"] * c["dp"] == 16
        assert c["micro_batch_size"] * c["microbatches"] * c["dp"] == 32
        assert c["tp"] <= 8 and 8 % c["tp"] == 0 and 8 % c["tp"] == 0  # kv heads 8
        assert 8192 % (2 * c["cp"]) == 0
        assert sum(c["split"]) == 8


def test_fitting_shapes_come_fastest_first_with_their_throughput(planned: dict) -> None:
    fits = [c for c in planned["candidates"] if c["fits"]]
    times = [c["iteration_time_ms"] for c in fits]
    # fastest first; shapes tied to a part in 10^9 in the order they are simplest to launch
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))
    best = planned["best"]
    assert best["iteration_time_ms"] == times[0]
    t = best["throughput"]
    assert t["tokens_per_s"] == pytest.approx(32 * 8192 / (best["iteration_time_ms"] / 1e3))
    assert all(c["held_back_by"] for c in planned["candidates"])
    assert any(c["held_back_by"].startswith("bubble") for c in fits if c["pp"] > 1)


def test_best_shape_simulates_to_the_same_time(planned: dict, capsys) -> None:
    b = planned["best"]
    argv = ["simulate", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--tp", str(b["tp"]), "--cp", str(b["cp"]), "--pp", str(b["pp"]),
            "--vpp", str(b["vpp"]), "--dp", str(b["dp"]), "--micro-batch-size",
            str(b["micro_batch_size"]), "--global-batch-size", "32", "--schedule",
            b["schedule"], "--split", ",".join(map(str, b["split"])), "--json"]
    assert main(argv) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_ms"] == pytest.approx(b["iteration_time_ms"], rel=1e-12)
    assert sim["throughput"] == pytest.approx(b["throughput"])


def test_a_batch_no_shape_divides_is_refused(capsys) -> None:
    # 3,072 GPUs over tp and cp up to 8 and pp up to the 32 layers leave dp at least 2
    # (pp 24); 7 is odd.
    rc = main(["plan", "--preset", "llama3-8b", "--gpus", "3072", "--global-batch-size", "7"])
    err = capsys.readouterr().err
    assert rc == 2 and "--global-batch-size" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags", [["--gpus", "0", "--global-batch-size", "8"],
                                   ["--gpus", "-8", "--global-batch-size", "8"],
                                   ["--gpus", "16", "--global-batch-size", "0"]])
def test_a_world_or_batch_below_one_is_refused_in_one_line(flags: list[str], capsys) -> None:
    """Before: --gpus 0 died dividing by zero (a traceback, exit 1)."""
    rc = main(["plan", "--preset", "llama3-8b", *flags])
    err = capsys.readouterr().err.strip()
    field = flags[0] if flags[1] in ("0", "-8") else flags[2]
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{field}: must be between 1 and" in err


def test_a_batch_every_shape_refuses_says_why(capsys) -> None:
    """Before: every shape over the microbatch limit left an empty table (exit 3)."""
    rc = main(["plan", "--preset", "llama3-8b", "--gpus", "16",
               "--global-batch-size", "100000000"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "no shape of 16 GPUs" in err and "above the limit of 1,000,000" in err


def test_weights_that_fit_no_shape_are_named_with_the_leanest_shape(capsys) -> None:
    """Before: DeepSeek-V3 on 8 GPUs printed an empty table and nothing else (exit 3).
    Its 671B parameters in bf16 alone are 1.34 TB; eight 80 GB GPUs hold 640 GB."""
    argv = ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--gpus", "8",
            "--global-batch-size", "8"]
    assert main(argv) == 3
    out = " ".join(capsys.readouterr().out.split())  # as one line, however Rich wraps it
    assert "nothing fits" in out and "alone overflow 80.00 GB per GPU" in out
    assert main([*argv, "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] is None and doc["candidates"] == []
    over = doc["static_overflow"]
    assert over["static_bytes"] > 80e9 and over["shape"].startswith("tp")
    # The leanest shape spreads the weights over all 8 GPUs: at least 671B x 2 bytes / 8.
    assert over["static_bytes"] >= 671e9 * 2 / 8


def test_a_shape_whose_even_split_overflows_is_planned_unevenly(capsys) -> None:
    """Llama 3 8B on 4 GPUs (pp 4, sequence 512) within 39 GB: Megatron's even split puts
    8 layers beside the 9.45 GB embedding, 40.9 GB of weights and Adam state on the first
    rank; fewer layers there fit. Before: "nothing fits: on every shape the weights ...
    alone overflow" (the even split's bytes taken for every split's), nothing simulated."""
    argv = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "4",
            "--global-batch-size", "16", "--tp", "1", "--pp", "4", "--seq-length", "512",
            "--memory-gb", "39", "--time-budget", "20", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["best"]
    assert doc["static_overflows"] == 0
    assert doc["evaluated"] + doc["floor_overflows"] == doc["total_shapes"]
    assert best["fits"] and best["peak_memory_bytes"] <= 39e9 and best["split_planned"]
    assert sum(best["split"][0::best["pp"]]) < 8  # the first rank's layers, every chunk


def _plan_json(argv: list[str], capsys) -> tuple[int, dict]:
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_the_job_search_finds_the_recompute_mode_that_fits(capsys) -> None:
    """Before: --search was dropped with --gpus: nothing fit 4 GB (exit 3)."""
    rc, plain = _plan_json(SMALL, capsys)
    assert rc == 3 and plain["best"] is None
    rc, doc = _plan_json([*SMALL, "--search", "recompute"], capsys)
    best = doc["best"]
    assert rc == 0 and best["fits"] and best["memory_policy"] == "full"
    assert best["megatron_policy_flags"] == ("--recompute-granularity full --recompute-method "
                                             "uniform --recompute-num-layers 1")
    assert best["peak_memory_bytes"] <= 4e9
    # The same shape simulated with full recompute takes the same time.
    argv = ["simulate", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--memory-gb", "4", "--recompute", "full", "--tp", str(best["tp"]),
            "--cp", str(best["cp"]), "--pp", str(best["pp"]), "--vpp", str(best["vpp"]),
            "--dp", str(best["dp"]), "--micro-batch-size", str(best["micro_batch_size"]),
            "--global-batch-size", "32", "--schedule", best["schedule"], "--split",
            ",".join(map(str, best["split"])), "--json"]
    assert main(argv) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-12)


def test_the_job_search_plans_megatrons_memory_policy_for_the_fastest_shapes(capsys) -> None:
    """Before: `plan --gpus ... --search policy` planned one shape's policy and ignored
    --gpus and --global-batch-size. At 4.5 GB the best global mode is full recompute and
    a policy of Megatron's knobs beats it, so a loaded machine's shorter search still
    finds it."""
    roomier = [*SMALL[:SMALL.index("--memory-gb")], "--memory-gb", "4.5", "--json"]
    _, modes = _plan_json([*roomier, "--search", "recompute"], capsys)
    rc, doc = _plan_json([*roomier, "--search", "policy"], capsys)
    best = doc["best"]
    assert rc == 0 and doc["gpus"] == 16 and best["fits"] and best["split_planned"]
    assert modes["best"]["memory_policy"] == "full"
    assert best["peak_memory_bytes"] <= 4.5e9
    assert best["iteration_time_ms"] < modes["best"]["iteration_time_ms"]  # beats full
    assert best["memory_policy"] not in ("none", "selective", "full")
    flags = best["megatron_policy_flags"]
    assert any(f in flags for f in ("--recompute-modules", "--offload-modules",
                                    "--recompute-method block"))


@pytest.mark.parametrize(("extra", "field"), [
    (["--search", "schedule"], "--search"),
    (["--search", "policy-per-stage"], "--search"),
    (["--compare", "4,4"], "--compare"),
    (["--search", "recompute", "--recompute-modules", "layernorm"], "--search")])
def test_what_the_job_search_cannot_take_is_refused(extra: list[str], field: str,
                                                     capsys) -> None:
    """Before: --search and --compare were dropped silently with --gpus."""
    rc = main([*SMALL[:-1], *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"error: {field}:" in err


def test_sizes_given_as_flags_are_held(capsys) -> None:
    """Before: --tp and --pp beside --gpus were only the search's start: every tp and pp
    came back."""
    argv = [*ARGS, "--top", "50", "--json", "--tp", "2", "--pp", "2"]
    rc, doc = _plan_json(["plan", *argv], capsys)
    cands = doc["candidates"]
    assert rc == 0 and len(cands) >= 4
    assert {(c["tp"], c["pp"]) for c in cands} == {(2, 2)}
    assert {c["cp"] * c["dp"] for c in cands} == {4}  # 16 GPUs / (tp x pp)
    assert len({(c["cp"], c["vpp"], c["micro_batch_size"]) for c in cands}) > 1  # the rest vary


def test_layers_per_virtual_stage_is_refused_by_the_job_search(capsys) -> None:
    """It was ignored: the search varies pp, so a fixed chunk size holds no vpp."""
    assert main(["plan", *ARGS, "--num-layers-per-virtual-pipeline-stage", "2"]) == 2
    err = capsys.readouterr().err
    assert "error: --num-layers-per-virtual-pipeline-stage:" in err and len(
        err.splitlines()) == 1


def test_an_expert_tp_given_is_held_while_tp_varies(capsys) -> None:
    """Megatron's MoE parallel folding: --expert-tensor-parallel-size 1 holds the experts
    whole while the search varies tp, so ep may reach past dp x cp into the tp ranks."""
    job = ["plan", "--preset", "mixtral-8x7b", "--num-layers", "4", "--hardware", "h100-80gb",
           "--gpus", "16", "--global-batch-size", "32", "--expert-tensor-parallel-size", "1",
           "--pp", "2",
           "--time-budget", "4", "--json", "--top", "40"]
    assert main(job) in (0, 3)
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert {c["etp"] for c in rows} == {1}
    assert any(c["ep"] > c["dp"] * c["cp"] for c in rows)


def test_held_sizes_no_shape_has_are_refused_in_one_line(capsys) -> None:
    rc = main(["plan", *ARGS, "--tp", "2", "--pp", "16"])  # 2 x 16 > 16 GPUs
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "has tp 2, pp 16" in err


def test_a_held_pipeline_size_below_one_is_refused_by_its_flag(capsys) -> None:
    """A pipeline size is checked only when a problem is built: --vpp 0 must still be
    named by its flag, not blamed on the batch."""
    rc = main(["plan", *ARGS, "--vpp", "0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "error: --vpp: must be between 1" in err


def test_the_job_search_reports_each_shape_it_simulates_and_each_split_it_plans() -> None:
    # Before: a job plan of 10-20 s printed nothing until its table.
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.job.search import search_job

    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    steps: list[tuple[str, int, int]] = []
    res = search_job(cfg, 16, 32, top_k=2, budget_s=5,
                     progress=lambda what, done, total: steps.append((what, done, total)))
    priced = [s for s in steps if s[0] == "pricing shapes"]
    simulated = [s for s in steps if s[0] == "simulating shapes"]
    planned = [s for s in steps if s[0] == "planning the top shapes' splits"]
    shots = [s for s in steps if s[0] == "planning long shots' splits"]
    bounded = [s for s in steps if s[0] == "simulating bounded-out long shots"]
    assert len(priced) + len(simulated) + len(planned) + len(shots) + len(bounded) \
        == len(steps)
    done = [d for _, d, _ in priced]
    assert done == sorted(set(done)) and done[0] == 0
    assert all(t == res.total for _, _, t in priced) and done[-1] < res.total
    # each shape reached: simulated, or passed over by the memory floor (and, after the
    # top shapes' splits, bounded-out shapes simulated as long shot candidates)
    assert [d for _, d, _ in simulated] == list(range(res.evaluated - len(bounded)
                                                      + res.over_floor))
    assert all(total >= res.evaluated for _, _, total in simulated)
    # the five fastest have their splits planned, however few rows are asked for (and
    # faster ones whose default split does not fit, ppsim.job.search.shapes_to_plan)
    assert len(planned) >= 5
    for phase in (planned, shots):
        assert [(d, t) for _, d, t in phase] == [(i, len(phase)) for i in range(len(phase))]
    # shapes priced first, then simulated, then their splits, then the long shots'
    assert steps == priced + simulated + planned + bounded + shots


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_job_search_s_bar_draws_on_any_console(monkeypatch) -> None:
    # The bar's first frame has no step yet; an unset total crashed its counter. A stderr
    # that says it is a terminal takes the bar's path (a log's would print lines instead).
    from ppsim.cli.render import step_bar

    err = _Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with step_bar("ppsim plan") as progress:
        progress("simulating shapes", 0, 3)
        progress("planning the top shapes' splits", 1, 2)
    drawn = err.getvalue()
    assert "planning the top shapes' splits" in drawn and "1 of 2" in drawn


def test_a_spent_budget_still_simulates_a_shape_and_says_the_budget_ran_out(capsys) -> None:
    """Before: a budget spent before the first shape (a loaded machine, a short
    --time-budget) printed an empty table and exit 3, read as "nothing fits"."""
    rc = main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "32",
               "--global-batch-size", "64", "--time-budget", "0.05", "--json"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["evaluated"] >= 1 and doc["candidates"] and not doc["complete"]
    if rc == 3:
        assert "within the time budget" in out.err and "--time-budget" in out.err
    else:
        assert rc == 0
