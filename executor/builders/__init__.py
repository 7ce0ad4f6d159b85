"""Model builders: how `ppsim run` and `ppsim profile` get the model to train.

A builder is named `module:function` (`--model`, or `[model] builder = "..."`);
`function(fields)` receives the merged `[model]` table (preset, architecture
fields, anything else the builder reads) and returns a `ModelBuilder`. ppsim
builds only the pieces each rank holds (see ppsim.executor.builders.stage), seeds
every piece by its name so any split starts from the same weights, makes the
`nn.Linear`s inside them defer weight gradients for zero-bubble schedules, and
applies recompute. Shipped: `ppsim.executor.builders.gpt:build` (default) and
`ppsim.executor.builders.llama:build` (RMSNorm, rotary, GQA, SwiGLU, optional MoE).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ppsim.errors import UserError

DEFAULT_BUILDER = "ppsim.executor.builders.gpt:build"


@runtime_checkable
class ModelBuilder(Protocol):
    """What ppsim needs from a model. Pieces are built on the CPU in float32; ppsim
    moves them to the device and `dtype`. Optional: `layer_kind(i)`, for tp > 1
    `parallelize(module, piece, tp)` (ppsim.executor.builders.user_tp), and
    `tie_embeddings` (ppsim.executor.builders.tied)."""

    num_layers: int
    """Decoder layers; must equal the config's num_layers."""
    activation_shape: tuple[int, ...]
    """Shape of the tensor one stage sends the next (and its gradient back)."""
    dtype: torch.dtype
    """Training dtype of the parameters and of the tensors between stages."""

    def embedding(self) -> nn.Module:
        """Token ids (the first element of a microbatch) -> activation."""
        ...

    def layer(self, index: int) -> nn.Module:
        """Decoder layer `index`: activation -> activation."""
        ...

    def head(self) -> nn.Module:
        """Activation -> output (logits) that `loss` takes."""
        ...

    def microbatch(self, seed: int, iteration: int, index: int) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
        """(inputs, targets) of one microbatch; a pure function of its arguments."""
        ...

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of one microbatch (a scalar)."""
        ...


def builder_spec(explicit: str | None, fields: dict[str, Any]) -> str:
    """--model beats [model] builder beats the GPT default."""
    return explicit or fields.get("builder") or DEFAULT_BUILDER


SHIPPED = "ppsim.executor.builders."
"""Builders under this package are ppsim's own; any other is the user's code."""


def split_spec(spec: str, where: str) -> tuple[str, str]:
    """(module or file, function) of a builder spec; UserError when it is not one."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise UserError(where, f"{spec!r} is not module:function",
                        f"write e.g. {DEFAULT_BUILDER}")
    return module, name


def code_note(spec: str) -> str | None:
    """The warning for a builder outside ppsim: loading it runs its code (its module's
    top level and the function, with the [model] table)."""
    module = spec.rpartition(":")[0]
    if module.startswith(SHIPPED) and not module.endswith(".py"):
        return None
    if not _findable(module):
        return None  # nothing will load: the import error is the one line
    return (f"loading model builder {spec!r}: this runs that code with your permissions "
            "(a config naming a builder is code; use only configs you trust)")


def import_root(spec: str) -> str | None:
    """The folder this process imports a `module:function` builder's top-level package
    from (None for a file path, ppsim's own builders, or a module not found here). A
    rank started as `python -P` has neither the working directory nor a script's folder
    on its path; the worker looks there last, so what `ppsim run` loaded, it loads."""
    module = spec.rpartition(":")[0]
    if module.endswith(".py") or module.startswith(SHIPPED) or not module:
        return None
    try:
        found = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    if found.submodule_search_locations:
        where = next(iter(found.submodule_search_locations), None)
    else:
        where = found.origin if found.has_location else None
    return os.path.dirname(os.path.abspath(where)) if where else None


def _findable(module: str) -> bool:
    if module.endswith(".py"):
        return os.path.isfile(module)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _import(module: str, where: str) -> Any:
    try:
        if module.endswith(".py"):
            spec = importlib.util.spec_from_file_location(
                "ppsim_user_builder_" + os.path.basename(module)[:-3], module)
            if spec is None or spec.loader is None or not os.path.exists(module):
                raise ImportError(f"no file {module}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(where, f"cannot import {module!r}: {exc}",
                        "give module:function (importable from here) or path/file.py:function"
                        ) from None


def load_builder(spec: str, fields: dict[str, Any], where: str = "--model") -> ModelBuilder:
    """Import `module:function`, call it with the model fields, check the result."""
    module, name = split_spec(spec, where)
    fn = getattr(_import(module, where), name, None)
    if not callable(fn):
        raise UserError(where, f"{module} has no function {name!r}",
                        "name a function that takes the [model] fields")
    builder = fn(dict(fields))
    missing = [a for a in ("num_layers", "activation_shape", "dtype", "embedding", "layer",
                           "head", "microbatch", "loss") if not hasattr(builder, a)]
    if missing:
        raise UserError(where, f"{spec} returned an object without " + ", ".join(missing),
                        "return a ModelBuilder (see README, 'Your own model')")
    if "num_layers" in fields and builder.num_layers != int(fields["num_layers"]):
        raise UserError("model.num_layers", f"the config says {fields['num_layers']} but "
                        f"{spec} builds {builder.num_layers} layers",
                        "make them agree")
    return builder


def layer_kind(builder: ModelBuilder, index: int) -> str:
    """A builder may name its layers' kinds (`layer_kind(i)`); one kind otherwise."""
    fn = getattr(builder, "layer_kind", None)
    return str(fn(index)) if callable(fn) else "layer"
