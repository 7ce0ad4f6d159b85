"""Context parallelism's three traffics (--cp-comm-type, ppsim.job.layers): the p2p ring
behind each chunk's attention, the exposed K/V all-gather (again in the backward, dK/dV
reduce-scattered), the exposed Ulysses all-to-alls of Q, K, V and the output. Expected
values restated from the shapes and the h100-80gb preset's NVLink (450 GB/s, 1 µs a
step); a cp group of 2 inside a node at tp 1."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.errors import UserError
from ppsim.job.layers import layer_collectives, per_rank_arch
from ppsim.job.model import build_job
from ppsim.pipeline.problem import model_costs

NV, NV_STEP = 450e6, 1e-3  # bytes per ms, ms a step (h100-80gb, inside a node)
SEQ, CP = 8192, 2
LOCAL = SEQ // CP  # a rank's tokens
Q, KV = 4096, 1024  # llama3-8b: 32 query heads, 8 key/value heads of 128


def cfg(kind: str, **model):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "tp": 1,
                                       "cp": CP, "seq_length": SEQ, "cp_comm_type": kind,
                                       **model},
                             "pipeline": {"pp": 1, "microbatches": 2},
                             "hardware": {"preset": "h100-80gb"}})


def cp_traffic(kind: str) -> tuple[float, float, float, float]:
    """(forward total, forward exposed, backward total, backward exposed) ms."""
    c = cfg(kind)
    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    a = per_rank_arch(job.arch)
    comm = layer_collectives(job, a, acc, "dense", transformer_costs(a, acc).layers[0])
    f = next(x for x in comm.forward if x.group == "cp")
    b = next(x for x in comm.backward if x.group == "cp")
    return f.total_ms, f.exposed_ms, b.total_ms, b.exposed_ms


def test_all_gather_gathers_k_and_v_twice_and_scatters_their_gradients() -> None:
    whole = SEQ * 2 * KV * 2  # K and V of the whole sequence, bf16
    one = (CP - 1) * NV_STEP + (CP - 1) / CP * whole / NV  # a ring gather (or scatter)
    f, fe, b, be = cp_traffic("all_gather")
    assert f == pytest.approx(one) and fe == f
    assert b == pytest.approx(2 * one) and be == b


def test_a2a_exchanges_q_k_v_and_the_output() -> None:
    def a2a(nbytes: float) -> float:
        return (CP - 1) * NV_STEP + nbytes * (CP - 1) / CP / NV

    want = a2a(LOCAL * (Q + 2 * KV) * 2) + a2a(LOCAL * Q * 2)
    f, fe, b, be = cp_traffic("a2a")
    assert f == pytest.approx(want) and b == pytest.approx(want)
    assert fe == f and be == b


def test_the_ring_hides_behind_the_attention() -> None:
    f, fe, b, be = cp_traffic("p2p")
    assert 0 < f and fe < f and be < b


def test_each_type_adds_only_its_exposed_traffic() -> None:
    """The layer's time differs between the types by what each leaves exposed."""
    def layer_ms(kind: str) -> float:
        c = model_costs(cfg(kind)).layers[0]
        return c.forward_ms + c.backward_ms

    base = layer_ms("p2p") - sum(cp_traffic("p2p")[1::2])
    for kind in ("all_gather", "a2a"):
        assert layer_ms(kind) - sum(cp_traffic(kind)[1::2]) == pytest.approx(base)


def test_ulysses_needs_cp_to_divide_the_heads() -> None:
    with pytest.raises(UserError) as err:
        cfg("a2a", tp=8)  # one key/value head a tensor rank
    assert err.value.field == "model.cp_comm_type"
    assert "num_heads_kv = 1, cp_size = 2" in str(err.value)


@pytest.mark.parametrize("flag, words", [
    (["a2a+p2p"], "not the hierarchical a2a+p2p"),
    (["p2p", "a2a"], "one type for every layer"),
])
def test_what_is_not_priced_is_refused_by_name(capsys: pytest.CaptureFixture[str],
                                               flag: list[str], words: str) -> None:
    code = main(["simulate", "--preset", "llama3-8b", "--cp", "2", "--cp-comm-type", *flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0] and "--cp-comm-type" in err[0]


def test_the_flag_reads_and_exports_as_megatron_says_it() -> None:
    a = cfg("all_gather").model.arch
    args = megatron_model_args(a)
    assert args[args.index("--cp-comm-type") + 1] == "all_gather"
    assert "--cp-comm-type" not in megatron_model_args(cfg("p2p").model.arch)


def test_a_flag_prices_the_exposed_gather(capsys: pytest.CaptureFixture[str]) -> None:
    def iteration(kind: str) -> float:
        assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--cp", "2",
                     "--pp", "2", "--microbatches", "4", "--cp-comm-type", kind, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["iteration_time_ms"]

    assert iteration("all_gather") > iteration("p2p")
