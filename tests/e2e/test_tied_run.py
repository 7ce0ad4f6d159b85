"""A tied embedding run for real (ppsim.executor.tied): two torchrun ranks a replica over
gloo, nothing mocked, against one process training the tied model (its head's weight the
embedding's table) on the same global batch with the same AdamW; on the ppsim engine and on
torch.distributed.pipelining's (ppsim.executor.peer)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from launch_cases import PEER, TIED  # noqa: E402
from launches import Pool  # noqa: E402

from ppsim.cli.main import main  # noqa: E402
from ppsim.config.schema import config_from_dict  # noqa: E402
from ppsim.costs.costfile import write_costs  # noqa: E402
from ppsim.executor.builders.gpt import build  # noqa: E402
from ppsim.executor.measure import profile  # noqa: E402
from ppsim.executor.reference import reference_losses, reference_step  # noqa: E402

pytestmark = pytest.mark.e2e
FIELDS = config_from_dict({"model": {"preset": "tiny-gpt", "vocab_size": 8192,
                                     "tie_embeddings": True}}).model.fields()
TABLE = "embedding.tokens.weight"


def _grads(run, ranks: range) -> list[dict[str, torch.Tensor]]:
    return [torch.load(run.tmp / f"grads.rank{r}.pt")["grads"] for r in ranks]


def _peaks_equal_simulated(run, costs: str, capsys) -> None:
    """Every rank's peak of `run` is simulate's from the cost file `costs`, byte for byte."""
    sim = str(run.tmp / "sim.json")
    assert main(["simulate", *run.argv, "--costs", costs, "--trace", sim]) == 0
    capsys.readouterr()
    assert main(["diff", sim, str(run.tmp / "out" / "trace.json"), "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert len(ranks) == 2
    for r in ranks:
        pred, real = r["peak_memory_bytes"]
        assert pred == real, (r["rank"], pred, real)


@pytest.mark.parametrize("case", list(TIED))
def test_a_tied_run_trains_as_one_process_of_the_tied_model(case: str,
                                                            launches: Pool) -> None:
    """Three iterations' losses are the tied model's on one process (each replica draws
    its 4 of the 8 microbatches): had the head's copy started or stepped apart from the
    table, the first or a later loss would differ."""
    run = launches.get(case)
    dp = 2 if "--dp" in run.argv else 1
    want, _ = reference_losses(build(FIELDS), 4 * dp, TIED[case].iterations)
    assert run.summary["losses"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("case", [c for c, spec in TIED.items() if PEER[0] in spec.extra])
def test_the_torch_engine_trains_as_one_process_of_the_tied_model(case: str,
                                                                  launches: Pool) -> None:
    """torch.distributed.pipelining's schedule, alongside: every iteration's loss is the
    tied model's on one process, its copies on two ranks (1F1B: summed after torch's
    backward, before its optimizer) or one table its rank's two stages share (ZB-V)."""
    peer = launches.get(case).summary["peer"]
    want, _ = reference_losses(build(FIELDS), 4, TIED[case].iterations)
    assert peer["engine"] == "torch"
    assert peer["losses"] == pytest.approx(want, rel=1e-5)


def test_the_copies_reduce_is_an_r_op_of_each_end(launches: Pool) -> None:
    """Ends on two ranks of one replica: the trace's one R op a rank and iteration is the
    copies' reduce, on the embedding's rank and the head's (no replicas to reduce over),
    as simulate's embedding all-reduce, so `ppsim diff` compares it."""
    run = launches.get("tied-1f1b")
    doc = json.loads((run.tmp / "out" / "trace.json").read_text())
    reduces = [(e["pid"], e["args"]["iteration"]) for e in doc["traceEvents"]
               if e.get("ph") == "X" and e.get("args", {}).get("kind") == "R"]
    iterations = range(TIED["tied-1f1b"].iterations)
    assert sorted(reduces) == [(r, it) for r in range(2) for it in iterations]


def test_the_two_copies_take_the_one_table_gradient(launches: Pool) -> None:
    """Ends on two ranks: after the step's reduce the embedding's table and the head's copy
    hold the same gradient on both ranks of each replica, the one-process table's."""
    run = launches.get("tied-1f1b-dp2")
    _, grads = reference_step(build(FIELDS), 8)  # the global batch: 2 replicas x 4
    for first, last in (_grads(run, range(r, r + 2)) for r in (0, 2)):
        assert TABLE not in last
        torch.testing.assert_close(first[TABLE], grads[TABLE], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(last["head.out.weight"], first[TABLE], rtol=0, atol=0)


def test_the_rank_holding_both_ends_keeps_one_table(launches: Pool, capsys) -> None:
    """ZB-V puts the embedding and the head on rank 0: one Parameter (dumped once, under
    the embedding's name, with the one-process gradient), and the rank's peak is
    simulate's from the profiled pieces, which counts the table once."""
    run = launches.get("tied-zbv")
    loss, grads = reference_step(build(FIELDS), 4)
    got = {k: v for d in _grads(run, range(2)) for k, v in d.items()}
    assert set(got) == set(grads)
    torch.testing.assert_close(got[TABLE], grads[TABLE], rtol=1e-4, atol=1e-6)
    costs = str(run.tmp / "costs.json")  # the tied model's pieces as ppsim profile measures
    # on both of the run's devices, as `ppsim profile` times them: in two processes at once
    write_costs(costs, profile(FIELDS, "cpu", repeats=1, warmup=0, p2p=False, devices=[0, 1]))
    _peaks_equal_simulated(run, costs, capsys)


def test_fsdp_shards_the_table_a_rank_holds_twice_once(launches: Pool) -> None:
    """ZB-V under FSDP: rank 0's first and last stage modules share one table, which its
    replicas shard, reduce and step once (dumped once, with the one-process gradient of
    the global batch), and the last rank's middle stages hold no table."""
    run = launches.get("tied-zbv-fsdp")
    _, grads = reference_step(build(FIELDS), 8)  # the global batch: 2 replicas x 4
    for first, middle in (_grads(run, range(r, r + 2)) for r in (0, 2)):
        assert TABLE in first and "head.out.weight" not in first
        assert TABLE not in middle and "head.out.weight" not in middle
        torch.testing.assert_close(first[TABLE], grads[TABLE], rtol=1e-4, atol=1e-6)


def test_a_tensor_parallel_profile_keeps_the_tied_table(tmp_path, capsys,
                                                        launches: Pool) -> None:
    """`ppsim profile --tp 2` of the tied model (two gloo processes) writes each tensor
    rank's share of the table, vocab x hidden / tp, so the tied config takes its file, and
    an interleaved run at tp 2 (each tensor rank's copy of its rows paired across the two
    ends' chunks) peaks where simulate says from it."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\nvocab_size = 8192\ntie_embeddings = true\n')
    out = tmp_path / "costs.json"
    assert main(["profile", "--config", str(cfg), "--tp", "2", "--microbatches", "2",
                 "--repeats", "1", "--warmup", "0", "--no-p2p", "--out", str(out)]) == 0
    tied = json.loads(out.read_text())["tied"]
    assert tied["params"] == 8192 * FIELDS["hidden_size"] // 2
    capsys.readouterr()
    assert main(["simulate", "--config", str(cfg), "--tp", "2", "--costs", str(out),
                 "--pp", "2", "--schedule", "zbv", "--vpp", "2", "--microbatches", "4"]) == 0
    _peaks_equal_simulated(launches.get("tied-interleaved-tp2"), str(out), capsys)
