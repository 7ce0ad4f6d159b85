"""Issue 27, defects 2, 4 and 8: readers bounded before they parse, models that cannot
exist refused, and a builder loaded only by a command that runs it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ppsim.cli.main import main
from ppsim.costs.costfile import cost_document
from ppsim.errors import UserError
from ppsim.pipeline.problem import model_costs
from ppsim.schedules.torchcsv import MAX_CSV_CELLS, load_actions_csv, parse_actions_csv

TINY = '[model]\npreset = "tiny-gpt"\n'
MIXTRAL = '[model]\npreset = "mixtral-8x7b"\n'


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    t0 = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert time.monotonic() - t0 < 30
    return err


def _file(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ------------------------------------------------------------------ defect 8: the model

IMPOSSIBLE = [
    (MIXTRAL + "top_k = 9\n", "model.top_k"),
    (MIXTRAL + "ep = 3\n", "model.ep"),
    (TINY + "ep = 2\n", "num_experts is not set"),
    (TINY + "tp = 1000000\n", "model.tp"),
    (TINY + "tp = 3\n", "num_heads"),
    (TINY + "num_heads = 4\nnum_kv_heads = 3\n", "model.num_kv_heads"),
    (TINY + "[hardware]\npeak_tflops = 1e-300\n", "hardware.peak_tflops"),
    (TINY + "[hardware]\npeak_tflops = 1e8\n", "hardware.peak_tflops"),
    (TINY + "[hardware]\np2p_bandwidth_gbps = 1e-300\n", "floor of 0.001"),
    (TINY + "[hardware]\nmemory_bandwidth_gbps = 1e-300\n", "hardware.memory_bandwidth"),
    (TINY + "[hardware]\nintra_node_bandwidth_gbps = 1e-300\n", "hardware.intra_node_band"),
    (TINY + "[hardware]\ninter_node_bandwidth_gbps = 1e-300\n", "hardware.inter_node_band"),
    (TINY + "[hardware]\nhost_link_gbps = 1e-300\n", "hardware.host_link_gbps"),
    (TINY + "[hardware]\ninter_node_latency_us = 1e300\n", "hardware.inter_node_latency"),
    (TINY + "[hardware]\np2p_bandwidth_gbps = 1e7\n", "100000"),
    (TINY + "[placement]\ninter_node_bandwidth_gbps = 1e-12\n", "placement.inter_node"),
    (TINY + "mtp_layers = 10000000\n", "model.mtp_layers"),
]


@pytest.mark.parametrize("text, words", IMPOSSIBLE, ids=range(len(IMPOSSIBLE)))
def test_an_impossible_model_or_machine_is_refused(tmp_path, capsys, text, words) -> None:
    _refused(capsys, ["simulate", "--config", _file(tmp_path, "c.toml", text)], words)


def test_tp_flag_is_checked_against_the_heads(capsys) -> None:
    _refused(capsys, ["simulate", "--tp", "3"], "model.tp", "num_heads = 4")


@pytest.mark.parametrize("argv", [["costs"], ["plan", "--time-budget", "10"],
                                  ["run", "--print-launch"]])
def test_mtp_layers_count_against_the_layer_cap_everywhere(tmp_path, capsys, argv) -> None:
    cfg = _file(tmp_path, "c.toml", TINY + "mtp_layers = 10000000\n")
    _refused(capsys, [*argv, "--config", cfg], "model.mtp_layers", "100,000")


MISTYPED = [
    (TINY + 'num_layers = "x"\n', "model.num_layers", "write a whole number"),
    (TINY + "[hardware]\nmemory_bytes = \"80GB\"\n", "hardware.memory_bytes", "write a number"),
    (TINY + "gated_mlp = 1\n", "model.gated_mlp", "write true or false"),
]


@pytest.mark.parametrize("text, field, fix", MISTYPED, ids=range(len(MISTYPED)))
def test_a_mistyped_field_names_the_kind_in_words(tmp_path, capsys, text, field, fix) -> None:
    err = _refused(capsys, ["simulate", "--config", _file(tmp_path, "c.toml", text)], field, fix)
    assert "write a int" not in err and "write a float" not in err


def test_a_plausible_floor_and_zero_still_pass(tmp_path, capsys) -> None:
    text = TINY + "[hardware]\npeak_tflops = 0.001\np2p_bandwidth_gbps = 0\n"
    assert main(["simulate", "--config", _file(tmp_path, "c.toml", text), "--json"]) == 0


def _costs(tmp_path: Path, change) -> str:
    doc = cost_document(model_costs(_tiny()), source="hand", model=None,
                        p2p={"latency_ms": 0.1, "bandwidth_gbps": 1.0})
    doc["conditions"] = {"devices": [0, 0], "optimizer": {"fixed_ms": 0.1, "gbps": 1.0}}
    change(doc)
    return _file(tmp_path, "costs.json", json.dumps(doc))


def _tiny():
    from ppsim.config.schema import load_config

    return load_config(None)


@pytest.mark.parametrize("change, words", [
    (lambda d: d["conditions"]["optimizer"].update(gbps=1e-300), "conditions.optimizer.gbps"),
    (lambda d: d["conditions"].update(devices=[10**30, 0]), "conditions.devices[0]"),
    (lambda d: d["p2p"].update(bandwidth_gbps=1e-300), "p2p.bandwidth_gbps"),
])
def test_cost_file_numbers_out_of_range_are_refused(tmp_path, capsys, change, words) -> None:
    _refused(capsys, ["simulate", "--costs", _costs(tmp_path, change)], words)


@pytest.fixture
def sim_doc(tmp_path: Path, capsys) -> dict:
    path = tmp_path / "sim.json"
    assert main(["simulate", "--trace", str(path)]) == 0
    capsys.readouterr()
    return json.loads(path.read_text())


@pytest.mark.parametrize("info, words", [
    ({"iteration_boundary_ms": -1e308}, "otherData.iteration_boundary_ms"),
    ({"whole_iteration_ms": [1e300]}, "otherData.whole_iteration_ms[0]"),
    ({"whole_iteration_ms": 5}, "otherData.whole_iteration_ms"),
])
def test_trace_numbers_out_of_range_are_refused(tmp_path, capsys, sim_doc, info,
                                                words) -> None:
    sim_doc["otherData"].update(info)
    bad = _file(tmp_path, "bad.json", json.dumps(sim_doc))
    good = _file(tmp_path, "good.json", json.dumps({**sim_doc, "otherData": {}}))
    _refused(capsys, ["diff", good, bad], words)


# ------------------------------------------------------------------ defect 4: readers


def test_a_fifo_as_actions_csv_is_refused_unread(tmp_path, capsys) -> None:
    fifo = str(tmp_path / "o.csv")
    os.mkfifo(fifo)
    _refused(capsys, ["simulate", "--actions-csv", fifo], "not a regular file")


def test_a_fifo_as_config_actions_csv_is_refused_unread(tmp_path, capsys) -> None:
    fifo = str(tmp_path / "o.csv")
    os.mkfifo(fifo)
    cfg = _file(tmp_path, "c.toml", TINY + f'[pipeline]\nactions_csv = "{fifo}"\n')
    _refused(capsys, ["simulate", "--config", cfg], "not a regular file")


def test_a_csv_of_too_many_cells_is_refused_before_parsing_past_the_limit(
        tmp_path, capsys, monkeypatch) -> None:
    from ppsim.schedules import torchcsv

    monkeypatch.setattr(torchcsv, "MAX_CSV_CELLS", 1_000)
    parsed = []
    monkeypatch.setattr(torchcsv._Reader, "cell", lambda self, text, where:
                        parsed.append(text) or [("F", 0, 0)])
    csv = _file(tmp_path, "big.csv", ",".join(["0F0"] * 400_000) + "\n")
    _refused(capsys, ["simulate", "--actions-csv", csv, "--pp", "1"], "cells")
    assert len(parsed) <= 1_000  # counted piece by piece as the row is split


def test_a_csv_is_refused_on_the_line_that_passes_the_cell_limit(tmp_path, capsys) -> None:
    # Streamed: the over-long first line is refused before the bytes after it are decoded
    # (a reader of the whole text finds the bad UTF-8 first).
    path = tmp_path / "big.csv"
    path.write_bytes((",".join(["0F0"] * (MAX_CSV_CELLS + 1)) + "\n").encode()
                     + b" " * 2**20 + b"\xff\xfe\n")  # past the decoder's chunk
    _refused(capsys, ["simulate", "--actions-csv", str(path), "--pp", "1"], "cells",
             f"{MAX_CSV_CELLS:,}")


def test_a_csv_of_bad_utf8_after_good_rows_is_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"0F0,0B0\n" * 3 + b"\xff\n")
    _refused(capsys, ["simulate", "--actions-csv", str(path)], "not UTF-8")


def test_a_streamed_csv_reads_as_its_text_does(tmp_path) -> None:
    text = "\ufeff0F0,,1F1\r\n\r\n0SEND_F0,1F0,0B1\r\n"
    path = tmp_path / "o.csv"
    path.write_text(text, encoding="utf-8", newline="")
    with pytest.raises(UserError) as from_file:
        load_actions_csv(str(path))
    with pytest.raises(UserError) as from_text:
        parse_actions_csv(text)
    assert str(from_file.value) == str(from_text.value)
    good = "0F0,0F1,,0B0,0B1\r\n\r\n1F0,1B0,1F1,1B1\r\n"
    path.write_text(good, encoding="utf-8", newline="")
    assert load_actions_csv(str(path)) == parse_actions_csv(good)


def test_a_trace_of_too_many_events_is_refused_before_decoding(tmp_path, capsys) -> None:
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": [' + ",".join(["{}"] * 4_100_000) + "]}")
    t0 = time.monotonic()
    _refused(capsys, ["diff", str(path), str(path)], "JSON objects")
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("text, words", [
    ('{"traceEvents": [{}, {}', "not valid JSON"),
    ('{"traceEvents": []} x', "not valid JSON"),
    ('{"traceEvents": 5}', "no traceEvents"),
    ('{"otherData": {}}', "no traceEvents"),
    ("[]", "no compute events"),
    ("3", "no traceEvents"),
    ('{"traceEvents": [], "traceEvents": []}', "twice"),
])
def test_streamed_trace_reader_refuses_malformed_documents(tmp_path, capsys, text,
                                                            words) -> None:
    path = _file(tmp_path, "t.json", text)
    _refused(capsys, ["diff", path, path], words)


def test_streamed_trace_reads_what_json_loads_reads(tmp_path, sim_doc) -> None:
    from ppsim.trace.read import read_trace, trace_from_json

    # Key order and whitespace differ from ppsim's own writer: otherData first, indented.
    path = tmp_path / "indented.json"
    path.write_text(json.dumps({"otherData": sim_doc["otherData"],
                                "traceEvents": sim_doc["traceEvents"]}, indent=3))
    streamed, parsed = read_trace(str(path)), trace_from_json(sim_doc, str(path))
    assert streamed == parsed and len(streamed.ops) > 0


# ------------------------------------------------------------------ defect 2: builders


def _evil(tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "RAN"
    code = f"open({str(marker)!r}, 'a').write('x')\n\ndef build(fields):\n    return 1\n"
    evil = _file(tmp_path, "evil.py", code)
    cfg = _file(tmp_path, "e.toml", TINY + f'builder = "{evil}:build"\n')
    return cfg, marker


def test_print_launch_loads_no_builder(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, marker = _evil(tmp_path)
    assert main(["run", "--config", cfg, "--print-launch"]) == 0
    capsys.readouterr()
    assert not marker.exists()


def test_loading_a_builder_from_outside_ppsim_says_so(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, marker = _evil(tmp_path)
    code = main(["run", "--config", cfg])
    err = capsys.readouterr().err
    assert code == 2 and marker.exists()  # it ran: the note came first
    assert "note: loading model builder" in err and "is code" in err
    assert "returned an object without" in err


def test_a_world_far_beyond_this_host_is_refused_but_printed_with_a_warning(capsys) -> None:
    dp = str(10 * (os.cpu_count() or 1))
    _refused(capsys, ["run", "--dp", dp], "--dp", "ranks")
    assert main(["run", "--dp", dp, "--print-launch"]) == 0
    assert "warning" in capsys.readouterr().err


def test_a_cost_file_of_too_many_objects_is_refused_before_parsing(tmp_path, capsys) -> None:
    path = tmp_path / "costs.json"
    path.write_text('{"format": "ppsim-costs", "version": 1, "layers": ['
                    + ",".join(["{}"] * 400_000) + "]}")
    _refused(capsys, ["simulate", "--costs", str(path)], "JSON objects and arrays")


def test_streamed_trace_reads_alike_whatever_the_chunk_size(tmp_path, sim_doc,
                                                            monkeypatch) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ppsim.trace import stream
    from ppsim.trace.read import read_trace, trace_from_json

    expected = trace_from_json(sim_doc, "t")
    path = tmp_path / "t.json"

    @settings(max_examples=40, deadline=None)
    @given(chunk=st.integers(1, 300), indent=st.sampled_from([None, 0, 2]),
           info_first=st.booleans())
    def reads_alike(chunk: int, indent: int | None, info_first: bool) -> None:
        keys = ["otherData", "traceEvents"] if info_first else ["traceEvents", "otherData"]
        path.write_text(json.dumps({k: sim_doc[k] for k in keys}, indent=indent) + "\n ")
        monkeypatch.setattr(stream, "CHUNK", chunk)
        got = read_trace(str(path))
        assert (got.info, got.ops, got.memory, got.step_ops) == \
            (expected.info, expected.ops, expected.memory, expected.step_ops)

    reads_alike()


def test_a_trace_cut_inside_a_character_or_number_is_one_line(tmp_path, capsys,
                                                             sim_doc) -> None:
    text = json.dumps(sim_doc)
    for cut, words in ((len(text) // 2, "not valid JSON"), (len(text) - 1, "not valid JSON")):
        bad = _file(tmp_path, f"cut{cut}.json", text[:cut])
        _refused(capsys, ["diff", bad, bad], words)
    (tmp_path / "utf8.json").write_bytes(text[:100].encode() + b"\xe2\x80")
    _refused(capsys, ["diff", str(tmp_path / "utf8.json"), str(tmp_path / "utf8.json")],
             "UTF-8")
