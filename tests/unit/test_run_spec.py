"""The run spec a launch hands its ranks (every setting, its JSON, its refusals), how the
ranks start from it, `--print-launch`, and the run's bad input refused before any process.
"""
# ruff: noqa: E402 (torch is imported only when present: importorskip comes first)

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]

from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import main
from ppsim.cli.run import run_spec
from ppsim.cli.run_flags import add_run_arguments
from ppsim.config.schema import config_to_dict, load_config
from ppsim.errors import UserError
from ppsim.executor import launch, rundir
from ppsim.executor.runspec import RunSpec


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(argv)


def _spec(argv: list[str]) -> RunSpec:
    args = _parse(argv)
    return run_spec(args)


_SPEC_ARGV = ["--pp", "2", "--vpp", "2", "--schedule", "interleaved-1f1b", "--split",
              "3,1,2,2", "--microbatches", "4", "--iterations", "2", "--warmup", "0",
              "--account-for-loss", "--model", "tests/model_moe.py:build", "--dp", "2",
              "--devices", "0,1", "--memory-gb", "12.5", "--seed", "7", "--lr", "0.02",
              "--timeout-s", "33", "--inject-fault", "1:B:1:0", "--fault-mode", "kill",
              "--device", "cuda", "--dump-grads", "g-"]


def test_the_run_spec_carries_every_setting_and_the_config(tmp_path) -> None:
    args = _parse([*_SPEC_ARGV, "--trace-dir", str(tmp_path)])
    spec = run_spec(args)
    path = rundir.spec_path(str(tmp_path))
    spec.write(path)
    again = RunSpec.read(path)
    assert again == spec
    # What the launcher resolved, field by field, as the ranks see it.
    expected = {"builder": "tests/model_moe.py:build", "dp": 2, "device": "cuda",
                "engine": "ppsim", "alongside_torch": False, "iterations": 2, "warmup": 0,
                "seed": 7, "lr": 0.02, "timeout_s": 33.0, "trace_dir": str(tmp_path),
                "inject_fault": "1:B:1:0", "fault_mode": "kill", "dump_grads": "g-",
                "versus": None, "builder_root": None}
    assert {k: getattr(again, k) for k in expected} == expected
    assert {f.name for f in dataclasses.fields(RunSpec)} == {*expected, "config"}
    # The worker's config is the launcher's, flags applied.
    cfg = again.run_config()
    assert cfg == config_from_args(args)
    assert (cfg.pipeline.split, cfg.pipeline.vpp, cfg.placement.devices,
            cfg.hardware.memory_bytes, cfg.pipeline.account_for_loss) == \
        ([3, 1, 2, 2], 2, [0, 1], 12.5e9, True)


def test_a_versus_spec_holds_the_other_split() -> None:
    spec = _spec(["--split", "5,3", "--versus", "4,4"])
    (mine, other) = spec.problems()
    assert list(mine.split.counts) == [5, 3] and list(other.split.counts) == [4, 4]
    assert RunSpec.from_json(spec.to_json()) == spec


def test_a_versus_layout_is_the_split_its_counts_give() -> None:
    # --versus took counts only ("is not a comma-separated list of integers"); plan's
    # --compare takes a layout too.
    (_, by_layout) = _spec(["--split", "5,3", "--versus", "Et*4|t*4L"]).problems()
    (_, by_counts) = _spec(["--split", "5,3", "--versus", "4,4"]).problems()
    assert by_layout.split.counts == by_counts.split.counts == (4, 4)


@given(st.builds(
    RunSpec, config=st.just(config_to_dict(load_config(None))),
    versus=st.none() | st.just(config_to_dict(load_config(None))),
    builder=st.text(max_size=20), dp=st.integers(1, 64), device=st.sampled_from(["cpu", "cuda"]),
    engine=st.sampled_from(["ppsim", "torch"]), alongside_torch=st.booleans(),
    iterations=st.integers(1, 10**6), warmup=st.integers(0, 10**6), seed=st.integers(),
    lr=st.floats(allow_nan=False, allow_infinity=False), timeout_s=st.floats(1e-3, 1e6),
    trace_dir=st.none() | st.text(max_size=30), inject_fault=st.none() | st.text(max_size=12),
    fault_mode=st.sampled_from([None, "raise", "kill"]),
    dump_grads=st.none() | st.text(max_size=12)))
def test_every_spec_survives_its_json(spec: RunSpec) -> None:
    text = spec.to_json()
    assert RunSpec.from_json(text) == spec
    # A printed launch writes it with a here-document: no line may end it early.
    assert launch.SPEC_END not in text.splitlines()


@pytest.mark.parametrize("change, field", [
    ({"iterations": "3"}, "iterations"),
    ({"iterations": True}, "iterations"),
    ({"lr": float("inf")}, "lr"),
    ({"engine": "jax"}, "engine"),
    ({"fault_mode": "explode"}, "fault_mode"),
    ({"iteration": 3}, "iteration"),
    ({"format": "ppsim-run-spec/0"}, "format"),
    ({"builder": None}, "builder"),
    ({"config": {"pipeline": {"pp": "two"}}}, "config.pipeline.pp"),
    ({"config": {"modle": {}}}, "config.modle"),
    ({"versus": {"pipeline": {"split": "x"}}}, "versus.pipeline.split"),
])
def test_a_bad_spec_names_its_field(change, field) -> None:
    doc = _spec(["--versus", "4,4"]).document()
    for key, value in change.items():
        if key in ("config", "versus"):  # one section's key changed, the rest kept
            for section, table in value.items():
                doc[key][section] = {**doc[key].get(section, {}), **table}
        else:
            doc[key] = value
    with pytest.raises(UserError) as exc:
        RunSpec.from_json(json.dumps(doc))
    assert exc.value.field == field, exc.value


@pytest.mark.parametrize("drop", ["builder", "config", "iterations"])
def test_a_spec_missing_a_required_field_is_refused(drop) -> None:
    doc = _spec([]).document()
    del doc[drop]
    with pytest.raises(UserError, match="missing") as exc:
        RunSpec.from_json(json.dumps(doc))
    assert exc.value.field == drop


def test_a_rank_with_a_bad_spec_names_the_field_and_exits_2(tmp_path) -> None:
    bad = tmp_path / "run-spec.json"
    bad.write_text(json.dumps({**_spec([]).document(), "warmup": "one"}))
    proc = subprocess.run([sys.executable, "-P", "-m", "ppsim.executor.worker", "--spec",
                           str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ppsim-error: rank ? failed: run "
                                                           "spec "), proc.stderr
    assert "warmup: expected int" in proc.stderr


def test_the_executor_imports_nothing_from_the_command_layer() -> None:
    import ast
    from pathlib import Path

    upward = []
    for path in Path(launch.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            upward += [f"{path.name}: {n}" for n in names if n.split(".")[:2] == ["ppsim", "cli"]]
    assert upward == []


def test_ranks_start_from_the_spec_with_the_working_directory_off_the_path() -> None:
    args = _parse([])
    args.nproc_per_node = 2
    cmd = launch.launch_command(args, "out/run-spec.json")
    assert cmd[:4] == [sys.executable, "-P", "-m", "torch.distributed.run"]
    assert "--standalone" in cmd
    # torchrun forks each rank (torch already imported) and runs the worker script in it
    rank = cmd[cmd.index("--start-method"):]
    assert rank[:3] == ["--start-method", "fork", "--run-path"]
    assert Path(rank[3]).resolve() == (ROOT / "executor" / "worker.py").resolve()
    assert rank[4:] == ["--spec", "out/run-spec.json"]
    printed = launch.worker_command("out/run-spec.json", "python")
    assert printed == ["--no-python", "python", "-P", "-u", "-m", "ppsim.executor.worker",
                       "--spec", "out/run-spec.json"]
    # with CUDA (or --rank-start exec) an interpreter per rank, as the printed launch
    for device, start in (("cuda", None), ("cpu", "exec")):
        args.device, args.rank_start = device, start
        cmd = launch.launch_command(args, "out/run-spec.json")
        assert "--start-method" not in cmd
        assert cmd[cmd.index("--no-python") + 1:] == [
            sys.executable, "-P", "-u", "-m", "ppsim.executor.worker", "--spec",
            "out/run-spec.json"]


def test_print_launch_shows_torchrun_and_sbatch(capsys) -> None:
    rc = main(["run", "--print-launch", "--nnodes", "2", "--nproc-per-node", "1",
               "--master-addr", "10.0.0.1", "--master-port", "29511", "--device", "cuda"])
    out = capsys.readouterr().out
    assert rc == 0
    # The one line every node runs: its rank from NODE_RANK (it was --node-rank 0 on all).
    assert 'torchrun --nnodes 2 --node-rank "$NODE_RANK" --master-addr 10.0.0.1 ' \
           '--master-port 29511' in out and "NODE_RANK set to 0..1:" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=1" in out
    assert "--rdzv-backend c10d" in out and "-m ppsim.executor.worker" in out
    # Both forms read one spec, which the printout writes (and ppsim wrote nowhere).
    spec = re.findall(r"--spec (\S+)", out)
    assert len(spec) == 2 and spec[0] == spec[1] and not os.path.exists(spec[0])
    assert out.count(f"cat > {spec[0]} <<'{launch.SPEC_END}'") == 2
    assert "--no-python python -P -u -m ppsim.executor.worker --spec" in out


def test_print_launch_of_several_nodes_asks_for_node_0_s_address(capsys) -> None:
    # No --master-addr: the loopback default reaches no other node.
    assert main(["run", "--print-launch", "--nnodes", "3", "--nproc-per-node", "1", "--pp", "3",
                 "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert '--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port 29500' in out
    assert "NODE_RANK set to 0..2 and MASTER_ADDR to node 0's address:" in out
    assert "127.0.0.1" not in out.split("# Slurm")[0]
    # One node keeps its plain line.
    assert main(["run", "--print-launch", "--device", "cuda"]) == 0
    assert "$NODE_RANK" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["--split", "5,4"], "pipeline.split"),
    (["--nproc-per-node", "3"], "--nproc-per-node"),
    (["--schedule", "nope"], "pipeline.schedule"),
    (["--inject-fault", "1:F:0:0"], "--inject-fault"),  # stage 0 is not on rank 1
    (["--inject-fault", "garbage"], "--inject-fault"),
    (["--warmup", "3", "--iterations", "3"], "--warmup"),
    (["--preset", "llama3-70b", "--pp", "2"], "model: the run's weights"),
    (["--engine", "torch", "--microbatches", "1"], "pipeline.microbatches"),
    (["--model", "no_such_module:build"], "--model"),
    (["--model", "ppsim.executor.builders.gpt"], "--model"),
    (["--dp", "0"], "--dp"),
    (["--dp", "2", "--engine", "torch"], "--dp"),
    (["--dp", "2", "--nproc-per-node", "2"], "--nproc-per-node"),
    (["--config", "{tmp}/bad-builder.toml"], "model.builder"),
])
def test_bad_input_exits_2_before_any_process(argv, field, tmp_path, capsys,
                                              monkeypatch) -> None:
    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    # ppsim run forks torchrun (launch.run_torchrun); an exec'd one would be a Popen
    monkeypatch.setattr(launch, "run_torchrun", no_launch)
    monkeypatch.setattr(launch.subprocess, "Popen", no_launch)
    (tmp_path / "bad-builder.toml").write_text('[model]\npreset = "tiny-gpt"\nbuilder = 3\n')
    argv = [a.format(tmp=tmp_path) for a in argv]
    rc = main(["run", "--trace-dir", str(tmp_path / "t"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and field in err[0], err
    assert not (tmp_path / "t").exists()
