"""A memory-policy flag's value that the [memory] rules refuse is refused in the name of
the flag typed, not the config key it sets (`memory.offload_fraction`), which the user
never wrote; a config's own [memory] value keeps the key's name."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main

LLAMA = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "4",
         "--microbatches", "8"]
OFFLOAD = ["--fine-grained-activation-offloading", "--offload-modules", "core_attn"]


@pytest.mark.parametrize("flags, name", [
    (["--activation-offload-fraction", "2", *OFFLOAD], "--activation-offload-fraction"),
    (["--offload-fraction", "-0.5", *OFFLOAD], "--offload-fraction"),
    (["--recompute-num-layers", "-1"], "--recompute-num-layers"),
    (["--delta-offload-bytes-across-pp-ranks", "-5", *OFFLOAD],
     "--delta-offload-bytes-across-pp-ranks"),
    (["--recompute-modules", "foo"], "--recompute-modules"),
    (["--fine-grained-activation-offloading", "--offload-modules", "mlp"], "--offload-modules"),
])
def test_an_out_of_range_flag_value_is_refused_in_the_flags_name(
        flags: list[str], name: str, capsys) -> None:
    assert main([*LLAMA, *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert f"error: {name}: " in err and "memory." not in err


def test_a_config_value_keeps_the_keys_name(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "llama3-70b"\n[memory]\noffload_modules = '
                    '["core_attn"]\noffload_fraction = 2\n')
    assert main(["simulate", "--config", str(path)]) == 2
    assert "error: memory.offload_fraction: " in capsys.readouterr().err


def test_the_two_names_of_the_fraction_still_disagree(capsys) -> None:
    assert main([*LLAMA, *OFFLOAD, "--offload-fraction", "0.5",
                 "--activation-offload-fraction", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "--activation-offload-fraction" in err and "--offload-fraction 0.5" in err
