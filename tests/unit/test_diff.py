"""ppsim diff: exact on known perturbations, antisymmetric, strict about bad traces."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
from helpers import uniform_problem

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.schedules.torchcsv import to_torch_csv
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import diff_traces
from ppsim.trace.read import trace_from_json
from ppsim.trace.schema import simulation_trace


@pytest.fixture
def sim_doc():
    # Integer costs: every timestamp is an exact number of microseconds.
    problem = uniform_problem(2, 1, 4, "1f1b", counts=[3, 2], f=1.0, b=2.0, act=10, static=5)
    return simulation_trace(simulate(problem))


def compute_events(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") == "compute"]


def as_trace(doc, name):
    return trace_from_json(copy.deepcopy(doc), name)


def test_self_diff_is_zero_everywhere(sim_doc):
    d = diff_traces(as_trace(sim_doc, "a"), as_trace(sim_doc, "b")).to_dict()
    assert d["iteration_time_delta_ms"] == 0 and d["iteration_time_error"] == 0
    assert d["ops_matched"] == len(compute_events(sim_doc)) and d["ops_only_in"] == [0, 0]
    for r in d["ranks"]:
        assert r["busy_delta_ms"] == 0 and r["final_start_drift_ms"] == 0
        assert r["peak_memory_bytes"][0] == r["peak_memory_bytes"][1]
    for e in d["duration_error"].values():
        assert e["median"] == 0 and e["max"] == 0
    assert not d["critical_path_changed"]
    assert d["largest_divergences"] == []  # no op's duration differs


def test_a_self_diff_lists_no_divergence(sim_doc, tmp_path, capsys):
    a = write(tmp_path, "a.json", sim_doc)
    assert main(["diff", a, a]) == 0
    assert "largest divergences" not in capsys.readouterr().out


def test_scaling_one_op_is_reported_exactly(sim_doc):
    other = copy.deepcopy(sim_doc)
    ev = next(e for e in compute_events(other) if e["args"]["kind"] == "B"
              and e["pid"] == 0 and e["args"]["microbatch"] == 1)
    before = ev["dur"]
    ev["dur"] = before * 1.5
    d = diff_traces(as_trace(sim_doc, "a"), as_trace(other, "b")).to_dict()
    top = d["largest_divergences"][0]
    assert (top["rank"], top["kind"], top["microbatch"]) == (0, "B", 1)
    assert top["duration_delta_ms"] == before * 0.5 / 1e3
    assert len(d["largest_divergences"]) == 1  # the one op whose duration differs
    assert d["duration_error"]["B"]["max"] == 0.5
    assert d["duration_error"]["F"]["max"] == 0
    assert d["ranks"][0]["busy_delta_ms"] == before * 0.5 / 1e3


def test_shifting_the_last_op_moves_drift_and_iteration_time(sim_doc):
    other = copy.deepcopy(sim_doc)
    last = max(compute_events(other), key=lambda e: e["ts"] + e["dur"])
    last["ts"] += 2000.0  # 2 ms later
    d = diff_traces(as_trace(sim_doc, "a"), as_trace(other, "b")).to_dict()
    assert d["iteration_time_delta_ms"] == 2.0
    assert d["ranks"][last["pid"]]["final_start_drift_ms"] == 2.0
    assert all(e["max"] == 0 for e in d["duration_error"].values())


def test_swapping_negates_signed_differences(sim_doc):
    other = copy.deepcopy(sim_doc)
    for e in compute_events(other):
        if e["args"]["kind"] == "F":
            e["dur"] *= 1.25
    a, b = as_trace(sim_doc, "a"), as_trace(other, "b")
    ab, ba = diff_traces(a, b).to_dict(), diff_traces(b, a).to_dict()
    assert ab["iteration_time_delta_ms"] == -ba["iteration_time_delta_ms"]
    for ra, rb in zip(ab["ranks"], ba["ranks"], strict=True):
        assert ra["busy_delta_ms"] == -rb["busy_delta_ms"]
        assert ra["bubble_delta"] == -rb["bubble_delta"]
    assert ab["duration_error"]["F"]["median_delta_ms"] == \
        -ba["duration_error"]["F"]["median_delta_ms"]


def write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_cli_json_and_png(sim_doc, tmp_path, capsys):
    a = write(tmp_path, "a.json", sim_doc)
    png = tmp_path / "d.png"
    assert main(["diff", a, a, "--json", "--png", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["iteration_time_error"] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_truncated_and_mismatched_traces_exit_2(sim_doc, tmp_path, capsys):
    good = write(tmp_path, "good.json", sim_doc)
    text = json.dumps(sim_doc)
    trunc = tmp_path / "trunc.json"
    trunc.write_text(text[: len(text) // 2])
    notrace = write(tmp_path, "nothing.json", {"hello": 1})
    badev = copy.deepcopy(sim_doc)
    del compute_events(badev)[0]["args"]["microbatch"]
    bad = write(tmp_path, "badev.json", badev)
    other = copy.deepcopy(sim_doc)
    other["otherData"]["microbatches"] = 8
    mism = write(tmp_path, "mism.json", other)
    other_pp = copy.deepcopy(sim_doc)
    other_pp["otherData"]["pp"] = 4
    mism_pp = write(tmp_path, "mismpp.json", other_pp)
    for path, words in ((str(trunc), "truncated"), (notrace, "traceEvents"),
                        (bad, "microbatch"), (mism, "microbatches"), (mism_pp, "pp"),
                        (str(tmp_path / "missing.json"), "cannot read")):
        assert main(["diff", good, path]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_default_iteration_is_the_median_steady_one(sim_doc):
    # Three recorded iterations after one warm-up: lengths T, 3T (a hiccup), 2T.
    doc = copy.deepcopy(sim_doc)
    base = compute_events(doc)
    events = [e for e in doc["traceEvents"] if e.get("cat") != "compute"]
    length = max(e["ts"] + e["dur"] for e in base)
    offset = 0.0
    for it, stretch in enumerate((5.0, 1.0, 3.0, 2.0)):  # iteration 0 is warm-up
        for e in base:
            ev = copy.deepcopy(e)
            ev["ts"] = offset + e["ts"] * stretch
            ev["dur"] = e["dur"] * stretch
            ev["args"]["iteration"] = it
            events.append(ev)
        offset += length * stretch + 1000.0
    doc["traceEvents"] = events
    doc["otherData"]["warmup_iterations"] = 1
    real = as_trace(doc, "real")
    d = diff_traces(as_trace(sim_doc, "sim"), real).to_dict()
    assert d["iterations"] == [0, 3]  # lengths 1x, 3x, 2x: the median is iteration 3
    assert d["iteration_time_ms"][1] == pytest.approx(2 * d["iteration_time_ms"][0])
    assert diff_traces(as_trace(sim_doc, "sim"), real, iteration=2).to_dict()[
        "iterations"] == [0, 2]


def test_iterations_are_compared_whole_start_to_next_start(sim_doc):
    """A real iteration runs to the next one's first op; the last one adds the median gap;
    a simulated one adds the boundary the profile measured."""
    doc = copy.deepcopy(sim_doc)
    base = compute_events(doc)
    events = [e for e in doc["traceEvents"] if e.get("cat") != "compute"]
    length = max(e["ts"] + e["dur"] for e in base)
    starts = (0.0, length + 1500.0, 2 * length + 4000.0)  # gaps of 1.5 and 2.5 ms
    for it, start in enumerate(starts):
        for e in base:
            ev = copy.deepcopy(e)
            ev["ts"] = e["ts"] + start
            ev["args"]["iteration"] = it
            events.append(ev)
    doc["traceEvents"] = events
    doc["otherData"].update(source="executor", iterations=3)
    real = as_trace(doc, "real")
    t = length / 1e3
    for it, want in ((0, t + 1.5), (1, t + 2.5), (2, t + 2.0)):  # last: the median gap
        d = diff_traces(as_trace(sim_doc, "sim"), real, iteration=it).to_dict()
        assert d["iteration_time_ms"][1] == pytest.approx(want)
    sim = copy.deepcopy(sim_doc)
    sim["otherData"]["iteration_boundary_ms"] = 0.75
    d = diff_traces(as_trace(sim, "sim"), real, iteration=0).to_dict()
    assert d["iteration_time_ms"][0] == pytest.approx(t + 0.75)


def test_alternated_run_ends_each_iteration_where_the_other_split_began(sim_doc):
    """A trace from `ppsim run --versus` carries each iteration's whole length (until the
    other split's iteration started), and diff uses it instead of start to next start."""
    from ppsim.executor.summary import alternated_wholes

    a = {0: (0.0, 900.0), 1: (3000.0, 3900.0)}
    b = {0: (1000.0, 2500.0), 1: (4100.0, 5600.0)}
    wa, wb = alternated_wholes(a, b)
    assert wa == [1.0, 1.1] and wb == [2.0, None]  # b's last: nothing followed it
    doc = copy.deepcopy(sim_doc)
    base = compute_events(doc)
    events = [e for e in doc["traceEvents"] if e.get("cat") != "compute"]
    length = max(e["ts"] + e["dur"] for e in base)
    for it in range(2):
        for e in base:
            ev = copy.deepcopy(e)
            ev["ts"] = e["ts"] + it * 10 * length  # another split ran in between
            ev["args"]["iteration"] = it
            events.append(ev)
    doc["traceEvents"] = events
    t = length / 1e3
    doc["otherData"].update(source="executor", iterations=2,
                            whole_iteration_ms=[t + 0.5, t + 0.25])
    real = as_trace(doc, "real")
    for it, want in ((0, t + 0.5), (1, t + 0.25)):
        d = diff_traces(as_trace(sim_doc, "sim"), real, iteration=it).to_dict()
        assert d["iteration_time_ms"][1] == pytest.approx(want)
    doc["otherData"]["whole_iteration_ms"] = [t + 0.5, None]  # the last: the median gap
    d = diff_traces(as_trace(sim_doc, "sim"), as_trace(doc, "real"), iteration=1).to_dict()
    assert d["iteration_time_ms"][1] == pytest.approx(t + 0.5)


def test_the_diff_picture_draws_each_ranks_step(tmp_path, capsys):
    """The recorded run's optimizer step (S) closes each rank's lane in both panels; before,
    the picture stopped at the last F or B, short of the iteration its title gives."""
    from pathlib import Path

    from PIL import Image

    from ppsim.cli.picture import COLOURS

    run = Path(__file__).parents[2] / "traces" / "1f1b-5-3-m8"
    png = tmp_path / "d.png"
    assert main(["diff", str(run / "sim.json"), str(run / "real.json"), "--png",
                 str(png)]) == 0
    capsys.readouterr()
    colours = {c: n for n, c in Image.open(png).convert("RGB").getcolors(1 << 20)}
    assert colours.get(COLOURS["S"], 0) > 0


def test_a_training_log_given_as_a_trace_is_named_as_not_one(sim_doc, tmp_path, capsys):
    # Megatron's log lines open with "[2026-07-10 ...": a JSON array whose first element
    # reads as a number, so it used to be "event 0 is not an object (fix or re-record)".
    good = write(tmp_path, "good.json", sim_doc)
    log = tmp_path / "train.log"
    log.write_text(" [2026-07-10 10:00:00] iteration        2/     100 | elapsed time per "
                   "iteration (ms): 7250.3 | throughput per GPU (TFLOP/s/GPU): 465.1 |\n")
    assert main(["diff", good, str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a Chrome trace" in err
    assert "ppsim simulate --compare-log" in err


def test_a_gzipped_trace_reads_as_its_json_and_a_cut_one_exits_2(sim_doc, tmp_path, capsys):
    # torch's profiler and Perfetto write traces as .json.gz
    plain = write(tmp_path, "a.json", sim_doc)
    packed = tmp_path / "a.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(sim_doc).encode()))
    assert main(["diff", plain, str(packed), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    ends = [e["ts"] + e["dur"] for e in compute_events(sim_doc)]
    assert d["iteration_time_ms"][1] >= max(ends) / 1e3
    assert d["iteration_time_ms"][0] == d["iteration_time_ms"][1]
    assert d["ops_matched"] == len(compute_events(sim_doc)) and d["ops_only_in"] == [0, 0]
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed.read_bytes()[:-20])
    assert main(["diff", plain, str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a whole gzip file" in err and str(cut) in err


def test_a_gzipped_trace_is_held_to_the_limit_once_uncompressed(sim_doc, tmp_path, capsys,
                                                                 monkeypatch):
    from ppsim.config import files

    text = json.dumps(sim_doc).encode()
    packed = tmp_path / "big.json.gz"
    packed.write_bytes(gzip.compress(text))
    monkeypatch.setattr(files, "MAX_TRACE_BYTES", len(text) - 1)
    assert packed.stat().st_size < len(text) - 1
    assert main(["diff", str(packed), str(packed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "above the limit" in err


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without(sim_doc, tmp_path, capsys):
    # an editor's or PowerShell's "UTF-8" puts EF BB BF first
    plain = write(tmp_path, "a.json", sim_doc)
    marked = tmp_path / "bom.json"
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps(sim_doc).encode())
    assert main(["diff", plain, str(marked), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ops_matched"] == len(compute_events(sim_doc)) and d["iteration_time_error"] == 0


@pytest.mark.parametrize("renumber", [lambda m: m + 1, lambda m: 9 if m == 3 else m],
                         ids=["shifted", "gap"])
def test_microbatches_numbered_differently_are_named_not_counted(sim_doc, tmp_path, capsys,
                                                                 renumber):
    """As many microbatches on both sides, numbered apart: the error names the numbers
    each trace alone holds, not two equal counts."""
    other = copy.deepcopy(sim_doc)
    for e in compute_events(other):
        if e["args"]["microbatch"] >= 0:
            e["args"]["microbatch"] = renumber(e["args"]["microbatch"])
    a, b = write(tmp_path, "a.json", sim_doc), write(tmp_path, "b.json", other)
    mine = {e["args"]["microbatch"] for e in compute_events(sim_doc)} - {-1}
    theirs = {e["args"]["microbatch"] for e in compute_events(other)} - {-1}
    assert len(mine) == len(theirs) and mine != theirs
    assert main(["diff", a, b]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for m in mine - theirs:
        assert f"{m} only in {a}" in err
    for m in theirs - mine:
        assert f"{m} only in {b}" in err


def csv_trace(tmp_path, generator):
    """The simulated trace of `generator`'s order at pp 2 x vpp 2, read from a torch
    schedule CSV (so named "csv" whatever its placement)."""
    path = tmp_path / f"{generator}.csv"
    path.write_text(to_torch_csv(uniform_problem(2, 2, 4, generator).schedule))
    model = {"kind": "uniform", "num_layers": 4, "forward_ms": 1.0, "backward_ms": 2.0,
             "weight_grad_ms": 0.5, "activation_bytes": 100, "output_bytes": 10,
             "static_bytes": 1000}
    cfg = config_from_dict({"model": model, "hardware": {"memory_bytes": 1e15},
                            "pipeline": {"pp": 2, "vpp": 2, "microbatches": 4,
                                         "actions_csv": str(path)}})
    return simulation_trace(simulate(build_problem(cfg)))


def test_loop_and_v_placed_orders_of_one_name_are_refused_naming_both(tmp_path, capsys):
    """A rank's second chunk is stage 2 under loop placement and stage 3 under V: its ops
    would be matched across stages."""
    loop, v = csv_trace(tmp_path, "interleaved-1f1b"), csv_trace(tmp_path, "zbv")
    assert loop["otherData"]["schedule"] == v["otherData"]["schedule"]
    assert (loop["otherData"]["placement"], v["otherData"]["placement"]) == ("loop", "v")
    a, b = write(tmp_path, "loop.json", loop), write(tmp_path, "v.json", v)
    assert main(["diff", a, b]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"loop in {a}" in err and f"v in {b}" in err
    assert main(["diff", b, b, "--json"]) == 0  # one placement on both sides diffs
    capsys.readouterr()


def test_traces_of_other_ranks_are_named_as_runs_of_ranks(sim_doc, tmp_path, capsys):
    # 64 ranks against 2 listed every rank of both on the error's one line.
    wide = simulation_trace(simulate(uniform_problem(64, 1, 4, "1f1b", f=1.0, b=2.0)))
    for doc in (sim_doc, wide):
        doc["otherData"].pop("pp")  # the ranks alone tell the traces apart
    a, b = write(tmp_path, "a.json", sim_doc), write(tmp_path, "b.json", wide)
    assert main(["diff", a, b]) == 2
    err = capsys.readouterr().err
    assert f"0-1 in {a}, 0-63 in {b}" in err and err.count("\n") == 1, err
