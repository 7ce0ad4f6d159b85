"""Recompute modules Megatron's TransformerConfig refuses for a model: refused in its words
when asked for, and never offered by the memory policy search (whose flags would not
launch); offload sets it refuses: no Megatron flags, and never offered either."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator
from ppsim.policy.costs import PolicyCosts
from ppsim.policy.megatron import policy_export
from ppsim.policy.model import StagePolicy
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


@pytest.mark.parametrize("policy, words", [
    (StagePolicy(offload_modules=("attn_proj",), offload_fraction=1.0),
     "attn_proj cannot be set to offload_modules alone without core_attn"),
    (StagePolicy(recompute_modules=("moe",), offload_modules=("expert_fc1", "moe_act"),
                 offload_fraction=1.0),
     "Cannot offload {'expert_fc1', 'moe_act'} while recomputing the entire MoE layer."),
])
def test_an_offload_megatron_refuses_has_no_megatron_flags(policy: StagePolicy,
                                                           words: str) -> None:
    """ppsim's executor runs such a policy; Megatron's TransformerConfig refuses it, so the
    export gives no flags and says why in its words."""
    export = policy_export((policy,), DEEPSEEK, 0)
    assert export.megatron_flags is None and words in export.notes[0]
    assert "Megatron-LM" not in export.frameworks


def test_the_search_offers_no_offload_megatron_would_refuse() -> None:
    """No offload inside a MoE block the policy recomputes whole, and attn_proj only with
    core_attn (a stage of MoE layers alone: where whole-block recompute is on offer)."""
    moe = replace(DEEPSEEK, layers="moe*4")
    groups = module_groups(PolicyCosts(arch=moe, acc=ACC), True)
    assert any("moe" in p.recompute_modules for p in groups)
    assert any(p.offloads for p in groups)
    for p in groups:
        assert not ("moe" in p.recompute_modules and {"expert_fc1", "moe_act"}
                    & set(p.offload_modules)), p
        assert "attn_proj" not in p.offload_modules or "core_attn" in p.offload_modules
