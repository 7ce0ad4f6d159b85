"""What `ppsim plan --gpus N --global-batch-size B` says of its answer: the Megatron line
that launches the best shape, the sizes it held, the overlaps the best leaves off, whether
its split is proven, and why it passed shapes over."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from helpers import JOB_ARGS as ARGS
from helpers import TIGHT_JOB as SMALL

from ppsim.cli.main import main


def test_the_best_shape_does_not_depend_on_how_many_rows_are_shown() -> None:
    """Llama-3-8B on 8 GPUs: the fastest shape is the second at its default split, so with
    --top 1 only the first had its split planned and the plan was 6 % slower (3,735 ms,
    tp 4 cp 2 pp 1, against tp 2 cp 2 pp 2 vpp 4 at 3,528 ms with --top 5)."""
    import contextlib
    import io

    def plan(top: str) -> list[dict]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus",
                         "8", "--global-batch-size", "32", "--time-budget", "4", "--top", top,
                         "--json"]) == 0
        doc = json.loads(out.getvalue())
        assert len(doc["candidates"]) >= int(top)
        return doc["candidates"]

    one, five = plan("1")[0], plan("5")
    fastest = five[0]["iteration_time_ms"]
    assert one["iteration_time_ms"] <= fastest * 1.01
    # Shapes of equal time (cp 2 dp 1 against cp 1 dp 2: the same work a rank) tie; the
    # one shown first may be either under a time budget.
    tied = {(c["tp"], c["cp"], c["pp"]) for c in five if c["iteration_time_ms"] <= fastest * 1.01}
    assert (one["tp"], one["cp"], one["pp"]) in tied


@pytest.mark.parametrize("model, job", [
    ("--preset llama3-8b --num-layers 8", "--gpus 16 --global-batch-size 32"),
    # Held sizes keep the searches to a few shapes, which any budget finishes.
    ("--preset mixtral-8x7b", "--gpus 32 --global-batch-size 64 --use-distributed-optimizer "
     "--overlap-grad-reduce --overlap-param-gather --search policy --tp 1 --cp 4 --ep 8 "
     "--pp 1 --micro-batch-size 2 --use-precision-aware-optimizer --exp-avg-dtype bf16"),
    ("--preset nemotron-h-8b", "--gpus 16 --global-batch-size 64 --tp 2 --pp 2 --cp 1 "
     "--micro-batch-size 1"),
    ("--preset llama3-8b --num-layers 8", "--gpus 16 --global-batch-size 32 "
     "--use-tp-pp-dp-mapping --use-distributed-optimizer --overlap-grad-reduce "
     "--ddp-bucket-size 20000000"),
], ids=["dense", "moe-overlapped-policy", "hybrid", "tp-pp-dp-mapping-buckets"])
def test_the_job_plans_megatron_line_launches_the_best_shape(model: str, job: str,
                                                             capsys) -> None:
    """The job plan named the best shape but gave no flags to launch it with: the sizes,
    the batch, the policy and the overlaps had to be copied out of the table by hand."""
    import shlex

    common = [*shlex.split(model), "--hardware", "h100-80gb"]
    assert main(["plan", *common, *shlex.split(job), "--time-budget", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    flags = shlex.split(best["megatron_job_flags"])
    assert ("--global-batch-size" in flags) and ("--micro-batch-size" in flags)
    mapping = "--use-tp-pp-dp-mapping"
    for flag in (mapping, "--ddp-bucket-size", "--use-precision-aware-optimizer",
                 "--exp-avg-dtype"):
        assert (flag in flags) == (flag in job)
    # Megatron's default dispatcher is allgather, which ppsim does not price at ep > 1.
    if best["ep"] > 1:
        assert flags[flags.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    gpus = shlex.split(job)[1]
    # Megatron recomputes nothing unless told; a preset's own mode is ppsim's default.
    unless = [] if "--recompute-granularity" in flags else ["--recompute", "none"]
    assert main(["simulate", *common, "--gpus", gpus, *flags, *unless, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-9)
    assert sim["split"] == best["split"] and sim["job"]["dp"] == best["dp"]
    assert sim["job"]["rank_order"] == ("tp-cp-ep-pp-dp" if mapping in job
                                        else "tp-cp-ep-dp-pp")


def test_a_rank_order_megatron_cannot_select_gives_no_megatron_line(capsys) -> None:
    """Megatron's arguments select its default order or --use-tp-pp-dp-mapping's only."""
    assert main(["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware",
                 "h100-80gb", "--gpus", "16", "--global-batch-size", "32", "--rank-order",
                 "tp-dp-cp-ep-pp", "--time-budget", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["iteration_time_ms"] > 0 and best["megatron_job_flags"] is None


def test_the_job_plan_says_which_sizes_it_held(capsys) -> None:
    """A pasted launch line fixes tp, pp, ...: the table showed a handful of shapes with
    no word on why the search was so small."""
    argv = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
            "--gpus", "16", "--global-batch-size", "32", "--tp", "2", "--micro-batch-size",
            "1", "--time-budget", "2"]
    assert main(argv) == 0
    assert "held as given: --tp 2 --micro-batch-size 1" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["held"] == {"tp": 2, "micro_batch_size": 1}


@pytest.mark.parametrize("sharding", [[], ["--use-distributed-optimizer"]])
def test_the_overlaps_the_best_leaves_off_are_named_and_hide_its_communication(
        sharding: list[str], capsys) -> None:
    """Megatron's overlaps are off unless given: the plan names those that apply to the
    best shape (data-parallel reduce and gather, tensor-parallel collectives), and with
    them given the best waits less. tp 2 dp 8: dp rings across two nodes."""
    held = [*ARGS, "--tp", "2", "--cp", "1", "--pp", "1", *sharding]
    assert main(["plan", *held, "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["best"]
    want = ["--overlap-grad-reduce", *["--overlap-param-gather"] * bool(sharding),
            "--tp-comm-overlap"]
    assert (b["tp"], b["dp"]) == (2, 8) and b["overlaps_off"] == want
    assert main(["plan", *held]) == 0
    text = " ".join(capsys.readouterr().out.split())
    share = b["exposed_comm_ms"] / b["iteration_time_ms"]
    assert share >= 0.05
    assert f"the best waits {share:.0%} of its iteration on communication; " \
           f"Megatron's {' '.join(want)}, off here, hide part of it" in text
    assert main(["plan", *held, *want, "--json"]) == 0
    given = json.loads(capsys.readouterr().out)["best"]
    assert given["overlaps_off"] == []
    assert given["exposed_comm_ms"] < b["exposed_comm_ms"]
    assert given["iteration_time_ms"] < b["iteration_time_ms"]
    assert main(["plan", *held, *want]) == 0
    assert "off here" not in capsys.readouterr().out


def test_simulate_names_the_overlaps_its_job_leaves_off(capsys) -> None:
    """The same shape simulated says what the plan said of it: its exposed communication
    and the overlaps off; with them on, none is named."""
    held = [*ARGS, "--tp", "2", "--cp", "1", "--pp", "1"]
    assert main(["plan", *held, "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["best"]
    sim = ["simulate", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
           "--gpus", "16", "--global-batch-size", "32", "--tp", "2", "--pp", "1",
           "--micro-batch-size", str(b["micro_batch_size"])]
    assert main([*sim, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["iteration_time_ms"] == pytest.approx(b["iteration_time_ms"], rel=1e-12)
    assert doc["exposed_comm_ms"] == pytest.approx(b["exposed_comm_ms"], rel=1e-12)
    assert doc["overlaps_off"] == b["overlaps_off"] == ["--overlap-grad-reduce",
                                                         "--tp-comm-overlap"]
    assert main(sim) == 0
    share = doc["exposed_comm_ms"] / doc["iteration_time_ms"]
    assert f"the job waits {share:.0%} of its iteration on communication; Megatron's " \
           "--overlap-grad-reduce --tp-comm-overlap, off here" \
           in " ".join(capsys.readouterr().out.split())
    assert main([*sim, "--overlap-grad-reduce", "--tp-comm-overlap", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overlaps_off"] == []


def test_the_split_plan_names_the_overlaps_its_best_split_leaves_off(capsys) -> None:
    """`ppsim plan` without --gpus plans the split of the job given, and says the same of
    its best split as simulate does of that split."""
    job = ["--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
           "--tp", "8", "--pp", "2", "--dp", "4", "--global-batch-size", "32"]
    assert main(["plan", *job, "--json"]) == 0
    split = json.loads(capsys.readouterr().out)["best"]["split"]
    assert main(["simulate", *job, "--split", ",".join(map(str, split)), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    share = sim["exposed_comm_ms"] / sim["iteration_time_ms"]
    assert share >= 0.05
    assert main(["plan", *job]) == 0
    assert f"the best split waits {share:.0%} of its iteration on communication; " \
           "Megatron's --overlap-grad-reduce --tp-comm-overlap, off here" \
           in " ".join(capsys.readouterr().out.split())


def test_the_plan_says_whether_the_best_split_is_proven(capsys) -> None:
    """A one-stage shape has one split: its planner finishes and proves it. With the
    budget spent before any split is planned, none is proven and the plan says a longer
    budget may find a faster one."""
    one_stage = [*ARGS, "--tp", "2", "--cp", "1", "--pp", "1"]
    assert main(["plan", *one_stage, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["pp"] == 1 and best["split_proven"] is True
    assert main(["plan", *one_stage]) == 0
    assert "the best's split: proven the fastest of its shape's" in capsys.readouterr().out
    spent = ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb",
             "--gpus", "16", "--global-batch-size", "32", "--pp", "4", "--time-budget", "0.05"]
    rc = main([*spent, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 3) and all(c["split_proven"] is False for c in doc["candidates"])
    rc = main(spent)  # a spent budget may leave no fitting shape: exit 3, no best to name
    out = " ".join(capsys.readouterr().out.split())
    assert rc in (0, 3)
    if rc == 0:
        assert "not proven; a longer --time-budget may find a faster one" in out


def test_tp_comm_overlap_at_tp_1_is_refused_as_megatron_refuses_it(capsys) -> None:
    """Megatron turns sequence parallelism off at tp 1 and then asserts that
    --tp-comm-overlap needs it; the job search applies the flag to its shapes with tp > 1
    and launches those at tp 1 without it."""
    job = ["--preset", "llama3-8b", "--num-layers", "4", "--hardware", "h100-80gb",
           "--tp-comm-overlap"]
    for cmd in (["simulate", *job, "--tp", "1"], ["plan", *job, "--pp", "2"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "pipeline.tp_comm_overlap: Tensor parallel communication/GEMM overlap can " \
               "happen only when sequence parallelism is enabled" in err
        assert len(err.strip().splitlines()) == 1
    search = ["plan", *job[:6], "--gpus", "16", "--global-batch-size", "32",
              "--tp-comm-overlap", "--cp", "1", "--pp", "1", "--json"]
    for tp, flagged in (("1", False), ("2", True)):
        assert main([*search, "--tp", tp]) == 0
        best = json.loads(capsys.readouterr().out)["best"]
        assert best["tp"] == int(tp)
        assert ("--tp-comm-overlap" in best["megatron_job_flags"]) == flagged


def _args_plan_json(*extra: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", *ARGS, *extra, "--json"]) == 0
    return json.loads(out.getvalue())


def test_the_plan_says_why_each_shape_it_did_not_simulate_was_not(capsys) -> None:
    """Before: '86 of 465 shapes' left the other 379 unexplained (cut by the clock, or
    ruled out?)."""
    doc = _args_plan_json("--memory-gb", "20")
    assert doc["complete"]
    rest = doc["total_shapes"] - doc["evaluated"]
    assert rest > 0 and doc["static_overflows"] > 0
    assert main(["plan", *ARGS, "--memory-gb", "20"]) == 0
    head = " ".join(capsys.readouterr().out.split("held back by")[0].split())
    said = {"bounded out": 0, "over memory under any split": 0, "over memory on weights": 0,
            "refused by": 0}
    for n, why in re.findall(r"(\d[\d,]*) (bounded out|over memory under any split|"
                             r"over memory on weights|refused by)", head):
        said[why] = int(n.replace(",", ""))
    assert sum(said.values()) == rest
    assert said["over memory on weights"] == doc["static_overflows"]
    assert said["over memory under any split"] == doc["floor_overflows"]
    assert said["refused by"] == doc["refused"]
    # JSON counts the bounded-out shapes too, so the reasons add up without arithmetic
    assert said["bounded out"] == doc["bounded_out"] and doc["not_reached"] == 0
    assert sum(doc[k] for k in ("evaluated", "static_overflows", "floor_overflows",
                                "refused", "bounded_out", "not_reached")) == doc["total_shapes"]
    # Memory no shape's static bytes overflow: nothing is over memory.
    assert _args_plan_json("--memory-gb", "100000")["static_overflows"] == 0


@pytest.mark.parametrize("budget", [60.0, 120.0])
def test_a_longer_budget_gives_each_split_plan_more_time(budget: float, monkeypatch) -> None:
    """Before: each shape's split plan got at most 5 s whatever --time-budget said, so
    'a longer --time-budget may find a faster one' could not come true."""
    from ppsim.cli.flags import config_from_args
    from ppsim.cli.main import build_parser
    from ppsim.job import search

    given: list[float] = []

    def refined(r, cfg, policy, budget_s):  # noqa: ANN001, ANN202 - the search's own call
        given.append(budget_s)
        return r

    monkeypatch.setattr(search, "_refined", refined)
    cfg = config_from_args(build_parser().parse_args(
        ["plan", "--preset", "llama3-8b", "--num-layers", "8", "--hardware", "h100-80gb"]))
    res = search.search_job(cfg, 16, 32, budget_s=budget, fixed={"tp": 2, "cp": 1, "pp": 2,
                                                                  "vpp": 1, "mbs": 1})
    assert res.evaluated == len(given) == 1  # one shape holds every size
    assert budget / 12 * 0.99 <= given[0] <= budget / 12


def test_one_policy_on_every_shape_shown_is_said_once(capsys) -> None:
    """Before: "memory policy: recompute selective, except" and then every row, each
    with the same other mode."""
    text = [a for a in SMALL if a != "--json"]
    text[text.index("--top") + 1] = "1"
    assert main([*text, "--search", "recompute"]) == 0
    out = capsys.readouterr().out
    assert "memory policy: full on every shape shown (configured: recompute selective)" in out
    assert ", except" not in out


def test_a_search_cut_short_claims_no_more_than_the_shapes_it_priced(capsys) -> None:
    """DeepSeek-V3 on 128 H100s with a 1 s budget priced a few hundred of its 5,523
    shapes, yet said "on every shape the weights ... overflow" above "no shape that fits
    was found within the time budget". It now counts the shapes it priced."""
    line = ["plan", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--gpus", "128",
            "--global-batch-size", "512"]
    assert main([*line, "--time-budget", "1"]) == 3
    out, err = capsys.readouterr()
    said = " ".join(out.split())
    priced = re.search(r"on each of the ([\d,]+) shapes priced before the time budget ran "
                       r"out the weights", said)
    assert priced is not None and "on every shape" not in said, said
    total = int(re.search(r"of ([\d,]+) shapes simulated", said)[1].replace(",", ""))
    assert 0 < int(priced[1].replace(",", "")) < total
    assert "within the time budget" in err


@pytest.mark.parametrize("peak", [80.3e9, 80.04e9, 80.0004e9])
def test_a_shape_held_back_by_memory_reads_over_its_limit(peak: float) -> None:
    from types import SimpleNamespace

    from ppsim.job.exposure import held_back

    said = held_back(SimpleNamespace(fits=False, peak_memory_bytes=peak), 0.0, 80e9)
    shown, limit = (float(x) for x in re.findall(r"[\d.]+", said))
    assert said.startswith("memory (") and shown > limit and abs(shown - peak / 1e9) < 0.01


def test_one_overlap_left_off_is_named_in_the_singular(capsys) -> None:
    """tp 8 pp 2 at dp 1 has no data-parallel reduce: the one flag left off hides part of
    the communication, and the plan asks to plan again with it."""
    assert main(["plan", *ARGS, "--tp", "8", "--pp", "2", "--cp", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Megatron's --tp-comm-overlap, off here, hides part of it: plan again with it" \
        in text


def test_one_setting_that_refuses_every_shape_is_named_itself(capsys) -> None:
    """With tp held at 8, a dense MLP 8 does not divide refuses every shape: the plan
    names model.ffn_hidden_size, not the global batch, which no other size would help."""
    assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb",
                 "--ffn-hidden-size", "14340", "--gpus", "16", "--global-batch-size", "32",
                 "--tp", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("ppsim plan: error: model.ffn_hidden_size: 14,340 is not "
                          "divisible by 8 (tp)"), err
