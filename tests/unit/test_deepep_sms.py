"""What DeepEP holds on each GPU as Megatron runs it. Its SMs (--moe-flex-dispatcher-num-sms,
20 unset): compute beside its kernels (a combined 1F1B pair's, the shared experts' under
--moe-shared-expert-overlap) runs on the SMs they leave, so each millisecond it hides
costs their share of the GPU's SMs (H100: 132, the whitepaper's count) in compute. Its
buffer: DeepEP's own size hints, taken from the memory the model has. What DeepEP or the
executor cannot run is refused in one line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job.ep_comm import shared_experts_ms
from ppsim.job.layers import (
    ep_all_to_all_ms,
    layer_collectives,
    pair_saving_ms,
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
@given(st.sampled_from(["flex", "alltoall"]), st.integers(1, 50).map(lambda n: 2 * n),
       st.integers(101, 200),
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
    job, acc = _job("flex", 66, 132, shared_overlap=True)
    free, _ = _job("flex", 66, 0, shared_overlap=True)
    a = job.arch
    ep = ep_all_to_all_ms(job, a)
    over_f, over_b = shared_experts_ms(a, acc)
    layer = transformer_costs(a, acc).layers[-1]
    got = [c.exposed_ms for c in layer_collectives(job, a, acc, "moe", layer).forward
           if c.group == "ep"]
    base = [c.exposed_ms for c in layer_collectives(free, a, acc, "moe", layer).forward
            if c.group == "ep"]
    assert got == pytest.approx([base[0] + 0.5 * min(ep, over_f)])
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


# DeepEP's buffer: deepseek-ai/DeepEP csrc/legacy/config.hpp, Config's size hints, term by
# term (kNumMaxTopK = kNumMaxScales = 128, 64-bit top-k indices, an 8-byte SourceMeta,
# 8 NVLink peers), at the recommended configurations' receive queues (deep_ep
# Buffer.get_dispatch_config / get_combine_config); Megatron's get_buffer takes the larger
# of the two configurations' hints and hidden_bytes = hidden x 2.
NVL_RECV = {2: (256, 256), 4: (256, 256), 8: (256, 256), 16: (288, 288), 24: (288, 288),
            32: (288, 288), 48: (288, 288), 64: (288, 288), 96: (480, 480),
            128: (560, 560), 144: (720, 720), 160: (720, 720)}
RDMA_SEND = {2: (6, 6), 4: (6, 6), 8: (6, 6), 16: (20, 12), 24: (8, 8), 32: (8, 8),
             48: (8, 8), 64: (8, 8), 96: (12, 8), 128: (12, 8), 144: (12, 8), 160: (12, 8)}


def _hint_nvl(ranks: int, hidden_bytes: int, sms: int, recv: int) -> int:
    ch, nvl, rdma = sms // 2, min(ranks, 8), max(ranks // 8, 1)
    n = ch * nvl * (2 * rdma + 3) * 4
    n += ch * nvl * recv * hidden_bytes
    n += ch * nvl * recv * 8
    n += ch * nvl * recv * 128 * 8
    n += ch * nvl * recv * 128 * 4
    n += ch * nvl * recv * 128 * 4
    return (n + 127) // 128 * 128


def _hint_rdma(ranks: int, hidden_bytes: int, sms: int, send: int) -> int:
    if ranks <= 8:
        return 0
    recv = (128 + send - 1) // send * send  # Config rounds the queue up to the send chunk
    ch, rdma = sms // 2, ranks // 8
    n = ch * rdma * (8 * 2 + 2) * 2 * 4
    n += ch * rdma * recv * hidden_bytes * 2
    n += ch * rdma * recv * 8 * 2
    n += ch * rdma * recv * 128 * 8 * 2
    n += ch * rdma * recv * 128 * 4 * 2
    n += ch * rdma * recv * 128 * 4 * 2
    n += ch * rdma * recv * 16 * 2
    return (n + 127) // 128 * 128


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(NVL_RECV)), st.sampled_from([1024, 2048, 4096, 7168, 8192]),
       st.integers(1, 40).map(lambda n: 2 * n))
def test_deepeps_buffer_is_its_size_hints_at_its_recommended_configs(
        ranks: int, hidden: int, sms: int) -> None:
    from ppsim.job.deepep import buffer_bytes
    want = max(_hint_nvl(ranks, 2 * hidden, sms, r) for r in NVL_RECV[ranks]) \
        + max(_hint_rdma(ranks, 2 * hidden, sms, s) for s in RDMA_SEND[ranks])
    assert buffer_bytes(ranks, hidden, sms) == want


def test_the_model_has_what_deepeps_buffer_leaves(capsys) -> None:
    """Qwen3-235B at tp 2 ep 8 (16 ranks on 2 nodes, hidden 4096): 0.29 GB of each GPU's
    80 (the 0.24 GB NVLink queues and the 0.06 GB RDMA ones)."""
    assert main(["simulate", *QWEN, "--json"]) == 0
    flex = json.loads(capsys.readouterr().out)
    held = flex["job"]["deepep_buffer_bytes"]
    assert held == _hint_nvl(16, 8192, 20, 288) + _hint_rdma(16, 8192, 20, 20)
    assert flex["memory_limit_bytes"] == 80e9 - held
    i = QWEN.index("flex")
    assert main(["simulate", *QWEN[:i], "alltoall", *QWEN[i + 1:], "--json"]) == 0
    a2a = json.loads(capsys.readouterr().out)
    assert a2a["job"]["deepep_buffer_bytes"] == 0 and a2a["memory_limit_bytes"] == 80e9
    assert main(["simulate", *QWEN]) == 0
    assert "DeepEP (20 of 132 SMs, its buffer 0.29 GB)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags, message", [
    (["--tp", "4", "--ep", "64", "--gpus", "256"], "model.ep: tp x ep = 256: DeepEP has no "
     "configuration for that many ranks"),
    (["--tp", "1", "--ep", "1", "--gpus", "16"], "DeepEP dispatcher requires TPxEP > 1"),
    (["--moe-flex-dispatcher-num-sms", "21"], "pipeline.moe_flex_dispatcher_num_sms: 21 SMs: "
     "across nodes DeepEP pairs them"),
])
def test_groups_and_sm_counts_deepep_cannot_run_are_refused(capsys, flags: list[str],
                                                           message: str) -> None:
    assert main(["simulate", *QWEN, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_executor_refuses_deepep_before_any_process_starts(capsys) -> None:
    """ppsim run has no DeepEP (gloo processes): a flex dispatcher on a model with experts
    is refused in one line, as the combined 1F1B is, rather than run as something else."""
    assert main(["run", "--preset", "tiny-hybrid", "--tp", "2",
                 "--moe-token-dispatcher-type", "flex"]) == 2
    err = capsys.readouterr().err
    assert "pipeline.moe_token_dispatcher_type: flex: the executor has no DeepEP" in err
    assert len(err.strip().splitlines()) == 1
