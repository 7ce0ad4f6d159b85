"""Megatron-LM's pipeline split as Megatron writes it, for tests/property/test_split*.py.

An independent re-implementation, per pipeline rank and virtual stage, of
megatron/core/transformer/transformer_config.py (__post_init__), transformer_block.py
(get_num_layers_to_build), transformer_layer.py (get_transformer_layer_offset) and
megatron/training/arguments.py; vp is None when there are no virtual stages. Expected
values in the split tests come from here, from Megatron's own tests or by hand, never
from ppsim itself.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from ppsim.errors import UserError
from ppsim.pipeline.split import Split, megatron_split

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ref_validate(L, pp, vp, first, last, emb, loss):
    """Raise ValueError wherever Megatron refuses the configuration."""
    if vp is not None and pp < 2:
        raise ValueError("interleaved schedule needs pp > 1")  # arguments.py
    if (first is not None or last is not None) and (emb or loss):
        raise ValueError("first/last cannot be set with account_for_*")
    if first is not None or last is not None:
        stages, layers = pp, L
        for n in (first, last):
            if n is None:
                continue
            if n <= 0:
                raise ValueError("must be larger than 0")
            if vp is not None and n % vp:
                raise ValueError("must be divisible by virtual pipeline parallel degree")
            layers -= n
            stages -= 1
        if bool(layers) != bool(stages):
            raise ValueError("Mismatch: middle layers remaining but middle PP stages available")
        if stages and layers % stages:
            raise ValueError("number of layers at middle stage must be divisible")
        if stages and vp is not None and (layers // stages) % vp:
            raise ValueError("number of layers on each middle pipeline rank")
    elif emb or loss:
        n = L + emb + loss
        if n % pp:
            raise ValueError("num_layers after account_for_* must be divisible by pp")
        if vp is not None and (n // pp) % vp:
            raise ValueError("number of layers on each pipeline rank must be divisible by vp")


def ref_num_layers_to_build(L, pp, vp, first, last, emb, loss, vp_stage, pp_rank):
    is_first, is_last = pp_rank == 0, pp_rank == pp - 1
    if first is not None or last is not None:
        left, stages_left = L, pp
        if first is not None:
            left -= first
            stages_left -= 1
        if last is not None:
            left -= last
            stages_left -= 1
        if stages_left > 0:
            assert left % stages_left == 0
            per_rank = left // stages_left
        else:
            per_rank = 0
        if is_first and first is not None:
            per_rank = first
        if is_last and last is not None:
            per_rank = last
    else:
        n = L + emb + loss
        assert n % pp == 0, "num_layers should be divisible by pipeline_model_parallel_size"
        per_rank = n // pp
    if vp is not None and pp > 1:
        assert per_rank % vp == 0
        build = per_rank // vp
    else:
        build = per_rank
    vp_first = vp is None or vp_stage == 0
    vp_last = vp is None or vp_stage == vp - 1
    if emb and vp_first and is_first:
        build -= 1
    if loss and vp_last and is_last:
        build -= 1
    return build


def ref_offset(L, pp, vp, first, last, emb, loss, vp_stage, pp_rank):
    if pp == 1:
        return 0
    if first is not None or last is not None:
        middle_stages = pp - (first is not None) - (last is not None)
        f = 0 if first is None else first
        la = 0 if last is None else last
        middle_layers = L - f - la
        middle_rank = pp_rank if first is None else pp_rank - 1
        if vp is not None:
            f_chunk = 0 if first is None else first // vp
            l_chunk = 0 if last is None else last // vp
            m_chunk = middle_layers // vp
            total = f_chunk + m_chunk + l_chunk
            if pp_rank == 0:
                return vp_stage * total
            # Megatron divides by middle_stages here, which is 0 for pp = 2 with both set.
            return vp_stage * total + f_chunk + middle_rank * (m_chunk // middle_stages)
        per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
        return 0 if pp_rank == 0 else middle_rank * per_rank + f
    n = L + emb + loss
    per_rank = n // pp
    not_first = not ((vp is None or vp_stage == 0) and pp_rank == 0)
    if vp is not None:
        offset = vp_stage * (n // vp) + pp_rank * (per_rank // vp)
    else:
        offset = pp_rank * per_rank
    return offset - (1 if emb and not_first else 0)


def megatron_parse(layout):
    """Megatron's parse_str_to_list: strip commas, unroll (...)*n then x*n, split on '|'."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [list(stage) for stage in s.split("|")]


def args(L, pp, vpp=1, first=None, last=None, emb=False, loss=False):
    return (L, pp, None if vpp == 1 else vpp, first, last, emb, loss)


def call(L, pp, vpp=1, first=None, last=None, emb=False, loss=False):
    return megatron_split(L, pp, vpp, first, last, emb, loss)


def offsets(split):
    return [s.offset for s in split.stages]


@st.composite
def megatron_configs(draw):
    pp = draw(st.integers(1, 8))
    vpp = 1 if pp == 1 else draw(st.sampled_from([1, 1, 2, 3, 4]))
    if draw(st.booleans()):  # anything at all: mostly rejected
        L = draw(st.integers(1, 64))
        first = draw(st.none() | st.integers(-1, 24))
        last = draw(st.none() | st.integers(-1, 24))
        emb, loss = draw(st.booleans()), draw(st.booleans())
        return L, pp, vpp, first, last, emb, loss
    kind = draw(st.sampled_from(["even", "uneven", "account"]))
    if kind == "account":
        emb, loss = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        n = pp * vpp * draw(st.integers(1, 4))
        assume(n - emb - loss >= 1)
        return n - emb - loss, pp, vpp, None, None, emb, loss
    if kind == "even":
        return pp * vpp * draw(st.integers(1, 4)), pp, vpp, None, None, False, False
    first = draw(st.none() | st.integers(1, 4).map(lambda k: k * vpp))
    last = draw(st.none() | st.integers(1, 4).map(lambda k: k * vpp))
    middle = pp - (first is not None) - (last is not None)
    per_middle = vpp * draw(st.integers(1, 4)) if middle > 0 else 0
    L = (first or 0) + (last or 0) + per_middle * max(middle, 0)
    assume(L >= 1)
    return L, pp, vpp, first, last, False, False


def accepted(cfg):
    try:
        call(*cfg)
    except UserError:
        return False
    return True


splits = st.integers(1, 6).flatmap(
    lambda pp: st.integers(1, 3 if pp > 1 else 1).flatmap(
        lambda vpp: st.lists(st.integers(0, 12), min_size=pp * vpp, max_size=pp * vpp).map(
            lambda counts: Split(tuple(counts), pp, vpp)
        )
    )
)
