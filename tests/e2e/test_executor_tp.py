"""Tensor parallelism for real: tp 2 x pp 2 (x dp 2) over gloo, with sequence parallelism
and without, gives the one-process loss and, put back together, the one-process gradients
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
from ppsim.trace.read import read_trace  # noqa: E402

pytestmark = pytest.mark.e2e
CASES = ["tp2-1f1b", "tp2-llama-1f1b", "tp2-llama-policy", "tp2-moe-1f1b", "tp2-moe-policy",
         "tp2-mla-1f1b", "tp2-mla-q-offload", "tp2-dp2-interleaved-gated", "tp4-kv2-1f1b",
         "tp2-kv1-1f1b", "tp2-titan-1f1b", "tp2-titan-mla-moe-1f1b"]
"""The built-in GPT and the Llama-style decoder with sequence parallelism (and a memory
policy: the tensor-parallel projections' inputs offloaded, the MLP recomputed; with MoE
layers, each expert split over the tensor ranks as Megatron splits them by default, a
shared-expert MLP of its own width (40 beside 96-wide experts) split over them too, and
with the MoE's own pieces recomputed and offloaded; with latent attention, and without
a query latent with the layer's input offloaded), the gated GPT without it (its one
key/value group at tp 2: its biased QKV gathered); the Llama-style decoder (query and key
norms, an output gate) at more tensor ranks than key/value groups, its QKV gathered: 2
groups at tp 4, 1 at tp 2 without sequence parallelism; the built-in GPT split as
torchtitan splits it (--fsdp: each column-parallel block keeping its gathered input),
and with torchtitan's latent attention (the latents whole on every rank) and MoE layers
(every rank routing the gathered tokens through its slice of each expert).
Each expert whole (etp 1): the hybrid stack below."""
PACKED = ("kv.weight", "kv.bias")
"""K and V in one matmul, each block sliced alike (ppsim.executor.builders.tensor)."""


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(argv)


def _whole(name: str, shards: list[torch.Tensor], want: torch.Size) -> torch.Tensor:
    """The tensor ranks' slices of a weight (or its gradient) put back together: along the
    one dimension the slices split (column-parallel by rows, row-parallel by columns, the
    vocabulary by rows), K and V packed; a weight whole on every rank the same on each."""
    leaf = ".".join(name.split(".")[-2:])
    if shards[0].shape == want:
        assert all(torch.equal(s, shards[0]) for s in shards), name  # replicated: in step
        return shards[0]
    if leaf in PACKED:
        return torch.cat([s.view(2, -1, *s.shape[1:]) for s in shards], 1).flatten(0, 1)
    (dim,) = [d for d, n in enumerate(want) if shards[0].shape[d] * len(shards) == n]
    return torch.cat(shards, dim)


def _unfused(name: str, whole: torch.Tensor, fields: dict[str, Any],
             want: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The interleaved QKV's rows (ppsim.executor.builders.qkv_gather), every group's query
    heads, gates, key head and value head in turn, as the one process's weights (or
    biases): q, gate, k and v; the built-in GPT's K and V packed as its kv."""
    stem, leaf = name.rsplit("qkv.", 1)
    heads, groups = fields["num_heads"], fields["num_kv_heads"]
    hd = fields["hidden_size"] // heads  # tiny-gpt's head_dim is hidden / heads
    per = heads // groups
    gated = fields.get("attention_output_gate", False)
    parts: dict[str, list[torch.Tensor]] = {"q": [], "gate": [], "k": [], "v": []}
    widths = {"q": per * hd, "gate": per * hd if gated else 0, "k": hd, "v": hd}
    for block in whole.split(sum(widths.values())):
        for key, part in zip(widths, block.split(list(widths.values())), strict=True):
            parts[key].append(part)
    out = {f"{stem}{key}.{leaf}": torch.cat(rows) for key, rows in parts.items()
           if widths[key]}
    if f"{stem}kv.{leaf}" in want:  # the GPT's: K then V in one linear
        out[f"{stem}kv.{leaf}"] = torch.cat([out.pop(f"{stem}k.{leaf}"),
                                            out.pop(f"{stem}v.{leaf}")])
    return out


@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_loss_equals_one_process(case: str, launches: Pool) -> None:
    _check_one_process(launches.get(case))
    if case in ("tp2-1f1b", "tp2-dp2-interleaved-gated"):  # the Llama-style ones' next
        # batch starts higher, in one process too
        assert launches.get(case).summary["losses"][1] < launches.get(case).summary["losses"][0]


@pytest.mark.parametrize("case", ["tp2-own-1f1b", "tp2-dp2-own-interleaved"])
def test_a_builder_of_ones_own_splits_itself(case: str, launches: Pool) -> None:
    """tests/model_tp.py, written as a torchtitan model is, split by its own parallelize
    (heads, MLP units and the vocabulary over the ranks), with sequence parallelism and
    without (and with dp 2): the one-process loss and gradients."""
    _check_one_process(launches.get(case))


def _check_one_process(run: Any) -> None:
    """The run's first loss that of one process over all its microbatches; the pipeline's
    messages each tensor rank's tokens under sequence parallelism; its dumped gradients,
    put back together, the one process's."""
    assert run.returncode == 0, run.stderr
    argv = [a.replace("{tmp}", str(run.tmp)) for a in run.argv]
    args = _args(argv)
    fields = config_from_args(args).model.fields()
    problem = load_problem(args)
    m, dp = problem.schedule.microbatches, args.dp or 1
    spec = builder_spec(args.model, fields)
    # dp replicas of m microbatches each: one process over all dp x m of them
    loss, grads = reference_step(load_builder(spec, fields), m * dp)
    assert run.summary["losses"][0] == pytest.approx(loss, rel=1e-5)
    assert (run.summary["dp"], run.summary["tp"]) == (dp, fields["tp"])
    # The pipeline's messages: each tensor rank's tokens under sequence parallelism, every
    # token without it (fp32 hidden states on CPU).
    b, s, h = load_builder(spec, fields).activation_shape
    split = "--no-sequence-parallel" not in argv
    trace = json.loads((run.tmp / "out" / "trace.json").read_text())
    sent = {e["args"]["bytes"] for e in trace["traceEvents"]
            if e.get("args", {}).get("kind") == "send"}
    tp = fields["tp"]
    assert sent == {b * s * h * 4 // (tp if split else 1)}
    if not (run.tmp / "grads.rank0.pt").exists():  # no gradients dumped
        return
    got: dict[str, torch.Tensor] = {}
    for r in range(problem.split.pp):
        dumps = [torch.load(run.tmp / f"grads.rank{r * tp + t}.pt") for t in range(tp)]
        for name in dumps[0]["grads"]:
            shards = [d["grads"][name] for d in dumps]
            if name.endswith(("qkv.weight", "qkv.bias")):  # rows split evenly, across heads
                got |= _unfused(name, torch.cat(shards), fields, grads)
                continue
            assert name in grads, name
            got[name] = _whole(name, shards, grads[name].shape)
    assert set(got) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_each_ranks_activation_peak_is_predicted(case: str, launches: Pool) -> None:
    """The activations a tensor rank holds, measured between ops, within 0.5 % of
    `simulate`'s on every pipeline rank, with sequence parallelism (the hidden states
    between the blocks split by tokens, each linear keeping this rank's tokens) and
    without (whole on every rank); the head's logits and softmax split by vocabulary."""
    run = launches.get(case)
    argv = [a.replace("{tmp}", str(run.tmp)) for a in run.argv]
    got, want = _peaks(run), between_ops_peaks(argv)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= 0.005 * w, (got, want)


def test_torchtitan_keeps_each_blocks_gathered_input(launches: Pool) -> None:
    """torchtitan's tensor parallelism (--fsdp) keeps each column-parallel block's input
    gathered, where Megatron's keeps this rank's tokens: each rank's measured peak above
    Megatron's by what `simulate` adds for it (ppsim.costs.saved.gathered), within 0.5 %
    of the peak."""
    titan, megatron = launches.get("tp2-titan-1f1b"), launches.get("tp2-1f1b")
    argvs = [[a.replace("{tmp}", str(r.tmp)) for a in r.argv] for r in (titan, megatron)]
    got = [t - m for t, m in zip(_peaks(titan), _peaks(megatron), strict=True)]
    peaks = between_ops_peaks(argvs[0])
    want = [t - m for t, m in zip(peaks, between_ops_peaks(argvs[1]), strict=True)]
    assert all(w > 0 for w in want), want
    for g, w, p in zip(got, want, peaks, strict=True):
        assert abs(g - w) <= 0.005 * p, (got, want)


def _peaks(run: Any) -> list[int]:
    events = json.loads((run.tmp / "out" / "trace.json").read_text())["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C"]
    return [max(e["args"]["activations"] for e in counters if e["pid"] == r)
            for r in sorted({e["pid"] for e in counters})]


def test_a_hybrid_stack_splits_as_it_runs_whole(launches: Pool) -> None:
    """Mamba-2, GatedDeltaNet, attention, MLP and MoE layers at tp 2 (sequence parallel):
    both iterations' losses those of the same stack in one process a stage, and each
    rank's measured peak as far from `simulate`'s as at tp 1 (the mixers' fused kernels
    keep a few tensors the model leaves out), within 0.5 %."""
    split, whole = launches.get("tp2-hybrid-1f1b"), launches.get("hybrid-etp1-1f1b")
    assert split.summary["losses"] == pytest.approx(whole.summary["losses"], rel=1e-5)
    ratios = []
    for run in (split, whole):
        argv = [a.replace("{tmp}", str(run.tmp)) for a in run.argv]
        ratios.append([g / w for g, w in zip(_peaks(run), between_ops_peaks(argv),
                                              strict=True)])
    for tp2, tp1 in zip(*ratios, strict=True):
        assert tp2 == pytest.approx(tp1, abs=0.005), ratios


@pytest.fixture(scope="module")
def tp_costs(tmp_path_factory: pytest.TempPathFactory, launches: Pool) -> tuple[Path, dict]:
    """`ppsim profile --tp 2`: the pieces in two gloo processes, each holding its shard."""
    out = tmp_path_factory.mktemp("tp-profile") / "costs.json"
    r = launches.cli("profile", "--tp", "2", "--microbatches", "4", "--repeats", "3",
                     "--warmup", "1", "--no-p2p", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_profile_measures_the_tensor_parallel_collectives(tp_costs) -> None:
    path, doc = tp_costs
    c = doc["collectives"]
    b, s, h = load_builder(builder_spec(None, doc["model"]), doc["model"]).activation_shape
    assert c["tp"] == 2 and c["backend"] == "gloo"
    assert (c["processes"], c["copies"]) == (2, 2)  # pp 2: both ranks' groups at once
    assert c["bytes"] == b * s * h * 4  # one microbatch's hidden states, fp32 on CPU
    for key in ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms"):
        assert 0 < c[key] < 1e3
    # The file is for the tp 2 model: its sharded layers, loadable only at tp 2.
    assert doc["model"]["tp"] == 2
    code, _, err = run_main(["simulate", "--costs", str(path), "--tp", "1", "--json"])
    assert code == 2 and "tp" in err
    # ... and with sequence parallelism, as the processes ran it
    code, _, err = run_main(["simulate", "--costs", str(path), "--tp", "2",
                             "--no-sequence-parallel"])
    assert code == 2 and "model.sequence_parallel" in err


def test_diff_compares_a_tensor_parallel_run_with_its_simulation(launches: Pool, tp_costs,
                                                                  tmp_path: Path) -> None:
    run = launches.get("tp2-1f1b")
    assert run.returncode == 0, run.stderr
    measured = read_trace(str(run.tmp / "out" / "trace.json"))
    # The trace names pipeline ranks, so sends pair with their receives.
    assert {op.rank for op in measured.ops} == {0, 1}
    got = diff_with_simulation(run, tp_costs[0], tmp_path)
    # 2 ranks x 2 microbatches x (F, B)
    assert got["ops_matched"] == 8 and got["ops_only_in"] == [0, 0]
    assert all(t > 0 for t in got["iteration_time_ms"])
    # ... and the tensor-parallel collectives inside each F and B, measured beside priced
    assert_collectives_compared(got, "tp", ops=4)
    # priced by the profile's bare times at Megatron's count (sequence parallel): a layer
    # gathers and scatters around its attention and its MLP, and its backward gathers each
    # one's input again (traffic.regathers, as the executor's linears do); the embedding
    # all-reduces its lookup (learned positions) and gathers in the backward, the head the
    # mirror and its input again; the median of rank 0's two ops (5 layers) and rank 1's
    # (3 and the head)
    c = tp_costs[1]["collectives"]
    ag, rs = c["all_gather_ms"], c["reduce_scatter_ms"]
    simulated = {r["op"]: r["ms"][1] for r in got["collectives"]}
    assert simulated == pytest.approx({
        "F": (8 * (2 * ag + 2 * rs) + c["all_reduce_ms"] + ag) / 2,
        "B": (8 * (4 * ag + 2 * rs) + 2 * ag + rs) / 2}, rel=1e-6)


def test_diff_prices_and_measures_the_gather_of_qkv(launches: Pool, tmp_path: Path) -> None:
    """`ppsim profile --tp 4` of the decoder with 2 key/value groups times each layer with
    its gather of QKV inside (the run's layers), and `ppsim diff` sets the run's
    tensor-parallel collectives beside `simulate`'s, which prices the gather (one more
    all-gather a layer's F, one more reduce-scatter its B: ppsim.costs.kv_split)."""
    run = launches.get("tp4-kv2-1f1b")
    out = tmp_path / "costs.json"
    r = launches.cli("profile", "--config", str(run.tmp / "llama.toml"), "--tp", "4",
                     "--pp", "2", "--microbatches", "2", "--repeats", "1", "--warmup", "0",
                     "--no-p2p", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["collectives"]
    assert (c["tp"], c["processes"], c["copies"]) == (4, 4, 2)
    got = diff_with_simulation(run, out, tmp_path)
    assert_collectives_compared(got, "tp", ops=4)
    # rank 0's F holds 5 layers and the embedding's scatter, rank 1's 3 and the head's
    # gather (the median of the four); B the mirror, with each sublayer's and the head's
    # input gathered again
    ag, rs = c["all_gather_ms"], c["reduce_scatter_ms"]
    simulated = {row["op"]: row["ms"][1] for row in got["collectives"]}
    assert simulated == pytest.approx({"F": (8 * (3 * ag + 2 * rs) + ag + rs) / 2,
                                       "B": (8 * (4 * ag + 3 * rs) + 2 * ag + rs) / 2},
                                      rel=1e-6)


def test_diff_prices_and_measures_the_gather_of_the_gpts_qkv(launches: Pool,
                                                             tmp_path: Path) -> None:
    """The built-in GPT with one key/value group at tp 2 (its biased QKV gathered), dp 2,
    without sequence parallelism: `ppsim profile` times its layers with the gather inside,
    and `ppsim diff` sets the run's tensor-parallel collectives beside `simulate`'s, a
    layer's two all-reduces each way and the gather's all-gather (F) or reduce-scatter
    (B)."""
    run = launches.get("tp2-dp2-interleaved-gated")
    out = tmp_path / "costs.json"
    r = launches.cli("profile", "--config", str(run.tmp / "gated.toml"), "--tp", "2",
                     "--dp", "2", "--pp", "2", "--no-sequence-parallel", "--microbatches",
                     "2", "--repeats", "1", "--warmup", "0", "--no-p2p", "--out", str(out),
                     "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["collectives"]
    assert (c["tp"], c["processes"], c["copies"]) == (2, 2, 2)
    got = diff_with_simulation(run, out, tmp_path)
    assert_collectives_compared(got, "tp", ops=8)
    # The chunks hold 3 layers and the embedding, 1, 2, and 2 and the head: of the eight
    # ops each way the middle two are 2 layers' and 2 layers' and the head's (its F
    # all-reduces nothing, its B its input's gradient)
    ar = c["all_reduce_ms"]
    f, b = 2 * ar + c["all_gather_ms"], 2 * ar + c["reduce_scatter_ms"]
    simulated = {row["op"]: row["ms"][1] for row in got["collectives"]}
    assert simulated == pytest.approx({"F": 2 * f, "B": 2 * b + ar / 2}, rel=1e-6)
