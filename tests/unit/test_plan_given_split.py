"""`ppsim plan` with a launch line's split: --pipeline-model-parallel-layout,
--decoder-first/last-pipeline-num-layers and --account-for-*-in-pipeline-split were
"unrecognized arguments" on `plan`, so a pasted Megatron launch line with an uneven split
could not be planned, and a config's split was dropped without a word. Now the given
split is a row of the table ("given split", and `compared` in JSON) for the plan to beat."""

from __future__ import annotations

import json

import pytest
from helpers import run_main as _run

BASE = ["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--pp", "8",
        "--microbatches", "16", "--time-budget", "2"]


@pytest.mark.parametrize("flags, counts", [
    # Megatron: 7 first, 7 last, the other 66 evenly over the 6 middle stages
    (["--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7"],
     [7] + [11] * 6 + [7]),
    (["--pipeline-model-parallel-layout", "Et*9|(t*10|)*6t*11L"], [9] + [10] * 6 + [11]),
    (["--layout", "Et*9|(t*10|)*6t*11L"], [9] + [10] * 6 + [11]),
])
def test_the_given_split_is_a_row_to_beat(flags: list[str], counts: list[int]) -> None:
    code, out, err = _run([*BASE, *flags, "--json"])
    assert code == 0, err
    plan = json.loads(out)
    given = [c for c in plan["compared"] if c["label"] == "given split"]
    assert len(given) == 1 and given[0]["split"] == counts
    assert plan["best"]["iteration_time_ms"] <= given[0]["iteration_time_ms"]
    code, text, _ = _run([*BASE, *flags])
    row = next(line for line in text.splitlines() if line.startswith("given split"))
    assert ",".join(map(str, counts)) in row


def test_no_split_flags_no_given_row() -> None:
    code, out, _ = _run([*BASE, "--json"])
    assert code == 0 and not any(c["label"] == "given split"
                                 for c in json.loads(out)["compared"])


def test_a_split_megatron_refuses_is_refused_in_its_words() -> None:
    code, _, err = _run([*BASE, "--decoder-first-pipeline-num-layers", "9",
                         "--decoder-last-pipeline-num-layers", "9"])
    assert code == 2 and "62 middle layers do not divide over the 6 middle stages" in err
    assert len(err.strip().splitlines()) == 1


def test_the_job_search_says_it_plans_each_shapes_own_split() -> None:
    code, _, err = _run(["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb",
                         "--gpus", "64", "--global-batch-size", "128", "--tp", "8", "--pp", "8",
                         "--decoder-first-pipeline-num-layers", "7",
                         "--decoder-last-pipeline-num-layers", "7", "--time-budget", "2"])
    assert code == 0 and "note: the job search plans each shape's own split" in err
