"""Hierarchical context parallelism (--cp-comm-type a2a+p2p with
--hierarchical-context-parallel-sizes A B): Transformer Engine's all-to-all over A
consecutive ranks of the cp group, then the K/V ring over the B groups of them. ppsim
refused it by name before. Expected values restated from the shapes and the h100-80gb
preset's links: NVLink 450 GB/s and 1 µs a step inside a node, a 50 GB/s NIC and 5 µs a
step across; llama3-8b (32 query heads, 8 key/value heads of 128) at tp 2, cp 8: the cp
group's ranks 0, 2, ..., 14 put four on each of two nodes."""

from __future__ import annotations

import json

import pytest
from helpers import cp_layer_traffic
from helpers import run_main as _run

from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job.model import build_job
from ppsim.job.shapes import Shape, cp_comm_choices

NV, NV_STEP, NIC, NIC_STEP = 450e6, 1e-3, 50e6, 5e-3  # bytes per ms, ms a step
SEQ, TP, CP, A2A = 8192, 2, 8, 4
LOCAL = SEQ // CP  # a rank's tokens
Q, KV = 4096 // TP, 1024 // TP  # a tensor rank's query and key/value widths


def cfg(kind: str, a2a: int = 0, **model):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "tp": TP,
                                       "cp": CP, "dp": 1, "seq_length": SEQ,
                                       "cp_comm_type": kind, "cp_a2a_size": a2a,
                                       "recompute": "none", **model},
                             "pipeline": {"pp": 1, "microbatches": 2},
                             "hardware": {"preset": "h100-80gb"}})


def traffic(kind: str, a2a: int = 0) -> tuple[float, float, float, float]:
    """(forward total, forward exposed, backward total, backward exposed) ms."""
    return cp_layer_traffic(cfg(kind, a2a))


def test_the_all_to_all_inside_a_node_and_the_ring_across() -> None:
    kv = LOCAL * 2 * KV * 2  # a rank's K and V, bf16: the same bytes after the all-to-all
    ring_f, ring_b = NIC_STEP + kv / NIC, NIC_STEP + 2 * kv / NIC  # a pass across nodes

    def a2a(nbytes: float) -> float:  # over A2A ranks of one node
        return (A2A - 1) * NV_STEP + nbytes * (A2A - 1) / A2A / NV

    exchange = a2a(LOCAL * (Q + 2 * KV) * 2) + a2a(LOCAL * Q * 2)
    # The plain ring over all 8 crosses nodes each pass, hidden by one chunk's core: what
    # it leaves exposed gives that core's time (both directions leave some here).
    f, fe, b, be = traffic("p2p")
    assert f == pytest.approx(7 * ring_f) and b == pytest.approx(7 * ring_b)
    core_f, core_b = ring_f - fe / 7, ring_b - be / 7
    assert 0 < core_f < ring_f and 0 < core_b < ring_b
    # Hierarchical: the exchange, exposed, then one pass between the two nodes, hidden by
    # four chunks' core (each rank holds 4x the tokens for a quarter of the heads).
    hf, hfe, hb, hbe = traffic("a2a+p2p", A2A)
    assert hf == pytest.approx(exchange + ring_f) and hb == pytest.approx(exchange + ring_b)
    assert hfe == pytest.approx(exchange + max(0.0, ring_f - A2A * core_f))
    assert hbe == pytest.approx(exchange + max(0.0, ring_b - A2A * core_b))
    assert hfe < fe and hbe < be  # fewer passes, each better hidden


@pytest.mark.parametrize("model, field, words", [
    ({"cp_comm_type": "a2a+p2p"}, "model.cp_a2a_size",
     "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used"),
    ({"cp_comm_type": "a2a+p2p", "cp_a2a_size": 3}, "model.cp_a2a_size", "does not divide"),
    ({"cp_comm_type": "a2a+p2p", "cp_a2a_size": 8}, "model.cp_comm_type",
     "num_heads_kv = 4, cp_size = 8"),
    ({"cp_comm_type": "p2p", "cp_a2a_size": 2}, "model.cp_a2a_size", "and it is p2p"),
    ({"cp_comm_type": "a2a+p2p", "cp_a2a_size": 2, "attention_window": 1024},
     "model.attention_window", "cp_comm_type='a2a+p2p'"),
])
def test_megatrons_and_transformer_engines_checks(model: dict, field: str, words: str) -> None:
    with pytest.raises(UserError) as err:
        build_job(config_from_dict({"model": {"preset": "llama3-8b", "tp": TP, "cp": CP,
                                              "seq_length": SEQ, **model},
                                    "hardware": {"preset": "h100-80gb"}}))
    assert err.value.field == field and words in str(err.value)


def test_megatrons_flags_read_and_come_back() -> None:
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2",
            "--cp", "8", "--pp", "1", "--seq-length", "32768", "--gpus", "16", "--cp-comm-type",
            "a2a+p2p"]
    code, out, err = _run([*base, "--hierarchical-context-parallel-sizes", "4", "2",
                           "--json"])
    assert code == 0, err
    assert json.loads(out)["job"]["cp_comm_type"] == "a2a+p2p"
    args = megatron_model_args(cfg("a2a+p2p", A2A).model.arch)
    i = args.index("--hierarchical-context-parallel-sizes")
    assert args[i + 1:i + 3] == ["4", "2"]
    code, _, err = _run([*base, "--hierarchical-context-parallel-sizes", "4", "4"])
    assert code == 2 and "4 x 4 is not --context-parallel-size (8)" in err
    code, _, err = _run([*base, "--hierarchical-context-parallel-sizes", "2", "2", "2"])
    assert code == 2 and "a2a+p2p takes two sizes" in err


def test_the_job_search_tries_it_where_the_cp_group_spans_nodes() -> None:
    a = cfg("p2p").model.arch
    shape = Shape(tp=TP, cp=CP, ep=1, pp=1, dp=1, vpp=1, mbs=1, microbatches=1)
    kinds = [(s.cp_comm, s.cp_a2a) for s in cp_comm_choices(shape, a, 8)]
    # Ulysses over 8 would split 4 key/value heads eight ways: not offered.
    assert kinds == [("p2p", 0), ("all_gather", 0), ("a2a+p2p", 4)]
    assert cp_comm_choices(shape, a, 8)[2].label().endswith(" cp-a2a+p2p/4")
    # Inside one node there is nothing to split.
    assert [s.cp_comm for s in cp_comm_choices(shape, a, 16)] == ["p2p", "all_gather"]


def test_its_ends_are_the_ring_and_ulysses() -> None:
    """An all-to-all over one rank leaves the plain ring; over the whole group (cp x 1,
    no ring left), Ulysses' all-to-alls: a2a+p2p spans the two. (Ulysses over 8 cannot
    split the 4 key/value heads of a tensor rank at tp 2: tp 1, cp 4 tests that end.)"""
    assert traffic("a2a+p2p", 1) == pytest.approx(traffic("p2p"))

    def at(kind: str, size: int = 0) -> tuple[float, float, float, float]:
        return cp_layer_traffic(config_from_dict({
            "model": {"preset": "llama3-8b", "num_layers": 4, "tp": 1, "cp": 4, "dp": 1,
                      "seq_length": SEQ, "cp_comm_type": kind, "cp_a2a_size": size,
                      "recompute": "none"},
            "pipeline": {"pp": 1, "microbatches": 2}, "hardware": {"preset": "h100-80gb"}}))

    assert at("a2a+p2p", 4) == pytest.approx(at("a2a"))
    assert at("a2a+p2p", 1) == pytest.approx(at("p2p"))


@pytest.mark.parametrize("kind, sizes", [(None, ["4", "2"]), ("all_gather", ["2", "2", "2"])])
def test_megatron_forms_the_groups_beside_any_type_and_only_a2a_p2p_uses_them(
        kind: str | None, sizes: list[str]) -> None:
    """Megatron asserts only that the sizes multiply to cp (arguments.py) and builds the
    groups for every type; TE's a2a+p2p alone reads them. Beside another type the line
    runs as it does without them."""
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2",
            "--cp", "8", "--pp", "1", "--seq-length", "32768", "--gpus", "16", "--json",
            *(["--cp-comm-type", kind] if kind else [])]
    code, out, err = _run([*base, "--hierarchical-context-parallel-sizes", *sizes])
    assert code == 0, err
    code, alone, err = _run(base)
    assert code == 0, err
    assert json.loads(out)["iteration_time_ms"] == json.loads(alone)["iteration_time_ms"]
    assert json.loads(out)["job"]["cp_comm_type"] == (kind or "p2p")
    code, _, err = _run([*base, "--hierarchical-context-parallel-sizes", "2", "2"])
    assert code == 2 and "2 x 2 is not --context-parallel-size (8)" in err
