"""`plan --search policy`: its JSON, its flags, Megatron's refusals, bad input."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
from contextlib import redirect_stdout
from dataclasses import replace

import pytest

from ppsim.cli.main import main
from ppsim.config.overrides import with_overrides
from ppsim.config.schema import load_config
from ppsim.costs.arch import Architecture
from ppsim.pipeline.problem import build_problem
from ppsim.plan.planner import plan
from ppsim.policy.costs import Fixed
from ppsim.policy.megatron import policy_export, recompute_flags
from ppsim.policy.model import ALL_LAYERS, StagePolicy
from ppsim.policy.search import SpaceBest, plan_global, resimulated, space_key
from ppsim.policy.setup import policy_costs

DENSE = Architecture(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4,
                     ffn_hidden_size=256, vocab_size=512, seq_length=64)
MLA = Architecture(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4,
                   ffn_hidden_size=256, vocab_size=512, seq_length=64, attention="mla",
                   kv_lora_rank=16, qk_rope_head_dim=8, head_dim=16)
PLAN = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
        "--microbatches", "8", "--time-budget", "6", "--json"]


@pytest.fixture(scope="module")
def planned() -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main([*PLAN, "--search", "policy,policy-per-stage"]) == 0
    return json.loads(buf.getvalue())


def test_json_gives_a_policy_per_stage_and_every_space(planned: dict) -> None:
    best = planned["best"]
    assert [p["stage"] for p in best["policy"]] == [0, 1, 2, 3]
    for p in best["policy"]:
        assert set(p) == {"stage", "recompute_modules", "recompute_layers", "offload_modules",
                          "offload_fraction"}
    spaces = {s["space"]: s for s in planned["policy_search"]}
    assert set(spaces) == {"global", "megatron", "per-stage"}
    times = {k: s["best"]["iteration_time_ms"] for k, s in spaces.items()}
    assert best["iteration_time_ms"] == min(times.values())
    assert times["per-stage"] <= times["megatron"] * (1 + 1e-9)
    for s in spaces.values():
        assert s["gain_vs_global"] == pytest.approx(
            times["global"] / s["best"]["iteration_time_ms"])
        assert s["memory_rank"] in range(4) and s["busiest_rank"] in range(4)


def test_offloading_that_buys_no_time_is_not_recommended() -> None:
    """Llama-3-8B on 4 x 141 GB fits with nothing recomputed or offloaded, and offload's
    copies hide behind compute: the two tie, and the Megatron space took the offload as
    the lower peak, recommending Transformer Engine's activation offloading for
    nothing (`plan --search policy` printed its flags as the best)."""
    cfg = with_overrides(load_config(None), preset="llama3-8b", hardware="h200-141gb",
                         pipeline={"pp": 4, "microbatches": 4}, split={},
                         model={"recompute": "none"})
    problem, pc = build_problem(cfg), policy_costs(cfg)
    none = replace(plan_global(problem, pc, 30.0), space="megatron")
    assert none.proven and none.label == "none"
    offload = StagePolicy(offload_modules=("core_attn", "attn_proj", "mlp_norm"),
                          offload_fraction=1.0)
    policies = tuple(replace(offload, offload_fraction=f) for f in (1.0, 2 / 3, 1 / 3, 0.0))
    fixed = replace(problem, costs=pc.base, memory=Fixed(costs=pc, policies=policies))
    r = plan(fixed, top_k=1, time_budget_s=30.0, seeds=[none.result.best.split.counts])
    offloaded = resimulated(SpaceBest(space="megatron", result=r, policies=policies,
                                      label=offload.label()))
    assert r.proven_optimal
    assert offloaded.result.best.key[0] == none.result.best.key[0]  # the copies hide
    assert offloaded.result.best.key[1] < none.result.best.key[1]
    assert min((offloaded, none), key=space_key) is none
    assert min((none, offloaded), key=space_key) is none


def test_megatron_flags_carry_the_policy(planned: dict) -> None:
    meg = next(s for s in planned["policy_search"] if s["space"] == "megatron")
    flags, first = meg["megatron_policy_flags"], meg["best"]["policy"][0]
    assert len({json.dumps({k: v for k, v in p.items() if k not in ("stage",
                                                                   "offload_fraction")})
                for p in meg["best"]["policy"]}) == 1  # one setting for every stage
    if first["offload_modules"]:
        assert "--offload-modules " + " ".join(first["offload_modules"]) in flags
    if first["recompute_modules"]:
        assert "--recompute-modules " + " ".join(first["recompute_modules"]) in flags
    if first["recompute_layers"]:
        assert f"--recompute-num-layers {first['recompute_layers']}" in flags
    if planned["best"]["policy_space"] == "megatron":
        assert planned["best"]["megatron_flags"].endswith(flags)


def test_megatron_refuses_what_megatron_refuses() -> None:
    with pytest.raises(Exception, match="--recompute-num-layers"):
        recompute_flags(StagePolicy(recompute_modules=("core_attn",), recompute_layers=2), DENSE)
    with pytest.raises(Exception, match="mla_up_proj in recompute_modules is only supported"):
        recompute_flags(StagePolicy(recompute_modules=("mla_up_proj",)), DENSE)
    flags = recompute_flags(StagePolicy(recompute_modules=("mla_up_proj",)), MLA).flags
    assert flags == ["--recompute-granularity", "selective", "--recompute-modules",
                     "mla_up_proj"]
    moe = recompute_flags(StagePolicy(recompute_modules=("moe_act",)), DENSE)
    assert "--moe-grouped-gemm" in moe.flags and "grouped GEMM" in moe.notes[0]


def test_block_and_uniform_forms() -> None:
    assert recompute_flags(StagePolicy(recompute_layers=3), DENSE).flags == [
        "--recompute-granularity", "full", "--recompute-method", "block",
        "--recompute-num-layers", "3"]
    assert recompute_flags(StagePolicy(recompute_layers=ALL_LAYERS), DENSE).flags[-3:] == [
        "uniform", "--recompute-num-layers", "1"]


def test_offload_with_a_per_rank_delta_and_transformer_engine_noted() -> None:
    p = StagePolicy(offload_modules=("core_attn",), offload_fraction=0.5)
    ex = policy_export((p,) * 4, DENSE, step_bytes=100)
    assert ex.megatron_flags == ["--fine-grained-activation-offloading", "--offload-modules",
                                 "core_attn", "--activation-offload-fraction", "0.5",
                                 "--delta-offload-bytes-across-pp-ranks", "100"]
    assert "Transformer Engine" in ex.notes[0]
    assert "Megatron-LM" in ex.frameworks


def test_a_fraction_falling_per_rank_is_not_megatrons_delta() -> None:
    """Megatron's delta keeps whole offload groups per iteration (ppsim.policy.delta): no
    flag lowers one rank's fraction for every microbatch."""
    pols = tuple(StagePolicy(offload_modules=("core_attn",), offload_fraction=f)
                 for f in (0.5, 0.4, 0.3, 0.2))
    ex = policy_export(pols, DENSE)
    assert ex.megatron_flags is None and "one offload fraction" in ex.notes[0]


def test_a_per_stage_policy_says_who_can_run_it() -> None:
    pols = (StagePolicy(recompute_layers=2), StagePolicy())
    ex = policy_export(pols, DENSE)
    assert ex.megatron_flags is None and ex.frameworks == ["ppsim executor"]
    assert "one recompute setting" in ex.notes[0]
    norms = policy_export((StagePolicy(recompute_modules=("layernorm",)),) * 2, DENSE)
    assert "ppsim executor" in norms.frameworks  # output-discarding norm recompute runs
    same = policy_export((StagePolicy(recompute_modules=("core_attn",)),) * 2, DENSE)
    assert any(f.startswith("torchtitan") for f in same.frameworks)
    assert shlex.join(same.megatron_flags) == \
        "--recompute-granularity selective --recompute-modules core_attn"


def _stage_ns(ns: list[int], split: list[int], mtp: int = 0):
    """A llama3-8b problem on `split` whose stage i recomputes its first ns[i] layers."""
    from ppsim.config.schema import config_from_dict

    cfg = config_from_dict({
        "model": {"preset": "llama3-8b", "recompute": "none", "num_layers": sum(split) - mtp,
                  "mtp_layers": mtp},
        "pipeline": {"pp": len(split), "microbatches": 8, "split": split},
        "hardware": {"preset": "h100-80gb"},
        "memory": {"stage": [{"stage": i, "recompute_layers": n} for i, n in enumerate(ns)]}})
    problem = build_problem(cfg)
    return problem, problem.memory.policies


@pytest.mark.parametrize(("ns", "split", "mtp", "flags"), [
    # N capped at each stage's layers: Megatron's one block N recomputes the same layers.
    ([3, 3, 2], [3, 3, 2], 0, "--recompute-method block --recompute-num-layers 3"),
    ([2, 2, 1], [3, 3, 1], 0, "--recompute-method block --recompute-num-layers 2"),
    # Every layer, the MTP layer too (the block method skips it): the uniform method.
    ([3, ALL_LAYERS], [3, 2], 1, "--recompute-method uniform --recompute-num-layers 1"),
    # The block method skips the MTP layer: N = 3 on its stage of 2 recomputes 1, as N = 1.
    ([3, 1], [3, 2], 1, "--recompute-method block --recompute-num-layers 3"),
])
def test_a_per_stage_n_that_one_megatron_n_runs_gets_its_flags(ns, split, mtp, flags) -> None:
    """Stage block counts that differ only where N passes a stage's (decoder) layers run as
    Megatron's one N: its flags, not "differs per stage"."""
    from ppsim.policy.report import policy_flags

    problem, policies = _stage_ns(ns, split, mtp)
    ex = policy_flags(problem, policies)
    assert ex.megatron_flags is not None, ex.notes
    assert shlex.join(ex.megatron_flags) == "--recompute-granularity full " + flags


@pytest.mark.parametrize(("ns", "split", "mtp"), [
    ([3, 2, 2], [3, 3, 2], 0),  # stage 1 recomputes 2 of its 3 layers, stage 0 all 3
    # The MTP stage recomputes its MTP layer too, which only the uniform method does, but
    # stage 0 recomputes 2 of its 3 layers, which only the block method does.
    ([2, ALL_LAYERS], [3, 2], 1),
])
def test_a_per_stage_n_no_megatron_n_runs_is_refused(ns, split, mtp) -> None:
    from ppsim.policy.report import policy_flags

    problem, policies = _stage_ns(ns, split, mtp)
    ex = policy_flags(problem, policies)
    assert ex.megatron_flags is None and "differs per stage" in ex.notes[0]


def test_policy_search_takes_no_other_axes(capsys) -> None:
    assert main([*PLAN, "--search", "policy,vpp"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--search" in err and "\n" not in err


def test_text_output_lists_the_spaces(capsys) -> None:
    assert main([*PLAN[:-1], "--search", "policy", "--time-budget", "3"]) == 0
    out = capsys.readouterr().out
    assert "global" in out and "megatr" in out and "megatron policy as flags: " in out


def test_text_output_gives_the_fastest_split_and_policy_as_flags(capsys) -> None:
    # It printed the policy's flags alone: the planned split had no flags to paste.
    argv = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "16", "--memory-gb", "50", "--search", "policy",
            "--time-budget", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    space = next(x for x in out if x.startswith("fastest: ")).split()[1]
    row = next(x.split() for x in out if x.startswith(space + " "))
    policy = next(x for x in out if x.startswith(f"{space} policy as flags: "))
    # the flags alone: a note on what they need may follow in parentheses
    policy = policy.split(": ", 1)[1].split(";")[0].split(" (")[0]
    meg = next(x for x in out if x.startswith("Megatron: ")).split(None, 1)[1]
    counts = [int(c) for c in row[1].split(",")]
    assert meg.startswith("--num-layers 80 --pipeline-model-parallel-size 4 ")
    layout = "Et*{}|t*{}|t*{}|t*{}L".format(*counts)
    assert f"'{layout}'" in meg or len(set(counts[1:-1])) == 1, (meg, counts)
    assert policy.startswith("--recompute") and meg.endswith(" " + policy), (meg, policy)


def test_a_chunked_plan_not_proven_says_why_its_bound_is_loose(capsys) -> None:
    assert main(["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
                 "--vpp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "16",
                 "--recompute", "full", "--time-budget", "0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["proven_optimal"]  # gap ~20 %: the water-filling bound is far off
    assert "water-filling" in out["bound_note"]


def test_policy_search_refuses_compare_splits(capsys) -> None:
    assert main([*PLAN, "--search", "policy", "--compare", "8,8,8,8"]) == 2
    assert "--compare" in capsys.readouterr().err


@pytest.mark.parametrize(("mode", "flags"), [
    ("none", "--recompute-granularity full --recompute-method block --recompute-num-layers 2"),
    ("selective", None),  # core_attn and N: Megatron refuses the pair
])
def test_plan_with_a_configured_policy_exports_it(mode: str, flags, capsys) -> None:
    assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
                 "--microbatches", "8", "--recompute", mode, "--recompute-num-layers", "2",
                 "--time-budget", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert [p["recompute_layers"] for p in best["policy"]] == [2, 2, 2, 2]
    if flags is None:
        assert best["megatron_flags"] is None
        assert "--recompute-num-layers" in best["megatron_note"]
    else:
        assert best["megatron_flags"].endswith(flags)


def test_plan_text_gives_a_configured_policy_as_its_json_does_and_it_simulates_back(
        tmp_path) -> None:
    """The text `Megatron:` line of a plan under a configured policy carries the policy's
    flags, as best.megatron_flags does (it gave the split alone, which Megatron would run
    without the policy): pasted into simulate it gives the planned iteration time."""
    from tests.helpers import run_main

    argv = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "8", "--recompute-granularity", "selective",
            "--recompute-modules", "mlp"]
    code, out, _ = run_main(["plan", *argv, "--time-budget", "2"])
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("Megatron:"))
    tokens = shlex.split(line.removeprefix("Megatron:"))
    assert tokens[-4:] == ["--recompute-granularity", "selective", "--recompute-modules",
                           "mlp"]
    code, js, _ = run_main(["plan", *argv, "--time-budget", "2", "--json"])
    best = json.loads(js)["best"]
    assert shlex.join(tokens) == best["megatron_flags"]
    code, js, _ = run_main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                            "--microbatches", "8", *tokens, "--json"])
    sim = json.loads(js)
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-12)
    assert [r["peak_memory_bytes"] for r in sim["ranks"]] == best["peak_memory_bytes"]
    # A per-stage policy Megatron cannot run: the text says so, as the JSON's note does.
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
                   '[pipeline]\npp = 4\nmicrobatches = 8\n[memory]\n'
                   'recompute_modules = ["mlp"]\n[[memory.stage]]\nstage = 1\n'
                   'recompute_modules = ["core_attn"]\n')
    code, out, _ = run_main(["plan", "--config", str(cfg), "--time-budget", "2"])
    line = next(x for x in out.splitlines() if x.startswith("Megatron:"))
    assert line.startswith("Megatron:   n/a (") and "differs per stage" in line
    assert "--num-layers" not in line


def _chunked(memory_bytes: float):
    from ppsim.config.schema import config_from_dict
    from ppsim.pipeline.problem import build_problem
    from ppsim.policy.setup import policy_costs

    cfg = config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 8},
                            "pipeline": {"pp": 2, "vpp": 2, "microbatches": 8,
                                         "schedule": "interleaved-1f1b"},
                            "hardware": {"preset": "h100-80gb", "memory_bytes": memory_bytes}})
    return build_problem(cfg), policy_costs(cfg)


def test_with_two_chunks_per_rank_each_rank_gets_its_fastest_fitting_policy() -> None:
    """pp 2 vpp 2 at 34 GB: `full` is the best single global mode; with each rank's
    chunks given their own policy, the rank with room recomputes nothing."""
    from ppsim.policy.search import PER_RANK, plan_global, refine_per_rank, space_key

    problem, pc = _chunked(34e9)
    start = plan_global(problem, pc, 2.0)
    assert start.label == "full"
    got = refine_per_rank(problem, pc, start)
    assert got.space == "per-stage" and got.label == PER_RANK and not got.proven
    assert space_key(got)[0] < 0.95 * space_key(start)[0]
    assert got.result is not None and got.result.best is not None
    assert got.result.best.split == start.result.best.split  # the split is kept
    assert all(r.fits for r in got.result.best.summary.ranks)
    by_rank = [{got.policies[s] for s in range(4) if s % 2 == r} for r in range(2)]
    assert by_rank[0] != by_rank[1]  # the ranks differ: Megatron could not say it
    roomy_problem, roomy_pc = _chunked(1e15)  # nothing to gain: the start comes back
    roomy = plan_global(roomy_problem, roomy_pc, 2.0)
    assert space_key(refine_per_rank(roomy_problem, roomy_pc, roomy)) == space_key(roomy)


def test_each_chunk_of_a_rank_takes_its_own_policy_as_brute_force_would() -> None:
    """Per rank, the refined chunks' F + B is the least of every pair of policies (each
    chunk its own) that fits the rank, by the same estimate."""
    import itertools

    from ppsim.plan.search import SplitSearch
    from ppsim.policy.search import module_groups, plan_global, refine_per_rank
    from ppsim.sim.copies import estimated

    problem, pc = _chunked(31e9)
    start = plan_global(problem, pc, 2.0)
    got = refine_per_rank(problem, pc, start)
    assert got.result is not None and got.result.best is not None
    split = got.result.best.split
    search = SplitSearch(dataclasses.replace(problem.with_split(split), memory=None))
    offsets = [sum(split.counts[:k]) for k in range(split.num_stages)]
    options = [*module_groups(pc, True), *start.policies,
               *(StagePolicy(recompute_layers=n) for n in range(1, max(split.counts) + 1))]

    def costs(stages, pols):
        return [estimated(pc.stage_cost(p, offsets[k], split.counts[k], k == 0,
                                        k == split.num_stages - 1, search.receives[k]))
                for k, p in zip(stages, pols, strict=True)]

    def fits(rank, rc):
        return sum(c.static_bytes for c in rc) + search.rank_peak(rank, rc) <= search.memory

    mixed = False
    for rank, stages in enumerate(search.rank_stages):
        best = min(sum(c.forward_ms + c.backward_ms for c in rc)
                   for pols in itertools.product(options, repeat=len(stages))
                   if fits(rank, rc := costs(stages, pols)))
        rc = costs(stages, [got.policies[k] for k in stages])
        assert fits(rank, rc)
        assert sum(c.forward_ms + c.backward_ms for c in rc) == pytest.approx(best, rel=1e-9)
        mixed |= len({got.policies[k] for k in stages}) > 1
    assert mixed  # some rank's two chunks differ: one policy per rank would not say it


def test_a_job_search_axis_without_gpus_says_where_it_belongs(capsys) -> None:
    """Before: 'sharding' was an unknown axis, and the axes listed left policy out."""
    assert main([*PLAN, "--search", "sharding"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'sharding' is an axis of the job search (--gpus)" in err and "\n" not in err
    assert "policy, policy-per-stage alone" in err


def test_a_policy_of_nothing_says_to_drop_the_jobs_recompute_flags(capsys) -> None:
    # GPT-3 1.3B's preset recomputes selectively; the plan drops it. "none needed" read as
    # "keep the launch script's --recompute-granularity selective".
    argv = ["plan", "--preset", "gpt3-1.3b", "--hardware", "h100-80gb", "--pp", "2",
            "--microbatches", "4", "--search", "policy", "--time-budget", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "megatron policy: none" in out
    flags = next(x for x in out if x.startswith("megatron policy as flags: "))
    assert "leave out any --recompute-*" in flags, flags


def test_json_megatron_flags_give_each_flag_once_and_simulate_to_the_plan() -> None:
    """The fastest space's flags in `best.megatron_flags` are a line to paste: each
    option once (the policy's flags were appended twice), and simulated they give the
    planned iteration time and peak."""
    argv = ["--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "8", "--memory-gb", "50"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["plan", *argv, "--search", "policy", "--time-budget", "4",
                     "--json"]) == 0
    best = json.loads(buf.getvalue())["best"]
    tokens = shlex.split(best["megatron_flags"])
    options = [t for t in tokens if t.startswith("--")]
    assert "--recompute-granularity" in options
    assert len(options) == len(set(options)), best["megatron_flags"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["simulate", *argv, *tokens, "--json"]) == 0
    sim = json.loads(buf.getvalue())
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-12)
    assert [r["peak_memory_bytes"] for r in sim["ranks"]] == best["peak_memory_bytes"]


def test_a_policy_search_that_fits_nothing_says_how_near_it_came(capsys) -> None:
    """Llama-3-8B on 4 x 40 GB fits under no policy; the text gave 'global: none' and
    exit 3 with no word on stderr, the JSON no smallest peak. The nearest is full
    recompute, whose lowest peak a plain plan at --recompute full finds."""
    argv = ["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "4",
            "--microbatches", "8", "--memory-gb", "40", "--time-budget", "4"]
    assert main([*argv, "--recompute", "full", "--json"]) == 3
    full = json.loads(capsys.readouterr().out)
    peak, rank = full["smallest_peak_bytes"], full["smallest_peak_rank"]
    assert main([*argv, "--search", "policy", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["best"] is None
    assert (data["smallest_peak_bytes"], data["smallest_peak_rank"]) == (peak, rank)
    assert main([*argv, "--search", "policy"]) == 3
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "40.00 GB per rank" in err
    assert f"{peak / 1e9:.2f} GB on rank {rank}" in err and "--pp 8" in err
    assert "global: none" not in captured.out
    # Each space names what its lowest peak was planned under (per-stage said "under :").
    assert main([*argv, "--search", "policy,policy-per-stage"]) == 3
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert out.count("no split fits") == 3 and "under :" not in out
    assert "per-stage: no split fits; the lowest peak planned, under each stage's policy " \
        "that holds least:" in out


@pytest.mark.parametrize("top", ["0", "-3"])
def test_policy_search_refuses_top_below_one_as_plan_does(top: str, capsys) -> None:
    """`plan --top 0` exits 2; with --search policy it was taken without a word."""
    argv = [*PLAN[:-1], "--top", top]
    assert main(argv) == 2
    plain = capsys.readouterr().err.strip()
    assert main([*argv, "--search", "policy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == plain and "\n" not in err and "--top" in err


def test_policy_search_on_a_uniform_model_names_the_search(tmp_path, capsys) -> None:
    """A uniform model has no modules to recompute: the refusal named [memory] and
    --recompute-modules/--offload flags, none of which the command gave."""
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\n[pipeline]\npp = 2\n')
    assert main(["plan", "--config", str(cfg), "--search", "policy"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("ppsim plan: error: --search: policy")
    assert "[memory]" not in err and "drop --search policy" in err


def test_where_nothing_fits_the_megatron_space_is_as_near_as_the_global_full() -> None:
    """Global full recompute is a Megatron point (the uniform method), so where no split
    fits, the Megatron space's nearest policy holds at most what full does, and it
    recomputes: Megatron's default (none) is the farthest from fitting."""
    import time

    from ppsim.cli.plan_policy import search_spaces
    from ppsim.policy.search import lowest_peak

    cfg = with_overrides(load_config(None), preset="llama3-8b", hardware="h100-80gb",
                         pipeline={"pp": 4, "microbatches": 8}, memory_bytes=38e9)
    glob, meg = search_spaces(cfg, ["policy"], 6.0, time.perf_counter())
    assert glob.result.best is None and meg.result.best is None and glob.label == "full"
    assert lowest_peak(meg) <= lowest_peak(glob) < 38e9 * 1.2
    assert all(p.recompute_layers for p in meg.policies)
