"""Fuzz the command line and the config loader with hostile input (issues 15 and 27).

Every case must end in exit 0, 2 or 3 with no traceback, one line of error for
exit 2, strict JSON for --json, within 30 s. Cases are generated from a fixed
seed (and hypothesis runs derandomised), so a failure reproduces by its id.
Most run in-process through `ppsim.cli.main`; a few as real processes.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.limits import schedule_ops
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
SEED = 15
CLI_CASES = 400
CASE_SECONDS = 30

# ------------------------------------------------------------------ hostile files


def _trace_doc(**edit: Any) -> dict:
    events = []
    for r, k, s, ts in ((0, "F", 0, 0), (1, "F", 1, 1000), (1, "B", 1, 2000), (0, "B", 0, 4000)):
        events.append({"name": k, "cat": "compute", "ph": "X", "pid": r, "tid": 0, "ts": ts,
                       "dur": 1000, "args": {"kind": k, "stage": s, "chunk": 0,
                                             "microbatch": 0, "iteration": 0}})
    events[0].update(edit)
    return {"traceEvents": events, "otherData": {"schedule": "1f1b", "pp": 2, "vpp": 1,
                                                  "microbatches": 1, "split": [5, 3],
                                                  "warmup_iterations": 0}}


def _costs_doc(**layer: Any) -> dict:
    return {"format": "ppsim-costs", "version": 1, "model": None,
            "layers": [{"forward_ms": 1.0, "backward_ms": 2.0, **layer}],
            "embedding": {}, "head": {}, "p2p": None}


def _hostile_files(root: Path) -> dict[str, list[str]]:
    """Named files of each kind: configs, cost files, traces, and output paths."""
    def put(name: str, data: str | bytes) -> str:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(p)

    deep_json = "[" * 20_000 + "]" * 20_000
    tiny = '[model]\npreset = "tiny-gpt"\n'
    configs = [
        put("ok.toml", tiny), put("bad-utf8.toml", b"[model]\npreset = \"\xff\"\n"),
        put("deep.toml", "a = " + "[" * 20_000 + "]" * 20_000), put("model5.toml", "model = 5"),
        put("hw.toml", tiny + 'hardware = "cpu"'), put("nan.toml", tiny + "[hardware]\n"
                                                        "p2p_bandwidth_gbps = nan"),
        put("peak0.toml", tiny + "[hardware]\npeak_tflops = 0"),
        put("lat.toml", tiny + "[hardware]\np2p_latency_ms = 1e308"),
        put("ctrl.toml", tiny + 'costs_file = "a\\u0001b"'), put("empty.toml", ""),
        put("[/x].toml", tiny), put("dtype.toml", tiny + 'dtype = "int8"'),
        "/dev/zero", str(root), str(root / "missing.toml"),
    ]
    costs = [
        put("costs.json", json.dumps(_costs_doc())),
        put("costs-nan.json", json.dumps(_costs_doc(forward_ms=math.nan))),
        put("costs-big.json", json.dumps(_costs_doc(activation_bytes=1e300))),
        put("costs-utf8.json", b'{"format": "\xff"}'), put("costs-deep.json", deep_json),
        put("costs-trunc.json", json.dumps(_costs_doc())[:40]), "/dev/zero", str(root),
    ]
    cycle = _trace_doc()
    cycle["traceEvents"][0]["ts"] = 3000  # F0 after B1's start: the walk back can loop
    traces = [
        put("trace.json", json.dumps(_trace_doc())), put("cycle.json", json.dumps(cycle)),
        put("t-nan.json", json.dumps(_trace_doc(dur=math.nan))),
        put("t-pid.json", json.dumps(_trace_doc(pid="rank0"))),
        put("t-args.json", json.dumps(_trace_doc(args=[1]))),
        put("t-deep.json", deep_json), put("t-utf8.json", b'{"traceEvents": ["\xff"]}'),
        put("[bold]t.json", json.dumps(_trace_doc())), "/dev/zero", str(root),
    ]
    outs = [str(root / "out" / "o.json"), str(root), "/proc/ppsim-fuzz.json",
            str(root / ("x" * 300 + ".json")), str(root / "out" / "[/x].json")]
    return {"config": configs, "costs": costs, "trace": traces, "out": outs}


# ------------------------------------------------------------------ CLI cases

INTS = ["0", "-1", "1", "2", "3", "4", "8", "1000000000", "9223372036854775808", "1e3",
        "nan", "", "\u00b2", "0x10", "1" * 5000]
FLOATS = ["nan", "inf", "-inf", "0", "-1", "1e308", "1e-300", "80", "abc", "1" * 400]
WORDS = {
    "--schedule": ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev", "", "x",
                   "[/x]"],
    "--preset": ["tiny-gpt", "llama3-8b", "", "[bold]", "nope"],
    "--hardware": ["cpu", "h100", "", "[/x]"],
    "--recompute": ["none", "full", "selective", "x"],
    "--split": ["5,3", "even", "a", "-1,9", "9" * 50, "\u00b2,1", "4,4,0", ","],
    "--layout": ["Et*3|t*5L", "E(t|)*100000000L", "Et*3000000000|L", "", "((", "t*\u00b2",
                 "Et*" + "9" * 5000 + "|L"],
}
CONFIG_INT_FLAGS = ["--pp", "--vpp", "--microbatches", "--num-layers", "--tp"]
COMMANDS = ["split", "simulate", "simulate", "plan", "diff", "calibrate", "costs"]


def _flag(rng: random.Random, files: dict[str, list[str]], command: str) -> list[str]:
    if command == "diff":  # diff takes no config flags
        return [rng.choice(["--png", "--top", "--iteration"]),
                rng.choice(files["out"] + ["-1", "0", "1", "99", "nan"])]
    choice = rng.random()
    if choice < 0.3:
        return [rng.choice(CONFIG_INT_FLAGS), rng.choice(INTS)]
    if choice < 0.4:
        return ["--memory-gb", rng.choice(FLOATS)]
    if choice < 0.55:
        flag = rng.choice(list(WORDS))
        if command in ("calibrate", "costs") and flag in ("--split", "--layout"):
            flag = "--schedule"
        return [flag, rng.choice(WORDS[flag])]
    if choice < 0.7:
        return ["--config", rng.choice(files["config"])]
    if choice < 0.8:
        return ["--costs", rng.choice(files["costs"])]
    if command == "simulate":
        return [rng.choice(["--trace", "--trace", "--png"]), rng.choice(files["out"])]
    if command == "plan":
        return ["--time-budget", rng.choice(FLOATS + ["0.5"])]
    if command == "calibrate":
        return ["--out", rng.choice(files["out"])]
    return ["--split", rng.choice(WORDS["--split"])]


def cli_cases(files: dict[str, list[str]], n: int, seed: int) -> list[list[str]]:
    """n command lines: a command, sometimes --json, one to three hostile flags."""
    rng = random.Random(seed)
    traces = files["trace"]
    cases = []
    for _ in range(n):
        command = rng.choice(COMMANDS)
        argv = [command]
        if command == "diff":  # mostly one good trace, so the other one is what is tested
            argv += [traces[0], rng.choice(traces)][:: rng.choice([1, -1])]
        elif command == "calibrate":
            argv += [rng.choice(traces[:3] + traces), "--out", files["out"][0]]
        elif command == "plan":
            argv += ["--time-budget", "0.5"]  # a later hostile value overrides it
        if rng.random() < 0.7:
            argv.append("--json")
        for _ in range(rng.randint(0 if command == "diff" else 1, 3)):
            argv += _flag(rng, files, command)
        cases.append(argv)
    return cases


def check_outcome(argv: list[str], code: Any, out: str, err: str, seconds: float) -> None:
    what = f"{argv!r}: exit {code}, stderr {err[-600:]!r}"
    assert code in (0, 2, 3), what
    assert "Traceback" not in err, what
    if code == 2:
        assert err.endswith("\n") and err.count("\n") == 1, what
    if code == 0 and "--json" in argv:
        def strict(name: str) -> None:
            raise AssertionError(f"{what}: {name} in JSON output")

        assert isinstance(json.loads(out, parse_constant=strict), dict), what
    assert seconds < CASE_SECONDS, f"{what}: took {seconds:.1f} s"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return _hostile_files(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def cases(files: dict[str, list[str]]) -> list[list[str]]:
    return cli_cases(files, CLI_CASES, SEED)


def test_the_generator_is_seeded(files):
    assert cli_cases(files, 20, SEED) == cli_cases(files, 20, SEED)
    assert cli_cases(files, 20, SEED) != cli_cases(files, 20, SEED + 1)


@pytest.mark.parametrize("chunk", range(8))
def test_cli_fuzz_in_process(cases, capsys, monkeypatch, tmp_path, chunk):
    monkeypatch.chdir(tmp_path)  # default outputs (costs-calibrated.json) land here
    for argv in cases[chunk::8]:
        t0 = time.monotonic()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: bad flag values
            code = exc.code
        out, err = capsys.readouterr()
        check_outcome(argv, code, out, err, time.monotonic() - t0)


def test_cli_fuzz_as_processes(cases, tmp_path):
    """A handful as real processes: the exit status and stderr a user sees, under 2 GB."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for argv in cases[:: len(cases) // 5][:5]:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ppsim.cli", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=CASE_SECONDS, env=env)
        check_outcome(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 2 * 1024 * 1024, f"a child peaked at {peak_kib / 1024:.0f} MiB"


OUTPUT_FLAGS = {"simulate": ["--trace", "--png"], "diff": ["--png"], "calibrate": ["--out"]}


def _inputs(argv: list[str], files: dict[str, list[str]]) -> list[str]:
    """The existing regular files a command line reads (config, costs, traces)."""
    given = {*files["config"], *files["costs"], *files["trace"]}
    return [a for a in argv if a in given and os.path.isfile(a)]


def test_cli_fuzz_outputs_never_replace_inputs(cases, files, capsys, monkeypatch, tmp_path):
    """Issue 27: each case with an input file, its output pointed at that input (or at a
    link to it): refused, or failed earlier, and the input's bytes untouched."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(SEED)
    tried = 0
    for argv in cases:
        inputs = _inputs(argv, files)
        if argv[0] not in OUTPUT_FLAGS or not inputs:
            continue
        target = rng.choice(inputs)
        if rng.random() < 0.3:  # the same file by another name
            target = os.path.join(os.path.dirname(target), ".", os.path.basename(target))
        before = {p: Path(p).read_bytes() for p in inputs}
        hostile = [*argv, rng.choice(OUTPUT_FLAGS[argv[0]]), target]
        t0 = time.monotonic()
        try:
            code = main(hostile)
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        check_outcome(hostile, code, out, err, time.monotonic() - t0)
        assert code != 0, f"{hostile!r} wrote over an input"
        assert {p: Path(p).read_bytes() for p in inputs} == before, hostile
        tried += 1
    assert tried >= 20


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_cli_fuzz_with_a_failing_stdout(cases, tmp_path):
    """Issue 27: standard output full (/dev/full) or closed: one line, exit 0, 2 or 3."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    good = [["simulate", "--json"], ["costs"], ["schedule"], ["plan", "--time-budget", "1"]]
    picked = good + [c for c in cases if c[0] in ("simulate", "costs", "plan")][:: 20][:2]
    for n, argv in enumerate(picked):
        cmd = [sys.executable, "-P", "-m", "ppsim.cli", *argv]
        if n % 2:  # closed, as `>&-` leaves it
            cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
        with open("/dev/full", "w") as full:
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=tmp_path, stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=CASE_SECONDS, env=env)
        check_outcome([a for a in argv if a != "--json"], proc.returncode, "", proc.stderr,
                      time.monotonic() - t0)
        if argv in good:  # each prints: the failure is the stream's, said in one line
            assert proc.returncode == 2 and "standard output" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ config fuzz

HOSTILE = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 4, 8, 5000, 2**63, 10**400, 0.5, 1e308, -1e308]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=8),
    st.lists(st.integers(-2, 9), max_size=4),
    st.lists(st.lists(st.sampled_from([0, 1, 0.5, 1e3, -1, math.nan, math.inf]), max_size=3),
             max_size=3),
    st.dictionaries(st.sampled_from(["a", "forward_ms", "static_bytes"]),
                    st.sampled_from([1, -1, math.nan, "x"]), max_size=2),
)
MODEL_KEYS = ["preset", "kind", "num_layers", "forward_ms", "backward_ms", "weight_grad_ms",
              "static_bytes", "activation_bytes", "output_bytes", "head", "embedding",
              "hidden_size", "num_heads", "num_kv_heads", "dtype", "recompute", "tp",
              "seq_length", "gated_mlp", "layers", "num_experts", "bogus"]
PIPE_KEYS = ["pp", "vpp", "microbatches", "schedule", "split", "layout", "first_stage_layers",
             "last_stage_layers", "account_for_embedding", "bogus"]
HW_KEYS = ["preset", "memory_bytes", "p2p_latency_ms", "p2p_bandwidth_gbps", "peak_tflops",
           "efficiency", "matmul_efficiency", "attention_efficiency", "memory_bandwidth_gbps",
           "kernel_overhead_us", "bogus"]
BASES = [{"model": {"preset": "tiny-gpt"}},
         {"model": {"kind": "uniform", "num_layers": 4, "forward_ms": 1.0, "backward_ms": 2.0}}]


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid base with a few fields replaced by hostile values (or whole sections)."""
    data: dict[str, Any] = json.loads(json.dumps(draw(st.sampled_from(BASES))))
    data.setdefault("pipeline", {"pp": 2, "microbatches": 4})
    for _ in range(draw(st.integers(1, 4))):
        section, keys = draw(st.sampled_from([("model", MODEL_KEYS), ("pipeline", PIPE_KEYS),
                                              ("hardware", HW_KEYS), ("costs_file", None),
                                              ("whole", None)]))
        value = draw(HOSTILE)
        if keys is None:
            data[draw(st.sampled_from(["model", "pipeline", "hardware", "costs_file"]))
                 if section == "whole" else "costs_file"] = value
        elif isinstance(data.get(section, {}), dict):
            data.setdefault(section, {})[draw(st.sampled_from(keys))] = value
    return data


@settings(max_examples=300, derandomize=True, deadline=None)
@given(configs())
def test_config_fuzz_fails_only_with_user_errors(data):
    try:
        cfg = config_from_dict(data)
        problem = build_problem(cfg)
        s = problem.schedule
        if schedule_ops(s.pp, s.vpp, s.microbatches, s.split_backward) <= 20_000:
            summary = simulate(problem).summary
            assert math.isfinite(summary.iteration_time_ms)
    except UserError as exc:
        assert "\n" not in str(exc)


# ------------------------------------------------------------------ trace fuzz

TRACE_VALUES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 7, -1, 10**9, 2**70, 0.5, "F", "B", "W", "x", None, [], {}]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5000))
EVENT_KEYS = ["pid", "ts", "dur", "kind", "stage", "chunk", "microbatch", "iteration"]
INFO_KEYS = ["pp", "vpp", "microbatches", "split", "warmup_iterations", "schedule", "placement"]


@pytest.fixture(scope="module")
def sim_trace() -> tuple[dict, Any]:
    from helpers import uniform_problem

    from ppsim.trace.schema import simulation_trace

    doc = simulation_trace(simulate(uniform_problem(2, 1, 4, "1f1b", counts=[3, 2])))
    cfg = config_from_dict({"model": {"kind": "uniform", "num_layers": 5, "forward_ms": 1.0,
                                      "backward_ms": 2.0},
                            "pipeline": {"pp": 2, "microbatches": 4}})
    return doc, cfg


@settings(max_examples=150, derandomize=True, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 15), st.sampled_from(EVENT_KEYS), TRACE_VALUES),
                      max_size=4),
       info=st.dictionaries(st.sampled_from(INFO_KEYS), TRACE_VALUES, max_size=2))
def test_trace_fuzz_diff_and_calibrate_fail_only_with_user_errors(sim_trace, edits, info):
    from ppsim.trace.calibrate import calibrate
    from ppsim.trace.diff import diff_traces
    from ppsim.trace.read import trace_from_json

    doc, cfg = sim_trace
    bad = json.loads(json.dumps(doc))
    compute = [e for e in bad["traceEvents"] if e.get("cat") == "compute"]
    for i, key, value in edits:
        ev = compute[i % len(compute)]
        (ev if key in ("pid", "ts", "dur") else ev["args"])[key] = value
    bad["otherData"].update(info)
    try:
        t = trace_from_json(bad, "t")
        d = diff_traces(trace_from_json(json.loads(json.dumps(doc)), "a"), t).to_dict()
        assert isinstance(d["critical_path"], list)
        calibrate(t, cfg)
    except UserError as exc:
        assert "\n" not in str(exc)
