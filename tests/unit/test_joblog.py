"""A real job's training log beside its simulation (`ppsim simulate --compare-log`): the
lines as Megatron-LM and torchtitan print them, restated here from their sources."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.trace.joblog import logged_run, parse_line


def megatron_line(iteration: int, ms: float, tflops: float | None, gbs: int = 1024) -> str:
    """megatron/training/training.py, training_log: the fields in their order and
    formats (`{:8d}/{:8d}`, `{:.1f}`), `throughput per GPU` only with --log-throughput."""
    line = " [2026-12-01 10:00:00.123456]"
    line += f" iteration {iteration:8d}/{500000:8d} |"
    line += f" consumed samples: {iteration * 1024:12d} |"
    line += f" elapsed time per iteration (ms): {ms:.1f} |"
    if tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    line += f" learning rate: {3e-4:.6E} | global batch size: {gbs:5d} |"
    line += f" lm loss: {7.1:.6E} | loss scale: 1.0 | grad norm: 1.234 |"
    return line


def torchtitan_line(step: int, tps: float, tflops: float, mfu: float,
                    reserved_gib: float = 30.5) -> str:
    """torchtitan/components/metrics.py, MetricsProcessor.log: coloured fields (memory
    the most reserved in GiB `5.2f` with its share of the device, tps rounded with
    thousands separators, tflops `,.2f`, mfu `.2f%`) after the logger's prefix."""
    red, green, blue, cyan, magenta, reset = (f"\x1b[{c}m" for c in (31, 32, 34, 36, 35, 39))
    turquoise = "\x1b[38;2;54;234;195m"
    return (f"[rank0]:[titan] 2024-12-01 10:00:00,123 - root - INFO - {red}step: {step:2}  "
            f"{green}loss:  7.1234  {turquoise}memory: {reserved_gib:5.2f}GiB"
            f"({reserved_gib / 80 * 100:.2f}%)  {blue}tps: {round(tps):,}  "
            f"{cyan}tflops: {tflops:,.2f}  {magenta}mfu: {mfu:.2f}%{reset}")


@given(st.integers(1, 10**7), st.floats(0.1, 1e7), st.floats(0.1, 5000.0))
def test_a_megatron_line_reads_back_as_printed(iteration, ms, tflops) -> None:
    step = parse_line(megatron_line(iteration, ms, tflops))
    assert step is not None and step.framework == "Megatron-LM"
    assert step.iteration == iteration
    assert step.iteration_ms == pytest.approx(float(f"{ms:.1f}"))
    assert step.tflops_per_gpu == pytest.approx(float(f"{tflops:.1f}"))


@given(st.integers(1, 10**6), st.floats(1.0, 1e8), st.floats(0.01, 5000.0),
       st.floats(0.0, 100.0))
def test_a_torchtitan_line_reads_back_as_printed(step_no, tps, tflops, mfu) -> None:
    step = parse_line(torchtitan_line(step_no, tps, tflops, mfu))
    assert step is not None and step.framework == "torchtitan"
    assert step.iteration == step_no
    assert step.tokens_per_s_per_gpu == round(tps)
    assert step.tflops_per_gpu == pytest.approx(float(f"{tflops:.2f}"))
    assert step.mfu == pytest.approx(float(f"{mfu:.2f}") / 100)


@pytest.mark.parametrize("line", [
    " iteration 80/ 100 | elapsed time per iteration (ms): 1548.1 | mem usages: 0.8131 | "
    "throughput per GPU (TFLOP/s/GPU): 57.6 | Tokens per second per GPU (Tok/s/GPU): 2645.8 |",
    " iteration 80/ 100 | elapsed time per iteration (ms): 1548.1 | tokens per GPU "
    "(tokens/s/GPU): 2645.8 | compute per GPU (TFLOP/s/GPU): 57.6 (avg 57.5) |",
])
def test_forks_of_megatron_that_print_tokens_per_gpu(line) -> None:
    step = parse_line(line)
    assert step is not None and step.framework == "Megatron-LM" and step.iteration == 80
    assert (step.iteration_ms, step.tflops_per_gpu, step.tokens_per_s_per_gpu) == (
        1548.1, 57.6, 2645.8)


def test_the_first_line_is_warm_up_and_the_rest_give_their_median() -> None:
    lines = ["loading checkpoint...", megatron_line(10, 30000.0, 170.0),
             megatron_line(20, 15100.0, 340.0), "validation loss ...",
             megatron_line(30, 15300.0, 336.0), megatron_line(40, 15000.0, 342.0)]
    run = logged_run(lines)
    assert run.framework == "Megatron-LM" and run.left_out == 1 and len(run.steps) == 3
    assert run.median("iteration_ms") == 15100.0
    assert run.median("tflops_per_gpu") == 340.0
    assert run.median("tokens_per_s_per_gpu") is None
    one = logged_run([megatron_line(10, 1234.5, None)])
    assert one.left_out == 0 and one.median("iteration_ms") == 1234.5
    assert one.median("tflops_per_gpu") is None  # no --log-throughput


def deepspeed_line(step: int, samples_per_s: float, max_gib: float) -> str:
    """deepspeed/utils/timer.py, ThroughputTimer.stop: `{}`-formatted fields after the
    logger's prefix; memory in GiB rounded to 2 places."""
    running, now = samples_per_s * 0.97, round(max_gib / 3, 2)
    return ("[2024-03-07 15:27:02,646] [INFO] [timer.py:260:stop] "
            f"epoch={0}/micro_step={step}/global_step={step}, RunningAvgSamplesPerSec="
            f"{running}, CurrSamplesPerSec={samples_per_s}, MemAllocated={now}GB, "
            f"MaxMemAllocated={round(max_gib, 2)}GB")


@given(st.integers(1, 10**6), st.floats(0.001, 1e6), st.floats(0.0, 200.0))
def test_a_deepspeed_line_reads_back_as_printed(step_no, samples, gib) -> None:
    step = parse_line(deepspeed_line(step_no, samples, gib))
    assert step is not None and step.framework == "DeepSpeed"
    assert step.iteration == step_no and step.samples_per_s == samples
    assert step.max_allocated_gib == round(gib, 2)


def test_a_megatron_deepspeed_log_reads_megatrons_lines() -> None:
    run = logged_run([deepspeed_line(10, 50.0, 19.5), megatron_line(10, 14287.5, None),
                      deepspeed_line(20, 53.0, 19.6), megatron_line(20, 14100.0, None)])
    assert run.framework == "Megatron-LM" and [s.iteration_ms for s in run.steps] == [14100.0]
    assert run.max_allocated == {0: 19.6 * 2**30}  # DeepSpeed's rank 0 report


@pytest.mark.parametrize("lines, words", [
    (["nothing here", "iteration 5 done"], "has no line Megatron-LM"),
    ([megatron_line(10, 1.0, 1.0), torchtitan_line(10, 1.0, 1.0, 1.0)],
     "torchtitan's lines beside Megatron-LM's"),
    ([deepspeed_line(10, 1.0, 1.0), torchtitan_line(10, 1.0, 1.0, 1.0)],
     "torchtitan's lines beside DeepSpeed's"),
])
def test_a_log_without_one_frameworks_speed_lines_is_refused(lines, words) -> None:
    with pytest.raises(UserError, match=words) as err:
        logged_run(lines)
    assert err.value.field == "--compare-log"


SIMULATE = ["simulate", "--preset", "llama3.1-405b", "--hardware", "h100-80gb", "--tp", "8",
            "--pp", "16", "--microbatches", "32"]


def test_simulate_sets_the_logged_speed_beside_its_own(tmp_path, capsys) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(megatron_line(10 * i, ms, tf) for i, (ms, tf) in enumerate(
        [(40000.0, 130.0), (15000.0, 345.0), (15200.0, 340.0), (15100.0, 342.0)], 1)))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = doc["compared_with_log"]
    assert got["framework"] == "Megatron-LM" and got["lines"] == 3 and got["left_out"] == 1
    assert got["logged"] == {"iteration_ms": 15100.0, "tflops_per_gpu": 342.0}
    ms, tflops = doc["iteration_time_ms"], doc["throughput"]["tflops_per_gpu"]
    assert got["error"]["iteration_ms"] == pytest.approx(ms / 15100.0 - 1)
    assert got["error"]["tflops_per_gpu"] == pytest.approx(tflops / 342.0 - 1)
    # the log's job trained 1,024 sequences an iteration, the simulated one more
    assert got["global_batch_sizes"] == [1024, doc["job"]["global_batch_size"]] != [1024, 1024]
    assert main([*SIMULATE, "--compare-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "logged by Megatron-LM (median of 3 line(s), the first left out as warm-up): " \
           "iteration 15,100.0 ms, 342.0 TFLOP/s/GPU; simulated: iteration" in out
    assert "the log's global batch size is 1,024" in out
    log.write_text(megatron_line(10, 15000.0, 345.0, doc["job"]["global_batch_size"]))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["compared_with_log"]["global_batch_sizes"] is None


def test_torchtitans_log_is_compared_by_its_own_flop_count(tmp_path, capsys) -> None:
    log = tmp_path / "titan.log"
    log.write_text("\n".join(torchtitan_line(10 * i, tps, 300.0, 30.0)
                             for i, tps in enumerate([100.0, 5000.0, 5200.0], 1)))
    argv = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--fsdp", "--dp",
            "8", "--pp", "1", "--json", "--compare-log", str(log)]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    got, t = doc["compared_with_log"], doc["throughput"]
    assert got["logged"] == {"tokens_per_s_per_gpu": 5100.0, "tflops_per_gpu": 300.0,
                             "mfu": 0.3}
    assert got["simulated"]["tflops_per_gpu"] == t["torchtitan_tflops_per_gpu"]
    assert got["simulated"]["mfu"] == t["torchtitan_mfu"]
    assert got["error"]["tokens_per_s_per_gpu"] == pytest.approx(
        t["tokens_per_s_per_gpu"] / 5100.0 - 1)


def test_torchtitans_reserved_memory_is_set_beside_the_first_stages_peak(tmp_path,
                                                                        capsys) -> None:
    """torchtitan logs rank 0's most reserved memory (GiB) each interval: the largest is
    set beside pipeline rank 0's simulated peak, named as the reserve it is."""
    log = tmp_path / "titan.log"
    log.write_text("\n".join(torchtitan_line(10 * i, 5000.0, 300.0, 30.0, gib)
                             for i, gib in enumerate([61.25, 70.5, 69.0], 1)))
    argv = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--fsdp", "--dp",
            "4", "--pp", "2", "--microbatches", "8", "--compare-log", str(log)]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got, peak = doc["compared_with_log"], doc["ranks"][0]["peak_memory_bytes"]
    assert got["memory_measure"] == "max reserved"
    assert got["memory"] == [{"pipeline_rank": 0, "logged_bytes": 70.5 * 2**30,
                              "simulated_bytes": peak,
                              "error": pytest.approx(peak / (70.5 * 2**30) - 1)}]
    assert main(argv) == 0
    assert (f"the log's max reserved / simulated, GB): r0 {70.5 * 2**30 / 1e9:.1f} / "
            f"{peak / 1e9:.1f}") in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, "no speed here\n"])
def test_a_missing_or_speedless_log_exits_2_in_one_line(content, tmp_path, capsys) -> None:
    log = tmp_path / "train.log"
    if content is not None:
        log.write_text(content)
    assert main([*SIMULATE, "--compare-log", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compare-log" in err[0] and "Traceback" not in err[0]


def memory_line(rank: int, iterations: int, max_mb: float) -> str:
    """megatron/training/utils report_memory (MB of 2^20 bytes, `:.2f` in current
    releases), printed by each data-parallel rank 0."""
    return (f"[Rank {rank}] (after {iterations} iterations) memory (MB) | allocated: "
            f"{max_mb / 2:.2f} | max allocated: {max_mb:.2f} | reserved: {max_mb + 9:.2f} | "
            f"max reserved: {max_mb + 10:.2f}")


def test_each_stages_logged_peak_is_set_beside_the_simulated(tmp_path, capsys) -> None:
    """The 405B job on 8,192 GPUs (tp 8, dp 64, pp 16): data-parallel rank 0 of stage p
    holds global ranks 512 p .. 512 p + 7 in Megatron's order; each rank's largest report
    counts (the one after the optimizer's state exists), a stage's most of its ranks."""
    log = tmp_path / "train.log"
    log.write_text("\n".join([megatron_line(10, 15000.0, 345.0),
                               memory_line(0, 10, 50000.0), memory_line(0, 20, 60000.0),
                               memory_line(3, 20, 61000.5), memory_line(512, 20, 55000.0),
                               memory_line(7680, 20, 40000.0)]))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    peaks = [r["peak_memory_bytes"] for r in doc["ranks"]]
    got = doc["compared_with_log"]["memory"]
    want = {0: 61000.5 * 2**20, 1: 55000.0 * 2**20, 15: 40000.0 * 2**20}
    assert [m["pipeline_rank"] for m in got] == [0, 1, 15]
    for m in got:
        assert m["logged_bytes"] == want[m["pipeline_rank"]]
        assert m["simulated_bytes"] == peaks[m["pipeline_rank"]]
        assert m["error"] == pytest.approx(peaks[m["pipeline_rank"]] / m["logged_bytes"] - 1)
    assert main([*SIMULATE, "--compare-log", str(log)]) == 0
    assert f"r0 {61000.5 * 2**20 / 1e9:.1f} / {peaks[0] / 1e9:.1f}" in capsys.readouterr().out


def test_deepspeeds_samples_per_second_against_the_simulated_batch(tmp_path, capsys) -> None:
    log = tmp_path / "ds.log"
    log.write_text("\n".join(deepspeed_line(10 * i, sps, 70.0) for i, sps in
                             enumerate([20.0, 140.0, 150.0, 145.0], 1)))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = doc["compared_with_log"]
    assert got["framework"] == "DeepSpeed" and got["logged"] == {"samples_per_s": 145.0}
    simulated = doc["job"]["global_batch_size"] / (doc["iteration_time_ms"] / 1e3)
    assert got["simulated"]["samples_per_s"] == pytest.approx(simulated)
    assert [(m["pipeline_rank"], m["logged_bytes"]) for m in got["memory"]] == [(0, 70 * 2**30)]


def test_a_rank_outside_the_simulated_job_is_named_and_no_stage_compared(tmp_path,
                                                                        capsys) -> None:
    """The 405B job has 8,192 GPUs (ranks 0 .. 8,191): a log reporting rank 9,000 is
    another job's, and its ranks would fall on the wrong stages."""
    log = tmp_path / "train.log"
    log.write_text("\n".join([megatron_line(10, 15000.0, 345.0, 2048),
                               memory_line(0, 20, 60000.0), memory_line(9000, 20, 1.0)]))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    got = json.loads(capsys.readouterr().out)["compared_with_log"]
    assert got["rank_beyond"] == [9000, 8192] and got["memory"] == []
    assert main([*SIMULATE, "--compare-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "the log reports rank 9,000, beyond the simulated job's 8,192 GPUs" in out
    assert "peak memory by pipeline rank" not in out


def test_nemos_progress_bar_gives_a_step_per_update() -> None:
    """NeMo's progress bar (global_step and train_step_timing in seconds), its updates
    split by carriage returns on one line of the file, as a terminal log holds them."""
    bar = "\r".join(f"Epoch 0: : {i}/100 [00:{i:02d}<01:00, reduced_train_loss=6.370, "
                    f"global_step={i - 1}.00, consumed_samples={128 * i}.0, "
                    f"train_step_timing in s={t}]" for i, t in
                    ((1, "40.00"), (2, "11.20"), (3, "11.40"), (4, "11.30")))
    run = logged_run(["[NeMo I 2024-06-17 08:36:41] starting", bar,
                      "Epoch 0: : 2e+3 steps, global_step=2e+3, train_step_timing in s=11.25"])
    assert run.framework == "NeMo" and run.left_out == 1
    assert [s.iteration for s in run.steps] == [1, 2, 3, 2000]
    assert run.median("iteration_ms") == pytest.approx(11275.0)


@pytest.mark.parametrize(("iterations", "warned"), [([1], True), ([10], False),
                                                    ([1, 2], False)])
def test_a_log_of_the_first_iteration_alone_is_said_to_be_warm_up(iterations, warned,
                                                                   tmp_path, capsys) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(megatron_line(i, 15000.0, 345.0) for i in iterations))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["compared_with_log"]["first_only"] is warned
    assert main([*SIMULATE, "--compare-log", str(log)]) == 0
    said = "the log's one line is the first iteration, which warm-up slows"
    assert (said in " ".join(capsys.readouterr().out.split())) is warned


def nemo2_line(iteration: int, seconds: float, gbs: int) -> str:
    """NeMo 2's ProgressPrinter (nemo/lightning/pytorch/callbacks/progress_printer.py):
    `Training epoch E, iteration N/T` then ` | name: value` per metric, a whole float as
    an int, any other as `{:.4}` (4 significant figures, maybe in e-notation)."""
    metrics = {"lr": 1.5e-6, "global_batch_size": float(gbs), "global_step": float(iteration),
               "reduced_train_loss": 11.03, "train_step_timing in s": seconds,
               "consumed_samples": float(gbs * (iteration + 1))}
    line = f"Training epoch 0, iteration {iteration}/99"
    for name, v in metrics.items():
        line += f" | {name}: {int(v)}" if v.is_integer() else f" | {name}: {v:.4}"
    return line


def test_nemo2s_progress_printer_lines_are_read(tmp_path, capsys) -> None:
    lines = [nemo2_line(i, t, 256) for i, t in enumerate([40.0, 6.08, 6.061, 1234.5])]
    assert lines[3].endswith("train_step_timing in s: 1.234e+03 | consumed_samples: 1024")
    run = logged_run(["[NeMo I 2025-01-10 10:00:00 nemo_logging:393] setting up", *lines])
    assert run.framework == "NeMo" and run.left_out == 1
    assert [s.iteration for s in run.steps] == [1, 2, 3]
    assert run.median("iteration_ms") == pytest.approx(6080.0)
    assert run.median("global_batch_size") == 256
    log = tmp_path / "nemo.log"
    log.write_text("\n".join(lines))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = doc["compared_with_log"]
    assert got["framework"] == "NeMo" and got["logged"]["iteration_ms"] == pytest.approx(6080.0)
    assert got["global_batch_sizes"] == [256, doc["job"]["global_batch_size"]]


def test_a_log_a_later_launch_appended_to_is_compared_by_its_last_run(tmp_path,
                                                                        capsys) -> None:
    """`tee -a train.log` over two launches: the second run's lines alone are compared,
    its own warm-up line left out, not a median over both runs (a figure of neither)."""
    first = [megatron_line(10 * i, ms, 100.0) for i, ms in
             enumerate([90000.0, 30000.0, 30000.0, 30000.0], 1)]
    second = [megatron_line(10 * i, ms, 300.0) for i, ms in
              enumerate([50000.0, 15000.0, 15200.0], 1)]
    run = logged_run([*first, memory_line(0, 10, 60000.0), *second,
                      memory_line(0, 10, 40000.0)])
    assert run.earlier_runs == 1 and run.left_out == 1
    assert [s.iteration for s in run.steps] == [20, 30]
    assert run.median("iteration_ms") == 15100.0
    assert run.max_allocated == {0: 40000.0 * 2**20}
    one = logged_run(first)
    assert one.earlier_runs == 0 and one.median("iteration_ms") == 30000.0
    log = tmp_path / "train.log"
    log.write_text("\n".join([*first, *second]))
    assert main([*SIMULATE, "--json", "--compare-log", str(log)]) == 0
    got = json.loads(capsys.readouterr().out)["compared_with_log"]
    assert got["earlier_runs"] == 1 and got["logged"]["iteration_ms"] == 15100.0
    assert main([*SIMULATE, "--compare-log", str(log)]) == 0
    assert "after 1 earlier one(s)" in " ".join(capsys.readouterr().out.split())
