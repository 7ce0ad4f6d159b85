"""`ppsim run` runs DDP, Megatron's distributed optimizer or torchtitan's pipelined FSDP
over the whole data-parallel group; a sharding it does not run is refused in one line
before any process starts, never run as another (the model prices what the config says)."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main


@pytest.mark.parametrize(("model", "flags", "field"), [
    # without pp torchtitan's FSDP syncs every microbatch; the executor runs its pipelined form
    ('fsdp = true', ["--pp", "1"], "model.fsdp"),
    ('', ["--pp", "1", "--fsdp"], "model.fsdp"),  # the flag sets what the field does
    ('fsdp = true\nfsdp_reshard_after_forward = "always"', [],
     "model.fsdp_reshard_after_forward"),
    ('fsdp = true\ndp_replicas = 2', [], "model.dp_replicas"),
    ('distributed_optimizer = true\ndp_replicas = 2', [], "model.dp_replicas"),
    # Megatron's flag sets what the config's field does (simulate takes it too).
    ('dp_replicas = 2', ["--use-distributed-optimizer"], "model.dp_replicas"),
])
def test_a_sharding_the_executor_does_not_run_is_refused(tmp_path, capsys, model: str,
                                                          flags: list[str], field: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\npreset = "tiny-gpt"\n{model}\n')
    assert main(["run", "--config", str(cfg), "--pp", "2", "--dp", "4",
                 "--microbatches", "4", *flags]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and len(err.strip().splitlines()) == 1, err
