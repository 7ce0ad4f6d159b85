"""The message rule (ppsim.pipeline.messages) against an independent statement of it.

The statement, from the docs: F of stage s sends its activation to F of stage s + 1,
B of stage s sends its input gradient to B of stage s - 1; the last F and the first B
send nothing (the loss joins them), W never sends. So the messages of a schedule are
exactly ("F", s, i) for s in 1..n-1 and ("B", s, i) for s in 0..n-2, each received by
the op of that kind, stage and microbatch and sent by the op one stage before (F) or
after (B) it.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from helpers import uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.pipeline import messages
from ppsim.pipeline.messages import Message, awaits, delay_ms, feeds, key, key_count, stage_keys
from ppsim.pipeline.placement import LinkSpec
from ppsim.pipeline.problem import Hardware
from ppsim.schedules.actions import dependencies
from ppsim.schedules.generators import build_schedule
from ppsim.sim.simulate import simulate
from ppsim.sim.timing import compile_schedule


@st.composite
def shapes(draw):
    """(schedule, pp, vpp, microbatches) that every generator accepts."""
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb",
                                 "zb-h1", "zbv", "dualpipev"]))
    pp = draw(st.integers(1, 5))
    vpp, m = 1, draw(st.integers(1, 9))
    if name in ("interleaved-1f1b", "interleaved-zb"):
        vpp = draw(st.integers(2, 3))
    elif name in ("zbv", "dualpipev"):
        vpp = 2
        m = draw(st.integers(2 * pp, 2 * pp + 4)) if name == "dualpipev" else m
    elif name == "gpipe":
        vpp = draw(st.integers(1, 3))
    return name, pp, vpp, m


def expected(n: int, m: int) -> dict[tuple[str, int, int], tuple[str, int, int]]:
    """The statement above: message (kind, receiving stage, microbatch) -> sending op."""
    out = {}
    for i in range(m):
        for s in range(1, n):
            out[("F", s, i)] = ("F", s - 1, i)
        for s in range(n - 1):
            out[("B", s, i)] = ("B", s + 1, i)
    return out


@given(shapes())
def test_the_rule_sends_and_awaits_exactly_the_stated_messages(shape):
    s = build_schedule(*shape)
    n, m = s.num_stages, s.microbatches
    sent = Counter()
    awaited = Counter()
    for acts in s.actions:
        for a in acts:
            out, inbox = feeds(a, n), awaits(a, n)
            if out is not None:
                sent[tuple(out)] += 1
                assert expected(n, m)[tuple(out)] == (a.kind, a.stage, a.microbatch)
                assert out.sender == a.stage
            if inbox is not None:
                awaited[tuple(inbox)] += 1
                assert (inbox.kind, inbox.stage, inbox.microbatch) == (a.kind, a.stage,
                                                                       a.microbatch)
                dep = dependencies(a, n)
                assert (dep.kind, dep.stage, dep.microbatch) == expected(n, m)[tuple(inbox)]
            if a.kind == "W":
                assert out is None and inbox is None
    want = Counter(expected(n, m).keys())
    assert sent == want  # every message sent exactly once ...
    assert awaited == want  # ... and awaited exactly once


@given(shapes())
def test_every_wait_has_exactly_one_send_with_a_unique_key_on_the_right_rank(shape):
    s = build_schedule(*shape)
    c = compile_schedule(s)
    senders: dict[int, list[tuple[int, int]]] = {}
    for r in range(s.pp):
        for i, k in enumerate(c.send_key[r]):
            if k >= 0:
                senders.setdefault(k, []).append((r, i))
    waits = [(r, k) for r in range(s.pp) for k in c.wait_key[r] if k >= 0]
    assert sorted(senders) == sorted(k for _, k in waits)  # one send per wait, keys unique
    assert all(len(v) == 1 for v in senders.values())
    assert len(waits) == len(expected(s.num_stages, s.microbatches))
    for r, k in waits:
        (src, i), = senders[k]
        assert c.send_rank[src][i] == r  # the message goes to the rank that waits for it
        assert 0 <= k < 2 * s.num_stages * s.microbatches
        assert k < c.messages  # the list list_schedule holds arrivals in is long enough


@given(st.integers(1, 40), st.integers(1, 40))
def test_keys_name_every_message_once(n, m):
    keys = [key(s, i, b, m) for s in range(n) for i in range(m) for b in (False, True)]
    assert len(set(keys)) == len(keys) == 2 * n * m == key_count(n, m)
    assert min(keys) == 0 and max(keys) == 2 * n * m - 1
    for s in range(n):
        for b in (False, True):
            assert list(stage_keys(s, b, m)) == [key(s, i, b, m) for i in range(m)]


@given(shapes())
def test_the_executor_sends_what_the_rule_says_in_its_own_order(shape):
    p2p = pytest.importorskip("ppsim.executor.p2p")
    s = build_schedule(*shape)
    n, m = s.num_stages, s.microbatches
    crossing = {k: v for k, v in expected(n, m).items()
                if s.stage_rank(k[1]) != s.stage_rank(v[1])}
    got = []
    for r in range(s.pp):
        out = p2p.outgoing(s, r)
        order = [(a.kind, a.stage, a.microbatch) for a in s.actions[r]]
        # In the order rank r runs the ops that send them.
        assert [order.index(crossing[tuple(msg)]) for _, msg in out] == \
            sorted(order.index(crossing[tuple(msg)]) for _, msg in out)
        for peer, msg in out:
            assert s.stage_rank(crossing[tuple(msg)][1]) == r
            assert peer == s.stage_rank(msg.stage) != r
        got += [tuple(msg) for _, msg in out]
    assert sorted(got) == sorted(crossing)
    # The wire tag is the message's key: one tag per message.
    tags = [p2p.P2P.tag(SimpleNamespace(m=m), Message(*k)) for k in crossing]
    assert tags == [key(k[1], k[2], k[0] == "B", m) for k in crossing]
    assert len(set(tags)) == len(tags)


floats = st.floats(0, 1e3, allow_nan=False)


@given(floats, floats, st.integers(0, 10**12))
def test_one_delay_formula_on_every_link(latency, bandwidth, nbytes):
    want = latency + nbytes / (bandwidth * 1e6) if bandwidth > 0 else latency
    assert delay_ms(latency, bandwidth, nbytes) == want
    assert Hardware(1e9, latency, bandwidth).transfer_ms(nbytes) == want
    assert LinkSpec(("dev", 0, 1), latency, bandwidth).transfer_ms(nbytes) == want
    assert messages.wire_ms(bandwidth, nbytes) + latency == want


@settings(max_examples=40, deadline=None)
@given(shapes(), st.sampled_from([0.0, 0.25]), st.sampled_from([0, 10**6]))
def test_the_simulator_starts_no_op_before_its_message_arrives(shape, latency, out):
    name, pp, vpp, m = shape
    problem = uniform_problem(pp, vpp, m, name, out=out, w=0.5,
                              hw={"p2p_latency_ms": latency, "p2p_bandwidth_gbps": 1.0})
    s = problem.schedule
    tl = simulate(problem).timeline
    ops = {(o.action.kind, o.action.stage, o.action.microbatch): o for rank in tl.ops
           for o in rank}
    # Transfers recorded between ranks: exactly the crossing messages of the rule.
    crossing = {k: v for k, v in expected(s.num_stages, m).items()
                if s.stage_rank(k[1]) != s.stage_rank(v[1])}
    sent = Counter((t.action.kind, t.action.stage, t.action.microbatch) for t in tl.transfers)
    assert sent == Counter(crossing.values())
    arrival = {(t.action.kind, t.action.stage, t.action.microbatch): t.end for t in tl.transfers}
    for msg, sender in expected(s.num_stages, m).items():
        got = arrival.get(sender, ops[sender].end)  # on one rank: handed over at once
        assert ops[msg].start >= got
        if msg in crossing:
            delay = problem.hardware.transfer_ms(problem.stage_costs[min(msg[1],
                                                                         sender[1])].output_bytes)
            assert got == ops[sender].end + delay
