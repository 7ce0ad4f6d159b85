"""Megatron's memory-policy flags read as Megatron reads them.

Megatron-LM (d98e8a6) offloads a module only under --fine-grained-activation-offloading:
attention.py sets `offload_core_attention = config.fine_grained_activation_offloading and
"core_attn" in config.offload_modules` (likewise qkv_linear, attn_proj, and experts.py's
expert_fc1, moe_act), and TransformerConfig.__post_init__ checks the offload knobs only
under the switch, so --offload-modules, --activation-offload-fraction and
--delta-offload-bytes-across-pp-ranks alone offload nothing. Under the switch it asserts
`len(self.offload_modules) > 0`. Its recompute and offload module lists are checked
against their allowed sets, so an empty name ('') is refused there."""

from __future__ import annotations

import json
import shlex

import pytest

from ppsim.cli.main import main

LLAMA = ["simulate", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
         "--microbatches", "16"]


def _run(flags: str, capsys) -> tuple[int | str | None, str, str]:
    try:
        rc = main([*LLAMA, *shlex.split(flags)])
    except SystemExit as stop:  # argparse's own refusals
        rc = stop.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("flags, field", [
    ("--offload-modules core_attn", "--offload-modules"),
    ("--activation-offload-fraction 0.5", "--activation-offload-fraction (--offload-fraction)"),
    ("--offload-fraction 0.5", "--activation-offload-fraction (--offload-fraction)"),
    ("--delta-offload-bytes-across-pp-ranks 1000", "--delta-offload-bytes-across-pp-ranks"),
    ("--offload-modules core_attn --activation-offload-fraction 0.5", "--offload-modules"),
])
def test_an_offload_flag_without_megatrons_switch_is_refused(flags: str, field: str,
                                                             capsys) -> None:
    rc, out, err = _run(flags, capsys)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and f"error: {field}:" in err
    assert "add --fine-grained-activation-offloading" in err


def test_the_switch_without_offload_modules_is_refused(capsys) -> None:
    rc, _, err = _run("--fine-grained-activation-offloading", capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "error: --fine-grained-activation-offloading:" in err and "--offload-modules" in err


def test_the_switch_takes_a_configs_offload_modules(tmp_path, capsys) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "llama3-70b"\n[hardware]\npreset = "h100-80gb"\n'
                    '[pipeline]\npp = 8\nmicrobatches = 16\n'
                    '[[memory.stage]]\nstage = 0\noffload_modules = ["core_attn"]\n')
    assert main(["simulate", "--config", str(path), "--fine-grained-activation-offloading",
                 "--activation-offload-fraction", "0.5", "--json"]) == 0
    policy = json.loads(capsys.readouterr().out)["policy"]
    assert policy[0]["offload_modules"] == ["core_attn"]


def test_with_the_switch_core_attn_is_offloaded(capsys) -> None:
    rc, out, _ = _run("--fine-grained-activation-offloading --offload-modules core_attn "
                      "--json", capsys)
    assert rc == 0
    policy = json.loads(out)["policy"]
    assert all(p["offload_modules"] == ["core_attn"] and p["offload_fraction"] == 1.0
               for p in policy)


@pytest.mark.parametrize("flags, field", [
    ("--recompute-granularity selective --recompute-modules ''", "--recompute-modules"),
    ("--recompute-modules ''", "--recompute-modules"),
    ("--recompute-modules core_attn ' '", "--recompute-modules"),
    ("--recompute-granularity selective --recompute-modules ,", "--recompute-modules"),
    ("--fine-grained-activation-offloading --offload-modules ''", "--offload-modules"),
    ("--fine-grained-activation-offloading --offload-modules ,,", "--offload-modules"),
])
def test_an_empty_module_name_is_refused_as_megatron_refuses_it(flags: str, field: str,
                                                                capsys) -> None:
    rc, out, err = _run(flags, capsys)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err


@pytest.mark.parametrize("model, flags, words", [
    (LLAMA, "--offload-modules attn_proj",
     "attn_proj cannot be set to offload_modules alone without core_attn"),
    (["simulate", "--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb", "--pp", "4"],
     "--moe-layer-recompute --offload-modules moe_act",
     "Cannot offload {'moe_act'} while recomputing the entire MoE layer."),
])
def test_an_offload_set_megatron_refuses_is_priced_with_a_warning_in_its_words(
        model: list[str], flags: str, words: str, capsys) -> None:
    """TransformerConfig raises for these sets under the switch; ppsim's executor runs
    them, so simulate prices them and says on one line that Megatron stops there."""
    assert main([*model, "--fine-grained-activation-offloading", *shlex.split(flags)]) == 0
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if line.startswith("warning: Megatron refuses")]
    assert len(warned) == 1 and words in warned[0]


def test_an_offload_set_megatron_takes_has_no_warning(capsys) -> None:
    rc, _, err = _run("--fine-grained-activation-offloading --offload-modules core_attn "
                      "attn_proj", capsys)
    assert rc == 0 and "warning" not in err
