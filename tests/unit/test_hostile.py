"""Issue 15, items 7-10: malformed and hostile input ends in exit 2 and one line.

Each case here ended in a traceback, a hang or a silently wrong answer before
ppsim.validate existed; they go through `ppsim.cli.main` as a user's command would.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from helpers import uniform_problem
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import emit_json
from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.config.to_toml import config_to_toml, toml_value
from ppsim.sim.simulate import simulate
from ppsim.trace.diff import critical_path, window
from ppsim.trace.read import trace_from_json
from ppsim.trace.schema import simulation_trace

ROOT = Path(__file__).resolve().parents[2]

UNIFORM = """\
[model]
kind = "uniform"
num_layers = 4
forward_ms = 1.0
backward_ms = 2.0
activation_bytes = 10
"""
TINY = '[model]\npreset = "tiny-gpt"\n'


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one in-process command (argparse exits too)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> str:
    code, _, err = run(capsys, argv)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert words in err, err
    return err


def _file(tmp_path: Path, name: str, data: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


# ------------------------------------------------------------------ configs (item 8, 9)

CONFIGS = [
    (b'[model]\npreset = "tiny-\xff\xfe"\n', "UTF-8"),
    ("a = " + "[" * 50_000 + "]" * 50_000 + "\n", "nested"),
    ("model = 5\n", "model"),
    (UNIFORM + 'hardware = "cpu"\n', "hardware"),
    ("pipeline = [1, 2]\n" + UNIFORM, "pipeline"),
    (UNIFORM + "head = [1, 2]\n", "model.head"),
    (UNIFORM + 'embedding = "x"\n', "model.embedding"),
    ('[model]\npreset = ["tiny-gpt"]\n', "model.preset"),
    (UNIFORM + '[hardware]\npreset = {a = 1}\n', "hardware.preset"),
    (TINY + 'dtype = "int8"\n', "model.dtype"),
    (TINY + "dtype = 3\n", "model.dtype"),
    (TINY + 'gated_mlp = "yes"\n', "model.gated_mlp"),
    ('[model]\nkind = "transformer"\nnum_layers = 4\nhidden_size = 64\nnum_heads = 4\n'
     'num_kv_heads = 4\nffn_hidden_size = 128\nvocab_size = 100\n', "model.seq_length"),
    (TINY + "[hardware]\npeak_tflops = 0\n", "hardware.peak_tflops"),
    (TINY + "[hardware]\nefficiency = 0\n", "hardware.efficiency"),
    (TINY + "[hardware]\npeak_tflops = -5\n", "hardware.peak_tflops"),
    (TINY + "[hardware]\nefficiency = -0.5\n", "hardware.efficiency"),
    (UNIFORM + "[hardware]\np2p_latency_ms = 1e308\n", "hardware.p2p_latency_ms"),
    (UNIFORM + "[hardware]\np2p_latency_ms = -1\n", "hardware.p2p_latency_ms"),
    (UNIFORM + "[hardware]\np2p_bandwidth_gbps = nan\n", "hardware.p2p_bandwidth_gbps"),
    (UNIFORM + "[hardware]\np2p_bandwidth_gbps = inf\n", "hardware.p2p_bandwidth_gbps"),
    (UNIFORM + "[hardware]\nmemory_bytes = nan\n", "hardware.memory_bytes"),
    (UNIFORM + "[hardware]\nmemory_bytes = inf\n", "hardware.memory_bytes"),
    (UNIFORM.replace("forward_ms = 1.0", "forward_ms = inf"), "model.forward_ms"),
    (UNIFORM.replace("forward_ms = 1.0", "forward_ms = nan"), "model.forward_ms"),
    (UNIFORM.replace("forward_ms = 1.0", "forward_ms = 1e308"), "model.forward_ms"),
    (UNIFORM.replace("backward_ms = 2.0", "backward_ms = -inf"), "model.backward_ms"),
    (UNIFORM.replace("activation_bytes = 10", "activation_bytes = 1e308"),
     "model.activation_bytes"),
    (UNIFORM + "[model.head]\nforward_ms = nan\n", "model.head.forward_ms"),
    (TINY + "[hardware]\nmatmul_efficiency = [[1, nan]]\n", "hardware.matmul_efficiency"),
    (TINY + "[hardware]\nmatmul_efficiency = [[inf, 0.5]]\n", "hardware.matmul_efficiency"),
    (TINY + "[hardware]\nmatmul_efficiency = 3\n", "hardware.matmul_efficiency"),
    (TINY + "[hardware]\nkernel_overhead_us = inf\n", "hardware.kernel_overhead_us"),
    (TINY + "[hardware]\nmemory_bandwidth_gbps = 1e308\n", "hardware.memory_bandwidth_gbps"),
    (TINY + "[hardware]\nattention_efficiency = 7\n", "hardware.attention_efficiency"),
    (TINY + "hidden_size = 1000000000000000000000\n", "model.hidden_size"),
    (UNIFORM + "[placement]\ninter_node_latency_ms = 1e308\n", "placement.inter_node_latency"),
    (UNIFORM + "[placement]\nlocal_message_cpu_ms = -1\n", "placement.local_message_cpu_ms"),
    (UNIFORM + "placement = 3\n", "placement"),
    (UNIFORM + "[pipeline]\npp = 9223372036854775807\n", "pipeline.pp"),
    (UNIFORM + "[pipeline]\nmicrobatches = 1000000000\n", "pipeline.microbatches"),
    (UNIFORM + "[pipeline]\nsplit = [9223372036854775807, 1]\n", "pipeline.split"),
]


@pytest.mark.parametrize("text, words", CONFIGS, ids=range(len(CONFIGS)))
def test_malformed_config_exits_2_in_one_line(tmp_path, capsys, text, words):
    path = _file(tmp_path, "c.toml", text)
    refused(capsys, ["simulate", "--config", path, "--json"], words)


@pytest.mark.parametrize("flags, words", [
    (["--memory-gb", "nan"], "--memory-gb"),
    (["--memory-gb", "inf"], "--memory-gb"),
    (["--memory-gb", "1e300"], "--memory-gb"),
    (["--pp", "1000000000"], "pipeline.pp"),
    (["--microbatches", "1000000000"], "pipeline.microbatches"),
    (["--layout", "Et*\u00b2|tL"], "pipeline.layout"),
    (["--layout", "Et*" + "1" * 5000 + "|tL"], "pipeline.layout"),
    (["--config", "/dev/zero"], "--config"),
    (["--config", "/"], "--config"),
])
def test_bad_flags_exit_2_in_one_line(capsys, flags, words):
    t0 = time.monotonic()
    refused(capsys, ["simulate", "--json", "--pp", "2", "--num-layers", "4", *flags], words)
    assert time.monotonic() - t0 < 5  # refused from the inputs, not after the work


@pytest.mark.parametrize("command", ["split", "simulate", "plan"])
@pytest.mark.parametrize("flag", ["--pp", "--vpp"])
def test_zero_stages_exit_2(capsys, command, flag):
    budget = ["--time-budget", "1"] if command == "plan" else []
    refused(capsys, [command, "--json", flag, "0", *budget], f"pipeline.{flag[2:]}")


def test_plan_time_budget_must_be_finite(capsys):
    for value in ("nan", "inf", "0", "-1"):
        refused(capsys, ["plan", "--json", "--time-budget", value], "--time-budget")


def test_json_output_is_strict(capsys):
    emit_json({"a": math.inf, "b": [math.nan, 1.5], "c": {"d": -math.inf}})
    text = capsys.readouterr().out

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    assert json.loads(text, parse_constant=no_constants) == {"a": None, "b": [None, 1.5],
                                                             "c": {"d": None}}


# ------------------------------------------------------------------ saved configs (item 10)


@given(st.text(max_size=30))
def test_any_string_round_trips_through_saved_toml(text):
    assert tomllib.loads(f"x = {toml_value(text)}\n")["x"] == text


def test_config_with_control_characters_loads_back(tmp_path):
    cfg = load_config(_file(tmp_path, "c.toml", UNIFORM))
    cfg.costs_file = str(tmp_path / "a\x01b\tc\x7fd\x1b[31m.json")
    path = _file(tmp_path, "again.toml", config_to_toml(cfg))
    assert load_config(path).costs_file == cfg.costs_file


# ------------------------------------------------------------------ cost files (item 8, 10)


def _costs_doc(**layer) -> dict:
    return {"format": "ppsim-costs", "version": 1, "model": None,
            "layers": [{"forward_ms": 1.0, "backward_ms": 2.0, **layer}],
            "embedding": {}, "head": {}, "p2p": None}


@pytest.mark.parametrize("data, words", [
    (b'{"format": "ppsim-costs\xff"}', "UTF-8"),
    ("[" * 100_000 + "]" * 100_000, "nested"),
    (json.dumps(_costs_doc(forward_ms=math.nan)), "forward_ms"),
    (json.dumps(_costs_doc(backward_ms=math.inf)), "backward_ms"),
    ('{"format": "ppsim-costs", "version": 1, "layers": [{"forward_ms": 1e400}], '
     '"embedding": {}, "head": {}}', "forward_ms"),
    (json.dumps(_costs_doc(forward_ms=1e308, backward_ms=1e308)), "forward_ms"),
    (json.dumps(_costs_doc(activation_bytes=1e300)), "activation_bytes"),
    (json.dumps({**_costs_doc(), "p2p": {"latency_ms": 1e308}}), "latency_ms"),
])
def test_malformed_cost_file_exits_2(tmp_path, capsys, data, words):
    path = _file(tmp_path, "costs.json", data)
    refused(capsys, ["simulate", "--json", "--costs", path, "--num-layers", "4"], words)


def test_special_and_huge_cost_files_are_refused_before_reading(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: no disk used, and nothing may read it
        fh.truncate(200 << 20)
    cfg = _file(tmp_path, "c.toml", 'costs_file = "/dev/zero"\n' + UNIFORM)
    for argv, words in ((["--costs", str(big)], "MB"), (["--config", cfg], "regular file"),
                        (["--costs", str(tmp_path)], "regular file")):
        t0 = time.monotonic()
        refused(capsys, ["simulate", "--json", *argv], words)
        assert time.monotonic() - t0 < 2


# ------------------------------------------------------------------ traces (item 7, 8)


@pytest.fixture
def sim_doc() -> dict:
    problem = uniform_problem(2, 1, 4, "1f1b", counts=[3, 2], f=1.0, b=2.0, act=10, static=5)
    return simulation_trace(simulate(problem))


def _compute(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "compute"]


def _edit(doc: dict, how: str) -> dict | str:
    doc = copy.deepcopy(doc)
    ev = _compute(doc)[0]
    if how == "pid_huge":  # json.dumps cannot write 1e400 itself
        ev["pid"] = 987654321
        return json.dumps(doc).replace("987654321", "1e400")
    edits = {
        "pid_str": lambda: ev.__setitem__("pid", "rank0"),
        "pid_neg": lambda: ev.__setitem__("pid", -1),
        "args_list": lambda: ev.__setitem__("args", [1, 2]),
        "other_list": lambda: doc.__setitem__("otherData", [1]),
        "warmup_str": lambda: doc["otherData"].__setitem__("warmup_iterations", "one"),
        "pp_float": lambda: doc["otherData"].__setitem__("pp", 2.5),
        "split_str": lambda: doc["otherData"].__setitem__("split", ["a"]),
        "dur_neg": lambda: ev.__setitem__("dur", -5.0),
        "dur_nan": lambda: ev.__setitem__("dur", math.nan),
        "ts_inf": lambda: ev.__setitem__("ts", math.inf),
        "kind_list": lambda: ev["args"].__setitem__("kind", ["F"]),
        "mb_huge": lambda: ev["args"].__setitem__("microbatch", 10**30),
        "mem_args": lambda: doc["traceEvents"].append(
            {"name": "memory", "ph": "C", "pid": "x", "ts": 0, "args": {"a": 1}}),
        "mem_nan": lambda: doc["traceEvents"].append(
            {"name": "memory", "ph": "C", "pid": 0, "ts": 0, "args": {"a": math.nan}}),
    }
    edits[how]()
    return doc


TRACE_EDITS = ["pid_huge", "pid_str", "pid_neg", "args_list", "other_list", "warmup_str",
               "pp_float", "split_str", "dur_neg", "dur_nan", "ts_inf", "kind_list",
               "mb_huge", "mem_args", "mem_nan"]


@pytest.mark.parametrize("how", TRACE_EDITS)
def test_malformed_trace_exits_2_in_diff_and_calibrate(sim_doc, tmp_path, capsys, how):
    good = _file(tmp_path, "good.json", json.dumps(sim_doc))
    bad_doc = _edit(sim_doc, how)
    bad = _file(tmp_path, "bad.json", bad_doc if isinstance(bad_doc, str)
                else json.dumps(bad_doc))
    refused(capsys, ["diff", good, bad, "--json"], "bad.json")
    refused(capsys, ["calibrate", bad, "--num-layers", "5", "--out",
                     str(tmp_path / "out.json")], "bad.json")


@pytest.mark.parametrize("data, words", [(b'{"traceEvents": ["\xff"]}', "UTF-8"),
                                         ("[" * 100_000 + "]" * 100_000, "nested")])
def test_unreadable_trace_exits_2(sim_doc, tmp_path, capsys, data, words):
    good = _file(tmp_path, "good.json", json.dumps(sim_doc))
    refused(capsys, ["diff", good, _file(tmp_path, "bad.json", data)], words)


def _cycling_doc(sim_doc: dict) -> dict:
    """Rank 0 runs F1 (stage 1) then B1; rank 1 runs B0 then F0: walking back from F1,
    input F0 -> its rank's previous B0 -> input B1 -> its rank's previous F1 -> ..."""
    ops = [(0, "F", 1, 0, 1000), (0, "B", 1, 1, 1), (1, "B", 0, 0, 1), (1, "F", 0, 2, 1)]
    events = [{"name": f"{k}0", "cat": "compute", "ph": "X", "pid": r, "tid": 0, "ts": ts,
               "dur": dur, "args": {"kind": k, "stage": s, "chunk": 0, "microbatch": 0}}
              for r, k, s, ts, dur in ops]
    info = {**sim_doc["otherData"], "microbatches": 1, "split": [1, 1]}
    return {"traceEvents": events, "otherData": info}


def test_critical_path_walk_ends_on_a_cycling_trace(sim_doc):
    w = window(trace_from_json(_cycling_doc(sim_doc), "cycle"), None)

    def too_long(*_: object) -> None:
        raise TimeoutError("critical_path did not end")

    # Fail, rather than hang, where the walk loops.
    old = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        path = critical_path(w)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sum(ms for _, ms in path) == pytest.approx(sum(w.dur(k) for k in w.ops))
    assert [r for r, _ in path] == [0, 1, 0]


def test_diff_of_a_cycling_trace_terminates(sim_doc, tmp_path):
    doc = _cycling_doc(sim_doc)
    a = _file(tmp_path, "a.json", json.dumps(doc))
    # A subprocess: on the old code this loops forever, growing memory.
    proc = subprocess.run([sys.executable, "-m", "ppsim.cli", "diff", a, a, "--json"],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["iteration_time_delta_ms"] == 0


def test_calibrate_refuses_a_trace_claiming_a_huge_pipeline_at_once(sim_doc, tmp_path, capsys):
    doc = copy.deepcopy(sim_doc)
    doc["otherData"].update(pp=4096, microbatches=1_000_000)
    for ev in _compute(doc):
        ev["pid"] = 4095 - ev["pid"]  # ranks the claimed pp allows
    path = _file(tmp_path, "t.json", json.dumps(doc))
    t0 = time.monotonic()
    refused(capsys, ["calibrate", path, "--num-layers", "5", "--out",
                     str(tmp_path / "out.json")], "ops")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_calibrate_on_zero_or_negative_durations_exits_2(sim_doc, tmp_path, capsys, scale):
    doc = copy.deepcopy(sim_doc)
    for ev in _compute(doc):
        ev["dur"] *= scale
        ev["ts"] = 0.0
    path = _file(tmp_path, "t.json", json.dumps(doc))
    refused(capsys, ["calibrate", path, "--num-layers", "5", "--out",
                     str(tmp_path / "out.json")], "t.json")


# ------------------------------------------------------------------ outputs (item 8)


def test_unwritable_outputs_exit_2(sim_doc, tmp_path, capsys):
    trace = _file(tmp_path, "t.json", json.dumps(sim_doc))
    long_name = str(tmp_path / ("x" * 300 + ".json"))
    for path in (str(tmp_path), long_name, "/proc/ppsim-test.json"):
        refused(capsys, ["simulate", "--json", "--trace", path], "--trace")
        refused(capsys, ["diff", trace, trace, "--json", "--png", path], "--png")
        refused(capsys, ["calibrate", trace, "--num-layers", "5", "--out", path], "--out")


def test_file_names_that_look_like_markup(sim_doc, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "[").mkdir()  # an output's folder must exist
    code, out, err = run(capsys, ["simulate", "--trace", "[/x].json"])
    assert code == 0, err
    assert "[/x].json" in out
    for name in ("[bold]a.json", "[/b].json"):
        (tmp_path / name).write_text(json.dumps(sim_doc))
    code, out, err = run(capsys, ["diff", "[bold]a.json", "[/b].json"])
    assert code == 0, err
    assert "[bold]a.json" in out


def test_control_characters_in_names_stay_on_one_line(tmp_path, capsys):
    bad = _file(tmp_path, "a\nb\x1b[31m.json", "{}")
    err = refused(capsys, ["diff", bad, bad], "traceEvents")
    assert "\x1b" not in err
    cfg = _file(tmp_path, "c.toml", UNIFORM + '[hardware]\npreset = "x\\ny\\u001b"\n')
    err = refused(capsys, ["simulate", "--config", cfg], "hardware.preset")
    assert "\x1b" not in err
