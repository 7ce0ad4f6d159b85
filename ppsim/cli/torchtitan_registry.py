"""torchtitan's config-registry functions ppsim prices, as their source states them
(torchtitan b5bcd76, torchtitan/models/<model>/config_registry.py, the model flavours in
torchtitan/models/<model>/__init__.py; read, never run: torchtitan is not a dependency).

Each entry is the function's model, as the ppsim preset whose sizes agree with the
flavour's (recorded beside it, as torchtitan states them), and the fields of its
ParallelismConfig, TrainingConfig, activation_checkpoint, compile and converters that
ppsim prices; a field the function leaves out holds torchtitan's default
(torchtitan/config/configs.py): data_parallel_shard_degree -1, the other degrees 1,
pipeline_parallel_schedule "1F1B", num_pp_microbatches 1, num_tokens_per_train_step -1.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Flavour:
    """The model flavour's sizes, as torchtitan's model registry builds them."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    """MLA: the heads (each its own key and value, from the shared latent)."""
    head_dim: int
    vocab: int
    ffn: int | None = None
    """The dense FFN's width; None where every layer is MoE."""
    dense_layers: int = 0
    """The dense layers before the MoE ones."""
    experts: int = 0
    top_k: int = 0
    expert_ffn: int | None = None
    shared_experts: int = 0


@dataclass(frozen=True, kw_only=True)
class RegistryJob:
    """One config-registry function's job, in torchtitan's fields."""

    source: str
    """The module that defines the function."""
    preset: str
    """ppsim's preset for its model flavour."""
    flavour: Flavour
    mtp_layers: int | None = None
    """MTP depths where the flavour's differ from the preset's."""
    tensor_parallel_degree: int = 1
    context_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    pipeline_parallel_schedule: str = "1F1B"
    num_tokens_per_microbatch_per_dp_rank: int
    max_context_length: int
    activation_checkpoint: str
    """The subcommand of its policy: selective, full or none."""
    compile: bool = False
    async_tp: bool = False
    """compile.enable_async_tensor_parallel."""
    float8: bool = False
    """Float8LinearConverter (rowwise, the head filtered out)."""
    loss_chunks: int = 8
    """Its loss, ChunkedLossWrapper, at its default num_chunks (every function here)."""


_LLAMA = "torchtitan/models/llama3/config_registry.py"
_DEEPSEEK = "torchtitan/models/deepseek_v3/config_registry.py"
_QWEN = "torchtitan/models/qwen3/config_registry.py"
_GPT_OSS = "torchtitan/models/gpt_oss/config_registry.py"

_LLAMA_SIZES = dict(kv_heads=8, head_dim=128, vocab=128256)

REGISTRY: dict[str, RegistryJob] = {
    "llama3_8b": RegistryJob(source=_LLAMA, preset="llama3-8b",
                             flavour=Flavour(hidden=4096, layers=32, heads=32, ffn=14336,
                                             **_LLAMA_SIZES),
                             num_tokens_per_microbatch_per_dp_rank=1 * 8192,
                             max_context_length=8192, activation_checkpoint="selective"),
    "llama3_70b": RegistryJob(source=_LLAMA, preset="llama3-70b",
                              flavour=Flavour(hidden=8192, layers=80, heads=64, ffn=28672,
                                              **_LLAMA_SIZES),
                              tensor_parallel_degree=8,
                              num_tokens_per_microbatch_per_dp_rank=8 * 8192,
                              max_context_length=8192, activation_checkpoint="full"),
    "llama3_405b": RegistryJob(source=_LLAMA, preset="llama3.1-405b",
                               flavour=Flavour(hidden=16384, layers=126, heads=128, ffn=53248,
                                               **_LLAMA_SIZES),
                               tensor_parallel_degree=8,
                               num_tokens_per_microbatch_per_dp_rank=2 * 8192,
                               max_context_length=8192, activation_checkpoint="full",
                               compile=True, async_tp=True, float8=True),
    # Flavour "671B" (MLA) sets num_mtp_layers 0; the preset has DeepSeek's one MTP depth.
    "deepseek_v3_671b": RegistryJob(source=_DEEPSEEK, preset="deepseek-v3", mtp_layers=0,
                                    flavour=Flavour(hidden=7168, layers=61, heads=128,
                                                    kv_heads=128, head_dim=128, vocab=129280,
                                                    ffn=18432, dense_layers=3, experts=256,
                                                    top_k=8, expert_ffn=2048,
                                                    shared_experts=1),
                                    expert_parallel_degree=2,
                                    pipeline_parallel_schedule="Interleaved1F1B",
                                    num_tokens_per_microbatch_per_dp_rank=4 * 4096,
                                    max_context_length=4096,
                                    activation_checkpoint="selective", compile=True),
    "qwen3_30b_a3b": RegistryJob(source=_QWEN, preset="qwen3-30b-a3b",
                                 flavour=Flavour(hidden=2048, layers=48, heads=32, kv_heads=4,
                                                 head_dim=128, vocab=151936, experts=128,
                                                 top_k=8, expert_ffn=768),
                                 num_tokens_per_microbatch_per_dp_rank=2 * 4096,
                                 max_context_length=4096, activation_checkpoint="full"),
    # Flavour "120b": a 128-token sliding window on the even layers (the preset's 127
    # tokens back), gpt-oss's gated experts; ep 1 as the function states it.
    "gpt_oss_120b": RegistryJob(source=_GPT_OSS, preset="gpt-oss-120b",
                                flavour=Flavour(hidden=2880, layers=36, heads=64, kv_heads=8,
                                                head_dim=64, vocab=201088, experts=128,
                                                top_k=4, expert_ffn=2880),
                                num_tokens_per_microbatch_per_dp_rank=1 * 8192,
                                max_context_length=8192, activation_checkpoint="full"),
}
"""The functions whose model flavour a ppsim preset matches. Left out: the debug models;
the flavours with no preset (the dense Qwen3 and Qwen3.5 sizes, qwen35_35b_a3b and
qwen35_122b_a10b, deepseek_v3_16b, gpt_oss_20b, moonlight_16b_a3b, muse_glimmer, flux);
the vision-language jobs, whose vision tower runs on every image (kimi_vl_a3b, and
qwen35_397b_a17b: cc12m's image-text pairs through a 27-layer tower beside the
qwen3.5-397b-a17b decoder); kimi_k2_5, Kimi K2's text tower (kimi-k2) trained with
distributed Muon, which ppsim does not price under FSDP2; and the variants on converters
or kernels ppsim does not price (MXFP8, NVFP4, float8 grouped experts, HybridEP, DeepEP,
async EP)."""


def registry_job(name: str) -> RegistryJob:
    """The function `name`'s job, refused where ppsim has none."""
    job = REGISTRY.get(name)
    if job is None:
        raise UserError("--torchtitan-config", f"{name!r} is not a config-registry function "
                        "ppsim prices", "give one of " + ", ".join(REGISTRY))
    return job
