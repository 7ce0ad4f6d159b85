"""Megatron's optimizer on the host (--optimizer-cpu-offload, its HybridDeviceOptimizer),
against closed forms restated from its code: what the device keeps, what the host keeps,
the copies over the host link and the host's step, as Megatron asserts its flags.

ppsim refused the flag before; a launch line with it could not be priced."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import run_main as _run
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.sim.summary import rank_tails

H100_LINK, H100_DRAM, CORE = 63e6, 563.2e6, 0.9e6
"""PCIe Gen5 x16 each way, a DGX H100's DDR5 (bytes per ms), one core's fused AdamW
(parameters per ms): the h100-80gb preset's datasheet and measured figures."""
HBM = 3000e6
"""The preset's achieved HBM rate, bytes per ms."""
HOST = {"precision_aware_optimizer": True, "optimizer_cpu_offload": True}


def _problem(model: dict, pipe: dict | None = None, hw: dict | None = None):
    return build_problem(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "dp": 4,
                  "distributed_optimizer": True, **model},
        "pipeline": {"pp": 2, "microbatches": 4, **(pipe or {})},
        "hardware": {"preset": "h100-80gb", **(hw or {})}}))


def _ranks(problem) -> list[int]:
    """Each pipeline rank's parameters (its stages')."""
    out = [0] * problem.schedule.pp
    for i, c in enumerate(problem.stage_costs):
        out[problem.schedule.stage_rank(i)] += c.params
    return out


def _expected_step(shard: float, f: float, threads: int, overlap: bool) -> float:
    """hybrid_optimizer.py restated: the device steps (1 - f) of the shard in fp32 (28
    bytes a parameter over HBM); the host's share goes out (4 bytes, fp32 gradient),
    is stepped at min(threads x a core's rate, an eighth of the node's DRAM at 28 bytes)
    and comes back (4 bytes, fp32 weight); in turn without the overlap, beside each
    other with it."""
    device = (1 - f) * shard * 28 / HBM
    copy = f * shard * 4 / H100_LINK
    host = f * shard / min(threads * CORE, H100_DRAM / 8 / 28)
    if f == 0:
        return device
    return max(device, copy, host) if overlap else copy + max(device, host) + copy


@settings(max_examples=25, deadline=None)
@given(f=st.sampled_from([0.0, 0.25, 0.5, 1.0]), threads=st.sampled_from([1, 2, 8, 32]),
       overlap=st.booleans(), dp=st.sampled_from([2, 4, 8]))
def test_the_step_is_its_closed_form(f: float, threads: int, overlap: bool, dp: int) -> None:
    p = _problem({**HOST, "dp": dp, "optimizer_offload_fraction": f,
                  "optimizer_cpu_threads": threads, "overlap_cpu_optimizer_d2h_h2d": overlap})
    tails = rank_tails(p.schedule, p.stage_costs, p.hardware.job, HBM / 1e6)
    for params, tail in zip(_ranks(p), tails, strict=True):
        shard = params / dp  # the distributed optimizer's share of a dense model
        assert tail.optimizer_ms == pytest.approx(_expected_step(shard, f, threads, overlap))
        assert tail.host_bytes == pytest.approx(16 * f * shard)  # fp32 w, m, v, grad


@settings(max_examples=20, deadline=None)
@given(f=st.sampled_from([0.0, 0.3, 0.5, 1.0]), dp=st.sampled_from([1, 2, 8]))
def test_the_device_keeps_the_fp32_state_of_what_stays(f: float, dp: int) -> None:
    """Megatron's default distributed optimizer keeps 12 bytes of state a parameter over
    dp ranks; the host optimizer keeps the same fp32 master and moments (it hands the
    precision-aware dtypes to neither side), (1 - f) of them on the device."""
    plain = _problem({"dp": dp})
    host = _problem({**HOST, "dp": dp, "optimizer_offload_fraction": f})
    for a, b, n in zip(plain.stage_costs, host.stage_costs, (c.params for c in
                                                             plain.stage_costs), strict=True):
        assert a.static_bytes - b.static_bytes == pytest.approx(12 * f * n / dp, abs=8)


def test_nothing_on_the_host_is_megatrons_default_optimizer_to_the_digit() -> None:
    base = ["--preset", "llama3-8b", "--num-layers", "8", "--pp", "2", "--gpus", "8",
            "--global-batch-size", "16", "--use-distributed-optimizer", "--json"]
    _, plain, _ = _run(["simulate", *base])
    code, zero, err = _run(["simulate", *base, "--use-precision-aware-optimizer",
                            "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0"])
    assert code == 0, err
    a, b = json.loads(plain), json.loads(zero)
    assert a["iteration_time_ms"] == b["iteration_time_ms"]
    assert [r["peak_memory_bytes"] for r in a["ranks"]] == \
        [r["peak_memory_bytes"] for r in b["ranks"]]


def test_a_state_too_big_for_the_device_fits_with_the_optimizer_on_the_host() -> None:
    """DeepSeek-V3 on 256 H100s, pp 16 ep 16: the routed experts' state shards over one
    rank (dp x cp / ep = 1), up to 57 GB of weights and state on a rank; with the
    optimizer on the host the device keeps 34 GB less and the step takes seconds on one
    core a rank, less on 14 beside the copies."""
    line = ("--preset deepseek-v3 --hardware h100-80gb --gpus 256 --pp 16 --ep 16 "
            "--recompute full --microbatches 16 --json")
    runs = {}
    for name, extra in (("device", ""), ("host", " --use-precision-aware-optimizer "
                                         "--optimizer-cpu-offload"),
                        ("host14", " --use-precision-aware-optimizer --optimizer-cpu-offload "
                         "--optimizer-cpu-threads 14 --overlap-cpu-optimizer-d2h-h2d")):
        code, out, err = _run(["simulate", *shlex.split(line + extra)])
        assert code == 0, err
        runs[name] = json.loads(out)
    device, host = ([r["static_bytes"] for r in runs[k]["ranks"]] for k in ("device", "host"))
    fullest = device.index(max(device))
    assert device[fullest] - host[fullest] > 30e9
    assert runs["device"]["iteration_time_ms"] < runs["host14"]["iteration_time_ms"] \
        < runs["host"]["iteration_time_ms"]
    held = runs["host"]["optimizer_host_bytes"]
    assert len(held) == 16 and all(h > 0 for h in held) and runs["host"]["host_fits"]
    assert "optimizer_host_bytes" not in runs["device"]


def test_host_memory_too_small_warns(tmp_path) -> None:
    cfg = tmp_path / "small_host.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
                   "host_memory_bytes = 8e9\n")
    code, out, err = _run(["simulate", "--config", str(cfg), "--gpus", "8", "--pp", "1",
                           "--global-batch-size", "8", "--use-distributed-optimizer",
                           "--use-precision-aware-optimizer", "--optimizer-cpu-offload"])
    assert code == 0 and out
    # 8B parameters over 8 ranks, 16 bytes each on the host: 16 GB, over 1 GB a rank.
    assert "warning: the host optimizer's state need up to 16.1 GB of host memory" in err


@pytest.mark.parametrize(("extra", "field", "words"), [
    (["--optimizer-cpu-offload"], "model.optimizer_cpu_offload",
     "must be used in conjunction with `--use-precision-aware-optimizer`"),
    (["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--fp8-format",
      "hybrid", "--fp8-recipe", "blockwise", "--fp8-param-gather"],
     "model.optimizer_cpu_offload", "must be used in conjunction with `--fp8-recipe delayed`"),
    (["--optimizer-offload-fraction", "0.5"], "model.optimizer_offload_fraction",
     "--optimizer-cpu-offload is off"),
    (["--overlap-cpu-optimizer-d2h-h2d"], "model.overlap_cpu_optimizer_d2h_h2d",
     "--optimizer-cpu-offload is off"),
    (["--use-precision-aware-optimizer", "--optimizer-cpu-offload",
      "--optimizer-offload-fraction", "1.5"], "model.optimizer_offload_fraction",
     "at most 1"),
    (["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-cpu-threads",
      "0"], "model.optimizer_cpu_threads", "at least 1"),
    (["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--hardware", "cpu"],
     "hardware.host_link_gbps", "needs the copies' link"),
])
def test_megatrons_assertions_and_bad_settings_name_the_field(extra, field, words) -> None:
    code, out, err = _run(["simulate", "--preset", "llama3-8b", "--gpus", "8",
                           "--use-distributed-optimizer", *extra])
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"error: {field}: " in err and words in err, err


def test_an_unknown_host_rate_is_refused(tmp_path) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
                   "host_memory_bandwidth_gbps = 0\n")
    code, _, err = _run(["simulate", "--config", str(cfg), "--gpus", "8",
                         "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                         "--optimizer-cpu-offload"])
    assert code == 2 and "error: hardware.host_memory_bandwidth_gbps: is 0" in err


def test_megatrons_flags_paste_and_come_back_in_the_plans_launch_line() -> None:
    line = ("--preset llama3-8b --num-layers 8 --gpus 8 --pp 2 --global-batch-size 16 "
            "--use-distributed-optimizer --use-precision-aware-optimizer "
            "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 "
            "--overlap-cpu-optimizer-d2h-h2d --no-pin-cpu-grads "
            "--use-torch-optimizer-for-cpu-offload")
    code, out, err = _run(["plan", *shlex.split(line), "--time-budget", "5", "--json"])
    assert code == 0, err
    assert "--no-pin-cpu-grads taken, not priced" in err
    assert "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 " \
           "--overlap-cpu-optimizer-d2h-h2d" in json.loads(out)["best"]["megatron_job_flags"]


def test_no_split_fits_names_the_host_optimizer() -> None:
    code, _, err = _run(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                         "--pp", "1", "--memory-gb", "20", "--microbatches", "2"])
    assert code == 3
    assert "the optimizer on the host (--optimizer-cpu-offload" in err


def test_the_executor_refuses_it(tmp_path) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\ndtype = "bf16"\ndistributed_optimizer = true\n'
                   "precision_aware_optimizer = true\noptimizer_cpu_offload = true\n"
                   "[pipeline]\npp = 2\n")
    code, _, err = _run(["run", "--config", str(cfg), "--print-launch"])
    assert code == 2 and "error: model.optimizer_cpu_offload: " in err, err


SMALL_JOB = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8",
             "--global-batch-size", "16", "--memory-gb", "12", "--time-budget", "10"]
"""Llama 3 8B on 8 GPUs of 12 GB: no shape holds its weights and optimizer state."""


def test_the_job_search_puts_the_least_share_on_the_host_that_fits() -> None:
    code, out, _ = _run(["plan", *SMALL_JOB, "--search", "recompute"])
    assert code == 3 and "or search the optimizer on the host (--search host-optimizer)" \
        in " ".join(out.split())  # the table's text wraps
    code, out, err = _run(["plan", *SMALL_JOB, "--search", "host-optimizer,recompute",
                           "--json"])
    assert code == 0, err
    best = json.loads(out)["best"]
    share = best["optimizer_offload_fraction"]
    assert best["fits"] and share in (0.25, 0.5, 0.75, 1.0)
    # Its step on one core a rank costs more of the iteration than bubble or communication.
    assert best["held_back_by"].startswith("host optimizer ")
    assert f"--optimizer-cpu-offload --optimizer-offload-fraction {share:g}" \
        in best["megatron_job_flags"]
    # A quarter less on the host does not fit the shape under its own recompute mode:
    # the least share leaves more weights and state than the memory holds, all of it
    # (chosen to leave the activations room) too little room for them.
    if share > 0.25:
        line = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--memory-gb",
                "12", "--tp", str(best["tp"]), "--pp", str(best["pp"]), "--dp",
                str(best["dp"]), "--global-batch-size", "16", "--use-distributed-optimizer",
                "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
                "--optimizer-offload-fraction", str(share - 0.25), "--recompute",
                best["memory_policy"], "--json"]
        code, out, err = _run(line)
        assert code == 0, err
        assert not json.loads(out)["fits"]


def test_the_job_search_refuses_the_host_where_it_cannot_be_priced() -> None:
    code, out, err = _run(["plan", "--preset", "llama3-8b", "--hardware", "cpu", "--gpus",
                           "8", "--global-batch-size", "16", "--search", "host-optimizer"])
    assert code == 2 and out == "" and "error: --search: host-optimizer: the [hardware]" in err


def test_the_split_planner_searches_it_too() -> None:
    """One shape (Llama 3 8B on 2 GPUs of 40 GB): its weights and Adam's state alone
    overflow; a quarter of the state on the host at a time, the plan finds what fits."""
    base = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
            "--microbatches", "8", "--memory-gb", "40", "--json"]
    code, _, _ = _run([*base, "--search", "recompute"])
    assert code == 3
    code, out, err = _run([*base, "--search", "host-optimizer,recompute"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["variant"].endswith("optimizer 1 on the host")
    shares = {v["variant"].split(" optimizer ")[1] for v in doc["variants"]
              if " optimizer " in v["variant"]}
    assert shares == {"0.25 on the host", "0.5 on the host", "0.75 on the host",
                      "1 on the host"}
    code, out, err = _run(["plan", "--search", "host-optimizer"])  # the CPU default
    assert code == 2 and out == "" and "error: --search: host-optimizer:" in err


def test_simulate_says_what_the_host_step_costs_and_what_would_shorten_it() -> None:
    """1B parameters of Adam on one core a rank: the step outweighs most of the iteration;
    ceil((563.2 GB/s / 8 ranks / 28 B) / 0.9 G a core) = 3 threads reach the rank's share of
    the node's memory, and the overlap hides the copies: the same as simulating that."""
    base = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8",
            "--pp", "1", "--global-batch-size", "8", "--use-distributed-optimizer",
            "--use-precision-aware-optimizer", "--optimizer-cpu-offload"]
    code, out, err = _run(base)
    assert code == 0, err
    text = " ".join(out.split())
    said = text.split("OMP_NUM_THREADS=3 and --overlap-cpu-optimizer-d2h-h2d would take ")
    assert "(100% of its state on the host) steps in" in text and len(said) == 2
    promised = float(said[1].split(" ms")[0].replace(",", ""))
    code, out, _ = _run([*base, "--optimizer-cpu-threads", "3",
                         "--overlap-cpu-optimizer-d2h-h2d", "--json"])
    assert round(max(json.loads(out)["host_optimizer_step_ms"])) == promised


# torchtitan's training.enable_cpu_offload: FSDP2's CPUOffloadPolicy (torch's
# _fsdp_param.py copies the fp32 shard in before each all-gather, _fsdp_collectives.py the
# reduced fp32 shard out after each reduce-scatter); the fused AdamW then steps on the host.
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
"""A Llama-3-8B layer's parameters (q and o, k and v, the SwiGLU MLP, two norms)."""


def _fsdp(offload: bool, dp: int = 16, pp: int = 1):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "dp": dp,
                                       "fsdp": True, "fsdp_cpu_offload": offload,
                                       "recompute": "none", "seq_length": 1024},
                             "pipeline": {"pp": pp, "microbatches": 4},
                             "hardware": {"preset": "h100-80gb"}})


@pytest.mark.parametrize("dp", [2, 8, 16])
def test_fsdp_offload_copies_each_shard_at_each_gather_and_reduce(dp: int) -> None:
    from ppsim.job import fsdp
    from ppsim.job.model import build_job

    on, off = build_job(_fsdp(True, dp)), build_job(_fsdp(False, dp))
    assert on is not None and off is not None
    copy = LAYER / dp * 4 / H100_LINK  # a layer's fp32 shard over PCIe Gen5
    assert fsdp.gather_ms(on, LAYER) - fsdp.gather_ms(off, LAYER) == pytest.approx(copy)
    assert fsdp.reduce_ms(on, LAYER) - fsdp.reduce_ms(off, LAYER) == pytest.approx(copy)
    # The step: Adam on the host over the shard, one core a rank, nothing more copied.
    tail = on.tail(LAYER, 1.0, 1.0, HBM / 1e6)
    assert tail.optimizer_ms == pytest.approx(LAYER / dp / min(CORE, H100_DRAM / 8 / 28))
    assert tail.host_bytes == pytest.approx(16 * LAYER / dp)


def test_fsdp_offload_leaves_the_device_its_gathered_units_alone() -> None:
    """The shards' fp32 weight, gradient and moments (16 bytes a parameter over dp x cp)
    leave the device; what FSDP holds unsharded stays."""
    from ppsim.pipeline.problem import model_costs

    on, off = model_costs(_fsdp(True)), model_costs(_fsdp(False))
    for a, b in zip(off.layers, on.layers, strict=True):
        assert a.static_bytes - b.static_bytes == pytest.approx(16 * LAYER / 16, abs=8)


def test_fsdp_offload_flags_checks_and_torchtitans_field() -> None:
    base = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "8", "--pp", "1",
            "--global-batch-size", "8"]
    code, _, err = _run(["simulate", *base, "--fsdp-cpu-offload"])
    assert code == 2 and "error: model.fsdp_cpu_offload: is FSDP's CPU offload and FSDP " \
        "is off" in err
    code, _, err = _run(["simulate", *base[:2], "--hardware", "cpu", *base[4:], "--fsdp",
                         "--training.enable_cpu_offload"])
    assert code == 2 and "error: hardware.host_link_gbps: is 0 and --fsdp-cpu-offload" in err
    code, out, err = _run(["simulate", *base, "--fsdp", "--fsdp-cpu-offload"])
    assert code == 0, err
    # No Megatron overlap to suggest: the step copies nothing.
    assert "OMP_NUM_THREADS=3 would take" in " ".join(out.split())
    assert "--overlap-cpu-optimizer" not in out
    code, out, err = _run(["plan", *base, "--fsdp", "--fsdp-cpu-offload", "--json"])
    assert code == 0, err
    assert json.loads(out)["best"]["torchtitan_job"]["training"]["enable_cpu_offload"]


def test_the_searches_offload_fsdp_shapes_whole() -> None:
    """Under FSDP the search's host variant is FSDP2's CPU offload: all of the state."""
    code, out, err = _run(["plan", *SMALL_JOB, "--search", "host-optimizer,recompute,sharding",
                           "--json"])
    assert code == 0, err
    doc = json.loads(out)
    fsdp = [c for c in doc["candidates"] if c["data_parallel"] == "fsdp"]
    shares = {c["optimizer_offload_fraction"] for c in fsdp}
    assert shares == {1.0} or shares == {0.0, 1.0}
    assert doc["best"]["fits"]
    code, out, err = _run(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                           "--pp", "2", "--microbatches", "8", "--memory-gb", "40", "--fsdp",
                           "--dp", "4", "--search", "host-optimizer,recompute", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["variant"].endswith("optimizer 1 on the host")
    assert sum(" on the host" in v["variant"] for v in doc["variants"]) == 3  # one a mode


def test_the_job_search_keeps_the_host_state_within_the_hosts_memory(tmp_path) -> None:
    """A node of 8 GB of host memory (1 GB a rank) cannot hold the 16 bytes a parameter of
    the state it would take: the search puts none of it there (it did not check)."""
    cfg = tmp_path / "small_host.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
                   "host_memory_bytes = 8e9\n")
    code, out, err = _run(["plan", "--config", str(cfg), *SMALL_JOB[4:],
                           "--search", "host-optimizer,recompute", "--json"])
    assert code == 3, err
    assert not any(c["optimizer_offload_fraction"] for c in json.loads(out)["candidates"])


def test_plan_says_when_the_host_cannot_hold_the_state(tmp_path) -> None:
    cfg = tmp_path / "small_host.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
                   "host_memory_bytes = 8e9\n")
    host = ["--use-distributed-optimizer", "--use-precision-aware-optimizer",
            "--optimizer-cpu-offload"]
    code, out, err = _run(["plan", "--config", str(cfg), "--pp", "2", "--microbatches", "8",
                           *host])
    assert code == 0 and "warning: the host optimizer's state need up to" in err
    code, out, _ = _run(["plan", "--config", str(cfg), "--pp", "2", "--microbatches", "8",
                         *host, "--json"])
    best = json.loads(out)["best"]
    assert best["host_fits"] is False and max(best["optimizer_host_bytes"]) > 1e9
    code, out, _ = _run(["plan", "--config", str(cfg), "--gpus", "8", "--pp", "1",
                         "--global-batch-size", "8", *host])
    assert code == 3 and "optimizer state kept on the host overflows the rank's share" \
        in " ".join(out.split())


def test_the_job_search_refuses_the_host_optimizer_under_megatrons_fsdp2() -> None:
    """`plan --gpus --search host-optimizer` over --use-torch-fsdp2 planned as if nothing
    could go to the host; it is refused in one line, as the one-shape search refuses it."""
    code, _, err = _run(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                         "16", "--global-batch-size", "64", "--use-torch-fsdp2",
                         "--no-gradient-accumulation-fusion", "--pp", "1",
                         "--search", "host-optimizer"])
    err = err.strip()
    assert code == 2
    assert "--use-torch-fsdp2 offers no CPU offload" in err and len(err.splitlines()) == 1
