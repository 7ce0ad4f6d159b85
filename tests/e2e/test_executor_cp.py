"""Context parallelism for real: cp 2 x pp 2 over gloo (K and V gathered, round the ring
for latent attention under an interleaved schedule, or the heads exchanged under ZB-H1),
and tp 2 x cp 2 x dp 2 with a sliding window, rotary positions and MoE layers, give the
one-process loss and gradients;
each rank sends its half of the tokens and holds the activations `simulate` prices
(nothing mocked: torchrun processes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from helpers import (  # noqa: E402
    assert_collectives_compared,
    between_ops_peaks,
    diff_with_simulation,
    run_main,
)
from launches import Pool  # noqa: E402

from ppsim.cli.flags import config_from_args  # noqa: E402
from ppsim.cli.run import load_problem  # noqa: E402
from ppsim.cli.run_flags import add_run_arguments  # noqa: E402
from ppsim.executor.builders import builder_spec, load_builder  # noqa: E402
from ppsim.executor.reference import reference_step  # noqa: E402

pytestmark = pytest.mark.e2e
CASES = ["cp2-1f1b", "cp2-ring-interleaved", "cp2-a2a-zb", "cp4-hierarchical",
         "cp2-ep2-moe", "cp2-tp2-dp2-window"]


def _argv(run: Any) -> list[str]:
    return [a.replace("{tmp}", str(run.tmp)) for a in run.argv]


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("case", CASES)
def test_context_parallel_loss_equals_one_process(case: str, launches: Pool) -> None:
    """Both iterations' losses those of one process over all the replicas' microbatches
    (the second after a step on the gradients reduced over dp x cp)."""
    run = launches.get(case)
    assert run.returncode == 0, run.stderr
    args = _args(_argv(run))
    fields = config_from_args(args).model.fields()
    m, dp = load_problem(args).schedule.microbatches, args.dp or 1
    builder = load_builder(builder_spec(args.model, fields), fields)
    loss, _ = reference_step(builder, m * dp)
    assert run.summary["losses"][0] == pytest.approx(loss, rel=1e-5)
    assert (run.summary["dp"], run.summary["cp"]) == (dp, config_from_args(args).model.arch.cp)


def test_the_optimizer_shards_over_the_context_parallel_ranks(launches: Pool) -> None:
    """Megatron's distributed optimizer at cp 2 (dp 1) shards its state over the two
    context-parallel ranks, as over Megatron's data-and-context-parallel group: both
    iterations' losses those of the same run stepping whole."""
    sharded, whole = launches.get("cp2-distopt"), launches.get("cp2-1f1b")
    assert sharded.returncode == 0, sharded.stderr
    assert sharded.summary["losses"] == pytest.approx(whole.summary["losses"], rel=1e-6)

    def static(run: Any) -> int:  # rank 0's weights, gradients and optimizer state
        events = json.loads((run.tmp / "out" / "trace.json").read_text())["traceEvents"]
        return max(e["args"]["static"] for e in events if e.get("ph") == "C" and e["pid"] == 0)

    # AdamW's two fp32 moments (and the fp32 main weights) halved by the sharding
    assert static(sharded) < 0.8 * static(whole)


@pytest.mark.parametrize("case", ["cp2-1f1b", "cp2-ring-interleaved", "cp2-a2a-zb",
                                  "cp4-hierarchical"])
def test_each_rank_reads_its_chunks_and_steps_as_one_process(case: str,
                                                             launches: Pool) -> None:
    """cp 2 x pp 2, K and V gathered or round the ring, or the heads exchanged (under a
    split backward, W apart), and both at cp 4: every rank's reduced gradients the one
    process's, and the pipeline's messages 1 / cp of a microbatch's tokens (fp32 hidden
    states on CPU)."""
    run = launches.get(case)
    args = _args(_argv(run))
    cfg = config_from_args(args)
    fields, cp = cfg.model.fields(), cfg.model.arch.cp
    problem = load_problem(args)
    builder = load_builder(builder_spec(args.model, fields), fields)
    _, grads = reference_step(builder, problem.schedule.microbatches)
    b, s, h = builder.activation_shape
    trace = json.loads((run.tmp / "out" / "trace.json").read_text())
    sent = {e["args"]["bytes"] for e in trace["traceEvents"]
            if e.get("args", {}).get("kind") == "send"}
    assert sent == ({b * s * h * 4 // cp} if problem.split.pp > 1 else set())
    for rank in range(problem.split.pp * cp):
        got = torch.load(run.tmp / f"grads.rank{rank}.pt")["grads"]
        assert got and set(got) <= set(grads)
        for name, g in got.items():
            torch.testing.assert_close(g, grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_each_ranks_activation_peak_is_predicted(case: str, launches: Pool) -> None:
    """A context-parallel rank holds its s / cp tokens' activations (its own K and V, not
    the gathered ones), within 0.5 % of `simulate`'s on every pipeline rank."""
    run = launches.get(case)
    events = json.loads((run.tmp / "out" / "trace.json").read_text())["traceEvents"]
    want = between_ops_peaks(_argv(run))
    got = [max(e["args"]["activations"] for e in events if e.get("ph") == "C"
               and e["pid"] == r) for r in range(len(want))]
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= 0.005 * w, (got, want)


@pytest.fixture(scope="module")
def cp_costs(tmp_path_factory: pytest.TempPathFactory, launches: Pool) -> tuple[Path, dict]:
    """`ppsim profile` of the cp2-1f1b model: the pieces in two gloo processes, each
    holding its chunks of the sequence."""
    run = launches.get("cp2-1f1b")
    out = tmp_path_factory.mktemp("cp-profile") / "costs.json"
    r = launches.cli("profile", "--cp", "2", "--config", str(run.tmp / "cp.toml"),
                  "--microbatches", "4", "--repeats", "3", "--warmup", "1",
                  "--out", str(out), "--json")  # P2P measured: the gathers' link
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_profile_measures_a_context_parallel_rank(cp_costs, launches: Pool) -> None:
    """The profile's processes each hold half the tokens: a layer keeps what the run's
    ranks keep (its trace's stage bytes), and the file prices cp 2 alone."""
    path, doc = cp_costs
    c = doc["collectives"]
    assert (c["cp"], c["processes"], c["cp_comm_type"]) == (2, 2, "all_gather")
    # the bare gathers at a microbatch's K and V a rank holds: 2 x 32 tokens of the
    # GPT's 4 heads of 16 (fp32), K and V
    assert c["cp_bytes"] == 2 * 32 * 2 * 64 * 4
    assert 0 < c["cp_all_gather_ms"] < 1e3 and 0 < c["cp_reduce_scatter_ms"] < 1e3
    assert doc["model"]["cp"] == 2 and doc["model"]["cp_comm_type"] == "all_gather"
    run = launches.get("cp2-1f1b")
    want = between_ops_peaks([*_argv(run), "--costs", str(path)])
    analytic = between_ops_peaks(_argv(run))
    assert want == pytest.approx(analytic, rel=0.005)
    code, _, err = run_main(["simulate", "--costs", str(path), "--config",
                             str(run.tmp / "cp.toml")])
    assert code == 2 and "model.cp" in err


def test_diff_compares_a_context_parallel_run_with_its_simulation(launches: Pool, cp_costs,
                                                                  tmp_path: Path) -> None:
    run = launches.get("cp2-1f1b")
    got = diff_with_simulation(run, cp_costs[0], tmp_path)
    # 2 ranks x 2 microbatches x (F, B)
    assert got["ops_matched"] == 8 and got["ops_only_in"] == [0, 0]
    assert all(t > 0 for t in got["iteration_time_ms"])
    # ... and the gathers inside each F and B, measured beside priced
    assert_collectives_compared(got, "cp", ops=4)
    # priced by the profile's bare gathers: each layer gathers K and V before its
    # attention, and in the backward again, reduce-scattering their gradients after it;
    # the median of rank 0's two ops (5 layers) and rank 1's (3)
    c = cp_costs[1]["collectives"]
    simulated = {r["op"]: r["ms"][1] for r in got["collectives"]}
    assert simulated == pytest.approx({
        "F": 4 * c["cp_all_gather_ms"],
        "B": 4 * (c["cp_all_gather_ms"] + c["cp_reduce_scatter_ms"])}, rel=1e-6)
