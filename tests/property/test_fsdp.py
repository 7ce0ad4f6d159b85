"""FSDP's invariants on random jobs: more shards never cost a rank more memory; against
Megatron's distributed optimizer it saves memory without pp and costs more with it (the
gathered weights and the accumulated gradient stay all step); what a step waits for is
never negative, never more than the collectives take, and with pp never less than the
gradients' reduce-scatter nothing follows."""

from __future__ import annotations

from fsdp_forms import tiny_cfg as cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.costs.transformer import accelerator, transformer_costs
from ppsim.job import fsdp
from ppsim.job.layers import layer_collectives
from ppsim.job.model import build_job
from ppsim.pipeline.problem import model_costs

KINDS = st.sampled_from(["tiny-llm", "tiny-gpt"])


@settings(max_examples=40, deadline=None)
@given(KINDS, st.integers(1, 64), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.sampled_from(["default", "always", "never"]))
def test_more_shards_never_cost_more(preset: str, dp: int, cp: int, pp: int,
                                     policy: str) -> None:
    def static(n: int) -> int:
        c = model_costs(cfg(preset, {"dp": n, "cp": cp, "fsdp": True,
                                     "fsdp_reshard_after_forward": policy}, pp))
        return sum(x.static_bytes for x in (*c.layers, c.embedding, c.head))

    more = static(dp + 1)
    assert more <= static(dp) or dp == 1 and cp == 1  # one rank gathers nothing


@settings(max_examples=40, deadline=None)
@given(KINDS, st.integers(2, 64), st.sampled_from([1, 2, 4]))
def test_against_the_distributed_optimizer(preset: str, dp: int, pp: int) -> None:
    full = model_costs(cfg(preset, {"dp": dp, "fsdp": True}, pp)).layers[0].static_bytes
    zero1 = model_costs(cfg(preset, {"dp": dp, "distributed_optimizer": True}, pp))
    if pp == 1:
        assert full < zero1.layers[0].static_bytes
    else:
        assert full >= zero1.layers[0].static_bytes


@settings(max_examples=40, deadline=None)
@given(KINDS, st.integers(2, 64), st.sampled_from([1, 2]),
       st.sampled_from(["default", "always", "never"]), st.integers(128, 4096))
def test_what_a_step_waits_for(preset: str, dp: int, pp: int, policy: str, seq: int) -> None:
    c = cfg(preset, {"dp": dp, "fsdp": True, "fsdp_reshard_after_forward": policy,
                     "seq_length": seq}, pp)
    job = build_job(c)
    assert job is not None
    acc = accelerator(c.hardware)
    alone = transformer_costs(job.arch, acc).layers[0]
    comm = layer_collectives(job, job.arch, acc, "dense", alone)
    for piece in (comm.forward, comm.backward):
        for one in piece:
            assert 0.0 <= one.exposed_ms <= one.total_ms
    params = sum(x.params for x in model_costs(c).layers)
    tail = job.tail(params, alone.forward_ms, alone.backward_ms, 0.0)
    assert tail.reduce_ms >= 0.0
    if pp > 1:
        assert tail.reduce_ms >= fsdp.reduce_ms(job, params)
    else:
        assert tail.reduce_ms == 0.0


@settings(max_examples=40, deadline=None)
@given(KINDS, st.sampled_from([4, 8, 16, 32]), st.booleans(), st.sampled_from([1, 2]),
       st.sampled_from([1, 2]))
def test_more_copies_never_hold_less(preset: str, dp: int, full: bool, pp: int,
                                     copies: int) -> None:
    sharding = {"fsdp": True} if full else {"distributed_optimizer": True}

    def static(n: int) -> int:
        c = model_costs(cfg(preset, {"dp": dp, "dp_replicas": n, **sharding}, pp))
        return sum(x.static_bytes for x in (*c.layers, c.embedding, c.head))

    assert static(copies) <= static(2 * copies)


@settings(max_examples=30, deadline=None)
@given(KINDS, st.integers(2, 64), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
       st.sampled_from(["none", "selective", "full"]))
def test_an_fp8_gather_never_costs_more(preset: str, dp: int, pp: int, tp: int,
                                        recompute: str) -> None:
    """torchtitan's float8 under FSDP: gathering the weights in FP8 never holds more on a
    rank nor takes longer to gather than the tensorwise recipe gathering bf16, and the
    rowwise recipe keeps what a bf16 layer keeps."""
    def costs(more: dict):
        return model_costs(cfg(preset, {"dp": dp, "tp": tp, "fsdp": True, "recompute": recompute,
                                        "dtype": "bf16", **more}, pp))

    tensorwise = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "dtype": "bf16"}
    plain, gathered = costs(tensorwise), costs({**tensorwise, "fp8_param_gather": True})
    for a, b in zip((*plain.layers, plain.embedding, plain.head),
                    (*gathered.layers, gathered.embedding, gathered.head), strict=True):
        assert b.static_bytes + b.activation_bytes <= a.static_bytes + a.activation_bytes
    job = build_job(cfg(preset, {"dp": dp, "tp": tp, "fsdp": True, **tensorwise,
                                 "fp8_param_gather": True}, pp))
    assert job is not None
    n = plain.layers[0].params
    assert fsdp.gather_ms(job, n) <= fsdp.gather_ms(job, n, wide=n)
    rowwise = costs({"fp8": "hybrid", "fp8_recipe": "rowwise"})
    assert [c.activation_bytes for c in rowwise.layers] == \
        [c.activation_bytes for c in costs({}).layers]
