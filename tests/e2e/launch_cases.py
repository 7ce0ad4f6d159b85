"""The pooled launches' cases (launches.py runs them): each case's flags and the files
its folder holds first. A case's name is what a test asks the pool for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MOE = ["--model", "tests/model_moe.py:build"]


@dataclass(kw_only=True)
class Spec:
    """One launch: the case's flags (with `{tmp}` for its folder) and how it is run."""

    argv: list[str]
    extra: list[str] = field(default_factory=list)
    """Flags of the pool (--alongside-torch, --versus, --engine) beside the case's own."""
    iterations: int = 2
    recorded: bool = True
    """--iterations, warm-up 1, --trace-dir tmp/out and --json."""
    dump_grads: bool = True
    """--dump-grads tmp/grads (with recorded; the ppsim engine's gradients)."""
    in_tmp: bool = False
    """Run with the launch's folder as the working directory."""
    env: dict[str, str] = field(default_factory=dict)
    watch_listen: bool = False
    """Poll `ss` while it runs: the addresses its processes listen on."""



def zb_h1_csv(pp: int, m: int) -> str:
    """ZB-H1 (Qi et al. 2024): B and W split, W of microbatch i - r after B of i."""
    rows = []
    for r in range(pp):
        warm, cells, f, w = pp - r - 1, [], 0, 0
        cells += [f"{r}F{i}" for i in range(warm)]
        f = warm
        for i in range(m):
            if f < m:
                cells.append(f"{r}F{f}")
                f += 1
            cells.append(f"{r}I{i}")
            if i >= r:
                cells.append(f"{r}W{w}")
                w += 1
        cells += [f"{r}W{j}" for j in range(w, m)]
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"


def torch_dualpipev_csv(path: Path) -> None:
    """The CSV torch's ScheduleDualPipeV writes, with its send/recv actions."""
    import types

    import torch
    from torch.distributed.pipelining import schedules as ts

    # Building an order reads only these fields of a stage; no process group talks.
    stages = [types.SimpleNamespace(group_size=2, group_rank=0, num_stages=4, stage_index=i,
                                    submod=torch.nn.Identity(), is_first=i == 0,
                                    is_last=i == 3) for i in range(2)]
    ts.ScheduleDualPipeV(stages, 4)._dump_csv(str(path), format="compute_comms")


def tiny_gpt_toml(**fields: Any) -> str:
    """A config of tiny-gpt with these [model] fields over the preset's."""
    return '[model]\npreset = "tiny-gpt"\n' + "".join(f"{k} = {json.dumps(v)}\n"
                                                      for k, v in fields.items())


GATED_TOML = tiny_gpt_toml(gated_mlp=True, num_kv_heads=1, norm="layernorm",
                           position="learned")
"""The built-in GPT with SwiGLU and grouped-query attention (4 heads, 1 key/value head:
at tp 2 its biased QKV gathered, ppsim.executor.builders.qkv_gather)."""

RANK_ONLY_BUILDER = """import os

from ppsim.executor.builders.gpt import build as gpt


def build(fields):
    if "RANK" in os.environ:
        raise RuntimeError("the tokenizer file is not on this host")
    return gpt(fields)
"""
"""The shipped GPT in `ppsim run`'s own process; in a rank, an error while building."""

GPIPE = ["--schedule", "gpipe", "--pp", "2", "--split", "6,2", "--microbatches", "3"]
ONE_F_ONE_B = ["--schedule", "1f1b", "--pp", "2", "--split", "5,3", "--microbatches", "4"]
INTERLEAVED = ["--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2", "--split",
               "3,1,2,2", "--microbatches", "4"]
ONE_F_ONE_B_HYBRID = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]
"""1F1B over two stages at a hybrid pattern's own split (two microbatches: see M2)."""
M2 = ["--microbatches", "2"]
"""For the launches whose ranks also talk inside each layer (tensor, context and expert
parallelism): every microbatch costs them collectives, the most of a launch's time on two
cores; on 2 ranks two microbatches still give 1F1B its warm-up, a steady F-B pair and
its cool-down, and interleaving its two chunks."""
ONE_F_ONE_B_M2 = [*ONE_F_ONE_B[:-2], *M2]
INTERLEAVED_M2 = [*INTERLEAVED[:-2], *M2]
ZB_H1 = ["--schedule", "zb-h1", "--pp", "2", "--split", "5,3", "--microbatches", "4"]
ZBV = ["--schedule", "zbv", "--pp", "2", "--vpp", "2", "--split", "3,2,1,2",
       "--microbatches", "4"]
DUALPIPEV = ["--schedule", "dualpipev", "--pp", "2", "--vpp", "2", "--split", "2,3,2,1",
             "--microbatches", "4"]
V = ["--pp", "2", "--vpp", "2", "--split", "2,3,2,1"]
PEER = ["--alongside-torch"]
POLICY = ["--recompute-modules", "core_attn",
          "--fine-grained-activation-offloading", "--offload-modules",
          "attn_norm,qkv_linear,mlp_norm"]
"""A memory policy (issue 28): core_attn recomputed, three modules offloaded."""
NORM_POLICY = ["--recompute-modules", "layernorm,core_attn",
               "--fine-grained-activation-offloading", "--offload-modules",
               "attn_norm,mlp_norm"]
"""The norms' outputs freed (output-discarding recompute), their inputs offloaded."""
MOE_TOML = tiny_gpt_toml(gated_mlp=True, num_kv_heads=2, layers="dense, moe, " * 3 + "dense, moe",
                         num_experts=4, top_k=2, moe_ffn_hidden_size=96, shared_experts=1)
"""tiny-gpt with MoE layers, as `simulate` and `run` both read it."""
MOE_CONFIG = ["--config", "{tmp}/moe.toml"]
MOE_WIDE_TOML = MOE_TOML.replace("shared_experts = 1", "shared_expert_ffn_hidden_size = 40")
"""The same with a shared-expert MLP of its own width (40, no whole number of the 96-wide
experts: Megatron's --moe-shared-expert-intermediate-size), split over the tensor ranks."""
MOE_WIDE_CONFIG = ["--config", "{tmp}/moe-wide.toml"]
OWN_TP = ["--model", "tests/model_tp.py:build"]
"""A torchtitan-style decoder of one's own whose parallelize splits it (tests/model_tp.py)."""
HYBRID_TP_TOML = '[model]\npreset = "tiny-hybrid"\netp = 1\n'
"""Mamba-2, attention, GatedDeltaNet, MoE and MLP layers, each expert whole at tp > 1."""
MOE_POLICY = ["--recompute-modules", "layernorm,moe_act",
              "--fine-grained-activation-offloading", "--offload-modules",
              "moe_act,expert_fc1,attn_norm"]
"""The MoE's own pieces: its activation's output freed, its inputs and the dispatched
tokens offloaded."""
LLAMA_TOML = tiny_gpt_toml(gated_mlp=True, num_kv_heads=2, norm="rmsnorm", position="rotary",
                           qk_layernorm=True, attention_output_gate=True, vocab_size=2000)
"""The Llama-style decoder (RMSNorm, rotary, SwiGLU, GQA) with query and key norms and an
output gate; its vocabulary padded (to 2,048 at tp 2, as Megatron pads it)."""
MLA_TOML = tiny_gpt_toml(gated_mlp=True, norm="rmsnorm", position="rotary", attention="mla",
                         q_lora_rank=32, kv_lora_rank=24, qk_rope_head_dim=8, head_dim=16,
                         v_head_dim=12)
"""tiny-gpt with DeepSeek's latent attention (value heads narrower than key heads)."""
MLA_CONFIG = ["--config", "{tmp}/mla.toml"]
MLA_MOE_TOML = tiny_gpt_toml(gated_mlp=True, norm="rmsnorm", position="rotary", attention="mla",
                             q_lora_rank=32, kv_lora_rank=24, qk_rope_head_dim=8, head_dim=16,
                             v_head_dim=12, layers="dense, moe, " * 3 + "dense, moe",
                             num_experts=4, top_k=2, moe_ffn_hidden_size=96,
                             shared_expert_ffn_hidden_size=40)
"""Latent attention and MoE layers with a shared-expert MLP of its own width: at tp 2
under --fsdp each of torchtitan's (the latents whole, the gathered tokens routed)."""
MLA_Q_TOML = tiny_gpt_toml(gated_mlp=True, norm="rmsnorm", position="rotary", attention="mla",
                           q_lora_rank=0, kv_lora_rank=24, qk_rope_head_dim=8, head_dim=16,
                           v_head_dim=12)
"""The same with no query latent: the queries projected from the layer's input (q_proj)."""
WINDOW_TOML = tiny_gpt_toml(gated_mlp=True, num_kv_heads=2, norm="rmsnorm", position="rotary",
                            layers="dense, moe, " * 3 + "dense, moe", num_experts=4, top_k=2,
                            moe_ffn_hidden_size=96, attention_window=5,
                            window_attn_skip_freq="[1,1,0,0]*2")
"""gpt-oss's shape in small: rotary, MoE and a sliding window on half the layers."""
MLA_POLICY = ["--recompute-modules", "mla_up_proj,layernorm",
              "--fine-grained-activation-offloading", "--offload-modules",
              "core_attn,qkv_linear"]
"""MLA's up projection and the norms freed; attention's and the latents' inputs offloaded."""
HYBRID_HALVES = ["--preset", "tiny-hybrid", "--hybrid-layer-pattern", "*-*-E-*-"]
"""A hybrid stack of attention, MLP and MoE layers only (each half of a decoder layer)."""
HYBRID_POLICY = ["--recompute-modules", "core_attn,mlp,moe_act",
                 "--fine-grained-activation-offloading", "--offload-modules",
                 "attn_norm,mlp_norm"]
"""Each half's own modules: attention and the MLP recomputed, the MoE's activation's
output freed, both norms' inputs offloaded."""
LINEAR_GPT = ["--preset", "tiny-gpt", "--experimental-attention-variant", "gated_delta_net",
              "--linear-attention-freq", "2", "--linear-num-key-heads", "2",
              "--linear-num-value-heads", "4", "--linear-key-head-dim", "16",
              "--linear-value-head-dim", "16", "--qk-layernorm", "--attention-output-gate"]
"""tiny-gpt with GatedDeltaNet in every other layer and gated, normed attention in the rest."""
SMALL = ["--microbatches", "4", "--iterations", "2", "--timeout-s", "30"]

# test_executor.py's cases: every schedule, both builders, recompute modes and dp 2.
EXECUTOR = {
    "gpipe": Spec(argv=GPIPE),
    # also the --versus launch (3 iterations: the third has no successor)
    "1f1b": Spec(argv=ONE_F_ONE_B, extra=["--versus", "3,5"], iterations=3),
    "1f1b-selective": Spec(argv=[*ONE_F_ONE_B, "--recompute", "selective"]),
    # also the --alongside-torch launch, and torch's 1F1B with full recompute
    "1f1b-full": Spec(argv=[*ONE_F_ONE_B, "--recompute", "full"], extra=PEER, iterations=3),
    "interleaved": Spec(argv=INTERLEAVED),
    # 4 ranks x 2 chunks, with an empty stage (3) that only passes tensors on
    "interleaved-4x2": Spec(argv=["--schedule", "interleaved-1f1b", "--pp", "4", "--vpp", "2",
                                  "--split", "2,1,1,0,1,1,1,1", "--microbatches", "4"]),
    "zb-h1-csv": Spec(argv=["--schedule", "1f1b", "--pp", "2", "--split", "3,5",
                            "--microbatches", "4", "--actions-csv", "{tmp}/zb.csv"]),
    "zb-h1-full": Spec(argv=[*ZB_H1, "--recompute", "full"], extra=PEER),
    "zbv-selective-dp2": Spec(argv=[*ZBV, "--recompute", "selective", "--dp", "2"]),
    "dualpipev": Spec(argv=DUALPIPEV, extra=PEER),
    "moe-gpipe-full": Spec(argv=[*MOE, *GPIPE, "--recompute", "full"]),
    "moe-1f1b-selective-dp2": Spec(argv=[*MOE, *ONE_F_ONE_B, "--recompute", "selective",
                                         "--dp", "2"]),
    "moe-interleaved": Spec(argv=[*MOE, *INTERLEAVED]),
    "moe-zb-h1-selective": Spec(argv=[*MOE, *ZB_H1, "--recompute", "selective"]),
    "moe-zbv-full": Spec(argv=[*MOE, *ZBV, "--recompute", "full"]),
    "moe-dualpipev": Spec(argv=[*MOE, *DUALPIPEV]),
    # a hybrid stack (Mamba-2, attention, GatedDeltaNet, MoE, MLP layers), zero-bubble
    "hybrid-zb-h1": Spec(argv=["--preset", "tiny-hybrid", *ZB_H1]),
    # GatedDeltaNet in a GPT model's layers, with Qwen3-Next's gated attention
    "linear-zb-h1": Spec(argv=[*LINEAR_GPT, *ZB_H1]),
    # a memory policy on 1F1B, interleaved and ZB-V (test_policy_launches.py's peaks)
    "1f1b-policy": Spec(argv=[*ONE_F_ONE_B, *POLICY]),
    "interleaved-policy": Spec(argv=[*INTERLEAVED, *POLICY]),
    "zbv-policy": Spec(argv=["--schedule", "zbv", *V, "--microbatches", "4", *NORM_POLICY]),
    "moe-interleaved-config": Spec(argv=[*INTERLEAVED, *MOE_CONFIG]),
    "moe-interleaved-policy": Spec(argv=[*INTERLEAVED, *MOE_CONFIG, *MOE_POLICY]),
    "mla-1f1b-config": Spec(argv=[*ONE_F_ONE_B, *MLA_CONFIG]),
    "mla-1f1b-policy": Spec(argv=[*ONE_F_ONE_B, *MLA_CONFIG, *MLA_POLICY]),
    "hybrid-1f1b": Spec(argv=[*HYBRID_HALVES, *ONE_F_ONE_B]),
    "hybrid-1f1b-policy": Spec(argv=[*HYBRID_HALVES, *ONE_F_ONE_B, *HYBRID_POLICY]),
    "window-moe-1f1b-selective": Spec(argv=[*ONE_F_ONE_B, "--config", "{tmp}/window.toml",
                                            "--recompute", "selective"]),
    # data parallelism three ways: DDP, Megatron's distributed optimizer and FSDP
    # (test_distributed_optimizer.py compares them)
    "1f1b-dp2": Spec(argv=[*ONE_F_ONE_B, "--dp", "2", "--config", "{tmp}/ddp.toml"],
                     iterations=3),
    "1f1b-dp2-distopt": Spec(argv=[*ONE_F_ONE_B, "--dp", "2", "--config",
                                   "{tmp}/distopt.toml"], iterations=3),
    # torchtitan's FSDP with pipeline parallelism
    "1f1b-dp2-fsdp": Spec(argv=[*ONE_F_ONE_B, "--dp", "2", "--config", "{tmp}/fsdp.toml"],
                          iterations=3),
    # Megatron's --optimizer muon under DDP (test_muon_run.py)
    "1f1b-dp2-muon": Spec(argv=[*ONE_F_ONE_B, "--dp", "2", "--config", "{tmp}/muon.toml"],
                          iterations=3),
}

# test_executor_schedules.py's cases beyond those above; its zb-h1, dualpipev and
# full-recompute 1F1B peers ride on the launches of the same schedules above.
SCHEDULES = {
    "interleaved-m3": Spec(argv=["--schedule", "interleaved-1f1b", *V[:4], "--split",
                                 "3,1,2,2", "--microbatches", "3"]),
    "interleaved-zb": Spec(argv=["--schedule", "interleaved-zb", *V[:4], "--split", "2,2,1,3",
                                 "--microbatches", "4"], extra=PEER),
    "torch-dualpipev-csv": Spec(argv=[*V, "--microbatches", "4", "--actions-csv",
                                      "{tmp}/dualpipev.csv"], extra=PEER),
    "zbv": Spec(argv=["--schedule", "zbv", *V, "--microbatches", "4"], extra=PEER),
}

OTHERS = {
    # torch's engine alone (not alongside ppsim's) on the 1f1b case's split
    "1f1b-torch": Spec(argv=ONE_F_ONE_B, extra=["--engine", "torch"], dump_grads=False),
    # The default config, run in its folder (ppsim-run/latest), watched with ss; rank 1
    # aborts after finishing (gloo's teardown abort). Its trace feeds calibrate and the
    # profile checks, its losses the shared-core check.
    "default": Spec(argv=["--iterations", "2", "--warmup", "1", "--timeout-s", "30",
                          "--json"], recorded=False, in_tmp=True, watch_listen=True,
                    env={"PPSIM_TEST_ABORT_AFTER_FINISH": "1"}),
    "default-one-core": Spec(argv=["--devices", "0,0"], dump_grads=False),
    # one iteration and no --warmup: a smoke run, timed whole (no warm-up left out); its
    # folder's name starts with "-", which the ranks' own flags must not read as an option
    "one-iteration": Spec(argv=["--iterations", "1", "--timeout-s", "30", "--json",
                                "--trace-dir=-out"], recorded=False, in_tmp=True),
    # an injected fault, in a folder that holds an earlier run's results
    "fault": Spec(argv=[*SMALL, "--inject-fault", "1:B:1:2"], recorded=False, in_tmp=True),
    "sigkill": Spec(argv=[*SMALL, "--trace-dir", "{tmp}/out", "--inject-fault", "1:B:1:2:1",
                          "--fault-mode", "kill"], recorded=False),
    # a builder that fails in the ranks alone (validated in ppsim run's own process)
    "rank-builder-error": Spec(argv=["--model", "{tmp}/rankonly.py:build", "--iterations",
                                     "1", "--microbatches", "2"], recorded=False),
    # rank 1's LM head sleeps in iteration 1: rank 0 times out waiting, rank 1 is blamed
    "stall": Spec(argv=["--model", "tests/model_sleepy.py:build", "--microbatches", "4",
                        "--iterations", "3", "--timeout-s", "5"], recorded=False),
}

# test_executor_tp.py: tensor parallelism for real (column/row-parallel layers over gloo),
# tp 2 x pp 2 = 4 processes; then tp 2 x pp 2 x dp 2 = 8 with a SwiGLU MLP and GQA, so
# every sharded matmul and both kinds of group are covered.
TENSOR = {
    "tp2-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2]),
    # torchtitan's tensor parallelism (--fsdp): each column-parallel block keeps its input
    # gathered, gathering nothing in the backward
    "tp2-titan-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--fsdp"]),
    # its latent attention (the latents whole on every rank) and MoE without expert
    # parallelism (every rank routing the gathered tokens through its slice of each expert)
    "tp2-titan-mla-moe-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--config",
                                         "{tmp}/mla-moe.toml", "--fsdp"]),
    "tp2-llama-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/llama.toml"]),
    "tp2-hybrid-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_HYBRID, "--config",
                                  "{tmp}/hybrid-tp.toml"], dump_grads=False),
    "hybrid-etp1-1f1b": Spec(argv=[*ONE_F_ONE_B_HYBRID, "--config", "{tmp}/hybrid-tp.toml"],
                             dump_grads=False),
    "tp2-mla-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, *MLA_CONFIG]),
    "tp2-mla-q-offload": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/mla-q.toml",
                                    "--fine-grained-activation-offloading",
                                    "--offload-modules", "qkv_linear"]),
    "tp2-moe-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, *MOE_WIDE_CONFIG]),
    "tp2-moe-policy": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, *MOE_WIDE_CONFIG,
                                 *MOE_POLICY]),
    "tp2-llama-policy": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/llama.toml",
                                   "--fine-grained-activation-offloading",
                                   "--offload-modules", "qkv_linear", "attn_proj",
                                   "--recompute-modules", "mlp"]),
    # more tensor ranks than key/value groups: QKV gathered along its width (Megatron's)
    "tp4-kv2-1f1b": Spec(argv=["--tp", "4", *ONE_F_ONE_B_M2, "--config", "{tmp}/llama.toml"]),
    "tp2-kv1-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, "--no-sequence-parallel",
                               "--config", "{tmp}/llama-kv1.toml"]),
    # a builder of one's own, split by its parallelize
    "tp2-own-1f1b": Spec(argv=["--tp", "2", *ONE_F_ONE_B_M2, *OWN_TP]),
    "tp2-dp2-own-interleaved": Spec(argv=["--tp", "2", "--dp", "2", *INTERLEAVED_M2,
                                          "--no-sequence-parallel", *OWN_TP], dump_grads=False),
    # tensor parallelism without sequence parallelism: all-reduces, norms whole; the
    # built-in GPT at more tensor ranks than key/value groups (its QKV gathered)
    "tp2-dp2-interleaved-gated": Spec(argv=["--tp", "2", "--dp", "2", *INTERLEAVED_M2,
                                            "--no-sequence-parallel",
                                            "--config", "{tmp}/gated.toml"]),
}

EXPERT = {
    # routed experts over 2 replicas (all-to-alls over gloo), DDP; then over 2 of 4 with
    # the distributed optimizer (the experts' gradients reduced over the other 2)
    "ep2-dp2-1f1b": Spec(argv=["--dp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/moe-ep.toml"]),
    "ep2-dp4-distopt": Spec(argv=["--dp", "4", "--pp", "1", "--microbatches", "2",
                                  "--config", "{tmp}/moe-ep-distopt.toml"]),
    "ep2-dp2-fsdp": Spec(argv=["--dp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/moe-ep-fsdp.toml"]),
    # folded over tp x dp: 4 experts, one on each of the 4 ranks (etp 1)
    "ep4-tp2-dp2": Spec(argv=["--tp", "2", "--dp", "2", "--pp", "1", "--microbatches", "2",
                              "--config", "{tmp}/moe-ep-folded.toml"]),
    # ... and over the tensor ranks of one replica: two hold each two experts
    "ep2-tp4": Spec(argv=["--tp", "4", "--pp", "1", "--microbatches", "2",
                          "--config", "{tmp}/moe-ep-tp4.toml"]),
    # each expert split over the tensor ranks too (etp = tp, Megatron's default): the
    # pairs an all-to-all brought gathered over the tensor group
    "ep2-etp2-tp2-dp2": Spec(argv=["--tp", "2", "--dp", "2", "--pp", "1", "--microbatches", "2",
                                   "--config", "{tmp}/moe-ep.toml"]),
    # ... over 2 of 4 tensor ranks (etp 2 at tp 4), and over the 2 replicas at tp 1
    "etp2-tp4": Spec(argv=["--tp", "4", "--pp", "1", "--microbatches", "2",
                           "--config", "{tmp}/moe-etp2-tp4.toml"]),
    "etp2-dp2": Spec(argv=["--dp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/moe-etp2.toml"]),
}

# test_executor_cp.py: context parallelism for real over gloo: K and V gathered, the GPT
# at cp 2 x pp 2; K and V round the ring (Megatron's default), latent attention
# interleaved over pp 2; the heads exchanged (a2a), the Llama-style decoder under ZB-H1;
# both (a2a+p2p: pairs exchanging heads, a ring across them), the GPT at cp 4; the
# MoE's experts folded over the cp ranks (ep 2 at cp 2, as Megatron folds them);
# then gpt-oss's shape in small (rotary, a sliding window on half the layers, MoE split
# over the tensor ranks; K and V gathered) at tp 2 x cp 2 x dp 2.
CONTEXT = {
    "cp2-1f1b": Spec(argv=["--cp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/cp.toml"]),
    "cp2-distopt": Spec(argv=["--cp", "2", *ONE_F_ONE_B_M2, "--config", "{tmp}/cp.toml",
                              "--use-distributed-optimizer"], dump_grads=False),
    "cp2-ring-interleaved": Spec(argv=["--cp", "2", *INTERLEAVED_M2, *MLA_CONFIG]),
    "cp2-a2a-zb": Spec(argv=["--cp", "2", *ZB_H1, "--config", "{tmp}/cp-a2a.toml"]),
    "cp4-hierarchical": Spec(argv=["--cp", "4", "--pp", "1", "--microbatches", "2",
                                   "--config", "{tmp}/cp-hierarchical.toml"]),
    "cp2-ep2-moe": Spec(argv=["--cp", "2", "--pp", "1", "--microbatches", "2",
                              "--config", "{tmp}/moe-ep.toml"], dump_grads=False),
    "cp2-tp2-dp2-window": Spec(argv=["--cp", "2", "--tp", "2", "--dp", "2", "--pp", "1",
                                     "--microbatches", "2", "--config", "{tmp}/cp-window.toml"],
                               dump_grads=False),
}

# test_tied_run.py: a tied embedding, its two copies on two ranks of each of two replicas
# (the distributed optimizer sharding them), then on one rank holding both ends (ZB-V's V
# placement); the default model's sizes. The torch engine ties alongside, its copies on
# two ranks (1F1B) and its two stage modules of one rank sharing the table (ZB-V).
TIED = {
    "tied-1f1b-dp2": Spec(argv=[*ONE_F_ONE_B, "--dp", "2", "--use-distributed-optimizer",
                                "--config", "{tmp}/tied.toml"], iterations=3),
    # Five iterations: copies stepped apart (or one end's gradient lost) drift from the
    # table by 1e-5 of the loss only by the fifth (the lookup's gradient barely moves AdamW).
    "tied-1f1b": Spec(argv=[*ONE_F_ONE_B, "--config", "{tmp}/tied.toml"], extra=PEER,
                      iterations=5),
    "tied-zbv": Spec(argv=[*ZBV, "--config", "{tmp}/tied.toml"], extra=PEER, iterations=5),
    # One rank's two stage modules share the table under FSDP (each shards it once).
    "tied-zbv-fsdp": Spec(argv=[*ZBV, "--dp", "2", "--fsdp", "--config", "{tmp}/tied.toml"],
                          iterations=3),
    # The ends in two chunks of two ranks, each tensor rank's rows of the table paired.
    "tied-interleaved-tp2": Spec(argv=[*INTERLEAVED, "--tp", "2", "--config",
                                       "{tmp}/tied.toml"], iterations=3),
}

SPECS: dict[str, Spec] = {**EXECUTOR, **SCHEDULES, **OTHERS, **TENSOR, **EXPERT, **CONTEXT,
                          **TIED}


def prepare(name: str, tmp: Path) -> None:
    """Write the files the cases read into the launch's folder `tmp`."""
    (tmp / "zb.csv").write_text(zb_h1_csv(2, 4))
    (tmp / "gated.toml").write_text(GATED_TOML)
    (tmp / "moe.toml").write_text(MOE_TOML)
    (tmp / "moe-wide.toml").write_text(MOE_WIDE_TOML)
    (tmp / "mla.toml").write_text(MLA_TOML)
    (tmp / "mla-q.toml").write_text(MLA_Q_TOML)
    (tmp / "mla-moe.toml").write_text(MLA_MOE_TOML)
    (tmp / "moe-ep.toml").write_text(MOE_TOML + "ep = 2\n")
    (tmp / "moe-ep-folded.toml").write_text(MOE_TOML + "ep = 4\netp = 1\n")
    (tmp / "moe-ep-tp4.toml").write_text(MOE_TOML.replace("num_kv_heads = 2", "num_kv_heads = 4")
                                         + "ep = 2\netp = 1\n")
    (tmp / "moe-etp2-tp4.toml").write_text(MOE_TOML.replace("num_kv_heads = 2",
                                                            "num_kv_heads = 4") + "etp = 2\n")
    (tmp / "moe-etp2.toml").write_text(MOE_TOML + "etp = 2\n")
    (tmp / "moe-ep-fsdp.toml").write_text(MOE_TOML + "ep = 2\nfsdp = true\n")
    (tmp / "moe-ep-distopt.toml").write_text(MOE_TOML + "ep = 2\ndistributed_optimizer = true\n")
    (tmp / "llama.toml").write_text(LLAMA_TOML)
    (tmp / "llama-kv1.toml").write_text(LLAMA_TOML.replace("num_kv_heads = 2",
                                                           "num_kv_heads = 1"))
    (tmp / "hybrid-tp.toml").write_text(HYBRID_TP_TOML)
    (tmp / "window.toml").write_text(WINDOW_TOML)
    (tmp / "cp.toml").write_text(tiny_gpt_toml(cp_comm_type="all_gather"))
    (tmp / "cp-window.toml").write_text(WINDOW_TOML + 'cp_comm_type = "all_gather"\n')
    (tmp / "cp-a2a.toml").write_text(LLAMA_TOML + 'cp_comm_type = "a2a"\n')
    (tmp / "cp-hierarchical.toml").write_text(tiny_gpt_toml(cp_comm_type="a2a+p2p",
                                                            cp_a2a_size=2))
    (tmp / "ddp.toml").write_text(tiny_gpt_toml())
    (tmp / "distopt.toml").write_text(tiny_gpt_toml(distributed_optimizer=True))
    (tmp / "fsdp.toml").write_text(tiny_gpt_toml(fsdp=True))
    (tmp / "muon.toml").write_text(tiny_gpt_toml(optimizer="muon"))
    (tmp / "tied.toml").write_text(tiny_gpt_toml(vocab_size=8192, tie_embeddings=True))
    if name == "rank-builder-error":
        (tmp / "rankonly.py").write_text(RANK_ONLY_BUILDER)
    if name == "torch-dualpipev-csv":
        torch_dualpipev_csv(tmp / "dualpipev.csv")
    if name == "fault":  # an earlier good run the failed one must leave alone
        old = tmp / "ppsim-run" / "20000101-000000"
        old.mkdir(parents=True)
        (old / "trace.json").write_text("earlier good trace")
        (tmp / "ppsim-run" / "latest").symlink_to(old.name)
