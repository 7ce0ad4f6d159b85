"""In-process tests of the executor's parts: model, deferred W, messages, the trace merge.

The run spec, the launch and the run's CLI checks are in test_run_spec.py; the
multi-process tests (real torchrun + gloo) in tests/e2e.
"""
# ruff: noqa: E402 (torch is imported only when present: importorskip comes first)

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]

from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ppsim.cli.run import load_problem
from ppsim.cli.run_flags import add_run_arguments
from ppsim.config.model import model_fields
from ppsim.config.schema import load_config
from ppsim.costs.transformer import Architecture, layer_activation_bytes
from ppsim.errors import UserError
from ppsim.executor import launch
from ppsim.executor.builders import DEFAULT_BUILDER, load_builder
from ppsim.executor.builders.deferral import DeferringLinear, WeightGradStore, defer_linears
from ppsim.executor.builders.gpt import GPTBuilder, GPTShape
from ppsim.executor.builders.llama import LlamaBuilder, parse_kinds
from ppsim.executor.builders.moe import MoE
from ppsim.executor.builders.stage import Stage, full_model, saved_bytes
from ppsim.executor.outputs import backward_from, deallocate_output
from ppsim.executor.p2p import outgoing
from ppsim.executor.recorder import merge_parts
from ppsim.executor.runtime import Fault
from ppsim.schedules.generators import build_schedule

FIELDS = load_config(None).model.fields()
SHAPE = GPTShape.from_fields(FIELDS)
MOE_FIELDS = {**FIELDS, "layers": "dense, moe*2, dense*2, moe, dense*2", "num_kv_heads": 2,
              "num_experts": 4, "top_k": 2, "shared_experts": 1, "moe_ffn_hidden_size": 48}
BUILDERS = {"gpt": (DEFAULT_BUILDER, FIELDS),
            "llama-moe": ("ppsim.executor.builders.llama:build", MOE_FIELDS)}


def _builder(name: str):
    spec, fields = BUILDERS[name]
    return load_builder(spec, fields)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stages_compose_to_the_full_model(name: str, recompute: str) -> None:
    b = _builder(name)
    full = full_model(b)
    parts = [Stage(b, 0, 3, True, False, recompute=recompute), Stage(b, 3, 0, False, False),
             Stage(b, 3, 5, False, True, recompute=recompute)]
    ids, _ = b.microbatch(0, 0, 0)
    x = ids
    for part in parts:
        x = part(x)
    torch.testing.assert_close(x, full(ids), rtol=0, atol=0)
    names = {n for part in parts for n, _ in part.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}


@functools.cache
def _full_weights(name: str) -> dict[str, torch.Tensor]:
    """The whole model's weights, built once: the reference every split is held to."""
    return {n: p.detach() for n, p in full_model(_builder(name)).named_parameters()}


# 30 examples: each builds a whole model's worth of stages; the e2e runs check more
# splits (their gradients equal one process's only if the weights are these).
@settings(max_examples=30)
@given(cuts=st.lists(st.integers(0, 8), min_size=0, max_size=4))
def test_any_split_starts_from_the_same_weights(cuts: list[int]) -> None:
    b = _builder("gpt")
    bounds = [0, *sorted(cuts), 8]
    parts = [Stage(b, lo, hi - lo, i == 0, i == len(bounds) - 2)
             for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))]
    got = {n: p for part in parts for n, p in part.named_parameters()}
    for n, p in _full_weights("gpt").items():
        assert torch.equal(got[n], p), n


def test_data_is_seeded_and_learnable() -> None:
    b = _builder("gpt")
    a, c = b.microbatch(0, 1, 2), b.microbatch(0, 1, 2)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    assert not torch.equal(a[0], b.microbatch(0, 1, 3)[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # targets are the next tokens
    assert a[0].shape == (SHAPE.micro_batch_size, SHAPE.seq_length)


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_deferred_weight_grads_equal_plain_backward(name: str, recompute: str) -> None:
    b = _builder(name)
    ref, zb = full_model(b), full_model(b, recompute=recompute)
    ids, targets = b.microbatch(0, 0, 0)
    b.loss(ref(ids), targets).backward()
    WeightGradStore.enabled = True
    try:
        loss = b.loss(zb(ids), targets)
        WeightGradStore.deferring, WeightGradStore.key = True, (0, 0)
        loss.backward()
        WeightGradStore.deferring, WeightGradStore.key = False, None
        deferred = {n for n, p in zb.named_parameters() if p.grad is None}
        matmuls = {f"{m}.{n}" for m, mod in zb.named_modules() if isinstance(mod, DeferringLinear)
                   for n, _ in mod.named_parameters()}
        experts = {f"{m}.{n}" for m, mod in zb.named_modules() if isinstance(mod, MoE)
                   for n in ("gate", "up", "down")}
        assert deferred == matmuls | experts  # only matmul weights wait for W
        assert WeightGradStore.held_bytes((0, 0)) > 0
        WeightGradStore.run((0, 0))
    finally:
        WeightGradStore.reset()
    for (n, p), (_, q) in zip(ref.named_parameters(), zb.named_parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


def test_user_linears_become_deferring_in_place() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2, bias=False)))
    before = dict(m.named_parameters())
    assert defer_linears(m) == 2
    assert all(type(x) is DeferringLinear for x in (m[0], m[1][0]))
    assert dict(m.named_parameters()) == before  # same tensors under the same names


def test_full_recompute_keeps_exactly_the_layer_input() -> None:
    """The analytic full-recompute activations (2sbh at 16 bits) are what is kept."""
    b = _builder("gpt")
    layer = Stage(b, 2, 1, False, False, recompute="full")
    x = torch.randn(b.activation_shape, requires_grad=True)
    ptrs = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    with saved_bytes(ptrs) as seen:
        layer(x)
    arch = Architecture(**{**{k: v for k, v in FIELDS.items() if k not in ("kind", "builder")},
                           "recompute": "full"})
    assert sum(seen.values()) == layer_activation_bytes(arch, "dense") == x.numel() * 4


def test_layer_kinds_parse() -> None:
    assert parse_kinds("dense*2, moe, dense", 4) == ["dense", "dense", "moe", "dense"]
    assert parse_kinds(None, 2) == ["dense", "dense"]
    assert parse_kinds(["moe", "dense"], 2) == ["moe", "dense"]
    for bad in ("dense*3", "dense, mlp", ["moe"] * 3):
        with pytest.raises(UserError, match="model.layers"):
            parse_kinds(bad, 2)
    b = _builder("llama-moe")
    kinds = [b.layer_kind(i) for i in range(8)]
    assert kinds == parse_kinds(MOE_FIELDS["layers"], 8)
    assert [isinstance(b.layer(i).mlp, MoE) for i in range(8)] == [k == "moe" for k in kinds]


def test_the_default_builder_builds_what_the_fields_describe() -> None:
    assert isinstance(load_builder(DEFAULT_BUILDER, FIELDS), GPTBuilder)  # LayerNorm, learned
    # The presets' own norms, positions and layer kinds at a small width: a layer of
    # llama3-8b's 4,096 would take seconds to initialise for the same answer.
    small = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 128}
    llama = model_fields({"preset": "llama3-8b", **small})
    mixtral = model_fields({"preset": "mixtral-8x7b", **small, "moe_ffn_hidden_size": 128})
    for fields in (llama, mixtral):
        b = load_builder(DEFAULT_BUILDER, fields)
        assert isinstance(b, LlamaBuilder)
        layer = b.layer(0) if fields is llama else None
        if layer is not None:
            assert type(layer.attn_norm).__name__ == "RMSNorm" and layer.attention.rotary
    assert load_builder(DEFAULT_BUILDER, mixtral).layer_kind(3) == "moe"
    deepseek = load_builder(DEFAULT_BUILDER, model_fields({"preset": "deepseek-v3"}))
    assert deepseek.shape.arch.attention == "mla"  # built as MLA (its layers are not: 7168 wide)
    with pytest.raises(UserError, match="model.kv_lora_rank"):
        load_builder(DEFAULT_BUILDER, {**FIELDS, "attention": "mla", "kv_lora_rank": 0})


@pytest.mark.parametrize("spec, problem", [
    ("nocolon", "not module:function"),
    ("no.such.module:build", "cannot import"),
    ("ppsim.executor.builders.gpt:nothing", "no function"),
    ("tests/missing.py:build", "cannot import"),
])
def test_a_bad_builder_is_a_user_error(spec: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        load_builder(spec, FIELDS)


def test_builder_layer_count_must_match_the_config(tmp_path) -> None:
    f = tmp_path / "mine.py"
    f.write_text("from ppsim.executor.builders.gpt import build as gpt\n\n"
                 "def build(fields):\n    return gpt({**fields, 'num_layers': 3})\n")
    with pytest.raises(UserError, match="builds 3 layers"):
        load_builder(f"{f}:build", FIELDS)
    assert load_builder(f"{f}:build", {**FIELDS, "num_layers": 3}).num_layers == 3


def test_outgoing_messages_follow_the_sender_order() -> None:
    s = build_schedule("interleaved-1f1b", 2, 2, 4)
    sent = outgoing(s, 0)
    assert all(dst == 1 for dst, _ in sent)
    assert sent[0] == (1, ("F", 1, 0))
    # every activation and gradient crossing ranks is sent exactly once
    everything = [k for r in range(2) for _, k in outgoing(s, r)]
    assert len(everything) == len(set(everything)) == 2 * (4 - 1) * 4


def test_fault_spec() -> None:
    assert Fault.parse("1:B:1:2") == Fault(1, "B", 1, 2, 0)
    assert Fault.parse("0:F:2:3:1") == Fault(0, "F", 2, 3, 1)
    for bad in ("1:X:1:2", "1:B:1", "a:B:1:2"):
        with pytest.raises(ValueError):
            Fault.parse(bad)


def test_actions_csv_replaces_the_schedule(tmp_path) -> None:
    csv = tmp_path / "zb.csv"
    csv.write_text("0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n")
    problem = load_problem(_parse(["--microbatches", "2", "--actions-csv", str(csv)]))
    assert problem.schedule.split_backward and len(problem.schedule.actions[0]) == 6


def test_merge_pairs_sends_with_arrivals() -> None:
    send = {"ph": "send", "pid": 0, "iteration": 0, "ts": 10.0, "kind": "F", "dst": 1,
            "stage": 0, "dst_stage": 1, "microbatch": 0, "bytes": 8}
    recv = {"ph": "recv", "pid": 1, "src": 0, "kind": "F", "stage": 1, "microbatch": 0,
            "iteration": 0, "ts": 15.0}
    events = merge_parts([[send], [recv]], 2)
    (t,) = [e for e in events if e.get("cat") == "transfer"]
    assert (t["ts"], t["dur"], t["args"]["dst"]) == (0.0, 5.0, 1)


def test_cli_module_imports_without_torch() -> None:

    code = ("import sys, ppsim.cli.run, ppsim.cli.main; ppsim.cli.main.build_parser(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(("finished", "exits", "errors", "kept"), [
    ({0, 1}, {1: -6}, [], True),  # aborted in teardown, after its work: kept
    ({0}, {1: -6}, [], False),  # died before finishing: a failure
    ({0, 1}, {1: -6}, ["rank 1 failed in F0"], False),  # a rank said it failed
    ({0, 1}, {}, [], False),  # no torchrun record of which rank: a failure
])
def test_a_teardown_abort_is_kept_only_after_every_failed_rank_finished(
        finished, exits, errors, kept) -> None:
    out = launch.Outcome(1, errors=list(errors), exits=dict(exits), finished=set(finished))
    warnings = out.died_after_finishing()
    assert bool(warnings) == kept
    if kept:
        assert warnings == ["rank 1 killed by signal 6 (SIGABRT) after finishing its work (in "
                            "torch.distributed's teardown); the run's results are complete"]


def test_a_sent_output_is_freed_and_its_backward_still_runs() -> None:
    """Megatron's deallocate_output_tensor: the data of a stage's sent output goes, its
    graph stays, and the backward from it gives the gradients a plain backward gives."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 16)
    x = torch.randn(8, 16, requires_grad=True)
    grad = torch.randn(8, 16)
    lin(x).add(1.0).backward(grad)
    want_x, want_w = x.grad.clone(), lin.weight.grad.clone()
    x.grad, lin.weight.grad, lin.bias.grad = None, None, None
    y = lin(x).add(1.0)
    deallocate_output(y)
    assert y.untyped_storage().nbytes() == y.element_size()
    backward_from(y, grad)
    assert torch.equal(x.grad, want_x) and torch.equal(lin.weight.grad, want_w)
