"""The tensor-, context- and expert-parallel collectives a profile timed bare (a cost
file's "collectives") price those groups' collectives in the simulation: each kind timed
by its measured time, each kind not timed by its closed form, counted as Megatron makes
them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.costs.costfile import check_model, read_cost_file
from ppsim.costs.grouptimes import GroupTimes, TimedCollective, TimedGroup, in_layer_times
from ppsim.errors import UserError
from ppsim.job.collectives import (
    Link,
    all_gather_ms,
    all_reduce_ms,
    all_to_all_ms,
    reduce_scatter_ms,
    send_ms,
)

FIELDS = load_config(None).model.fields()
PRICED = {"all_reduce": all_reduce_ms, "all_gather": all_gather_ms,
          "reduce_scatter": reduce_scatter_ms, "all_to_all": all_to_all_ms, "send": send_ms}


@given(st.integers(2, 64), st.sets(st.sampled_from(sorted(PRICED))),
       st.floats(0.0, 50.0), st.floats(0.0, 1e9))
def test_a_kind_timed_is_priced_by_its_line_and_the_rest_by_their_closed_forms(
        size: int, kinds: set[str], ms: float, nbytes: float) -> None:
    line = TimedCollective(fixed_ms=ms, gbps=0.0)
    plain = Link(size=size, bus_bandwidth_gbps=50.0, latency_ms=0.01, per_node=size,
                 intra_bandwidth_gbps=50.0, inter_bandwidth_gbps=50.0)
    timed = replace(plain, timed=GroupTimes(size=size, **{k: line for k in kinds}))
    for kind, priced in PRICED.items():
        want = ms if kind in kinds else priced(nbytes, plain)
        assert priced(nbytes, timed) == pytest.approx(want)


def _timed_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str], collectives: dict,
                 *args: str) -> Path:
    assert main(["costs", "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    doc["collectives"] = collectives
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    return path


def _first_spans(trace: Path) -> dict[tuple[int, str], float]:
    """The first microbatch's collective wait per (pipeline rank, op kind)."""
    out: dict[tuple[int, str], float] = {}
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e.get("cat") == "collective":
            out.setdefault((e["pid"], e["args"]["op"]), e["args"]["exposed_ms"])
    return out


def test_simulated_tensor_parallel_waits_are_the_profiles_times_megatrons_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With sequence parallelism each sublayer (attention, MLP) gathers the sequence before
    it and reduce-scatters after it, the mirror in the backward (Korthikanti et al.
    2022, fig. 5), where Megatron's column-parallel linears gather their input again for
    the weight gradient; the embedding with learned positions all-reduces its lookup,
    gathered back in the backward; the head gathers its input, and in the backward
    reduce-scatters its gradient and gathers its input again."""
    shape = ["--tp", "2", "--pp", "2", "--split", "5,3", "--microbatches", "4"]
    ar, ag, rs = 0.5, 0.25, 1.0
    costs = _timed_costs(tmp_path, capsys, {"tp": 2, "bytes": 32768, "all_reduce_ms": ar,
                                            "all_gather_ms": ag, "reduce_scatter_ms": rs},
                         *shape)
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--costs", str(costs), *shape, "--trace", str(trace)]) == 0
    # collectives timed by ppsim profile are the executor's, whose gloo collectives
    # block: the backward waits for its gathers of the inputs again and the inputs'
    # gradients' scatters whole, as the executor's runs do (no GEMM hides them)
    layer, back = 2 * ag + 2 * rs, 4 * ag + 2 * rs
    assert _first_spans(trace) == pytest.approx({
        (0, "F"): 5 * layer + ar, (0, "B"): 5 * back + ag,
        (1, "F"): 3 * layer + ag, (1, "B"): 3 * back + rs + ag})


def test_without_timed_collectives_the_links_price_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shape = ["--tp", "2", "--pp", "2", "--split", "5,3", "--microbatches", "4"]
    costs = _timed_costs(tmp_path, capsys, {"tp": 2, "bytes": 32768, "all_reduce_ms": 10.0,
                                            "all_gather_ms": 10.0, "reduce_scatter_ms": 10.0},
                         *shape)
    timed, plain = tmp_path / "timed.json", tmp_path / "plain.json"
    assert main(["simulate", "--costs", str(costs), *shape, "--trace", str(timed)]) == 0
    doc = json.loads(costs.read_text())
    del doc["collectives"]
    costs.write_text(json.dumps(doc))
    assert main(["simulate", "--costs", str(costs), *shape, "--trace", str(plain)]) == 0
    got, link = _first_spans(timed), _first_spans(plain)
    assert set(got) == set(link) and all(got[k] > 10 * link[k] for k in got), (got, link)


def test_the_hierarchical_form_times_its_all_to_all_and_its_ring_apart() -> None:
    got = in_layer_times("f", {"cp": 4, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 2,
                               "cp_bytes": 100, "cp_all_to_all_ms": 1.5, "cp_pass_ms": 0.5})
    assert set(got) == {
        TimedGroup(group="cp_a2a", times=GroupTimes(
            size=2, all_to_all=TimedCollective(fixed_ms=1.5, gbps=0.0))),
        TimedGroup(group="cp_p2p", times=GroupTimes(
            size=2, send=TimedCollective(fixed_ms=0.5, gbps=0.0)))}
    # without the all-to-all's size the file cannot say which groups it timed
    assert in_layer_times("f", {"cp": 4, "cp_comm_type": "a2a+p2p", "cp_bytes": 100,
                                "cp_pass_ms": 0.5}) == ()
    # a group of one has no collectives to price
    assert in_layer_times("f", {"tp": 1, "bytes": 8, "all_reduce_ms": 1.0}) == ()


@pytest.mark.parametrize(("raw", "field"), [
    ([1], "collectives"),
    ({"tp": 2, "bytes": 8, "all_reduce_ms": -1.0}, "collectives.all_reduce_ms"),
    ({"tp": 2, "bytes": "8", "all_gather_ms": 1.0}, "collectives.bytes"),
    ({"tp": 0, "bytes": 8, "all_gather_ms": 1.0}, "collectives.tp"),
    ({"ep": 2, "all_to_all_ms": 1.0}, "collectives.all_to_all_bytes"),
    ({"cp": 2.0, "cp_bytes": 8, "cp_pass_ms": 1.0}, "collectives.cp"),
    ({"cp": 4, "cp_comm_type": "a2a+p2p", "cp_a2a_size": True, "cp_bytes": 8,
      "cp_pass_ms": 1.0}, "collectives.cp_a2a_size"),
])
def test_a_bad_collectives_entry_names_its_field(raw: object, field: str) -> None:
    with pytest.raises(UserError) as err:
        in_layer_times("f.json", raw)
    assert err.value.field == f"f.json: {field}"


def test_a_hierarchical_file_holds_for_its_all_to_all_size_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layers measured with all-to-alls over 2 of cp 4's ranks do not price groups of 4."""
    model = {**FIELDS, "cp": 4, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 2}
    assert main(["costs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    doc["model"] = model
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    cf = read_cost_file(str(path))
    check_model(cf, model)
    with pytest.raises(UserError, match="measured with cp_a2a_size = 2 but the config has 4"):
        check_model(cf, {**model, "cp_a2a_size": 4})


def test_calibrating_keeps_the_timed_collectives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace refits the ops' compute, not the bare collectives: the file calibrate
    writes keeps them, and they price its simulation as the base file's did."""
    shape = ["--tp", "2", "--pp", "2", "--split", "5,3", "--microbatches", "4"]
    timed = {"tp": 2, "bytes": 32768, "all_reduce_ms": 0.5, "all_gather_ms": 0.25,
             "reduce_scatter_ms": 1.0}
    base = _timed_costs(tmp_path, capsys, timed, *shape)
    trace, fitted = tmp_path / "sim.json", tmp_path / "fitted.json"
    assert main(["simulate", "--costs", str(base), *shape, "--trace", str(trace)]) == 0
    assert main(["calibrate", str(trace), "--costs", str(base), *shape,
                 "--out", str(fitted)]) == 0
    assert json.loads(fitted.read_text())["collectives"] == timed
    again = tmp_path / "again.json"
    assert main(["simulate", "--costs", str(fitted), *shape, "--trace", str(again)]) == 0
    assert _first_spans(again) == _first_spans(trace)
