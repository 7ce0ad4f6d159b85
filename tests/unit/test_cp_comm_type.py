"""Context parallelism's three traffics (--cp-comm-type, ppsim.job.layers): the p2p ring
behind each chunk's attention, the exposed K/V all-gather (again in the backward, dK/dV
reduce-scattered), the exposed Ulysses all-to-alls of Q, K, V and the output. Expected
values restated from the shapes and the h100-80gb preset's NVLink (450 GB/s, 1 µs a
step); a cp group of 2 inside a node at tp 1."""

from __future__ import annotations

import json

import pytest
from helpers import cp_layer_traffic

from ppsim.cli.main import main
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.problem import model_costs

NV, NV_STEP = 450e6, 1e-3  # bytes per ms, ms a step (h100-80gb, inside a node)
SEQ, CP = 8192, 2
LOCAL = SEQ // CP  # a rank's tokens
Q, KV = 4096, 1024  # llama3-8b: 32 query heads, 8 key/value heads of 128


def cfg(kind: str, **model):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "tp": 1,
                                       "cp": CP, "seq_length": SEQ, "cp_comm_type": kind,
                                       "recompute": "none", **model},
                             "pipeline": {"pp": 1, "microbatches": 2},
                             "hardware": {"preset": "h100-80gb"}})


def cp_traffic(kind: str, recompute: str = "none") -> tuple[float, float, float, float]:
    """(forward total, forward exposed, backward total, backward exposed) ms."""
    return cp_layer_traffic(cfg(kind, recompute=recompute))


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


@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_a_recomputed_attention_exchanges_its_forward_again(kind: str, recompute: str) -> None:
    """Megatron's selective recompute (the core attention) and full recompute run the
    attention's forward, its context-parallel traffic included, inside the backward."""
    f, fe, b, be = cp_traffic(kind)
    again = cp_traffic(kind, recompute)
    assert again[0] == f and again[2] == pytest.approx(b + f)
    assert again[3] == pytest.approx(be + fe)


def test_a_recomputed_attention_computes_the_other_chunks_again() -> None:
    """The backward of a layer whose attention is recomputed holds the other chunks'
    forward too: against no recompute, the layer's backward grows by the whole
    sequence's attention forward on this rank (cp chunks' worth), not its own chunk's
    alone (a defect: only the rank's own chunk was recomputed)."""
    def backward(cp: int, recompute: str) -> float:
        return model_costs(config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": 2, "tp": 1, "cp": cp,
                      "seq_length": SEQ * cp // CP, "recompute": recompute,
                      "cp_comm_type": "a2a"},
            "pipeline": {"pp": 1, "microbatches": 2},
            "hardware": {"preset": "h100-80gb"}})).layers[0].backward_ms

    grew = backward(CP, "selective") - backward(CP, "none")
    attention = grew - cp_traffic("a2a")[0]  # the forward's all-to-alls again, exposed
    alone = backward(1, "selective") - backward(1, "none")  # the core of a chunk's tokens
    # A rank's share of the whole sequence's causal core is cp chunks' worth (the core's
    # time is its FLOPs at this size).
    assert attention == pytest.approx(CP * alone, rel=1e-6)


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
    (["a2a+p2p+x"], "ppsim prices p2p, all_gather, a2a, a2a+p2p"),
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


def test_the_job_line_names_a_traffic_other_than_the_ring(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--cp", "2"]
    assert main([*args, "--cp-comm-type", "a2a"]) == 0
    assert "cp 2 a2a ep 1" in capsys.readouterr().out
    assert main(args) == 0
    assert "cp 2 ep 1" in capsys.readouterr().out


def test_a_flag_prices_the_exposed_gather(capsys: pytest.CaptureFixture[str]) -> None:
    def iteration(kind: str) -> float:
        assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--cp", "2",
                     "--pp", "2", "--microbatches", "4", "--cp-comm-type", kind, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["iteration_time_ms"]

    assert iteration("all_gather") > iteration("p2p")


def test_a_window_beside_context_parallelism_needs_a_gather_or_ulysses() -> None:
    with pytest.raises(UserError) as err:
        cfg("p2p", attention_window=1024)
    assert err.value.field == "model.attention_window"
    assert "cp_comm_type='p2p'" in str(err.value)


@pytest.mark.parametrize("kind", ["a2a", "all_gather"])
def test_a_windows_saving_is_shared_by_the_context_parallel_ranks(kind: str) -> None:
    """Each rank attends over 1 / cp of the whole sequence's windowed work: what the window
    saves a layer at cp 2 is half what it saves at cp 1 (the traffic is the same with or
    without it, and the core's time is its FLOPs at this size)."""
    def saved(cp: int) -> tuple[float, float]:
        full, windowed = (model_costs(config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": 2, "tp": 1, "cp": cp,
                      "seq_length": 16384, "cp_comm_type": kind, **window},
            "pipeline": {"pp": 1, "microbatches": 2},
            "hardware": {"preset": "h100-80gb"}})).layers[0]
            for window in ({}, {"attention_window": 1024}))
        return (full.forward_ms - windowed.forward_ms,
                full.backward_ms - windowed.backward_ms)

    (f1, b1), (f2, b2) = saved(1), saved(2)
    assert f1 > 0 and b1 > 0
    assert f2 == pytest.approx(f1 / 2, rel=1e-6) and b2 == pytest.approx(b1 / 2, rel=1e-6)
