"""Megatron's expert capacity (--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity):
with ppsim's even routing a factor of 1 or more drops nothing, a smaller one drops the
pairs beyond it, and padding makes every expert compute (and exchange) its whole
capacity."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import add_config_flags, config_from_args
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.arch import Architecture
from ppsim.costs.layerops import mlp_ops
from ppsim.errors import UserError
from ppsim.job.layers import ep_all_to_all_ms
from ppsim.job.model import build_job
from ppsim.pipeline.problem import model_costs

MIXTRAL = Architecture(**MODEL_PRESETS["mixtral-8x7b"])


def expert_flops(a: Architecture) -> float:
    return sum(op.flops for op in mlp_ops(a, "moe") if op.name.startswith("experts."))


@pytest.mark.parametrize(("factor", "pad", "share"), [
    (0.0, False, 1.0),   # dropless
    (1.0, False, 1.0),   # even routing fills every expert exactly
    (2.0, False, 1.0),   # room to spare, nothing padded
    (0.5, False, 0.5),   # half the pairs dropped
    (1.25, True, 1.25),  # every expert padded to 1.25 of its share
    (0.5, True, 0.5),
])
def test_the_experts_compute_their_capacity(factor: float, pad: bool, share: float) -> None:
    a = replace(MIXTRAL, moe_capacity_factor=factor, moe_pad_to_capacity=pad)
    assert expert_flops(a) == pytest.approx(share * expert_flops(MIXTRAL))


@given(st.floats(1.0, 64.0))
def test_padding_fills_an_expert_to_every_token_at_most(factor: float) -> None:
    """Megatron's apply_router_token_dropping keeps every token once the capacity,
    factor x tokens x top_k / experts, exceeds the tokens: padded, an expert computes
    min(factor, experts / top_k) shares (Mixtral: 4), never more tokens than there are."""
    a = replace(MIXTRAL, moe_capacity_factor=factor, moe_pad_to_capacity=True)
    shares = min(factor, MIXTRAL.num_experts / MIXTRAL.top_k)
    # (a whole number of tokens an expert: within a token's rounding)
    assert expert_flops(a) == pytest.approx(shares * expert_flops(MIXTRAL), rel=1e-3)


def test_padding_is_exchanged_too() -> None:
    def cfg(**model):
        return config_from_dict({"model": {"preset": "mixtral-8x7b", "dp": 8, **model},
                                 "pipeline": {"pp": 1, "microbatches": 2},
                                 "hardware": {"preset": "h100-80gb"}})

    plain, padded = build_job(cfg()), build_job(cfg(moe_capacity_factor=1.25,
                                                     moe_pad_to_capacity=True))
    assert plain is not None and padded is not None
    # Each all-to-all pays latency steps beside the bytes: compare the bytes' part.
    lat = 7 * 1e-3  # 8 ranks inside a node, 1 us a step
    assert ep_all_to_all_ms(padded, padded.arch) - 2 * lat == pytest.approx(
        1.25 * (ep_all_to_all_ms(plain, plain.arch) - 2 * lat))
    # Dropless and a factor of 1 price alike, to the digit.
    assert model_costs(cfg()) == model_costs(cfg(moe_capacity_factor=1.0))


def _arch(argv: str) -> Architecture:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return config_from_args(p.parse_args(shlex.split(argv))).model.arch


def test_megatrons_flags_read_and_write_back() -> None:
    a = _arch("--preset mixtral-8x7b --moe-expert-capacity-factor 1.5 "
              "--moe-pad-expert-input-to-capacity")
    assert (a.moe_capacity_factor, a.moe_pad_to_capacity) == (1.5, True)
    args = megatron_model_args(a)
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.5"
    assert "--moe-pad-expert-input-to-capacity" in args
    # A negative factor is Megatron's way to say dropless.
    assert _arch("--preset mixtral-8x7b --moe-expert-capacity-factor -1").expert_load == 1.0


def test_a_negative_factor_in_a_config_is_refused() -> None:
    with pytest.raises(UserError) as e:
        config_from_dict({"model": {"preset": "mixtral-8x7b", "moe_capacity_factor": -1}})
    assert e.value.field == "model.moe_capacity_factor"
