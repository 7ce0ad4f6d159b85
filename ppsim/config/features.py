"""Cross-field checks of transformer features ppsim prices in part (a sliding window,
FP8): each names the field and the fix. ppsim.config.validate calls them once the
fields' types and ranges are checked."""

from __future__ import annotations

from typing import Any

from ppsim.costs.choices import (
    FP4_FORMAT,
    FP4_RECIPE,
    FP8_RECIPES,
    LINEAR_VARIANTS,
    TORCHAO_FP8_RECIPES,
)
from ppsim.costs.patterns import linear_attention_layers, windows
from ppsim.errors import UserError


def sliding_window(raw: dict[str, Any]) -> None:
    """A sliding window on a stack of decoder layers, its pattern one a layer; not
    beside a hybrid pattern, which ppsim prices for full causal attention, nor context
    parallelism's p2p ring (Transformer Engine runs windows with all_gather and a2a)."""
    freq = raw.get("window_attn_skip_freq", "")
    if not raw.get("attention_window"):
        if freq:
            raise UserError("model.window_attn_skip_freq", "places a window, but there is "
                            "none", "add attention_window (--window-size W,0), or drop it")
        return
    if raw.get("hybrid_layer_pattern"):
        raise UserError("model.attention_window", "ppsim prices a hybrid stack's attention "
                        "layers without a window", "drop the window, or the pattern")
    ring = raw.get("cp_comm_type", "p2p")
    if raw.get("cp", 1) != 1 and ring in ("p2p", "a2a+p2p"):
        raise UserError("model.attention_window", "Context parallelism does not support "
                        f"sliding window attention with cp_comm_type='{ring}'!",
                        "use --cp-comm-type a2a or all_gather, or cp 1")
    if isinstance(raw.get("num_layers"), int):
        windows(raw["num_layers"], raw["attention_window"], freq)


def attention_variant(raw: dict[str, Any]) -> None:
    """An experimental attention variant in a GPT model's layers, as Megatron takes it:
    GatedDeltaNet with its pattern, one a layer, beside GQA; DSA over MLA; neither
    beside a hybrid pattern (whose own 'G' and 'D' layers are the same mixers) or a
    sliding window (which ppsim places by layer, over every layer)."""
    variant, freq = raw.get("experimental_attention_variant", ""), raw.get(
        "linear_attention_freq", "")
    field = "model.experimental_attention_variant"
    if freq.strip() and variant not in LINEAR_VARIANTS:
        raise UserError("model.linear_attention_freq", "places GatedDeltaNet layers, but "
                        "the attention variant is not gdn", "set experimental_attention_"
                        "variant = \"gdn\" (--experimental-attention-variant), or drop it")
    if not variant:
        return
    for key, why in (("hybrid_layer_pattern", "a hybrid pattern places its own layers"),
                     ("attention_window", "ppsim places a window over every layer")):
        if raw.get(key):
            raise UserError(field, f"beside {key}: {why}", f"drop one of the two ({key} or "
                            "--experimental-attention-variant)")
    if variant == "dsa":
        if raw.get("attention") != "mla":
            raise UserError(field, "Currently only MLA supports sparse attention. (Megatron's "
                            "assertion)", "add --multi-latent-attention (attention = \"mla\")")
        return
    if raw.get("attention") == "mla":
        raise UserError(field, "ppsim prices GatedDeltaNet beside GQA attention, not MLA",
                        "drop --multi-latent-attention or the linear attention")
    if not freq.strip():
        raise UserError("model.linear_attention_freq", f"Linear attention type {variant} is "
                        "specified but linear_attention_freq is None. Please set "
                        "linear_attention_freq to specify the LA/SDPA layer pattern.",
                        "give --linear-attention-freq N (every Nth layer full attention)")
    if isinstance(raw.get("num_layers"), int):
        linear_attention_layers(freq, raw["num_layers"])


def fp8(raw: dict[str, Any]) -> None:
    """FP8 as ppsim prices it (ppsim.costs.fp8): Hopper's recipes, over bf16 training,
    in the decoder layers (a hybrid stack's too), as Megatron runs it with Transformer
    Engine; --fp8-param-gather as Megatron asserts it. A mixer's in_proj width is
    checked with its shape (ppsim.costs.mixers)."""
    recipe = raw.get("fp8_recipe", "delayed")
    if raw.get("fp8_param_gather") and not raw.get("fp8"):
        raise UserError("model.fp8_param_gather", "keeps the weights in FP8 and FP8 is off",
                        "add --fp8-format hybrid (fp8 = \"hybrid\" in [model]), or drop it")
    framework = raw.get("fsdp", False) and raw.get("fsdp_framework", "torchtitan")
    if framework == "megatron" and raw.get("fp8"):
        raise UserError("model.fp8", "under Megatron's --use-torch-fsdp2 FP8 is Transformer "
                        "Engine's over torch's FSDP2, which ppsim does not price (it prices "
                        "Megatron-FSDP's and torchtitan's)",
                        "drop --fp8-format, or use --use-megatron-fsdp")
    if framework == "megatron-fsdp" and raw.get("fp8") and recipe == "mxfp8":
        raise UserError("model.fp8_recipe", "under Megatron-FSDP ppsim prices Hopper's FP8 "
                        "recipes, whose weights' transposes each backward makes again, not "
                        "MXFP8's", "use --fp8-recipe tensorwise, delayed or blockwise, or "
                        "drop --use-megatron-fsdp")
    nvfp4 = raw.get("fp8") == FP4_FORMAT or recipe == FP4_RECIPE
    if nvfp4:
        _nvfp4(raw, recipe)
    elif framework == "torchtitan":
        _torchao_fp8(raw, recipe)
    elif recipe not in FP8_RECIPES:
        raise UserError("model.fp8_recipe", f"{recipe!r} is not priced: ppsim prices "
                        "Hopper's FP8 recipes with Transformer Engine (torchao's rowwise "
                        "under --fsdp)", "use " + " | ".join(FP8_RECIPES))
    if not raw.get("fp8"):
        return
    if raw.get("first_last_layers_bf16") and recipe == "delayed":
        raise UserError("model.first_last_layers_bf16", "Delayed scaling does not support "
                        "first / last layer in BF16.", "use --fp8-recipe tensorwise or "
                        "blockwise, or drop --first-last-layers-bf16")
    if raw.get("fp8_param_gather") and not (raw.get("distributed_optimizer")
                                            or raw.get("fsdp") or nvfp4):
        raise UserError("model.fp8_param_gather", "--fp8-param-gather only supported with "
                        "distributed optimizer, torch fsdp2, megatron fsdp, or inference mode",
                        "add --use-distributed-optimizer (distributed_optimizer = true)")
    if raw.get("dtype", "bf16") != "bf16":
        raise UserError("model.dtype", "ppsim prices FP8 over bf16 training",
                        "train in bf16 (--bf16), or drop fp8 (--fp8-format)")


def _nvfp4(raw: dict[str, Any], recipe: str) -> None:
    """NVFP4 is the e2m1 format with Transformer Engine's NVFP4BlockScaling, over
    Megatron's DDP or distributed optimizer (ppsim.costs.fp8)."""
    if raw.get("fp8") != FP4_FORMAT:
        raise UserError("model.fp8_recipe", f"{FP4_RECIPE} scales NVFP4's {FP4_FORMAT} "
                        "elements, not FP8's", f"use --fp4-format {FP4_FORMAT} (fp8 = "
                        f"\"{FP4_FORMAT}\" in [model]), or an FP8 recipe: "
                        + " | ".join(FP8_RECIPES))
    if recipe != FP4_RECIPE:
        raise UserError("model.fp8_recipe", f"NVFP4 ({FP4_FORMAT}) scales by Transformer "
                        f"Engine's 16-element blocks, not {recipe!r}",
                        f"set fp8_recipe = \"{FP4_RECIPE}\" (--fp4-recipe {FP4_RECIPE})")
    if raw.get("fsdp"):
        raise UserError("model.fsdp", "ppsim prices NVFP4 over Megatron's DDP or distributed "
                        "optimizer, not under FSDP", "drop --fsdp (--use-megatron-fsdp, "
                        "--use-torch-fsdp2), or train in FP8")


def _torchao_fp8(raw: dict[str, Any], recipe: str) -> None:
    """FP8 under FSDP is torchtitan's: torchao's Float8Linear, tensorwise or rowwise;
    FSDP gathers FP8 weights (enable_fsdp_float8_all_gather) with tensorwise scales only,
    as torchao's Float8LinearConfig asserts."""
    if not raw.get("fp8"):
        return
    if recipe not in TORCHAO_FP8_RECIPES:
        raise UserError("model.fp8_recipe", f"torchtitan's float8 under FSDP (torchao's "
                        f"Float8Linear) scales tensorwise or rowwise, not {recipe!r}",
                        "use --fp8-recipe rowwise (torchtitan's default) or tensorwise")
    if raw.get("fp8_param_gather") and recipe != "tensorwise":
        raise UserError("model.fp8_param_gather", "enable_fsdp_float8_all_gather only "
                        f"supports tensorwise scaling granularity, got {recipe}",
                        "use --fp8-recipe tensorwise, or drop --fp8-param-gather")
