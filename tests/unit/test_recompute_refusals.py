"""Recompute modules Megatron's TransformerConfig refuses for a model: refused in its words
when asked for, and never offered by the memory policy search (whose flags would not
launch)."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator
from ppsim.policy.costs import PolicyCosts
from ppsim.policy.search import module_groups

DEEPSEEK = parse_model({"preset": "deepseek-v3", "num_layers": 4,
                        "layers": "dense, moe*3"}).arch  # type: ignore[union-attr]
ACC = accelerator(config_from_dict({"model": {"preset": "deepseek-v3"},
                                     "hardware": {"preset": "h100-80gb"}}).hardware)


@pytest.mark.parametrize("flags, message", [
    ("--preset deepseek-v3 --fp8-format hybrid --fp8-recipe delayed --recompute-modules "
     "layernorm", "Delayed scaling does not support moe_act and layernorm recompute for fp8."),
    ("--preset deepseek-v3 --fp8-format hybrid --recompute-modules core_attn moe_act",
     "Delayed scaling does not support moe_act and layernorm recompute for fp8."),
    ("--preset deepseek-v3 --recompute-modules shared_experts --moe-shared-expert-overlap",
     "shared_experts recompute cannot work with --moe-shared-expert-overlap."),
    ("--preset llama3-8b --recompute-modules mla_up_proj",
     "mla_up_proj in recompute_modules is only supported with multi_latent_attention."),
])
def test_a_module_megatron_refuses_is_one_line_in_its_words(capsys, flags: str,
                                                            message: str) -> None:
    assert main(["simulate", "--hardware", "h100-80gb", *shlex.split(flags)]) == 2
    err = capsys.readouterr().err
    assert f"memory.recompute_modules: {message}" in err
    assert len(err.strip().splitlines()) == 1, err


def _offered(pc: PolicyCosts) -> set[str]:
    return {m for p in module_groups(pc, False) for m in p.recompute_modules}


def test_the_search_offers_no_module_megatron_would_refuse() -> None:
    """Under FP8's delayed scaling no layernorm or moe_act; beside the shared experts'
    overlap no shared_experts; the same model otherwise offers them."""
    plain = _offered(PolicyCosts(arch=replace(DEEPSEEK, fp8="hybrid", fp8_recipe="tensorwise"),
                                 acc=ACC))
    assert {"layernorm", "moe_act"} <= plain
    delayed = _offered(PolicyCosts(arch=replace(DEEPSEEK, fp8="hybrid", fp8_recipe="delayed"),
                                   acc=ACC))
    assert not {"layernorm", "moe_act"} & delayed
    assert "shared_experts" in _offered(PolicyCosts(arch=DEEPSEEK, acc=ACC))
    assert "shared_experts" not in _offered(PolicyCosts(arch=DEEPSEEK, acc=ACC,
                                                        shared_overlap=True))
