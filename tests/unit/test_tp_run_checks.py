"""`ppsim run --tp N`: what the tensor-parallel executor refuses, before any process."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main
from ppsim.executor import launch


@pytest.mark.parametrize("argv, words", [
    (["--tp", "3"], "3 does not divide num_heads = 4"),
    (["--tp", "2", "--schedule", "zb-h1"], "without a split backward"),
    (["--tp", "2", "--alongside-torch"], "without the torch peer"),
    (["--tp", "2", "--model", "tests/model_sleepy.py:build"], "the builder has no parallelize"),
    # Megatron's sequence-parallel scatter rule is the config's (simulate's too): it
    # speaks before the builder's own check of its tokens
    (["--tp", "2", "--model", "tests/model_tp.py:build", "--seq-length", "63"],
     "model.seq_length: seq_length / cp = 63 tokens do not divide over tp = 2"),
    (["--tp", "2", "--nproc-per-node", "2"], "pp x dp x tp x cp = 4"),
    (["--tp", "2", "--seq-length", "63"], "63 tokens do not divide over tp = 2"),
])
def test_tensor_parallel_run_refusals(argv, words, tmp_path, capsys, monkeypatch) -> None:
    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    # ppsim run forks torchrun (launch.run_torchrun); an exec'd one would be a Popen
    monkeypatch.setattr(launch, "run_torchrun", no_launch)
    monkeypatch.setattr(launch.subprocess, "Popen", no_launch)
    rc = main(["run", "--preset", "tiny-gpt", "--trace-dir", str(tmp_path / "t"), *argv])
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("ppsim run: note: loading model builder")]
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("model, argv, error", [
    # context parallelism runs the shipped decoders alone: refused, not run as if cp
    # were 1
    ('cp = 2\ncp_comm_type = "all_gather"\nbuilder = "tests/model_tp.py:build"\n', [],
     "model.cp: 2: the executor splits the sequence of the shipped decoders' attention"),
    ('cp = 3\ncp_comm_type = "all_gather"\n', [],
     "model.cp: seq_length (64) is not divisible by 2 x cp (6)"),
    ('cp = 2\ncp_comm_type = "all_gather"\n', ["--tp", "4", "--seq-length", "68"],
     "model.seq_length: seq_length / cp = 34 tokens do not divide over tp = 4"),
    ('cp = 2\ncp_comm_type = "all_gather"\n', ["--alongside-torch"],
     "model.cp: 2: context parallelism runs on the ppsim engine, without the torch peer"),
    ('cp = 2\ncp_comm_type = "all_gather"\n', ["--nproc-per-node", "2"],
     "--nproc-per-node: 2 x 1 node(s) = 2 ranks but pp x dp x tp x cp = 4"),
    # Megatron gathers QKV at tp above the key/value groups (simulate prices it), as both
    # shipped decoders do: the gathered width splits evenly over the ranks, (4 + 2) x 3
    # over 4 not (the Llama-style decoder), nor (4 + 2) x 9 (the built-in GPT's)
    ('num_kv_heads = 1\nnorm = "rmsnorm"\nhead_dim = 3\n', ["--tp", "4"],
     "model.head_dim: the interleaved QKV projection's 18 outputs do not divide by tp (4)"),
    ('num_kv_heads = 1\nhidden_size = 36\n', ["--tp", "4"],
     "model.head_dim: the interleaved QKV projection's 54 outputs do not divide by tp (4)"),
    # a builder's own parallelize runs on the meta device first: a width tp does not
    # divide is named
    ('num_heads = 6\nnum_kv_heads = 6\nhidden_size = 96\nffn_hidden_size = 192\n'
     'builder = "tests/model_tp.py:build"\n',
     ["--tp", "3", "--seq-length", "48"], "model.tp: the builder's parallelize failed at tp "
     "= 3: ValueError: the embedding's vocabulary (256) does not divide by tp (3)"),
])
def test_a_config_the_split_cannot_run_is_refused(model, argv, error, tmp_path, capsys,
                                                   monkeypatch) -> None:
    monkeypatch.setattr(launch, "run_torchrun", lambda *a, **k: pytest.fail("launched"))
    cfg = tmp_path / "model.toml"
    cfg.write_text(f'[model]\npreset = "tiny-gpt"\n{model}')
    rc = main(["run", "--config", str(cfg), *argv, "--trace-dir", str(tmp_path / "t")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"ppsim run: error: {error}"), err
    assert not (tmp_path / "t").exists()


def test_nproc_per_node_help_gives_the_default_the_check_uses(capsys) -> None:
    """The help said pp / nnodes; a tp, cp or dp run's default is the whole world's."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ranks on this node (default: pp x dp x tp x cp / nnodes)" in text
