"""The frameworks' baselines in `plan`, exports each target accepts, Megatron's refusals.

One test per defect of issue 25 (each fails on the code before it): the DeepSpeed
row is DeepSpeed's own partition, torchtitan's split is a baseline, no export
torch cannot run, a warning whenever Megatron would refuse what was simulated,
DualPipeV's OVERLAP_F_B cells written as torch writes them, DeepSpeed's
spec-list shape and the override it needs.
"""

from __future__ import annotations

import contextlib
import io
import json
import types

import pytest

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.pipeline.exports import (
    DeepSpeedSpecs,
    deepspeed_boundaries,
    deepspeed_override,
    parse_deepspeed_specs,
    torchtitan_fqns,
)
from ppsim.pipeline.split import Split
from ppsim.plan.baselines import counts_from_boundaries
from ppsim.schedules.generators import build_schedule
from ppsim.schedules.torchcsv import parse_actions_csv, to_torch_csv

README_PLAN = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
               "--microbatches", "64", "--json"]


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def readme_plan():
    """README's plan example, planned once for the tests below: (JSON, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(README_PLAN) == 0
    return json.loads(out.getvalue()), err.getvalue()


def test_deepspeed_row_is_deepspeeds_partition(readme_plan):
    """Defect 1: DeepSpeed's partition_balanced over [embedding, 80 layers, head] weighted
    by parameters gives 9,11,11,10,10,10,10,9 (DeepSpeed's own code, run by the issue)."""
    data, err = readme_plan
    assert "warning" not in err  # Megatron runs 1F1B on pp 8 with 64 microbatches
    rows = {r["key"]: r for r in data["baselines"]}
    assert rows["deepspeed_parameters"]["split"] == [9, 11, 11, 10, 10, 10, 10, 9]
    assert data["deepspeed"]["split"] == [9, 11, 11, 10, 10, 10, 10, 9]
    best = data["best"]
    t = best["iteration_time_ms"]
    assert best["speedup_vs_deepspeed_parameters"] == pytest.approx(
        rows["deepspeed_parameters"]["iteration_time_ms"] / t)
    # DeepSpeed uniform: 82 entries on 8 stages, 11 then 10s; the entries hold the ends.
    assert rows["deepspeed_uniform"]["split"] == [10, 11, 10, 10, 10, 10, 10, 9]


def test_torchtitan_is_a_baseline(readme_plan, capsys):
    """Defect 2: torchtitan's default split, named, with its speed-up."""
    data, _ = readme_plan
    rows = {r["key"]: r for r in data["baselines"]}
    assert rows["torchtitan"]["label"] == "torchtitan default"
    assert rows["torchtitan"]["split"] == [10, 11, 10, 10, 10, 10, 10, 9]
    assert "speedup_vs_torchtitan" in data["best"] and "speedup_vs_megatron" in data["best"]
    assert all(data["best"][f"speedup_vs_{k}"] >= 1 - 1e-9 for k in rows)  # seeded: never slower
    small = run_json(capsys, ["plan", "--num-layers", "25", "--pp", "6", "--microbatches",
                              "12", "--json", "--time-budget", "5"])
    tt = next(r for r in small["baselines"] if r["key"] == "torchtitan")
    assert tt["split"] == [4, 5, 5, 4, 4, 3]


def test_plan_table_names_every_baseline(capsys):
    assert main(["plan", "--num-layers", "25", "--pp", "6", "--microbatches", "12",
                 "--time-budget", "5"]) == 0
    out = capsys.readouterr().out
    for label in ("DeepSpeed", "torchtitan", "best against each framework's own split"):
        assert label in out


def test_no_torch_export_with_an_empty_first_stage(capsys):
    """Defect 3: torch pipelining feeds token ids to stage 0 only."""
    data = run_json(capsys, ["split", "--num-layers", "4", "--pp", "2", "--layout", "|Et*4L",
                             "--json"])
    assert data["torchtitan_module_fqns_per_model_part"] is None
    assert "stage 0" in data["torchtitan_note"]
    assert data["megatron_flags"] is not None  # Megatron runs it


def test_no_torchtitan_export_with_mtp_under_pp():
    with pytest.raises(UserError, match="MTP"):
        torchtitan_fqns(Split((2, 3), 2, mtp=1))
    assert torchtitan_fqns(Split((3,), 1, mtp=1)) == [
        ["tok_embeddings", "layers.0", "layers.1", "norm", "lm_head"]]


@pytest.mark.parametrize("argv, words", [
    (["--pp", "2", "--vpp", "2", "--microbatches", "3"], "default group size"),
    (["--pp", "1", "--vpp", "2", "--microbatches", "3"], "pp 1"),
    (["--pp", "4", "--vpp", "2", "--microbatches", "3"], "outside [pp=4, m=3]"),
])
def test_megatron_refusals_warn_on_stderr(capsys, argv, words):
    """Defect 4: exit 0, and one warning line naming Megatron's reason."""
    cmd = ["simulate", "--num-layers", "8", "--schedule", "interleaved-1f1b", *argv, "--json"]
    assert main(cmd) == 0
    err = capsys.readouterr().err
    assert "warning: Megatron refuses" in err and words in err


def test_no_warning_where_megatron_runs_it(capsys):
    for extra in (["--microbatches", "4"], ["--microbatches", "3", "--microbatch-group-size",
                                            "3"]):
        assert main(["simulate", "--num-layers", "8", "--schedule", "interleaved-1f1b",
                     "--pp", "2", "--vpp", "2", *extra, "--json"]) == 0
        assert "warning" not in capsys.readouterr().err


def test_the_group_size_is_exported_and_shapes_the_order(capsys):
    data = run_json(capsys, ["split", "--num-layers", "8", "--pp", "2", "--vpp", "2",
                             "--microbatches", "3", "--json"])
    assert data["megatron_flags"].endswith(
        "--microbatch-group-size-per-virtual-pipeline-stage 3")
    even = run_json(capsys, ["split", "--num-layers", "8", "--pp", "2", "--vpp", "2",
                             "--microbatches", "4", "--json"])
    assert "microbatch-group" not in even["megatron_flags"]  # Megatron's default, pp
    a = build_schedule("interleaved-1f1b", 2, 2, 6, 2)
    b = build_schedule("interleaved-1f1b", 2, 2, 6, 3)
    assert a.actions != b.actions


@pytest.mark.parametrize("argv, words", [
    (["--microbatches", "3"], "default group size"),
    (["--pp", "4", "--microbatches", "3"], "outside [pp=4, m=3]"),
])
def test_split_warns_where_megatron_refuses_its_flags(capsys, argv, words):
    """split prints the flags of an interleaved order; where Megatron refuses that order
    (m < pp: no group lies in [pp, m]) or its default group, it says so as simulate does."""
    cmd = ["split", "--num-layers", "8", "--pp", "2", "--vpp", "2", *argv, "--json"]
    assert main(cmd) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: Megatron refuses" in err and words in err


@pytest.mark.parametrize("argv, rule", [
    (["--microbatches", "8"], "Megatron's rule (groups of 4 microbatches)"),
    (["--microbatches", "3"], "torch's rule (m < pp: one group of 3)"),
    (["--microbatches", "8", "--microbatch-group-size", "8"],
     "groups of 8 microbatches (--microbatch-group-size 8)"),
])
def test_schedule_names_whose_group_rule_shaped_the_order(capsys, argv, rule):
    """The flag is named only where it was given; unset, Megatron's rule (m >= pp) or
    torch's (m < pp, which Megatron refuses) chose the group."""
    doc = run_json(capsys, ["schedule", "--num-layers", "8", "--schedule", "interleaved-1f1b",
                            "--pp", "4", "--vpp", "2", *argv, "--json"])
    assert doc["rule"] == rule


def test_megatron_refuses_pp1_with_vpp(capsys):
    data = run_json(capsys, ["split", "--num-layers", "8", "--pp", "1", "--vpp", "2",
                             "--json"])
    assert data["megatron_flags"] is None and "pp >= 2" in data["megatron_note"]


# ---------------------------------------------------------------- DualPipeV cells (defect 5)

def _torch_dualpipev_csv(tmp_path, pp, m):
    # Imported here, not at collection: torch's pipelining takes ~3 s of CPU to import,
    # which every test worker would pay.
    torch = pytest.importorskip("torch")
    ts = pytest.importorskip("torch.distributed.pipelining.schedules")
    stages = [types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=2 * pp,
                                    stage_index=i, submod=torch.nn.Identity(),
                                    is_first=i == 0, is_last=i == 2 * pp - 1)
              for i in range(2)]
    path = tmp_path / f"dpv-{pp}-{m}.csv"
    ts.ScheduleDualPipeV(stages, m)._dump_csv(str(path), format="compute_only")
    return path.read_bytes().decode()  # csv.writer's \r\n line ends, kept


@pytest.mark.parametrize("pp, m", [(1, 2), (2, 4), (2, 7), (3, 6), (3, 9), (4, 8), (4, 11)])
def test_dualpipev_csv_is_torchs_cell_for_cell(tmp_path, pp, m):
    theirs = _torch_dualpipev_csv(tmp_path, pp, m)
    ours = to_torch_csv(build_schedule("dualpipev", pp, 2, m))
    assert ours == theirs
    assert ours.count("OVERLAP_F_B") == theirs.count("OVERLAP_F_B")
    back = parse_actions_csv(theirs)  # read, then written again: the same cells
    assert to_torch_csv(back) == theirs
    assert back.actions == build_schedule("dualpipev", pp, 2, m).actions


def test_overlap_cells_round_trip_without_split_backward():
    text = "0F0,1F0,0F1,(1F1;1B0)OVERLAP_F_B,0B0,1B1,0B1\n"
    # One rank, two stages in loop order: stage 1 after stage 0 on the same rank.
    s = parse_actions_csv(text)
    assert to_torch_csv(s) == text.replace("\n", "\r\n")


# ---------------------------------------------------------------- DeepSpeed specs (defect 6)


def test_deepspeed_specs_shift_the_boundaries(capsys):
    data = run_json(capsys, ["split", "--num-layers", "8", "--pp", "2", "--split", "5,3",
                             "--deepspeed-specs", "2,4", "--json"])
    assert data["deepspeed_boundaries"] == [0, 7, 14]  # 2 before + 5 layers; 2 + 8 + 4
    assert data["deepspeed_specs"] == {"before": 2, "after": 4}
    assert "_partition_layers" in data["deepspeed_partition_override"]
    plain = run_json(capsys, ["split", "--num-layers", "8", "--pp", "2", "--split", "5,3",
                              "--json"])
    assert plain["deepspeed_boundaries"] == [0, 6, 10]


def test_the_spec_list_is_read_out_in_entries_and_layers(capsys):
    assert main(["split", "--num-layers", "8", "--pp", "2", "--split", "5,3",
                 "--deepspeed-specs", "2,1"]) == 0
    assert "over the spec list (2 entries, the 8 layers, 1 entry)" in capsys.readouterr().out


def test_the_override_sets_deepspeeds_parts():
    """The printed subclass, run against a stand-in with DeepSpeed's two members."""
    calls = []

    class PipelineModule:
        stage_id = 1

        def _set_bounds(self, start=None, stop=None):
            calls.append((start, stop))

    scope = {"PipelineModule": PipelineModule}
    exec(deepspeed_override([0, 7, 14]), scope)  # noqa: S102 - our own generated text
    pipe = scope["PlannedPipe"]()
    pipe._partition_layers(method="parameters")
    assert pipe.parts == [0, 7, 14] and calls == [(7, 14)]


@pytest.mark.parametrize("counts", [(0, 3, 2), (4, 1, 0), (2, 2, 2)])
@pytest.mark.parametrize("before, after", [(1, 1), (2, 4), (3, 1)])
def test_boundaries_read_back_as_the_split(counts, before, after):
    specs = DeepSpeedSpecs(before=before, after=after)
    bounds = deepspeed_boundaries(Split(counts, 3), specs)
    assert counts_from_boundaries(bounds, specs, sum(counts)) == counts


@pytest.mark.parametrize("text", ["1", "a,b", "0,1", "1,2,3"])
def test_bad_specs_are_a_user_error(text):
    with pytest.raises(UserError, match="--deepspeed-specs"):
        parse_deepspeed_specs(text)


def test_no_torchtitan_export_with_an_empty_middle_stage(capsys):
    """torchtitan builds each model part's optimizer param groups and raises on a part
    that matches no parameter (components/optimizer/optimizer.py: "matched no
    parameters"); a split with an empty middle stage printed `[]` as that part."""
    data = run_json(capsys, ["split", "--num-layers", "8", "--pp", "2", "--layout",
                             "Et*4||t*4|L", "--json"])
    assert data["torchtitan_module_fqns_per_model_part"] is None
    assert "stage 1 holds no module" in data["torchtitan_note"]
    assert data["megatron_flags"] is not None  # Megatron's layout takes an empty stage


# ------------------------------------------- a Megatron without a split is a missing baseline


@pytest.mark.parametrize(("argv", "says"), [
    (["--schedule", "zbv", "--pp", "2", "--vpp", "2"], "loop order, not 'v'"),
    (["--num-layers", "7", "--pp", "4", "--vpp", "2"], "no even or first/last split of 7"),
])
def test_a_megatron_with_no_split_is_listed_missing_with_why(capsys, argv, says):
    """Before: Megatron was in neither `baselines` nor `baselines_missing`, and under V
    placement the text left the empty speed-up column unexplained."""
    data = run_json(capsys, ["plan", "--preset", "tiny-gpt", "--microbatches", "8", *argv,
                             "--json"])
    missing = {m["key"]: m for m in data["baselines_missing"]}
    assert says in missing["megatron"]["note"]
    assert data["baseline"] is None and "megatron" not in {b["key"] for b in data["baselines"]}
    assert "speedup_vs_megatron" not in data["best"]
    assert main(["plan", "--preset", "tiny-gpt", "--microbatches", "8", *argv]) == 0
    assert f"Megatron: none ({missing['megatron']['note']})" \
        in " ".join(capsys.readouterr().out.split())
