"""In-process tests of the executor's parts: model, deferred W, messages, launch, CLI checks.

The multi-process tests (real torchrun + gloo) are in test_executor.py.
"""

from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")

from executor import launch  # noqa: E402
from executor.cli import add_run_arguments, load_problem  # noqa: E402
from executor.model import (  # noqa: E402
    GPTShape,
    Linear,
    StageModule,
    WeightGradStore,
    full_model,
    microbatch,
    stage_loss,
)
from executor.recorder import merge_parts  # noqa: E402
from executor.runtime import Fault, outgoing  # noqa: E402
from ppsim.cli import main  # noqa: E402
from ppsim.config import load_config, model_fields  # noqa: E402
from ppsim.schedules import build_schedule  # noqa: E402

SHAPE = GPTShape.from_fields(model_fields(load_config(None).model))


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(argv)


def test_stages_compose_to_the_full_model() -> None:
    full = full_model(SHAPE)
    parts = [StageModule(SHAPE, 0, 3, True, False), StageModule(SHAPE, 3, 0, False, False),
             StageModule(SHAPE, 3, 5, False, True)]
    ids, _ = microbatch(SHAPE, 0, 0, 0)
    x = ids
    for part in parts:
        x = part(x)
    torch.testing.assert_close(x, full(ids), rtol=0, atol=0)
    names = {n for part in parts for n, _ in part.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}


def test_data_is_seeded_and_learnable() -> None:
    a, b = microbatch(SHAPE, 0, 1, 2), microbatch(SHAPE, 0, 1, 2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], microbatch(SHAPE, 0, 1, 3)[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # targets are the next tokens
    assert a[0].shape == (SHAPE.micro_batch_size, SHAPE.seq_length)


@pytest.mark.parametrize("gated", [False, True])
def test_deferred_weight_grads_equal_plain_backward(gated: bool) -> None:
    shape = GPTShape(**{**SHAPE.__dict__, "gated_mlp": gated, "num_kv_heads": 2})
    ref, zb = StageModule(shape, 0, 2, True, True), StageModule(shape, 0, 2, True, True)
    ids, targets = microbatch(shape, 0, 0, 0)
    stage_loss(ref(ids), targets).backward()
    WeightGradStore.enabled = True
    try:
        loss = stage_loss(zb(ids), targets)
        WeightGradStore.deferring, WeightGradStore.key = True, (0, 0)
        loss.backward()
        WeightGradStore.deferring, WeightGradStore.key = False, None
        deferred = {n for n, p in zb.named_parameters() if p.grad is None}
        linear = {f"{m}.{n}" for m, mod in zb.named_modules() if isinstance(mod, Linear)
                  for n, _ in mod.named_parameters()}
        assert deferred == linear  # only matmul weights wait for W
        assert WeightGradStore.held_bytes((0, 0)) > 0
        WeightGradStore.run((0, 0))
    finally:
        WeightGradStore.enabled = WeightGradStore.deferring = False
        WeightGradStore.key = None
    for (n, p), (_, q) in zip(ref.named_parameters(), zb.named_parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


def test_outgoing_messages_follow_the_sender_order() -> None:
    s = build_schedule("interleaved-1f1b", 2, 2, 4)
    sent = outgoing(s, 0)
    assert all(dst == 1 for dst, _ in sent)
    assert sent[0] == (1, ("F", 1, 0))
    # every activation and gradient crossing ranks is sent exactly once
    everything = [k for r in range(2) for _, k in outgoing(s, r)]
    assert len(everything) == len(set(everything)) == 2 * (4 - 1) * 4


def test_fault_spec() -> None:
    assert Fault.parse("1:B:1:2") == Fault(1, "B", 1, 2, 0)
    assert Fault.parse("0:F:2:3:1") == Fault(0, "F", 2, 3, 1)
    for bad in ("1:X:1:2", "1:B:1", "a:B:1:2"):
        with pytest.raises(ValueError):
            Fault.parse(bad)


def test_worker_argv_round_trips_the_config(tmp_path) -> None:
    args = _parse(["--pp", "2", "--vpp", "2", "--schedule", "interleaved-1f1b", "--split",
                   "3,1,2,2", "--microbatches", "4", "--iterations", "2", "--warmup", "0",
                   "--trace-dir", str(tmp_path), "--account-for-loss"])
    again = _parse(launch.worker_argv(args))
    for key in ("pp", "vpp", "schedule", "split", "microbatches", "iterations", "warmup",
                "trace_dir", "account_for_loss", "engine", "device"):
        assert getattr(again, key) == getattr(args, key), key
    args.nproc_per_node = 2
    cmd = launch.launch_command(args)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in cmd
    assert cmd[cmd.index("-m", 3) + 1] == "executor.worker"


def test_print_launch_shows_torchrun_and_sbatch(capsys) -> None:
    rc = main(["run", "--print-launch", "--nnodes", "2", "--nproc-per-node", "1",
               "--master-addr", "10.0.0.1", "--master-port", "29511", "--device", "cuda"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "torchrun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29511" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=1" in out
    assert "--rdzv-backend c10d" in out and "-m executor.worker" in out


@pytest.mark.parametrize("argv, field", [
    (["--split", "5,4"], "pipeline.split"),
    (["--nproc-per-node", "3"], "--nproc-per-node"),
    (["--schedule", "nope"], "pipeline.schedule"),
    (["--inject-fault", "1:F:0:0"], "--inject-fault"),  # stage 0 is not on rank 1
    (["--inject-fault", "garbage"], "--inject-fault"),
    (["--warmup", "3", "--iterations", "3"], "--warmup"),
    (["--preset", "llama3-70b", "--pp", "2"], "model.tp"),
    (["--engine", "torch", "--microbatches", "1"], "pipeline.microbatches"),
])
def test_bad_input_exits_2_before_any_process(argv, field, tmp_path, capsys,
                                              monkeypatch) -> None:
    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch.subprocess, "Popen", no_launch)
    rc = main(["run", "--trace-dir", str(tmp_path / "t"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and field in err[0], err
    assert not (tmp_path / "t").exists()


def test_actions_csv_replaces_the_schedule(tmp_path) -> None:
    csv = tmp_path / "zb.csv"
    csv.write_text("0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n")
    problem = load_problem(_parse(["--microbatches", "2", "--actions-csv", str(csv)]))
    assert problem.schedule.split_backward and len(problem.schedule.actions[0]) == 6


def test_merge_pairs_sends_with_arrivals() -> None:
    send = {"ph": "send", "pid": 0, "iteration": 0, "ts": 10.0, "kind": "F", "dst": 1,
            "stage": 0, "dst_stage": 1, "microbatch": 0, "bytes": 8}
    recv = {"ph": "recv", "pid": 1, "src": 0, "kind": "F", "stage": 1, "microbatch": 0,
            "iteration": 0, "ts": 15.0}
    events = merge_parts([[send], [recv]], 2)
    (t,) = [e for e in events if e.get("cat") == "transfer"]
    assert (t["ts"], t["dur"], t["args"]["dst"]) == (0.0, 5.0, 1)


def test_cli_module_imports_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, executor.cli, ppsim.cli; ppsim.cli.build_parser(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
