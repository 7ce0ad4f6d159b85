"""DeepSpeed's batch rule: train_batch_size = micro batch x gradient accumulation steps x
data-parallel size, the missing one derived and the three checked as DeepSpeed's config
does (deepspeed/runtime/config.py: _set_batch_related_parameters, _batch_assertion)."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.cli.deepspeed_config import ROOT, within_limit
from ppsim.errors import UserError


@dataclass(frozen=True)
class BatchTriple:
    """DeepSpeed's three batch numbers; None where the config leaves one out."""

    train_batch_size: int | None
    micro_batch: int | None
    grad_accum_steps: int | None


@dataclass(frozen=True)
class Batch:
    """The three, all known: sequences per iteration, per microbatch, microbatches."""

    train_batch_size: int
    micro_batch: int
    grad_accum_steps: int


def _derived(t: BatchTriple, dp: int) -> BatchTriple:
    """The missing numbers as DeepSpeed derives them (floor divisions, as it does)."""
    train, micro, gas = t.train_batch_size, t.micro_batch, t.grad_accum_steps
    if train is not None and micro is not None and gas is not None:
        return t
    if train is not None and micro is not None:
        return BatchTriple(train, micro, train // micro // dp if micro else 0)
    if train is not None and gas is not None:
        return BatchTriple(train, train // dp // gas if gas else 0, gas)
    if micro is not None and gas is not None:
        return BatchTriple(micro * gas * dp, micro, gas)
    if train is not None:
        return BatchTriple(train, train // dp, 1)
    if micro is not None:
        return BatchTriple(micro * dp, micro, 1)
    raise UserError(f"{ROOT}.train_batch_size", "Either train_batch_size or "
                    "train_micro_batch_size_per_gpu needs to be provided (DeepSpeed's "
                    "words)", "give train_micro_batch_size_per_gpu and "
                    "gradient_accumulation_steps, or train_batch_size")


def deepspeed_batch(given: BatchTriple, dp: int) -> Batch:
    """The batch DeepSpeed runs at data-parallel size `dp`, refused in its words where
    the numbers do not make one."""
    t = _derived(given, dp)
    train, micro, gas = t.train_batch_size, t.micro_batch, t.grad_accum_steps
    assert train is not None and micro is not None and gas is not None
    for key, value, words in (
            ("train_batch_size", train, f"Train batch size: {train} has to be greater "
             "than 0"),
            ("train_micro_batch_size_per_gpu", micro, f"Micro batch size per gpu: {micro} "
             "has to be greater than 0"),
            ("gradient_accumulation_steps", gas, f"Gradient accumulation steps: {gas} has "
             "to be greater than 0")):
        if value <= 0:
            raise UserError(f"{ROOT}.{key}", f"{words} (DeepSpeed's words; at dp {dp})",
                            _fix(given, dp))
        within_limit(key, value, f" (at dp {dp})")
    if train != micro * gas * dp:
        raise UserError(f"{ROOT}.train_batch_size", "Check batch related parameters. "
                        "train_batch_size is not equal to micro_batch_per_gpu * "
                        f"gradient_acc_step * world_size {train} != {micro} * {gas} * {dp} "
                        "(DeepSpeed's words; world_size is the data-parallel size)",
                        _fix(given, dp))
    return Batch(train, micro, gas)


def _fix(given: BatchTriple, dp: int) -> str:
    micro, gas = given.micro_batch, given.grad_accum_steps
    if micro and gas and micro > 0 and gas > 0:
        return f"give train_batch_size {micro * gas * dp} (= {micro} x {gas} x dp {dp})"
    return (f"give train_batch_size a multiple of train_micro_batch_size_per_gpu x "
            f"dp {dp}, or give the micro batch and the accumulation steps alone")
