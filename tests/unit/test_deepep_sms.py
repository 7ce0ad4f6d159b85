"""The SMs DeepEP's kernels hold (Megatron's --moe-flex-dispatcher-num-sms, 20 unset):
compute that runs beside them (a combined 1F1B pair's, the shared experts' under
--moe-shared-expert-overlap) runs on the SMs they leave, so each millisecond it hides
costs their share of the GPU's SMs (H100: 132, the whitepaper's count) in compute."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.layers import (
    ep_all_to_all_ms,
    layer_collectives,
    pair_saving_ms,
    shared_experts_ms,
)
from ppsim.job.model import build_job

QWEN = ["--preset", "qwen3-235b-a22b", "--num-layers", "8", "--hardware", "h100-80gb",
        "--tp", "2", "--ep", "8", "--pp", "2", "--vpp", "2", "--gpus", "32",
        "--global-batch-size", "128",
        "--moe-token-dispatcher-type", "flex", "--overlap-moe-expert-parallel-comm"]


def _job(dispatcher: str, sms: int | None, sm_count: int, shared_overlap: bool = False,
         per_node: int = 8):
    shared = {"shared_experts": 1} if shared_overlap else {}
    cfg = config_from_dict({
        "model": {"preset": "qwen3-235b-a22b", "num_layers": 4, "tp": 2, "ep": 8, "dp": 16,
                  **shared},
        "pipeline": {"pp": 1, "global_batch_size": 64, "moe_token_dispatcher_type": dispatcher,
                     "overlap_moe_expert_parallel_comm": not shared_overlap,
                     "moe_shared_expert_overlap": shared_overlap,
                     "moe_flex_dispatcher_num_sms": sms},
        "hardware": {"preset": "h100-80gb", "sm_count": sm_count, "gpus_per_node": per_node}})
    job = build_job(cfg)
    return job, accelerator(cfg.hardware)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["flex", "alltoall"]), st.integers(1, 100), st.integers(101, 200),
       st.sampled_from([2, 4, 8]))
def test_a_pairs_saving_keeps_the_sms_deepep_leaves(dispatcher: str, sms: int,
                                                    sm_count: int, per_node: int) -> None:
    job, acc = _job(dispatcher, sms, sm_count, per_node=per_node)
    free, _ = _job(dispatcher, sms, 0, per_node=per_node)  # no SM count: nothing held
    a = job.arch
    share = sms / sm_count if dispatcher == "flex" else 0.0
    assert job.dispatcher_sm_share == pytest.approx(share)
    assert pair_saving_ms(job, a, acc) == pytest.approx(
        pair_saving_ms(free, a, acc) * (1 - share), rel=1e-12)
    assert pair_saving_ms(free, a, acc) > 0


def test_the_shared_experts_beside_deepep_pay_its_share_of_what_they_hide() -> None:
    # Qwen3 with a shared expert, as DeepSeek's and Qwen2's MoE have.
    job, acc = _job("flex", 33, 132, shared_overlap=True)
    free, _ = _job("flex", 33, 0, shared_overlap=True)
    a = job.arch
    ep = ep_all_to_all_ms(job, a)
    over_f, over_b = shared_experts_ms(a, acc)
    layer = transformer_costs(a, acc).layers[-1]
    got = [c.exposed_ms for c in layer_collectives(job, a, acc, "moe", layer).forward
           if c.group == "ep"]
    base = [c.exposed_ms for c in layer_collectives(free, a, acc, "moe", layer).forward
            if c.group == "ep"]
    assert got == pytest.approx([base[0] + 0.25 * min(ep, over_f)])
    assert over_b > 0


def _iteration(capsys, *flags: str) -> float:
    assert main(["simulate", *QWEN, *flags, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    held = next((int(v) for k, v in zip(flags, flags[1:], strict=False)
                 if k == "--moe-flex-dispatcher-num-sms"), None) or (
        next((int(v) for k, v in zip(flags, flags[1:], strict=False)
              if k == "--moe-deepep-num-sms"), 20))
    assert doc["job"]["dispatcher_sm_share"] == pytest.approx(held / 132)
    return doc["iteration_time_ms"]


def test_megatrons_default_and_older_flag_are_read_as_megatron_reads_them(capsys) -> None:
    unset = _iteration(capsys)
    assert _iteration(capsys, "--moe-flex-dispatcher-num-sms", "20") == unset
    older = _iteration(capsys, "--moe-deepep-num-sms", "40")
    assert _iteration(capsys, "--moe-flex-dispatcher-num-sms", "40") == older > unset
    # The unified flag wins over the older one, as Megatron routes them.
    assert _iteration(capsys, "--moe-flex-dispatcher-num-sms", "20",
                      "--moe-deepep-num-sms", "40") == unset


@pytest.mark.parametrize("value, message", [
    ("132", "pipeline.moe_flex_dispatcher_num_sms: 132 SMs for DeepEP leave none of the "
            "GPU's 132 to compute"),
    ("0", "pipeline.moe_flex_dispatcher_num_sms: must be between 1 and 1,024"),
])
def test_sms_deepep_cannot_hold_are_refused_in_one_line(capsys, value: str,
                                                         message: str) -> None:
    assert main(["simulate", *QWEN, "--moe-flex-dispatcher-num-sms", value]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
