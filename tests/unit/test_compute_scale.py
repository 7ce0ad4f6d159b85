"""A device's kernel rates scaled by one factor (ppsim.config.compute_scale) and the
factor found for a logged iteration (`ppsim calibrate --log`): the fit, the table it
writes, and `--hardware FILE` reading that table back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.compute_scale import (
    NoScale,
    ScaleFit,
    fastest_scale,
    fit_scale,
    scaled_compute,
)
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import load_config
from ppsim.costs.costfile import cost_document, write_costs
from ppsim.pipeline.problem import build_problem, model_costs
from ppsim.sim.engines import simulator
from tests.helpers import run_cli
from tests.unit.test_joblog import megatron_line, torchtitan_line

# One GPU, one stage: every millisecond of its iteration is a kernel's.
ONE_GPU = with_overrides(load_config(None), preset="llama3-8b", hardware="h100-80gb",
                         pipeline={"pp": 1, "microbatches": 2}, split={})


def _iteration_ms(factor: float) -> float:
    cfg = replace(ONE_GPU, hardware=scaled_compute(ONE_GPU.hardware, factor))
    return simulator()(build_problem(cfg), record=False).summary.iteration_time_ms


BASE_MS = _iteration_ms(1.0)


@settings(max_examples=15, deadline=None)
@given(st.floats(0.75, 8.0))
def test_a_job_of_kernels_alone_takes_the_factor_times_as_long(factor) -> None:
    assert _iteration_ms(factor) == pytest.approx(factor * BASE_MS, rel=1e-5)


def test_no_kernel_is_scaled_past_the_devices_peak() -> None:
    hw = ONE_GPU.hardware
    top = max(e for _, e in hw.matmul_efficiency)
    assert fastest_scale(hw) == top  # the preset's best matmul, above its attention
    fastest = scaled_compute(hw, top)
    assert max(e for _, e in fastest.matmul_efficiency) == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="peak"):
        scaled_compute(hw, top * 0.99)
    assert (fastest.inter_node_bandwidth_gbps, fastest.memory_bytes) == \
        (hw.inter_node_bandwidth_gbps, hw.memory_bytes)  # links and memory as they were


@given(st.floats(1.0, 500.0), st.floats(0.0, 500.0), st.floats(0.2, 6.0),
       st.floats(1.0, 2.0))
def test_the_fit_finds_the_factor_of_a_nondecreasing_iteration(slope, fixed, factor,
                                                               power) -> None:
    def iteration(k: float) -> float:
        return slope * k ** power + fixed

    fit = fit_scale(iteration, iteration(factor), 1 / 8, 8.0)
    assert isinstance(fit, ScaleFit)
    assert fit.iteration_ms == pytest.approx(iteration(factor), rel=1e-4)
    # As close as the iteration's tolerance pins it: its slope there turns time into factor.
    assert abs(fit.factor - factor) <= 2e-4 * iteration(factor) / (
        slope * power * factor ** (power - 1))
    assert fit.steps <= 40


def test_an_affine_iteration_takes_one_step_past_the_ends() -> None:
    fit = fit_scale(lambda k: 100 * k + 50, 175.0, 1 / 8, 8.0)
    assert isinstance(fit, ScaleFit) and fit.steps == 3
    assert fit.factor == pytest.approx(1.25, rel=1e-12)


def test_a_target_out_of_reach_says_which_end() -> None:
    short = fit_scale(lambda k: 100 * k + 50, 40.0, 0.5, 8.0)
    long = fit_scale(lambda k: 100 * k + 50, 900.0, 0.5, 8.0)
    assert short == NoScale(low=0.5, high=8.0, fastest_ms=100.0, slowest_ms=850.0)
    assert isinstance(long, NoScale) and long.slowest_ms < 900.0


# ------------------------------------------------------------------ the command

JOB = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16", "--tp", "2",
       "--pp", "2", "--global-batch-size", "32", "--overlap-grad-reduce"]


def _simulated(argv: list[str]) -> dict:
    ran = run_cli(["simulate", *argv, "--json"])
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def _megatron_log(path: Path, ms: float, gbs: int = 32) -> Path:
    lines = [megatron_line(i, ms * (1.3 if i == 10 else 1.0), None, gbs) for i in (10, 20, 30)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_megatron_log_calibrates_the_hardware_the_plan_then_reads(tmp_path) -> None:
    """Before: `--log` was no flag of calibrate, and --hardware took a preset's name only."""
    before = _simulated(JOB)["iteration_time_ms"]
    logged = round(before * 1.2, 1)  # printed to 0.1 ms, as Megatron prints it
    log, out = _megatron_log(tmp_path / "train.log", logged), tmp_path / "hw.toml"
    ran = run_cli(["calibrate", "--log", str(log), *JOB, "--hardware-out", str(out), "--json"])
    assert ran.returncode == 0, ran.stderr
    fit = json.loads(ran.stdout)
    assert (fit["fitted_on"], fit["lines"], fit["left_out"]) == ("iteration_ms", 2, 1)
    assert fit["logged_iteration_ms"] == pytest.approx(logged, rel=1e-9)
    assert 1.2 < fit["compute_scale"] < 1.35  # the links' share does not slow down
    again = JOB[:2] + JOB[4:] + ["--hardware", str(out)]
    assert _simulated(again)["iteration_time_ms"] == pytest.approx(logged, rel=2e-4)
    assert out.read_text().startswith("# ppsim calibrate --log")


def test_a_torchtitan_log_is_fitted_on_its_tokens_per_second(tmp_path) -> None:
    job = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
           "--microbatches", "2"]
    tps = _simulated(job)["throughput"]["tokens_per_s_per_gpu"] / 1.5
    log = tmp_path / "titan.log"
    log.write_text("\n".join(torchtitan_line(s, tps, 300.0, 30.0) for s in (1, 10, 20)))
    out = tmp_path / "hw.toml"
    ran = run_cli(["calibrate", "--log", str(log), *job, "--hardware-out", str(out), "--json"])
    assert ran.returncode == 0, ran.stderr
    fit = json.loads(ran.stdout)
    assert fit["fitted_on"] == "tokens_per_s_per_gpu"
    assert fit["compute_scale"] == pytest.approx(1.5, rel=1e-3)  # one GPU: kernels alone
    calibrated = _simulated([*job[:2], *job[4:], "--hardware", str(out)])
    assert calibrated["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(round(tps),
                                                                               rel=2e-4)


@pytest.mark.parametrize("extra, log_ms, field, says", [
    ([], None, "--log", "logs global batch size 64, the job 32"),
    ([], 0.5, "--log", "is shorter than the job simulates"),
    (["--out", "c.json"], None, "--out", "--log writes a [hardware] table"),
    (["--costs", "costs.json"], None, "--costs", "which a cost file replaces"),
    (["--hardware-out", "LOG"], None, "--hardware-out", "is also --log"),
    (["trace.json"], None, "--log", "given with the trace trace.json"),
])
def test_a_log_that_cannot_calibrate_the_job_is_refused_by_name(tmp_path, extra, log_ms,
                                                               field, says) -> None:
    log = _megatron_log(tmp_path / "train.log", log_ms or 900.0,
                        gbs=64 if field == "--log" and log_ms is None and not extra else 32)
    extra = [str(log) if x == "LOG" else x for x in extra]
    ran = run_cli(["calibrate", "--log", str(log), *JOB, *extra])
    assert ran.returncode == 2
    line = ran.stderr.strip().splitlines()[-1]
    assert line.startswith(f"ppsim calibrate: error: {field}: ") and says in line, line


@pytest.mark.parametrize("text, says", [
    (None, "cannot read"),
    ("[model]\npreset = \"tiny-gpt\"\n", "has no [hardware] table"),
    ("[hardware]\npreset = \"h100-80gb\"\nattention_efficiency = -1\n", "attention_efficiency"),
])
def test_a_hardware_file_that_cannot_be_read_is_refused(tmp_path, text, says) -> None:
    path = tmp_path / "hw.toml"
    if text is not None:
        path.write_text(text)
    ran = run_cli(["simulate", "--preset", "llama3-8b", "--hardware", str(path)])
    assert ran.returncode == 2 and says in ran.stderr and "Traceback" not in ran.stderr


@pytest.mark.parametrize("off, named", [(1.2, True), (1.02, False)])
def test_a_compared_log_far_off_names_calibrate(tmp_path, off, named) -> None:
    """Before: the comparison said how far off, and nothing of what to do about it."""
    logged = round(_simulated(JOB)["iteration_time_ms"] * off, 1)
    log = _megatron_log(tmp_path / "train log.txt", logged)  # named as a shell takes it
    ran = run_cli(["simulate", *JOB, "--compare-log", str(log)])
    assert ran.returncode == 0, ran.stderr
    assert (f"ppsim calibrate --log '{log}' with" in ran.stdout) == named


@pytest.mark.parametrize("text, says", [(None, "cannot read"), ("\n", "has no line")])
def test_a_log_that_cannot_be_read_is_named_as_calibrates_flag(tmp_path, text, says) -> None:
    """Before: calibrate --log's unreadable log was blamed on --compare-log."""
    log = tmp_path / "train.log"
    if text is not None:
        log.write_text(text)
    ran = run_cli(["calibrate", "--log", str(log), *JOB])
    assert ran.returncode == 2
    assert ran.stderr.startswith("ppsim calibrate: error: --log: ") and says in ran.stderr


def test_a_compared_log_names_calibrate_only_where_it_can_take_the_job(tmp_path) -> None:
    """Before: a job priced by a cost file was told to run calibrate --log, which refuses
    --costs (a cost file's times replace the rates it scales)."""
    costs = tmp_path / "costs.json"
    default = load_config(None)
    write_costs(str(costs), cost_document(model_costs(default), source="hand",
                                          model=default.model.fields()))
    logged = round(_simulated(["--costs", str(costs)])["iteration_time_ms"] * 1.5, 1)
    log = tmp_path / "train.log"
    log.write_text("\n".join(megatron_line(i, logged, None, 16) for i in (10, 20, 30)))
    for flags, named in (([], True), (["--costs", str(costs)], False)):
        ran = run_cli(["simulate", *flags, "--compare-log", str(log)])
        assert ran.returncode == 0, ran.stderr
        assert "(-33.3%)" in ran.stdout
        assert ("ppsim calibrate --log" in ran.stdout) == named
    refused = run_cli(["calibrate", "--log", str(log), "--costs", str(costs)])
    assert refused.returncode == 2 and "error: --costs:" in refused.stderr


@pytest.mark.parametrize("name", ["hw.toml", "HW.TOML"])
def test_a_hardware_files_bad_field_names_the_file(tmp_path, name) -> None:
    """Before: beside --config's own [hardware], `hardware.efficiency` pointed at neither
    file; and a file named .TOML was looked up as a preset."""
    config, path = tmp_path / "job.toml", tmp_path / name
    config.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n')
    path.write_text('[hardware]\npreset = "h100-80gb"\nefficiency = nan\n')
    ran = run_cli(["simulate", "--config", str(config), "--hardware", str(path)])
    assert ran.returncode == 2
    assert ran.stderr.startswith(f"ppsim simulate: error: --hardware {path}: "
                                 "hardware.efficiency: must be a finite number"), ran.stderr
    path.write_text('[hardware]\npreset = "h100-80gb"\nefficiency = 0.4\n')
    assert run_cli(["simulate", "--config", str(config), "--hardware", str(path)]
                   ).returncode == 0


def test_a_log_faster_than_the_devices_peak_is_refused_as_that(tmp_path) -> None:
    """Before: the refusal called the fastest simulation 'its communication and bubble
    alone', though on one GPU it is all kernels, with the best matmul at the peak."""
    job = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "1",
           "--microbatches", "2"]
    peak = fastest_scale(ONE_GPU.hardware)
    log = _megatron_log(tmp_path / "train.log", round(BASE_MS * peak * 0.95, 1), gbs=2)
    ran = run_cli(["calibrate", "--log", str(log), *job, "--hardware-out",
                   str(tmp_path / "hw.toml")])
    assert ran.returncode == 2
    at_peak = f"{BASE_MS * peak:,.1f} ms, the best matmul at the device's peak"
    assert f"kernels at {1 / peak:.2f}x the hardware's rates ({at_peak})" in ran.stderr
    assert "communication" not in ran.stderr
