"""torchtitan's config-registry functions ppsim prices, as their source states them
(torchtitan b5bcd76, torchtitan/models/<model>/config_registry.py, the model flavours in
torchtitan/models/<model>/__init__.py; read, never run: torchtitan is not a dependency).

Each entry is the function's model, as the ppsim preset whose hidden size, layers, heads,
kv heads, FFN width and vocabulary agree with the flavour's, and the fields of its
ParallelismConfig, TrainingConfig, activation_checkpoint, compile and converters that
ppsim prices; a field the function leaves out holds torchtitan's default
(torchtitan/config/configs.py): data_parallel_shard_degree -1, the other degrees 1,
pipeline_parallel_schedule "1F1B", num_pp_microbatches 1, num_tokens_per_train_step -1.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError


@dataclass(frozen=True, kw_only=True)
class RegistryJob:
    """One config-registry function's job, in torchtitan's fields."""

    source: str
    """The module that defines the function."""
    preset: str
    """ppsim's preset for its model flavour."""
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


_LLAMA = "torchtitan/models/llama3/config_registry.py"
_DEEPSEEK = "torchtitan/models/deepseek_v3/config_registry.py"
_QWEN = "torchtitan/models/qwen3/config_registry.py"

REGISTRY: dict[str, RegistryJob] = {
    # Flavour "8B": dim 4096, 32 layers, 32/8 heads, FFN 14336, vocab 128256.
    "llama3_8b": RegistryJob(source=_LLAMA, preset="llama3-8b",
                             num_tokens_per_microbatch_per_dp_rank=1 * 8192,
                             max_context_length=8192, activation_checkpoint="selective"),
    # Flavour "70B": dim 8192, 80 layers, 64/8 heads, FFN 28672, vocab 128256.
    "llama3_70b": RegistryJob(source=_LLAMA, preset="llama3-70b", tensor_parallel_degree=8,
                              num_tokens_per_microbatch_per_dp_rank=8 * 8192,
                              max_context_length=8192, activation_checkpoint="full"),
    # Flavour "405B": dim 16384, 126 layers, 128/8 heads, FFN 53248, vocab 128256.
    "llama3_405b": RegistryJob(source=_LLAMA, preset="llama3.1-405b",
                               tensor_parallel_degree=8,
                               num_tokens_per_microbatch_per_dp_rank=2 * 8192,
                               max_context_length=8192, activation_checkpoint="full",
                               compile=True, async_tp=True, float8=True),
    # Flavour "671B": MLA, 61 layers (3 dense), 256 experts top-8 + 1 shared, vocab
    # 129280, num_mtp_layers 0 (the preset has DeepSeek's one MTP depth).
    "deepseek_v3_671b": RegistryJob(source=_DEEPSEEK, preset="deepseek-v3", mtp_layers=0,
                                    expert_parallel_degree=2,
                                    pipeline_parallel_schedule="Interleaved1F1B",
                                    num_tokens_per_microbatch_per_dp_rank=4 * 4096,
                                    max_context_length=4096,
                                    activation_checkpoint="selective", compile=True),
    # Flavour "30B-A3B": dim 2048, 48 MoE layers, 32/4 heads of 128, 128 experts top-8
    # (768 wide), vocab 151936.
    "qwen3_30b_a3b": RegistryJob(source=_QWEN, preset="qwen3-30b-a3b",
                                 num_tokens_per_microbatch_per_dp_rank=2 * 4096,
                                 max_context_length=4096, activation_checkpoint="full"),
}
"""The functions whose model flavour a ppsim preset matches. Left out: the debug models,
the dense Qwen3 sizes (no preset), and the variants on converters ppsim does not price
(MXFP8, NVFP4, float8 grouped experts)."""


def registry_job(name: str) -> RegistryJob:
    """The function `name`'s job, refused where ppsim has none."""
    job = REGISTRY.get(name)
    if job is None:
        raise UserError("--torchtitan-config", f"{name!r} is not a config-registry function "
                        "ppsim prices", "give one of " + ", ".join(REGISTRY))
    return job
