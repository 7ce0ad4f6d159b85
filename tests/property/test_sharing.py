"""Shared devices and links: the simulator with a placement."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import small_shapes, uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.pipeline.placement import PlacementConfig, Topology, topology
from ppsim.sim.engine import Records, run
from ppsim.sim.shared import SharedEngine, SharedResource
from ppsim.sim.simulate import simulate
from ppsim.sim.timing import p2p_link, stage_table

SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"]


@st.composite
def problems(draw, free_transfers: bool = False):
    name, pp, vpp, m = draw(small_shapes(SCHEDULES))
    t = st.integers(1, 16).map(lambda x: x / 4)
    counts = draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp))
    counts[0] += 1  # a model has at least one layer
    b = draw(t)
    hw = {"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 0.0} if free_transfers else \
        {"p2p_latency_ms": draw(st.sampled_from([0.0, 0.3])), "p2p_bandwidth_gbps": 1.0}
    return uniform_problem(pp, vpp, m, name, counts=counts, f=draw(t), b=b, w=b / 2,
                           out=draw(st.sampled_from([0, 10**6])), hw=hw,
                           head={"forward_ms": draw(t), "backward_ms": draw(t)})


def _shared_run(problem, cfg: PlacementConfig | Topology, record: bool = True):
    hw = problem.hardware
    topo = cfg if isinstance(cfg, Topology) else topology(
        cfg, problem.schedule.pp, hw.p2p_latency_ms, hw.p2p_bandwidth_gbps)
    table = stage_table(problem.schedule, problem.stage_costs)
    records = Records(problem.schedule.pp) if record else None
    return SharedEngine(problem.schedule, table, topo, records).run(), records


@settings(max_examples=60, deadline=None)
@given(problems())
def test_private_placement_equals_the_unshared_simulator_to_the_last_digit(problem):
    table = stage_table(problem.schedule, problem.stage_costs)
    base_records = Records(problem.schedule.pp)
    base = run(problem.schedule, table, p2p_link(problem.hardware.transfer_ms), base_records)
    shared, records = _shared_run(problem, PlacementConfig())
    assert shared == base  # ends, busy, memory peaks: exactly
    assert records.ops == base_records.ops
    assert sorted(map(repr, records.transfers)) == sorted(map(repr, base_records.transfers))


@settings(max_examples=60, deadline=None)
@given(problems(free_transfers=True), st.sampled_from([0.0, 0.25]))
def test_all_ranks_on_one_device_run_back_to_back(problem, local_cpu):
    """One device, free messages: some rank can always run, so the device never idles and
    the iteration takes exactly the summed work of every op, each message between two
    ranks adding `local_message_cpu_ms` at both ends."""
    sched = problem.schedule
    ranks, _ = _shared_run(problem, PlacementConfig(devices=[0] * sched.pp,
                                                    local_message_cpu_ms=local_cpu))
    table = stage_table(sched, problem.stage_costs)
    work = sum(table.duration[a.kind][a.stage] for acts in sched.actions for a in acts)
    last = len(table.duration["F"]) - 1  # the last stage

    def crosses(a: int, b: int) -> bool:
        return 0 <= b <= last and sched.stage_rank(a) != sched.stage_rank(b)

    messages = sum((a.kind == "F" and crosses(a.stage, a.stage + 1))
                   + (a.kind == "B" and crosses(a.stage, a.stage - 1))
                   for acts in sched.actions for a in acts)
    assert max(r.end for r in ranks) == pytest.approx(work + 2 * local_cpu * messages,
                                                      rel=1e-9, abs=1e-9)


@given(st.lists(st.integers(1, 100), min_size=1, max_size=6))
def test_processor_sharing_without_dependencies_takes_the_summed_work(works):
    dev = SharedResource()
    for j, w in enumerate(works):
        dev.add(j, float(w), 0.0)
    now, order = 0.0, []
    while (nxt := dev.next_finish()) is not None:
        now, job = nxt
        dev.remove(job, now)
        order.append(job)
    assert now == pytest.approx(sum(works))
    assert [works[j] for j in order] == sorted(works)  # shortest finishes first


@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 8), st.floats(0.5, 50.0))
def test_a_pool_runs_each_job_at_its_share_of_the_cores(cores, weight, jobs, work):
    """n jobs standing for `weight` processes each, on `cores` processors: each runs at
    min(1, cores / (n x weight)), so equal jobs started together end together."""
    pool = SharedResource(cores=cores, weight=weight)
    for j in range(jobs):
        pool.add(j, work, 0.0)
    ends = []
    while (nxt := pool.next_finish()) is not None:
        ends.append(nxt[0])
        pool.remove(nxt[1], nxt[0])
    stretch = max(1.0, jobs * weight / cores)
    assert ends[0] == pytest.approx(work * stretch)  # the first ends at the shared rate
    assert len(ends) == jobs


def _pooled(cores: int, copies: int):
    p = uniform_problem(2, 1, 2, "gpipe", counts=[1, 1], f=1.0, b=2.0,
                        hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 0.0},
                        head={"forward_ms": 0.0, "backward_ms": 0.0},
                        emb={"forward_ms": 0.0, "backward_ms": 0.0})
    topo = topology(PlacementConfig(), 2, 0.0, 0.0, cores, copies)
    return p, topo


def test_unpinned_ranks_and_their_replicas_share_the_cores():
    """GPipe, 2 ranks, 2 microbatches, F 1 ms and B 2 ms a stage, each rank's twin in a
    second replica, on 2 cores. Alone, r0 F0 0-1; r0 F1 and r1 F0 with their twins are
    4 processes on 2 cores, each at half speed, 1-3; r1 F1 3-4 and r1 B0 4-6 alone (the
    twins: 2 processes, 2 cores); r1 B1 and r0 B0 6-10 at half speed; r0 B1 10-12. Private
    (a core each): 9 ms."""
    p, topo = _pooled(cores=2, copies=2)
    assert topo.pooled and not topo.is_private
    runs, _ = _shared_run(p, topo)
    assert max(r.end for r in runs) == pytest.approx(12.0)
    assert simulate(replace(p, topology=topo)).summary.iteration_time_ms == pytest.approx(
        simulate(p).summary.iteration_time_ms + 3.0)
    roomy = _pooled(cores=4, copies=2)[1]
    assert not roomy.pooled and roomy.is_private


def test_sharing_only_slows_and_context_switches_cost_time():
    p = uniform_problem(2, 1, 8, "1f1b", counts=[2, 2])
    alone = simulate(p).summary.iteration_time_ms
    one, _ = _shared_run(p, PlacementConfig(devices=[0, 0]))
    switch, _ = _shared_run(p, PlacementConfig(devices=[0, 0], context_switch_ms=0.5))
    shared_t = max(r.end for r in one)
    assert alone < shared_t < max(r.end for r in switch)


def test_shared_link_halves_each_messages_bandwidth():
    # Two ranks per node, two nodes: both first-stage messages leave node 0 on one NIC.
    p = uniform_problem(2, 1, 1, "gpipe", counts=[1, 1], f=1.0, b=1.0, out=10**6,
                        hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 1.0})
    private, _ = _shared_run(p, PlacementConfig(ranks_per_node=1))
    shared, _ = _shared_run(p, PlacementConfig(ranks_per_node=1, shared_links=True))
    # One message at a time on the link: sharing changes nothing.
    assert max(r.end for r in private) == max(r.end for r in shared)
    p4 = uniform_problem(2, 1, 4, "gpipe", counts=[1, 1], f=0.1, b=5.0, out=10**6,
                         hw={"p2p_latency_ms": 0.0, "p2p_bandwidth_gbps": 1.0})
    private, _ = _shared_run(p4, PlacementConfig(ranks_per_node=1))
    shared, _ = _shared_run(p4, PlacementConfig(ranks_per_node=1, shared_links=True))
    assert max(r.end for r in shared) > max(r.end for r in private)


def test_message_cpu_cost_lands_on_both_ends():
    p = uniform_problem(2, 1, 1, "gpipe", counts=[1, 1], f=1.0, b=1.0)
    base, _ = _shared_run(p, PlacementConfig())
    cpu, _ = _shared_run(p, PlacementConfig(message_cpu_ms=0.25))
    # F0 sends, F1 receives; B1 sends, B0 receives: four ends of two messages... each once.
    assert max(r.end for r in cpu) == pytest.approx(max(r.end for r in base) + 4 * 0.25)


def test_each_message_pays_the_cpu_cost_of_where_it_runs():
    """Between devices `message_cpu_ms`, between two ranks of one device
    `local_message_cpu_ms`: each figure charges only its own kind of message."""
    p = uniform_problem(2, 1, 4, "1f1b", counts=[1, 1], f=1.0, b=2.0)
    together, _ = _shared_run(p, PlacementConfig(devices=[0, 0]))
    cross_only, _ = _shared_run(p, PlacementConfig(devices=[0, 0], message_cpu_ms=0.25))
    assert [r.end for r in cross_only] == [r.end for r in together]
    local, _ = _shared_run(p, PlacementConfig(devices=[0, 0], local_message_cpu_ms=0.25))
    # One device runs everything: 4 microbatches x 2 messages x 2 ends more work on it.
    assert max(r.end for r in local) == pytest.approx(max(r.end for r in together) + 4.0)
    apart, _ = _shared_run(p, PlacementConfig(devices=[0, 1]))
    local_apart, _ = _shared_run(p, PlacementConfig(devices=[0, 1], local_message_cpu_ms=0.25))
    assert [r.end for r in local_apart] == [r.end for r in apart]
    paid, _ = _shared_run(p, PlacementConfig(devices=[0, 1], message_cpu_ms=0.25))
    assert max(r.end for r in paid) > max(r.end for r in apart)


def test_placement_from_the_command_line_and_toml(tmp_path, capsys):
    assert main(["simulate", "--json"]) == 0
    alone = capsys.readouterr().out
    assert main(["simulate", "--json", "--devices", "0,0"]) == 0
    shared = capsys.readouterr().out
    import json

    assert json.loads(shared)["iteration_time_ms"] > json.loads(alone)["iteration_time_ms"]
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\n[pipeline]\npp = 2\nsplit = [5, 3]\n'
                   '[placement]\ndevices = [0, 0, 0]\n')
    assert main(["simulate", "--config", str(cfg)]) == 2
    assert "placement.devices" in capsys.readouterr().err


def test_unshared_problem_keeps_no_topology():
    p = uniform_problem(2, 1, 4, "1f1b", counts=[1, 1])
    assert p.topology is None
    assert replace(p, topology=None) == p

