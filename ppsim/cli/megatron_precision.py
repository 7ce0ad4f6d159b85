"""Megatron's precision flags as [model] fields: FP8's (--fp8-format, --fp8-recipe,
--fp8-param-gather), NVFP4's (--fp4-format, --fp4-recipe, --fp4-param-gather) and the
layers kept in bf16 (ppsim.costs.fp8)."""

from __future__ import annotations

from typing import Any

from ppsim.costs.choices import FP4_FORMAT, FP4_RECIPE
from ppsim.errors import UserError


def precision_fields(get: Any) -> dict[str, Any]:
    """--fp8-format, --fp8-recipe, --fp8-param-gather (or NVFP4's --fp4-format,
    --fp4-recipe, --fp4-param-gather: [model] fp8 = "e2m1", fp8_recipe = "nvfp4") and the
    bf16 first and last layers as fields (ppsim.costs.fp8)."""
    fp4 = get("fp4_format")
    _fp4_checks(get)
    if fp4 is not None:
        precision = {"fp8": fp4, "fp8_recipe": FP4_RECIPE,
                     "fp8_param_gather": get("fp4_param_gather")}
    else:
        precision = {"fp8": get("fp8_format"), "fp8_recipe": get("fp8_recipe"),
                     "fp8_param_gather": get("fp8_param_gather")}
    out: dict[str, Any] = {**precision,
                           "first_last_layers_bf16": get("first_last_layers_bf16"),
                           "num_layers_at_start_in_bf16": get("num_layers_at_start_in_bf16"),
                           "num_layers_at_end_in_bf16": get("num_layers_at_end_in_bf16")}
    return {k: v for k, v in out.items() if v is not None}


def _fp4_checks(get: Any) -> None:
    """Megatron's checks of --fp4-format beside the FP8 flags; a custom recipe refused."""
    fp4, recipe = get("fp4_format"), get("fp4_recipe")
    if fp4 not in (None, FP4_FORMAT):
        raise UserError("--fp4-format", f"{fp4!r}: Megatron's FP4 format is {FP4_FORMAT} "
                        f"(NVFP4's elements; the recipe is --fp4-recipe {FP4_RECIPE})",
                        f"give --fp4-format {FP4_FORMAT}")
    if recipe not in (None, FP4_RECIPE):
        raise UserError("--fp4-recipe", f"{recipe!r}: ppsim prices {FP4_RECIPE} "
                        "(NVFP4BlockScaling), not a quantizer factory of your own",
                        f"use --fp4-recipe {FP4_RECIPE}")
    if fp4 is not None and get("fp8_format") is not None:
        raise UserError("--fp4-format", "--fp4-format and --fp8-format cannot be used "
                        "simultaneously. Please choose one. (Megatron's error)",
                        "drop one of them")
    if get("fp4_param_gather") and fp4 is None:
        raise UserError("--fp4-param-gather", "--fp4-param-gather must be used together "
                        "with --fp4-format. (Megatron's error)",
                        f"add --fp4-format {FP4_FORMAT}")
