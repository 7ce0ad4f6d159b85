"""The job search's shapes with some sizes held (`plan --gpus N --tp 8 ...`)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job.search import _candidates
from ppsim.job.shapes import FIXABLE, shapes

ARCHS = {name: config_from_dict({"model": {"preset": name}}).model.arch
         for name in ("llama3-8b", "mixtral-8x7b")}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ARCHS)), gpus=st.sampled_from([8, 16, 48, 64, 256]),
       gbs=st.sampled_from([16, 64, 96, 512]), data=st.data())
def test_holding_sizes_keeps_exactly_the_shapes_that_have_them(name, gpus, gbs, data) -> None:
    a = ARCHS[name]
    free = shapes(a, gpus, gbs, 8, a.num_layers)
    keys = data.draw(st.lists(st.sampled_from(FIXABLE), unique=True, max_size=3))
    # Values the free search tries (so holding them can only filter), or any size.
    pool = {k: sorted({getattr(s, k) for s in free}) or [1] for k in FIXABLE}
    fixed = {k: data.draw(st.sampled_from(pool[k])) for k in keys}
    held = shapes(a, gpus, gbs, 8, a.num_layers, fixed)
    kept = [s for s in free if all(getattr(s, k) == v for k, v in fixed.items())]
    if "etp" in fixed and a.num_experts:
        # The search tries etp = tp and 1; a held one is tried at every tp it fits.
        assert set(kept) <= set(held) and {s.etp for s in held} <= {fixed["etp"]}
        assert [s for s in held if s.etp in (s.tp, 1)] == kept
    else:
        assert held == kept
    for s in held:
        assert s.tp * s.cp * s.pp * s.dp == gpus
        assert (s.tp * s.cp * s.dp) % (s.expert_tp * s.ep) == 0  # Megatron's expert world
        assert s.mbs * s.microbatches * s.dp == gbs


@settings(max_examples=80, deadline=None)
@given(mbs=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 3, 8]),
       m=st.integers(1, 64), given_m=st.integers(1, 64), batch_given=st.booleans())
def test_a_given_microbatch_count_is_the_batchs_refused_or_replaces_it(
        mbs, dp, m, given_m, batch_given) -> None:
    """Whatever is given is honoured or refused, never dropped: a count equal to the
    batch's keeps the batch; another is refused beside a given batch, else it replaces
    the loaded one."""
    from dataclasses import replace

    from ppsim.errors import UserError
    from ppsim.job.shape import resolved

    cfg = config_from_dict({"model": {"preset": "llama3-8b", "dp": dp,
                                      "micro_batch_size": mbs},
                            "pipeline": {"pp": 2, "global_batch_size": m * mbs * dp}})
    assert cfg.pipeline.microbatches == m
    cfg = replace(cfg, pipeline=replace(cfg.pipeline, microbatches=given_m))
    if given_m == m:
        out = resolved(cfg, given_m, batch_given)
        assert (out.pipeline.microbatches, out.pipeline.global_batch_size) == (m, m * mbs * dp)
    elif batch_given:
        try:
            resolved(cfg, given_m, batch_given)
        except UserError as exc:
            assert exc.field == "pipeline.microbatches"
        else:
            raise AssertionError("a disagreeing count beside a given batch was taken")
    else:
        out = resolved(cfg, given_m, batch_given)
        assert (out.pipeline.microbatches, out.pipeline.global_batch_size) == (given_m, 0)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ARCHS)), gpus=st.integers(1, 3 * 1024),
       layers=st.integers(1, 96))
def test_every_pipeline_size_megatron_takes_is_tried(name, gpus, layers) -> None:
    """Before, only powers of two: on 96 GPUs the 177B GPT of Megatron's own table
    (tp 8, pp 6, dp 2) was never a candidate, nor 8 chunks a rank. Now every pp up to 64
    (and the layers) that divides the world, at tp = cp = 1 with a batch that divides
    every dp."""
    a = ARCHS[name]
    held = shapes(a, gpus, 64 * gpus, 8, layers, {"tp": 1, "cp": 1, "mbs": 1})
    if a.num_experts:  # experts fold over the data-parallel ranks: not every ep fits
        held = [s for s in held if s.ep == 1]
    assert {s.pp for s in held} == {p for p in range(1, min(64, layers) + 1) if gpus % p == 0}
    # and every chunk count up to 8 (Megatron's 405B and DeepSeek-V3 recipes run 4 and 8)
    # that leaves each chunk a layer
    for pp in {s.pp for s in held} - {1}:
        assert {s.vpp for s in held if s.pp == pp} == {v for v in (1, 2, 4, 8)
                                                       if pp * v <= layers}


@settings(max_examples=40, deadline=None)
@given(seq=st.sampled_from([2048, 4096, 8192, 32768, 65536, 131072, 262144, 1048576]),
       gpus=st.sampled_from([256, 1024, 4096]))
def test_a_long_sequence_is_tried_over_more_context_parallel_ranks(seq, gpus) -> None:
    """Up to 8 context-parallel ranks for any sequence, beyond while each keeps 8,192
    tokens of it or more: before, cp stopped at 8, and Llama 3's 128K-token phase (cp 16
    on 16,384 GPUs at 128 sequences a batch) had no shape at all."""
    a = replace(ARCHS["llama3-8b"], seq_length=seq)
    held = shapes(a, gpus, 64 * gpus, 8, a.num_layers, {"tp": 1, "pp": 1, "mbs": 1})
    assert {s.cp for s in held} == {c for c in (1, 2, 4, 8, 16, 32, 64, 128)
                                    if c <= max(8, seq // 8192) and gpus % c == 0}


def test_llama3s_long_context_phase_has_its_shape() -> None:
    """Llama 3 405B's 128K-token phase ran tp 8, cp 16, pp 16, dp 8 on 16,384 GPUs at
    128 sequences a batch (the paper's Table 4). With cp at most 8, no shape of that job
    divided its batch (each rank of a 64-stage pipeline needs a microbatch)."""
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3.1-405b", "--hardware", "h100-80gb",
         "--seq-length", "131072"]))
    todo = _candidates(cfg, 16384, 128, None, frozenset())
    assert any((s.tp, s.cp, s.pp, s.dp) == (8, 16, 16, 8) for s in todo)
    assert max(s.cp for s in todo) == 16  # 8,192 tokens a rank at the least


def _config_or_error(argv: list[str]) -> tuple[str, object]:
    """The job's sizes config_from_args reads from `argv`, or its refusal's words."""
    try:
        cfg = config_from_args(build_parser().parse_args(["simulate", *argv]))
    except UserError as exc:
        return "refused", str(exc)
    a = cfg.model.arch
    return "ok", (a.tp, a.cp, a.dp, a.ep, a.expert_tp, cfg.pipeline.pp,
                  cfg.pipeline.microbatches)


@settings(max_examples=80, deadline=None)
@given(preset=st.sampled_from(["kimi-k2", "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b",
                               "gpt-oss-120b", "llama3-70b"]),
       tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 8, 16, 32, 64]),
       dp=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_gpus_say_what_the_dp_they_give_says(preset: str, tp: int, pp: int, cp: int,
                                             ep: int, dp: int) -> None:
    """`--gpus N` is `--dp N / (tp x cp x pp)`: the same job, or the same refusal. Kimi K2's
    preset (dp 16) with --gpus 512 --pp 8 --ep 64 was refused where --dp 32 was taken."""
    ep = ep if preset != "llama3-70b" else 1
    line = ["--preset", preset, "--hardware", "h100-80gb", "--tp", str(tp), "--pp", str(pp),
            "--cp", str(cp), "--ep", str(ep), "--global-batch-size", str(64 * dp)]
    by_dp = _config_or_error([*line, "--dp", str(dp)])
    by_gpus = _config_or_error([*line, "--gpus", str(tp * cp * pp * dp)])
    assert by_dp == by_gpus
