"""A large job search prices its shapes in worker processes (ppsim.job.pricing): the same
bounds, bytes and refusals as pricing them here, so the same answer."""

from __future__ import annotations

import multiprocessing
import os
import time

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.errors import UserError
from ppsim.job import pricing, search
from ppsim.job.pricing import price_shapes
from ppsim.job.search import _candidates, search_job
from ppsim.job.walk import silent


def _cfg(*argv: str):
    return config_from_args(build_parser().parse_args(["plan", *argv]))


def test_workers_price_as_this_process_does(monkeypatch) -> None:
    """gpt-oss-120b on 64 GPUs: its sliding windows refuse the p2p ring at cp > 1, so
    the shapes include refusals; every eighth shape, in two workers and here."""
    cfg = _cfg("--preset", "gpt-oss-120b", "--hardware", "h100-80gb")
    todo = _candidates(cfg, 64, 256, None, frozenset())[::8]
    here = price_shapes(cfg, todo, 256, silent, workers=1)
    monkeypatch.setattr(pricing, "PARALLEL_SHAPES", 1)
    steps: list[tuple[str, int, int]] = []
    apart = price_shapes(cfg, todo, 256, lambda *s: steps.append(s), workers=2)
    assert here.refusals and here.priced
    sent = [pricing.priced(p) for p in here.priced]  # priced here, kept whole
    assert apart.priced == sent  # shapes, bounds and bytes to the last digit
    assert [str(e) for e in apart.refusals] == [str(e) for e in here.refusals]
    assert [e.field for e in apart.refusals] == [e.field for e in here.refusals]
    # one step a task: about CHUNKS_PER_WORKER a worker, consecutive shapes together
    size = -(-len(todo) // (2 * pricing.CHUNKS_PER_WORKER))
    assert steps == [("pricing shapes", i, len(todo)) for i in range(0, len(todo), size)]


def test_a_search_priced_apart_answers_the_same(monkeypatch) -> None:
    cfg = _cfg("--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb")
    here = search_job(cfg, 16, 32, budget_s=30)
    monkeypatch.setattr(pricing, "PARALLEL_SHAPES", 1)
    monkeypatch.setattr(pricing, "usable_cores", lambda: 2)
    apart = search_job(cfg, 16, 32, budget_s=30)
    assert here.complete and apart.complete
    rows = [(r.shape, r.summary.iteration_time_ms, r.problem.split) for r in here.candidates]
    assert [(r.shape, r.summary.iteration_time_ms, r.problem.split)
            for r in apart.candidates] == rows
    assert (apart.evaluated, apart.over_floor, apart.overflowing) == (
        here.evaluated, here.over_floor, here.overflowing)


def test_where_no_worker_can_run_the_search_prices_here(monkeypatch) -> None:
    """A container without shared memory refuses the pool's semaphores (OSError): the
    shapes are priced in this process, as many and as priced."""
    cfg = _cfg("--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb")
    todo = _candidates(cfg, 16, 32, None, frozenset())

    def no_pool(*args, **kwargs):
        raise OSError(38, "Function not implemented")

    here = price_shapes(cfg, todo, 32, silent, workers=1)
    monkeypatch.setattr(pricing, "PARALLEL_SHAPES", 1)
    monkeypatch.setattr(pricing, "ProcessPoolExecutor", no_pool)
    assert price_shapes(cfg, todo, 32, silent, workers=2).priced == here.priced  # whole


def test_a_spawned_worker_does_not_run_the_command_again() -> None:
    """`python -m ppsim.cli plan --gpus ...` spawns pricing workers, which import the
    main module again as __mp_main__: unguarded, each ran the whole plan (and spawned
    workers of its own)."""
    import runpy
    import subprocess
    import sys

    runpy.run_module("ppsim.cli.__main__", run_name="__mp_main__")  # returns at once
    ran = subprocess.run([sys.executable, "-m", "ppsim.cli", "presets"], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0 and "llama3-8b" in ran.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_pricing_stops_at_its_deadline_with_a_sample_of_the_grid(monkeypatch) -> None:
    """Before, pricing ignored --time-budget: DeepSeek-V3 with --search cp-comm priced
    for 15 s under a 10 s budget. Past its deadline it ends after its first step, which
    holds a shape of every (tp, cp, pp), in the order given."""
    cfg = _cfg("--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb")
    todo = _candidates(cfg, 64, 128, None, frozenset())
    grid = {(s.tp, s.cp, s.pp) for s in todo}
    assert len(todo) >= 2 * len(grid) and len(grid) >= 10
    whole = price_shapes(cfg, todo, 128, silent, workers=1)
    for workers, big in ((1, 10 ** 9), (2, 1)):  # in this process, then in two workers
        monkeypatch.setattr(pricing, "PARALLEL_SHAPES", big)
        before = set(multiprocessing.active_children())  # another test's, if any
        cut = price_shapes(cfg, todo, 128, silent, workers=workers, deadline=0.0)
        assert whole.complete and not cut.complete
        # the workers are gone, not left pricing the tasks queued to them on the cores
        # the search goes on with (the OS asked: the pool's own thread may have reaped
        # one, leaving its Process object "started")
        assert not [p for p in set(multiprocessing.active_children()) - before
                    if _alive(p.pid)]
        done = [p.shape for p in cut.priced]
        assert 0 < len(done) + len(cut.refusals) < len(todo)
        assert done == [s for s in todo if s in set(done)]  # the order given
        if workers == 1:  # one step of 1 % of the shapes spans that much of the grid
            step = max(1, len(todo) // 100)
            assert len({(s.tp, s.cp, s.pp) for s in done}) == min(len(done), step)
        sent = {pricing.priced(p).shape: pricing.priced(p) for p in whole.priced}
        assert all(pricing.priced(p) == sent[p.shape] for p in cut.priced)


def test_a_search_whose_pricing_is_cut_says_it_is_incomplete(monkeypatch, capsys) -> None:
    argv = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--gpus", "64", "--global-batch-size", "128", "--time-budget", "20"]
    monkeypatch.setattr(search, "PRICING_SHARE", 0.0)  # the deadline is the start
    res = search_job(_cfg(*argv[1:7]), 64, 128, budget_s=20)
    assert not res.complete
    assert res.evaluated + res.overflowing + res.refused + res.over_floor < res.total
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not reached when the time budget ran out" in out


def test_a_cut_pricing_that_the_model_refuses_throughout_names_the_budget(
        monkeypatch, capsys) -> None:
    def refuse(cfg, s, gbs):
        raise UserError("model.tp", "refused here", "")

    monkeypatch.setattr(search, "PRICING_SHARE", 0.0)
    monkeypatch.setattr(pricing, "pending_shape", refuse)
    argv = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
            "h100-80gb", "--gpus", "64", "--global-batch-size", "128", "--time-budget", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("ppsim plan: error: --time-budget: 3 s priced ")
    assert "--time-budget 12" in err


def test_a_slow_pricing_leaves_the_optimizer_on_the_host_its_share(monkeypatch) -> None:
    """Hosting's deadline counted from the search's start: a pricing that took over 30 %
    of the budget (on a loaded machine, or a large search) left the 30 % of hosting spent
    before it began, and no shape that only fits with its optimizer on the host was
    found. Here the pricing sleeps 35 % of a 10 s budget first, which still leaves it
    1.5 s of its own share (its 0.13 s of work got under 0.4 s on a loaded machine, and
    stopped short)."""
    cfg = _cfg("--preset", "llama3-8b", "--hardware", "h100-80gb", "--memory-gb", "12")
    budget = 10.0
    priced_here = search.price_shapes

    def slow(*args, **kwargs):
        time.sleep(0.35 * budget)
        return priced_here(*args, **kwargs)

    monkeypatch.setattr(search, "price_shapes", slow)
    res = search_job(cfg, 8, 16, budget_s=budget, axes=frozenset({"host-optimizer"}))
    best = res.candidates[0]
    assert best.summary.fits and best.shape.host_optimizer
