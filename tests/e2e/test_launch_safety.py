"""`ppsim run` as an unfriendly input or a bad day would have it (issue 15).

Refusals happen before any process starts; the end-to-end cases start real
torchrun processes over gloo (nothing mocked): a rank SIGKILLed mid-run, an
injected fault, and a run whose listening sockets are watched with `ss`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from launch_cases import MOE_TOML, SMALL  # noqa: E402
from launches import Pool  # noqa: E402

from ppsim.cli.main import main
from ppsim.errors import UserError  # noqa: E402
from ppsim.executor import launch, rundir  # noqa: E402


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    monkeypatch.setattr(launch.forked.os, "fork", refuse)


def _one_line(capsys, rc: int, field: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0], err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("argv, field", [
    (["--master-port", "-1"], "--master-port"),
    (["--master-port", "70000"], "--master-port"),
    (["--inject-fault", "1:B:1:0:99"], "--inject-fault"),  # iteration 99 never runs
    (["--inject-fault", "1:B:1:0:2", "--iterations", "2"], "--inject-fault"),
    (["--timeout-s", "nan"], "--timeout-s"),
    (["--timeout-s", "inf"], "--timeout-s"),
    (["--lr", "nan"], "--lr"),
])
def test_out_of_range_values_exit_2_before_any_process(argv, field, tmp_path, capsys,
                                                       no_launch) -> None:
    rc = main(["run", "--trace-dir", str(tmp_path / "t"), *argv])
    _one_line(capsys, rc, field)
    assert not (tmp_path / "t").exists()


def test_a_port_in_use_is_one_line(tmp_path, capsys, no_launch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["run", "--master-port", str(port), "--trace-dir", str(tmp_path / "t")])
    assert "already in use" in _one_line(capsys, rc, "--master-port")
    assert not (tmp_path / "t").exists()


def test_a_port_in_use_on_node_0_of_two_is_one_line(tmp_path, capsys, no_launch) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["run", "--nnodes", "2", "--nproc-per-node", "1", "--master-port", str(port),
                   "--trace-dir", str(tmp_path / "t")])
    assert "already in use" in _one_line(capsys, rc, "--master-port")


def test_a_node_of_several_says_whom_it_waits_for(tmp_path, capsys, no_launch) -> None:
    with pytest.raises(AssertionError, match="a process was started"):
        main(["run", "--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "1",
              "--pp", "3", "--split", "3,3,2", "--master-port", "29533",
              "--trace-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert "node 1 of 3: waiting at 127.0.0.1:29533 for node(s) 0, 2" in err, err


def test_zero_iterations_names_the_iterations(tmp_path, capsys, no_launch) -> None:
    rc = main(["run", "--iterations", "0", "--trace-dir", str(tmp_path / "t")])
    assert "got 0" in _one_line(capsys, rc, "--iterations")


@pytest.mark.e2e
def test_one_iteration_without_warmup_runs_and_is_timed_whole(launches: Pool) -> None:
    # --warmup's default (the first iteration) used to refuse `--iterations 1`.
    run = launches.get("one-iteration")
    got = run.summary
    assert got["iterations"] == 1 and got["warmup_iterations"] == 0
    assert len(got["iteration_times_ms"]) == 1 and got["iteration_time_ms"] > 0
    # --trace-dir=-out: every rank read "-out/run-spec.json" as an option and exited 2.
    assert (run.tmp / "-out" / "trace.json").exists()


def test_a_master_address_not_of_this_machine_is_one_line(tmp_path, capsys,
                                                          no_launch) -> None:
    rc = main(["run", "--master-addr", "192.0.2.1", "--trace-dir", str(tmp_path / "t")])
    _one_line(capsys, rc, "--master-addr")


def test_argparse_errors_name_the_program_once(capsys) -> None:
    with pytest.raises(SystemExit) as top:
        main(["--bogus"])
    with pytest.raises(SystemExit) as sub:
        main(["run", "--iterations", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert top.value.code == 2 and sub.value.code == 2
    assert err[0].startswith("ppsim: error: ") and "ppsim ppsim" not in err[0], err
    assert err[1].startswith("ppsim run: error: argument --iterations"), err


def test_earlier_results_are_refused_not_deleted(tmp_path, capsys, no_launch) -> None:
    out = tmp_path / "out"
    (out / "parts").mkdir(parents=True)
    (out / "trace.json").write_text("old trace")
    (out / "parts" / "rank0.json").write_text("old part")
    rc = main(["run", "--trace-dir", str(out)])
    assert "earlier run" in _one_line(capsys, rc, "--trace-dir")
    assert (out / "trace.json").read_text() == "old trace"
    assert (out / "parts" / "rank0.json").read_text() == "old part"
    assert sorted(os.listdir(out)) == ["parts", "trace.json"]  # no lock left behind


def test_an_earlier_torch_engine_trace_is_refused(tmp_path, capsys, no_launch) -> None:
    """The trace of torch's engine run alongside (DIR/torch/) is an earlier run's result too."""
    out = tmp_path / "out"
    (out / "torch").mkdir(parents=True)
    (out / "torch" / "trace.json").write_text("old torch trace")
    rc = main(["run", "--alongside-torch", "--trace-dir", str(out)])
    assert "earlier run" in _one_line(capsys, rc, "--trace-dir")
    assert (out / "torch" / "trace.json").read_text() == "old torch trace"


@pytest.mark.parametrize("where", ["/proc/self/ppsim-out", "{tmp}/file"])
def test_an_unwritable_trace_dir_is_refused_before_ranks_start(where, tmp_path, capsys,
                                                               no_launch) -> None:
    (tmp_path / "file").write_text("x")
    rc = main(["run", "--trace-dir", where.format(tmp=tmp_path)])
    _one_line(capsys, rc, "--trace-dir")


def test_a_directory_another_run_writes_is_refused(tmp_path, capsys, no_launch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".ppsim-lock-node0").write_text(f"{os.getpid()}\n")  # a live run holds it
    rc = main(["run", "--trace-dir", str(out)])
    assert "another ppsim run" in _one_line(capsys, rc, "--trace-dir")


def test_runs_get_fresh_directories_and_latest_follows(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = rundir.prepare(None, 0, 1000)
    second = rundir.prepare(None, 0, 1000)
    assert first.path != second.path and os.path.dirname(first.path) == "ppsim-run"
    for run in (first, second):
        Path(run.path, "summary.json").write_text("{}")
        rundir.release(run, [])
        rundir.link_latest(run)
    assert os.readlink("ppsim-run/latest") == os.path.basename(second.path)
    assert Path(first.path, "summary.json").exists()
    with pytest.raises(UserError, match="more than"):
        # a stale lock of a dead process is taken over; a huge trace is refused for room
        dead = Path(tmp_path, "big")
        dead.mkdir()
        (dead / ".ppsim-lock-node0").write_text("999999999\n")
        try:
            rundir.prepare(str(dead), 0, 1 << 62)
        except UserError as exc:
            assert "MB free" in str(exc)
            raise UserError("x", "more than the disk") from None
    assert not (tmp_path / "big" / ".ppsim-lock-node0").exists()


def test_print_launch_names_a_fresh_directory_and_creates_nothing(tmp_path, monkeypatch,
                                                                  capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--print-launch"]) == 0
    assert re.search(r"--spec ppsim-run/\d{8}-\d{6}/run-spec.json", capsys.readouterr().out)
    assert os.listdir(tmp_path) == []


def _fake_torchrun(lines: list[str]) -> launch.Outcome:
    code = f"import sys; print({chr(10).join(lines)!r}); sys.exit(1)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return launch.follow(proc, lambda m: None)


def test_a_silent_death_in_torchruns_record_is_the_cause() -> None:
    out = _fake_torchrun([
        "ppsim-error: rank 0 failed in B7 (kind B): RuntimeError: Connection reset by peer",
        "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 6865)  (SIGKILL)", "Root Cause (first observed failure):",
        "[0]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 6864)"])
    assert out.exits == {1: -9, 0: 1}
    errors, notes = launch.failure_lines(out)
    assert errors == ["rank 1 died without reporting an error: killed by signal 9 (SIGKILL) "
                      "(torchrun's record)"]
    assert len(notes) == 1 and "consequences" in notes[0] and "rank 0 failed" in notes[0]


def test_rank_text_is_printed_without_terminal_escapes() -> None:
    out = _fake_torchrun(["ppsim-error: rank 1 failed: \x1b]0;owned\x07\x1b[2J boom\r",
                          "ppsim-abort: rank 0 stopping: \x1b[31mred\x9b"])
    errors, notes = launch.failure_lines(out)
    for line in errors + notes:
        assert not re.search(r"[\x00-\x1f\x7f-\x9f]", line), line
    assert "boom" in errors[0] and "\\x1b" in errors[0]


# ------------------------------------------------------------------ real runs (pooled)


HOSTILE = ("ppsim/__init__.py", "ppsim/executor/__init__.py", "ppsim/executor/worker.py",
           "executor/__init__.py", "executor/worker.py")


@pytest.mark.e2e
def test_a_users_ppsim_or_executor_folder_is_never_imported(tmp_path) -> None:
    # A working directory with folders named like ppsim's: only -P keeps the ranks from
    # importing them (python -m puts the working directory first on sys.path).
    marker = tmp_path / "imported"
    for name in HOSTILE:
        Path(tmp_path, name).parent.mkdir(parents=True, exist_ok=True)
        Path(tmp_path, name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    ppsim = Path(sys.executable).with_name("ppsim")  # the installed command, as a user runs it
    assert ppsim.exists(), ppsim
    res = subprocess.run([str(ppsim), "run", *SMALL, "--trace-dir", "out", "--json"],
                         cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=180)
    assert not marker.exists(), marker.read_text()
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["iterations"] == 2
    assert Path(tmp_path, "out", "run-spec.json").exists()


@pytest.mark.e2e
def test_a_sigkilled_rank_is_named_not_the_survivor(launches: Pool) -> None:
    res = launches.get("sigkill")
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0
    errors = [ln for ln in lines if ln.startswith("ppsim run: error: ")]
    assert errors == ["ppsim run: error: rank 1 died without reporting an error: killed by "
                      "signal 9 (SIGKILL) (torchrun's record)"], res.stderr
    assert not (res.tmp / "out").exists()


@pytest.mark.e2e
def test_a_timeout_blames_the_stalled_rank_not_the_waiting_one(launches: Pool) -> None:
    res = launches.get("stall")  # rank 1's head sleeps; rank 0 times out waiting for it
    lines = res.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("ppsim run: error: ")]
    assert res.returncode != 0 and len(errors) == 1, res.stderr
    assert errors[0].startswith("ppsim run: error: rank 1 failed: it made no progress"), \
        res.stderr
    assert "still in F" in errors[0] and "rank 0 timed out waiting for it" in errors[0]
    assert "Traceback" not in res.stderr


@pytest.mark.e2e
def test_an_injected_fault_blames_one_rank_and_keeps_earlier_results(launches: Pool) -> None:
    res = launches.get("fault")  # test_executor's injected-fault run too
    old = res.tmp / "ppsim-run" / "20000101-000000"
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0
    assert [ln for ln in lines if "error:" in ln] == [lines[0]], res.stderr
    assert lines[0].startswith("ppsim run: error: rank 1 failed in B2"), res.stderr
    assert "rank 0 failed" not in res.stderr
    assert (old / "trace.json").read_text() == "earlier good trace"
    assert sorted(os.listdir(res.tmp / "ppsim-run")) == sorted([old.name, "latest"])
    assert os.readlink(res.tmp / "ppsim-run" / "latest") == old.name


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_run_listens_on_the_master_address_only(launches: Pool) -> None:
    res = launches.get("default")  # run in its folder, watched with ss while it ran
    seen = res.listening
    assert res.returncode == 0, res.stderr
    assert seen and all(a.startswith("127.0.0.1:") for a in seen), seen
    latest = res.tmp / "ppsim-run" / "latest"
    assert res.summary["trace"] == os.path.join("ppsim-run", os.readlink(latest),
                                                "trace.json")
    assert (latest / "trace.json").exists() and (latest / "summary.json").exists()


def test_survivors_torchrun_stopped_are_not_the_cause() -> None:
    out = _fake_torchrun([
        "ppsim-error: rank 1 failed in B2 (kind B, stage 1): RuntimeError: injected fault",
        "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 1)  (SIGTERM)",
        "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 2)"])
    errors, notes = launch.failure_lines(out)
    assert errors == ["rank 1 failed in B2 (kind B, stage 1): RuntimeError: injected fault"]
    assert notes == ["1 other rank(s) stopped because of it"]


def test_a_stopped_rank_is_counted_once_however_often_it_said_so() -> None:
    out = _fake_torchrun([
        "ppsim-abort: rank 0 stopping: rank 1 failed in B2: RuntimeError: injected fault",
        "ppsim-error: rank 1 failed in B2: RuntimeError: injected fault",
        "ppsim-abort: rank 1 stopping: rank 1 failed in B2: RuntimeError: injected fault",
        "ppsim-abort: rank 0 stopping: rank 1 failed in B2: RuntimeError: injected fault"])
    errors, notes = launch.failure_lines(out)
    assert errors == ["rank 1 failed in B2: RuntimeError: injected fault"]
    assert notes == ["1 other rank(s) stopped because of it"]


@pytest.mark.parametrize("argv, fix", [([], "--dp 2"), (["--dp", "3"], "--dp 2"),
                                       (["--tp", "2"], "--dp 2")])
def test_experts_wider_than_the_ranks_they_fold_into_exit_2(argv, fix, tmp_path, capsys,
                                                            no_launch) -> None:
    cfg = tmp_path / "moe.toml"
    cfg.write_text(MOE_TOML + "ep = 2\n")
    rc = main(["run", "--config", str(cfg), "--trace-dir", str(tmp_path / "t"), *argv])
    line = _one_line(capsys, rc, "model.ep")
    assert f"run {fix} (or a multiple)" in line, line
    assert not (tmp_path / "t").exists()


@pytest.mark.e2e
def test_a_rank_that_fails_before_training_says_why_in_one_line(launches: Pool) -> None:
    res = launches.get("rank-builder-error")
    lines = [ln for ln in res.stderr.strip().splitlines() if "note: loading" not in ln]
    assert res.returncode == 1, res.stderr
    assert len(lines) == 2, res.stderr
    assert re.fullmatch(r"ppsim run: error: rank [01] failed: RuntimeError: the tokenizer "
                        r"file is not on this host", lines[0]), res.stderr
    # the other rank failed alike, or torchrun stopped it first
    assert lines[1] in ("ppsim run: rank(s) 0 failed the same way",
                        "ppsim run: rank(s) 1 failed the same way",
                        "ppsim run: 1 other rank(s) stopped because of it"), res.stderr


def test_ranks_that_failed_alike_are_one_note() -> None:
    out = _fake_torchrun([
        "ppsim-error: rank 2 failed: RuntimeError: no such file",
        "ppsim-error: rank 0 failed: RuntimeError: no such file",
        "ppsim-error: rank 1 failed: ValueError: other",
        "ppsim-error: rank 3 failed: RuntimeError: no such file"])
    errors, notes = launch.failure_lines(out)
    assert errors == ["rank 2 failed: RuntimeError: no such file"]
    assert notes == ["also: rank 1 failed: ValueError: other",
                     "rank(s) 0, 3 failed the same way"]
