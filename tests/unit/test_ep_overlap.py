"""--overlap-moe-expert-parallel-comm: what a combined pair hides, and which jobs Megatron
refuses (megatron/core/transformer/transformer_config.py's asserts, word for word)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ppsim.cli.main import main
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import config_from_dict
from ppsim.costs.transformer import accelerator
from ppsim.errors import UserError
from ppsim.job.layers import compute_costs
from ppsim.job.model import build_job
from ppsim.job.policy_search import fitting_mode
from ppsim.job.shapes import shapes
from ppsim.pipeline.problem import build_problem, model_costs
from ppsim.policy.search import module_groups
from ppsim.policy.setup import policy_costs

FLAG = {"overlap_moe_expert_parallel_comm": True}


def cfg(model: dict | None = None, pipe: dict | None = None, hw: dict | None = None,
        memory: dict | None = None):
    data = {"model": {"preset": "mixtral-8x7b", "num_layers": 4, "ep": 8, "dp": 8,
                      **(model or {})},
            "pipeline": {"pp": 1, "microbatches": 4, **FLAG, **(pipe or {})},
            "hardware": {"preset": "h100-80gb", **(hw or {})}}
    if memory is not None:
        data["memory"] = memory
    return config_from_dict(data)


def pair_ms(c) -> tuple[float, float, float]:
    """(F + B of a MoE layer in a pair, the same layer's compute alone, one all-to-all)."""
    got = model_costs(c).layers[0]
    alone = compute_costs(build_job(c), accelerator(c.hardware)).layers[0]
    a2a = (got.forward_ms - alone.forward_ms) / 2  # dispatch and combine, exposed alone
    return (got.forward_ms + got.backward_ms - 2 * got.pair_saving_ms,
            alone.forward_ms + alone.backward_ms, a2a)


def test_a_pair_on_a_slow_network_takes_its_four_all_to_alls_back_to_back() -> None:
    # Each expert-parallel rank on a node of its own, a NIC of 0.1 GB/s: the comm stream
    # runs dispatch, combine, and the backward's two without a gap; compute hides inside.
    paired, compute, a2a = pair_ms(cfg({"recompute": "none"},
                                       hw={"gpus_per_node": 1, "inter_node_bandwidth_gbps": 0.1}))
    assert a2a > 10 * compute
    assert paired == pytest.approx(4 * a2a, rel=1e-9)


def test_a_pair_on_a_fast_network_hides_every_all_to_all() -> None:
    paired, compute, a2a = pair_ms(cfg({"recompute": "none"},
                                       hw={"intra_node_bandwidth_gbps": 1e5,
                                           "intra_node_latency_us": 0.0}))
    assert 0 < a2a < compute / 100
    assert paired == pytest.approx(compute, rel=1e-9)


def test_without_the_flag_nothing_pairs() -> None:
    c = cfg(pipe={"overlap_moe_expert_parallel_comm": False})
    assert all(lc.pair_saving_ms == 0.0 for lc in model_costs(c).layers)
    assert build_problem(c).schedule.pairs == ()
    on = build_problem(cfg())
    assert on.schedule.pairs and all(lc.pair_saving_ms > 0 for lc in on.costs.layers)


@pytest.mark.parametrize("model, pipe, memory, field, words", [
    ({"ep": 1}, {}, None, "model.ep", "overlap_moe_expert_parallel_comm is only supported "
     "with expert model parallelism"),
    ({}, {"pp": 2, "microbatches": 4}, None, "pipeline.vpp", "If enabling EP A2A overlap, "
     "virtual_pipeline_model_parallel_size must be specified when "
     "pipeline_model_parallel_size > 1"),
    ({"recompute": "full"}, {}, None, "model.recompute", "disable full recomputation when "
     "enabling overlap_moe_expert_parallel_comm"),
    ({}, {}, {"recompute_layers": 1}, "memory.recompute_layers", "recompute_num_layers must "
     "be None when enabling overlap_moe_expert_parallel_comm"),
    ({}, {}, {"recompute_modules": ["moe"]}, "memory.recompute_modules", "disable moe in "
     "recompute_modules when enabling overlap_moe_expert_parallel_comm"),
    ({"dtype": "fp32"}, {}, None, "model.dtype", "overlap_moe_expert_parallel_comm is only "
     "supported with bf16 or fp16 model"),
    ({}, {"moe_shared_expert_overlap": True}, None, "pipeline.moe_shared_expert_overlap",
     "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm"),
    ({"mtp_layers": 2}, {}, None, "model.mtp_layers", "MTP supports at most one layer when "
     "enabling overlap_moe_expert_parallel_comm."),
    ({"fsdp": True}, {}, None, "pipeline.overlap_moe_expert_parallel_comm", "torchtitan"),
    ({}, {"pp": 2, "vpp": 2, "schedule": "zbv", "microbatches": 4}, None, "pipeline.schedule",
     "no combined 1F1B"),
])
def test_megatron_refuses_these_jobs_and_so_does_ppsim(model, pipe, memory, field,
                                                        words) -> None:
    with pytest.raises(UserError) as e:
        build_problem(cfg(model, pipe, memory=memory))
    assert e.value.field == field and words in e.value.problem


def test_a_model_without_experts_is_refused_with_exit_status_2() -> None:
    run = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--preset",
                          "llama3-8b", "--overlap-moe-expert-parallel-comm"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0
    assert "pipeline.overlap_moe_expert_parallel_comm" in run.stderr


def test_simulate_prices_the_combined_order(capsys) -> None:
    flags = ["simulate", "--preset", "qwen3-235b-a22b", "--hardware", "h100-80gb", "--tp", "2",
             "--pp", "8", "--vpp", "4", "--ep", "32", "--etp", "1", "--gpus", "256",
             "--global-batch-size", "2048", "--json"]
    assert main(flags) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*flags, "--overlap-moe-expert-parallel-comm"]) == 0
    paired = json.loads(capsys.readouterr().out)
    assert alone["job"]["ep_overlap"] is False and paired["job"]["ep_overlap"] is True
    # Its all-to-alls cross nodes (ep 32 of 8-GPU nodes): hiding them is most of a layer.
    assert paired["iteration_time_ms"] < 0.8 * alone["iteration_time_ms"]
    # One more microbatch in flight on every rank.
    assert [r["peak_inflight"] for r in paired["ranks"]] == \
        [r["peak_inflight"] + 1 for r in alone["ranks"]]


def test_schedule_writes_each_pair_as_torchs_overlap_cell(capsys) -> None:
    assert main(["schedule", "--preset", "mixtral-8x7b", "--num-layers", "4", "--ep", "8",
                 "--dp", "8", "--pp", "1", "--microbatches", "3",
                 "--overlap-moe-expert-parallel-comm"]) == 0
    out = capsys.readouterr().out
    assert "rank 0: 0F0 (0F1;0B0)OVERLAP_F_B (0F2;0B1)OVERLAP_F_B 0B2" in out


def test_searches_offer_only_what_megatron_runs_combined() -> None:
    c = cfg(model={"recompute": "none"})
    pc = policy_costs(c)
    assert pc.combined
    assert all("moe" not in g.recompute_modules for g in module_groups(pc, False))
    plain = policy_costs(cfg(pipe={"overlap_moe_expert_parallel_comm": False}))
    assert any("moe" in g.recompute_modules for g in module_groups(plain, False))
    # The job planner's shapes: experts spread (ep > 1), chunks whenever pp > 1.
    a = c.model.arch
    got = shapes(a, 64, 256, 8, 32, combined=True)
    assert got and all(s.ep > 1 and (s.pp == 1 or s.vpp > 1) for s in got)
    assert any(s.ep == 1 for s in shapes(a, 64, 256, 8, 32))
    # A shape that needs more than selective recompute is left without a mode.
    tight = with_overrides(c, memory_bytes=1e9)
    assert fitting_mode(tight) is None


def test_the_trace_shows_a_pairs_all_to_alls_hidden_behind_its_partner() -> None:
    from ppsim.sim.simulate import simulate
    from ppsim.trace.schema import simulation_trace

    problem = build_problem(cfg({"recompute": "none"}))
    saving = problem.stage_costs[0].pair_saving_ms
    events = [e for e in simulation_trace(simulate(problem))["traceEvents"]
              if e.get("cat") == "collective" and e["args"]["group"] == "ep"]
    by_mb = {(e["args"]["op"], e["args"]["microbatch"]): e["args"] for e in events}
    # 1F1B without pipelining, 4 microbatches: F0 alone, then (F1 B0) (F2 B1) (F3 B2), B3.
    alone, paired = by_mb["F", 0], by_mb["F", 1]
    assert alone["total_ms"] == paired["total_ms"] > 0
    assert paired["exposed_ms"] == pytest.approx(max(0.0, alone["exposed_ms"] - saving))
    assert by_mb["B", 3]["exposed_ms"] == alone["exposed_ms"] > paired["exposed_ms"]


def test_delayed_weight_gradients_let_the_dispatch_start_sooner() -> None:
    # Qwen3-235B tp 2 ep 32 etp 1 on H100 with DeepEP: one dispatch outlasts the experts' input
    # gradient but not with their weight gradient too, so the backward's dispatch waits
    # for it unless --delay-wgrad-compute moves it beside the dispatch.
    def saving(delay: bool) -> float:
        c = config_from_dict({
            "model": {"preset": "qwen3-235b-a22b", "num_layers": 4, "tp": 2, "ep": 32,
                      "etp": 1, "dp": 16, "recompute": "none"},
            "pipeline": {"pp": 1, "microbatches": 4, **FLAG, "delay_wgrad_compute": delay,
                         "moe_token_dispatcher_type": "flex"},
            "hardware": {"preset": "h100-80gb"}})
        return model_costs(c).layers[0].pair_saving_ms
    assert saving(True) > saving(False) > 0


def test_delayed_weight_gradients_need_the_combined_order() -> None:
    with pytest.raises(UserError) as e:
        build_problem(cfg(pipe={"overlap_moe_expert_parallel_comm": False,
                                "delay_wgrad_compute": True}))
    assert e.value.field == "pipeline.delay_wgrad_compute"
    assert "overlap_moe_expert_parallel_comm must be enabled when enabling " \
        "delay_wgrad_compute" in e.value.problem


def test_the_job_searchs_bound_holds_under_pairs() -> None:
    # All-to-alls across nodes of one GPU, many microbatches: most of the time is pairs
    # hiding them; the job search skips a shape whose bound passes the k-th fastest, so
    # the bound must stay below what the shape simulates to.
    from ppsim.job.search import pending_shape
    from ppsim.sim.simulate import simulate as run

    c = cfg({"recompute": "none"}, hw={"gpus_per_node": 1})
    checked = 0
    for s in shapes(c.model.arch, 16, 1024, 1, 4, combined=True)[:6]:
        p = pending_shape(c, s, 1024)
        t = run(build_problem(p.cfg, p.costs), record=False).summary.iteration_time_ms
        assert p.bound_ms <= t
        checked += 1
    assert checked


def test_costs_says_what_a_pair_saves(capsys) -> None:
    from ppsim.cli.render import ms_text

    flags = ["--preset", "mixtral-8x7b", "--num-layers", "4", "--hardware", "h100-80gb",
             "--ep", "8", "--dp", "8", "--pp", "1", "--recompute", "none"]
    saving = model_costs(cfg({"recompute": "none"})).layers[0].pair_saving_ms
    assert main(["costs", *flags, "--overlap-moe-expert-parallel-comm"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"each F and B of a moe layer takes {ms_text(saving)} ms less" in out
    assert main(["costs", *flags]) == 0
    assert "combined pair" not in capsys.readouterr().out


def test_simulate_says_where_too_few_microbatches_pair_nothing(capsys) -> None:
    flags = ["simulate", "--preset", "mixtral-8x7b", "--num-layers", "8", "--hardware",
             "h100-80gb", "--ep", "8", "--dp", "8", "--pp", "4", "--vpp", "2",
             "--overlap-moe-expert-parallel-comm"]
    # Rank 0 warms up with (vpp - 1) x 4 + 2 x 3 + 1 = 11 forwards: all 8 of m = 4.
    assert main([*flags, "--microbatches", "4"]) == 0
    assert "pairs nothing on ranks 0-" in capsys.readouterr().err
    assert main([*flags, "--microbatches", "32"]) == 0
    assert "pairs nothing" not in capsys.readouterr().err
