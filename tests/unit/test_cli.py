"""The command line: JSON contracts and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.config.to_toml import config_to_toml

UNIFORM = """
[model]
kind = "uniform"
num_layers = 8
forward_ms = 1.0
backward_ms = 2.0
static_bytes = 1_000_000
activation_bytes = 100_000
output_bytes = 10_000
[model.head]
forward_ms = 3.0
backward_ms = 6.0
[pipeline]
pp = 2
vpp = 1
microbatches = 8
schedule = "1f1b"
split = [6, 2]
[hardware]
memory_bytes = 80e9
"""


@pytest.fixture
def cfg_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(UNIFORM)
    return str(p)


def run_json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_simulate_json_contract(cfg_file, capsys):
    data = run_json(capsys, ["simulate", "--config", cfg_file, "--json"])
    assert data["split"] == [6, 2]
    assert len(data["ranks"]) == 2
    # Rank 0: 6 layers x 8 microbatches x 3 ms; rank 1: (2 layers + head) x 8 x (3 + 9) ms.
    assert data["ranks"][0]["busy_ms"] == 6 * 8 * 3.0
    assert data["ranks"][1]["busy_ms"] == 8 * (2 * 3.0 + 9.0)
    assert data["ranks"][1]["peak_inflight"] == 1 and data["ranks"][0]["peak_inflight"] == 2
    for key in ("iteration_time_ms", "bubble_fraction"):
        assert isinstance(data[key], float)
    for r in data["ranks"]:
        assert set(r) >= {"rank", "layers", "busy_ms", "bubble_fraction", "peak_memory_bytes",
                          "peak_inflight", "fits"}


def test_flags_override_file(cfg_file, capsys):
    data = run_json(capsys, ["simulate", "--config", cfg_file, "--split", "4,4", "--json",
                             "--microbatches", "4"])
    assert data["split"] == [4, 4] and data["microbatches"] == 4


def test_split_json_megatron_example(capsys):
    data = run_json(capsys, ["split", "--num-layers", "60", "--pp", "8",
                             "--first-stage-layers", "6", "--last-stage-layers", "6", "--json"])
    assert [s["layers"] for s in data["stages"]] == [6] + [8] * 6 + [6]
    assert [s["offset"] for s in data["stages"]] == [0, 6, 14, 22, 30, 38, 46, 54]
    assert [s["rank"] for s in data["stages"]] == list(range(8))


def test_trace_is_written_and_readable(cfg_file, tmp_path, capsys):
    from ppsim.trace.read import read_trace

    out = tmp_path / "t.json"
    assert main(["simulate", "--config", cfg_file, "--trace", str(out)]) == 0
    trace = read_trace(str(out))
    assert len(trace.ops) == 2 * 2 * 8
    assert {op.kind for op in trace.ops} == {"F", "B"}
    assert not list(tmp_path.glob(".tmp-*"))


def test_simulate_png(cfg_file, tmp_path, capsys):
    out = tmp_path / "t.png"
    assert main(["simulate", "--config", cfg_file, "--png", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_round_trips_through_toml(cfg_file, tmp_path):
    cfg = load_config(cfg_file)
    again = tmp_path / "again.toml"
    again.write_text(config_to_toml(cfg))
    assert load_config(str(again)) == cfg


BAD = [
    (["--split", "5,2"], "pipeline.split"),
    (["--split", "9,-1"], "pipeline.split"),
    (["--split", "4,x"], "--split"),
    (["--split", "4,2,2"], "pipeline.split"),
    (["--vpp", "2", "--split", "6,2"], "pipeline"),
    (["--schedule", "zigzag"], "pipeline.schedule"),
    (["--preset", "llama9"], "model.preset"),
    (["--schedule", "interleaved-1f1b", "--vpp", "1", "--microbatches", "3"], "pipeline.vpp"),
    (["--actions-csv", "/nonexistent/order.csv"], "pipeline.actions_csv"),
    (["--pp", "0"], "pipeline"),
    (["--memory-gb", "-5"], "hardware.memory_bytes"),
]


@pytest.mark.parametrize("flags, field", BAD)
def test_bad_input_exits_2_with_one_line(cfg_file, capsys, flags, field):
    assert main(["simulate", "--config", cfg_file, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


def test_malformed_toml_names_the_line(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("[model]\nkind = \"uniform\"\nnum_layers = = 3\n")
    assert main(["simulate", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and err.count("\n") == 1


def test_unknown_key_suggests_the_right_one(tmp_path, capsys):
    p = tmp_path / "typo.toml"
    p.write_text(UNIFORM.replace("microbatches = 8", "microbatchs = 8"))
    assert main(["simulate", "--config", str(p)]) == 2
    assert "microbatches" in capsys.readouterr().err


def test_the_valid_keys_of_a_table_are_listed_once_each(tmp_path, capsys):
    p = tmp_path / "odd.toml"
    p.write_text('[model]\npreset = "llama3-8b"\nzzzzzz = 1\n')
    assert main(["simulate", "--config", str(p)]) == 2
    keys = capsys.readouterr().err.split("valid keys: ")[1].rstrip(")\n").split(", ")
    assert "num_layers" in keys and len(keys) == len(set(keys))


def test_a_too_large_positive_field_gives_its_own_lower_bound(capsys):
    assert main(["simulate", "--preset", "llama3-8b", "--seq-length", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "model.seq_length: must be between 1 and 10,000,000" in err, err


def test_a_config_without_a_model_takes_the_preset_flag(tmp_path, capsys):
    # It was refused as "model.num_layers: missing": the file's absent [model] was parsed
    # as an empty uniform model before --preset could replace it.
    p = tmp_path / "hw.toml"
    p.write_text('[hardware]\npreset = "h100-80gb"\n[pipeline]\npp = 4\n')
    assert main(["simulate", "--config", str(p), "--preset", "llama3-8b", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
                 "--json"]) == 0
    assert got == json.loads(capsys.readouterr().out)
    assert main(["simulate", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim simulate: error: model: ") and "no [model] table" in err
    assert "--preset NAME" in err and err.count("\n") == 1


@pytest.mark.parametrize("section, key, fix", [
    ("hardware", "matmul_efficiency", "matmul_efficiency = [[1, 0.2], [1000, 0.8]]"),
    ("placement", "devices", "devices = [0, 0]"),
    ("pipeline", "split", "split = [6, 2]")])
def test_a_list_field_given_a_scalar_gets_its_own_example(section, key, fix, tmp_path,
                                                          capsys):
    # Every list field's fix read "write e.g. split = [6, 2]".
    p = tmp_path / "c.toml"
    p.write_text(f'[model]\npreset = "tiny-gpt"\n[{section}]\n{key} = "x"\n')
    assert main(["simulate", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{section}.{key}: expected a list, got 'x' (write e.g. {fix})" in err, err


def test_a_layout_given_to_split_points_to_layout(capsys):
    assert main(["simulate", "--split", "Et*4|t*4L"]) == 2
    assert "or give a layout string with --layout" in capsys.readouterr().err
    assert main(["simulate", "--split", "a,b"]) == 2
    assert "--layout" not in capsys.readouterr().err


def test_console_script_exit_status_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--split", "1,1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "pipeline.split" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert "iteration_time_ms" in json.loads(r.stdout)


def test_the_rank_table_keeps_each_rank_on_one_line_at_80_columns(monkeypatch, capsys):
    # 16 ranks of a 405B job: 5-digit busy times, GB columns, ranks that do not fit.
    import re

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["simulate", "--preset", "llama3.1-405b", "--hardware", "h100-80gb",
                 "--tp", "8", "--pp", "16", "--microbatches", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s+[\d.]+%( +[\d.]+ GB){3}\s+\d+\s+(yes|NO)$")
    ranks = [int(m.group(1)) for m in map(row.match, lines) if m]
    assert ranks == list(range(16))
    assert max(len(line) for line in lines if row.match(line)) <= 80


def test_the_job_plan_table_keeps_each_shape_s_figures_on_one_line_at_80_columns(
        monkeypatch, capsys):
    import re

    monkeypatch.setenv("COLUMNS", "80")
    # Held sizes leave nine shapes, which even a loaded machine simulates in the budget.
    assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "256", "--top", "3", "--time-budget", "3", "--tp",
                 "1", "--cp", "1", "--pp", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = re.compile(r"^\s*(best|#\d)\s+tp\d+ cp\d+ ep\d+ pp\d+ dp\d+\s+\d+\s+\d+\s+[\d.]+%"
                     r"\s+[\d,]+\s+[\d.]+\s+(bubble|exposed|nothing|memory)")
    assert [m.group(1) for m in map(row.match, lines) if m] == ["best", "#2", "#3"]
    # The flags to launch the best shape stay one line, to paste whole; so does the
    # DeepSpeed line after them.
    assert lines[-2].startswith("Megatron (64 GPUs): --")
    assert lines[-1].startswith("DeepSpeed (64 GPUs): ")
    assert max(map(len, lines[:-2])) <= 80
    # two lines a shape: what held it back wraps no further than the shape does
    at = [i for i, line in enumerate(lines) if row.match(line)]
    assert [j - i for i, j in zip(at, at[1:], strict=False)] == [2, 2]


def test_the_split_plan_table_shows_a_cpu_sized_model_s_peaks_in_mb(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["plan"]) == 0  # the embedded default: tens of MB per rank
    out = capsys.readouterr().out
    header = [line.split() for line in out.splitlines()[1:3]]
    assert ["peak", "MB"] == header[0][-3:-1] and ["per", "rank"] == header[1][-3:-1]
    assert " 0.0 0.0 " not in out


def test_the_split_plan_table_keeps_each_row_on_one_line_at_80_columns(monkeypatch, capsys):
    """At 80 columns (and piped, where rich takes 80) the table cut every split to
    '10,11,10,10…' and wrapped each row's peaks over four lines: the top five read alike."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
                 "--microbatches", "64"]) == 0
    import re

    lines = capsys.readouterr().out.splitlines()
    row = re.compile(r"^(best|#[2-5]|Megatron even|DeepSpeed parameters|DeepSpeed uniform|"
                     r"torchtitan default) +([\d,]+) +[\d.]+ +[\d.]+% +[\d.]+ r\d +[\d.]+x$")
    rows = [m for m in map(row.match, lines) if m]
    assert [m.group(1) for m in rows] == ["best", "#2", "#3", "#4", "#5", "Megatron even",
                                          "DeepSpeed parameters", "DeepSpeed uniform",
                                          "torchtitan default"]
    assert max(map(len, lines[:lines.index(rows[-1].string) + 1])) <= 80
    splits = [[int(c) for c in m.group(2).split(",")] for m in rows]
    assert all(sum(s) == 80 and len(s) == 8 for s in splits)
    assert len({tuple(s) for s in splits[:5]}) == 5


def test_the_costs_table_keeps_each_piece_on_one_line_at_80_columns(monkeypatch, capsys):
    # A hybrid's kinds alternate: 24 Mamba-2 layers spread over 52 (their ranges below).
    import re

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["costs", "--preset", "nemotron-h-8b", "--hardware", "h100-80gb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    size = r"\s+[\d.]+ [kMG]?B"
    row = re.compile(rf"^(embedding|mamba|mlp|attention|head)(\s+[\d.]+){{3}}({size}){{4}}")
    assert [m.group(1) for m in map(row.match, lines) if m] == [
        "embedding", "mamba", "mlp", "attention", "head"]
    assert any(line.startswith("mamba layers: 0, 2, 4, 6, 9") for line in lines)
    assert max(map(len, lines)) <= 80


def test_diff_keeps_each_rank_on_one_line_at_80_columns(monkeypatch, tmp_path, capsys):
    import re

    monkeypatch.setenv("COLUMNS", "80")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["simulate", "--split", "6,2", "--trace", str(a)]) == 0
    assert main(["simulate", "--split", "4,4", "--trace", str(b)]) == 0
    capsys.readouterr()
    assert main(["diff", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    size = r"\s+[\d.]+ [kMG]?B"
    row = re.compile(rf"^\s*(\d)(\s+[\d.]+){{2}}\s+[+-][\d.]+%(\s+[\d.]+%){{2}}({size}){{2}}"
                     r"\s+[+-][\d.]+$")
    assert [m.group(1) for m in map(row.match, lines) if m] == ["0", "1"]
    assert max(len(line) for line in lines if not line.startswith("largest")) <= 80


def test_presets_keep_each_name_whole_with_its_figures_at_80_columns(monkeypatch, capsys):
    """Before, the notes column took the width: names were cut ('gpt3-1.…') and a note
    wrapped to a word per line over 30 lines."""
    from ppsim.config.presets import HARDWARE_PRESETS, MODEL_NOTES, MODEL_PRESETS

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    for name, m in MODEL_PRESETS.items():
        figures = [name, str(m["num_layers"]), str(m["hidden_size"])]
        assert any(line.split()[:3] == figures for line in lines if line.strip()), name
        first_words = " ".join(MODEL_NOTES[name].split()[:3])
        assert any(line.startswith(name) and first_words in line for line in lines), name
    for name, hw in HARDWARE_PRESETS.items():
        assert any(line.split()[:2] == [name, f"{hw['memory_bytes'] / 1e9:.0f}"]
                   for line in lines if line.strip()), name


@pytest.mark.parametrize("argv", [
    ["plan", "--preset", "llama3-8b", "--pp", "4", "--time-budget", "2"],
    ["plan", "--preset", "llama3-8b", "--gpus", "32", "--global-batch-size", "64",
     "--time-budget", "2"],
    ["plan", "--preset", "llama3-8b", "--pp", "4", "--search", "policy", "--time-budget", "2"],
    ["costs", "--preset", "llama3-8b"],
], ids=["split", "job", "policy", "costs"])
def test_every_pricing_command_prices_a_gpu_model_on_an_assumed_gpu(capsys, argv):
    """As simulate and tui do. Before, plan, plan --gpus, plan --search policy and costs
    priced Llama-3-8B on the embedded default's cpu preset: 16 GB per rank (no split
    fits), iterations of 44,063,848 ms at 0 TFLOP/s/GPU."""
    code = main([*argv, "--json"])
    out = capsys.readouterr()
    assert "assuming --hardware h100-80gb" in out.err.splitlines()[0], out.err
    doc = json.loads(out.out)
    if argv[0] == "costs":
        assert code == 0 and "h100-80gb" in doc["source"]
    else:
        # The job search may stop at its budget before a shape that fits (exit 3, said
        # on a second line); what it simulated is priced on the GPU all the same.
        assert code == 0 or ("--gpus" in argv and not doc["complete"]), (code, out.err)
        best = doc["best"] or doc["candidates"][0]
        assert 0 < best["iteration_time_ms"] < 1e5
        assert best["throughput"]["tflops_per_gpu"] > 50
    assert main([*argv, "--json", "--hardware", "cpu"]) in (0, 3)
    # Nothing assumed (a budget that ran out on a loaded machine may still say so).
    assert "assuming" not in capsys.readouterr().err


def test_vpp_alone_picks_megatrons_interleaved_1f1b(capsys):
    """Megatron runs its interleaved 1F1B whenever a rank holds several chunks; `--vpp 2`
    alone was refused ("1f1b runs one chunk per rank"). A schedule named with it stays."""
    assert main(["simulate", "--vpp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "interleaved-1f1b"
    assert main(["simulate", "--vpp", "2", "--schedule", "interleaved-zb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "interleaved-zb"
    assert main(["simulate", "--vpp", "2", "--schedule", "1f1b"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "1f1b runs one chunk per rank" in err


@pytest.mark.parametrize("argv", [
    ["simulate", "--preset", "llama3-8b", "--pp", "4", "--hidden-size", "2048"],
    ["plan", "--gpus", "64", "--global-batch-size", "128", "--tp", "2"],
    ["calibrate", "t.json", "--recompute-modules", "core_attn"],
    ["schedule", "--pp", "2"],
])
def test_the_parser_built_for_one_command_reads_it_as_the_whole_parser_does(argv):
    """main() declares only the named command's flags (the model flags made every line pay
    for every command's); what it reads must not change."""
    from ppsim.cli.main import build_parser

    assert vars(build_parser(argv[0]).parse_args(argv)) == vars(build_parser().parse_args(argv))


@pytest.mark.parametrize("args, flag", [
    (["run", "--cp-comm", "p2p"], "--cp-comm p2p"),  # a prefix of --cp-comm-type
    (["simulate", "--micro", "2"], "--micro 2"),
])
def test_a_flag_is_never_taken_by_its_prefix(capsys, args: list[str], flag: str) -> None:
    """A prefix does not stand for a flag (a defect: `run --cp 2` was read as the hidden
    Megatron flag --cp-comm-type and refused in its name)."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and f"unrecognized arguments: {flag}" in err[-1]


@pytest.mark.parametrize("args, said", [
    (["simulate", "--presets", "llama3-8b"],
     "ppsim simulate: error: unrecognized arguments: --presets llama3-8b (--presets: did you "
     "mean --preset?) (see --help)"),
    (["plan", "--gpu", "8", "--microbatch=3"],
     "ppsim plan: error: unrecognized arguments: --gpu 8 --microbatch=3 (--gpu: did you mean "
     "--gpus?; --microbatch: did you mean --microbatches?) (see --help)"),
    (["simulate", "--bogus-flag"],
     "ppsim simulate: error: unrecognized arguments: --bogus-flag (see --help)"),
    # Megatron's --clip-grad is close to run's hidden --dump-grads, which --help never shows
    (["run", "--clip-grad", "1.0"],
     "ppsim run: error: unrecognized arguments: --clip-grad 1.0 (see --help)"),
])
def test_an_unknown_flag_is_named_with_its_command_and_the_close_flag(capsys, args, said):
    """It read "ppsim: error: unrecognized arguments: --presets llama3-8b": no command, no
    hint of the flag meant."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == said


def test_an_expert_tensor_parallel_size_of_0_on_the_command_line_is_refused(capsys) -> None:
    """--etp 0 silently meant "tp" (a config's 0 does, Megatron's flag takes none)."""
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--preset", "deepseek-v3", "--etp", "0"])
    assert exit_.value.code == 2
    assert "--etp/--expert-tensor-parallel-size: must be at least 1, got 0" in \
        capsys.readouterr().err


def test_version_prints_the_installed_distributions(capsys) -> None:
    import tomllib
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"ppsim {declared}" == f"ppsim {version('ppsim')}"
